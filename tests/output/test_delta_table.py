"""The committed output as Delta Lake tables (``pipeline/output/table.py``), read by real
readers: deltalake/pandas, Polars, Daft and Ray Data each read exactly the rows
``read_output`` reads - with a partition missing, after a resume, after ``--mode
overwrite`` and after a rebuild from the markers - never a WebDataset shard; the dedup
view drops the duplicates the pass found; the quarantine table holds the error rows; S3
(SeaweedFS) works with conditional puts.

The runs the tables are read during and after are real ``mmpipe run`` processes where the
claim is the process's: the run stopped with SIGTERM (exit 143) while a partition hangs,
the resume whose failed table write is logged to stderr - both with worker processes (no
Ray: the claims are the driver's and the tables', on either executor). The
``--mode overwrite`` run (the dataset-wide dedup pass: Ray) and the commands that read or
repair the tables (``mmpipe table``, ``status``, ``gc``) run ``cli.main`` in this process
on the session's Ray (``tests/inproc.py``: the same command, its exit code and what
it prints, without a local Ray start and stop of its own).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.output import table
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import read_output
from tests.conftest import CASES, PHOTOS, REPO, coco_captions
from tests.inproc import mmpipe as mmpipe_here
from tests.e2e.jobs import clean_ray_env

NO_MODEL = ["--set", "text_embedding.enabled=false"]


def mmpipe(*args: str, home: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m pipeline ARGS`` as a user runs it (its own local Ray when it starts one)."""
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1", **(env or {})))


def images_args(src: Path, out: Path, *extra: str) -> list[str]:
    """``mmpipe run`` of examples/images.yaml on ``src`` into ``out``, WebDataset shards
    on, without the text embedding (the claims are the tables', not the model's)."""
    return ["run", "examples/images.yaml", "--input", str(src), "--output", str(out),
            *NO_MODEL, "--set", "sink.webdataset.enabled=true",
            "--set", "source.partition_size=3", *extra]


def run_images(src: Path, out: Path, home: Path, *extra: str, executor: str = "ray",
               env: dict | None = None):
    """examples/images.yaml on ``src`` into ``out`` (``images_args``), a subprocess: on a
    new local Ray, or (``executor="processes"``) in worker processes, no Ray."""
    return mmpipe(*images_args(src, out, "--address", "local", "--executor", executor, *extra),
                  home=home, env=env)


@pytest.fixture
def small_input(tmp_path) -> Path:
    """8 real photos with .txt captions, a byte copy of the first that sorts last (another
    partition: only the dataset-wide pass sees it), and 2 broken files (error rows)."""
    src = tmp_path / "input"
    src.mkdir()
    rows = coco_captions()[:8]
    for row in rows:
        shutil.copy(PHOTOS / row["file"], src / row["file"])
        (src / row["file"]).with_suffix(".txt").write_text(row["captions"][0])
    shutil.copy(PHOTOS / rows[0]["file"], src / "zz_copy.jpg")
    shutil.copy(CASES / "C38_zero/empty.jpg", src / "empty.jpg")
    shutil.copy(CASES / "C41_ext/html_redirect_page.jpg", src / "html_page.jpg")
    return src


def committed_keys(out: Path) -> list[str]:
    return sorted(read_output(str(out), ["key"]).to_table()["key"].to_pylist())


def delta_keys(uri: str) -> dict[str, list[str]]:
    """The keys each reader reads from the Delta table at ``uri`` (Ray Data: below)."""
    import daft
    import deltalake
    import polars as pl

    return {"pandas": sorted(deltalake.DeltaTable(uri).to_pandas(columns=["key"])["key"]),
            "polars": sorted(pl.read_delta(uri, columns=["key"])["key"].to_list()),
            "daft": sorted(daft.read_deltalake(uri).select("key").to_pydict()["key"])}


def table_paths(uri: str) -> list[str]:
    return sorted(pa.table(table.open_table(uri).get_add_actions()).column("path").to_pylist())


def test_readers_see_exactly_the_committed_rows_through_resume_overwrite_dedup_and_rebuild(
        tmp_path, small_input, ray_local, capsys):
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    # 1. during a run: p-000001's attempt hangs; once the other three are committed the
    #    table lists exactly them (a reader of OUT/data would see p-000001's attempt files)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline",
         *images_args(small_input, out, "--address", "local", "--executor", "processes",
                      "--set", "dedup.dataset.enabled=false")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
        env=clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1", MMPIPE_CHAOS_HANG_ON="p-000001"))
    try:
        deadline = time.monotonic() + 180
        while (table.state(str(out)) or {}).get("partitions") != 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.5)
        assert proc.poll() is None           # still running: p-000001 hangs
        want = committed_keys(out)
        assert len(want) == 11 - 3
        assert delta_keys(str(out)) == {"pandas": want, "polars": want, "daft": want}
        assert table.state(str(out))["in_step"] is True
        paths = table_paths(str(out))
        # only the markers' data files: no .tar shard (wds/ holds them), no other attempt
        assert (out / "wds").is_dir() and paths and all(
            p.startswith("data/p-") and p.endswith(".parquet") for p in paths)
        named = {f for m in CheckpointStore(str(out)).markers().values() for f in m.files
                 if f.startswith("data/")}
        assert set(paths) == named and "p-000001" not in str(paths)
    finally:
        os.kill(proc.pid, signal.SIGTERM)    # a stop (exit 143): resume later
        assert proc.wait(120) == 143, proc.stdout.read()

    # 2. the resume commits p-000001 while the table cannot be written (its log is a file):
    #    the run still succeeds, the failure is logged
    shutil.rmtree(out / "_delta_log")
    (out / "_delta_log").write_text("not a folder")
    again = run_images(small_input, out, home, "--set", "dedup.dataset.enabled=false",
                       executor="processes")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Delta table not updated" in again.stderr
    want = committed_keys(out)
    assert len(want) == 11

    # 3. `mmpipe table` catches up from the markers alone; --rebuild gives the same rows
    (out / "_delta_log").unlink()
    synced = mmpipe_here(capsys, "table", str(out))
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "4 committed partitions, 4 published now" in synced.stdout
    assert delta_keys(str(out)) == {"pandas": want, "polars": want, "daft": want}
    d = ray_local.data.read_delta(str(out), columns=["key"])
    assert sorted(r["key"] for r in d.take_all()) == want
    rebuilt = mmpipe_here(capsys, "table", str(out), "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert delta_keys(str(out))["daft"] == want and table_paths(str(out)) == sorted(
        f for m in CheckpointStore(str(out)).markers().values() for f in m.files
        if f.startswith("data/"))
    status = mmpipe_here(capsys, "status", str(out))
    assert "4 of 4 committed partitions" in status.stdout, status.stdout + status.stderr
    # the error rows (empty.jpg, html_page.jpg) are in the quarantine table
    quarantine = table.table_uri(str(out), "quarantine")
    assert quarantine == str(out / "quarantine")
    import polars as pl

    errors = pl.read_delta(quarantine)
    assert sorted(errors["key"].to_list()) == ["empty", "html_page"]
    assert set(errors["status"].to_list()) == {"error"}

    # 4. --mode overwrite (partitions of 4, the dataset-wide pass on): readers see the new
    #    generation once it is complete, through one overwrite commit, never an empty frame
    before = table.open_table(str(out)).version()
    over = mmpipe_here(capsys, *images_args(small_input, out, "--address", "local",
                                            "--executor", "ray", "--mode", "overwrite",
                                            "--set", "source.partition_size=4"))
    assert over.returncode == 0, over.stdout + over.stderr
    new_root = out / "_generations" / "g-000002"
    assert not (out / "data").exists() and (new_root / "_SUCCESS").exists()
    assert not (out / "quarantine").exists()     # generation 1's quarantine table went with it
    want = committed_keys(out)
    assert len(want) == 11
    assert delta_keys(str(out)) == {"pandas": want, "polars": want, "daft": want}
    assert all(p.startswith("_generations/g-000002/data/p-") for p in table_paths(str(out)))
    dt = table.open_table(str(out))
    writes = [h for h in dt.history(dt.version() - before)
              if h.get("operationParameters", {}).get("mode") == "Overwrite"]
    assert len(writes) == 1 and writes[0]["mmpipe"].startswith("overwrite generation 2")
    assert table.table_uri(str(out), "quarantine") == str(new_root / "quarantine")
    assert sorted(pl.read_delta(str(new_root / "quarantine"))["key"].to_list()) == [
        "empty", "html_page"]

    # 5. the dedup pass (run by the job: dedup.dataset) found zz_copy; the documented
    #    anti-join drops it, as read_output(deduplicated=True) does
    dups = pl.read_delta(table.table_uri(str(out), "duplicates"))
    assert dups["key"].to_list() == ["zz_copy"]
    view = pl.read_delta(str(out)).filter(pl.col("status") == "ok").join(
        dups, on=["partition_id", "key"], how="anti")
    mmpipe_view = read_output(str(out), ["key"], deduplicated=True).to_table()
    assert sorted(view["key"].to_list()) == sorted(mmpipe_view["key"].to_pylist())
    assert "zz_copy" not in view["key"].to_list() and view.height == 11 - 2 - 1

    # 6. gc keeps the tables (mmpipe's own names, no generation's garbage)
    gc = mmpipe_here(capsys, "gc", str(out), "--lease-margin-s", "0")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert table.state(str(out))["in_step"] is True and delta_keys(str(out))["pandas"] == want


def test_the_table_works_on_s3_with_conditional_puts(s3_env, tmp_path):
    from pipeline.storage import s3

    out = f"s3://{s3_env}/out"
    home = tmp_path / "home"
    home.mkdir()
    run = mmpipe("run", "examples/quickstart.yaml", "--output", out, *NO_MODEL,
                 "--executor", "processes", home=home)
    assert run.returncode == 0, run.stdout + run.stderr
    options = s3.delta_options()
    assert options["conditional_put"] == "etag" and options["AWS_ALLOW_HTTP"] == "true"
    import deltalake
    import polars as pl

    want = committed_keys(out)
    assert len(want) == 57
    assert sorted(deltalake.DeltaTable(out, storage_options=options).to_pandas(
        columns=["key"])["key"]) == want
    assert sorted(pl.read_delta(out, storage_options=options)["key"].to_list()) == want
    assert table.state(out)["in_step"] is True
    # a run that starts reconciles first: a table lost after the markers (a driver killed
    # between them) is written again, though nothing is left to run
    from pipeline.storage import fs

    fs.delete_tree(f"{out}/_delta_log")
    assert table.open_table(out) is None
    again = mmpipe("run", "examples/quickstart.yaml", "--output", out, *NO_MODEL,
                   "--executor", "processes", home=home)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 skipped (already committed)" in again.stdout
    assert table.state(out)["partitions"] == 4
    assert pl.read_delta(out, storage_options=options).height == 57
