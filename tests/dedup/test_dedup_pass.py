"""The dataset-wide dedup pass as users run it: ``mmpipe run`` with ``dedup.dataset.enabled``
(the pass follows the main pass) and ``mmpipe dedup OUTPUT``, over copies of the bundled
photos spread across partitions. The commands run in this process on the session's Ray
(``tests/inproc.py``: the same ``cli.main``, exit codes and output, without a Ray
start and stop of their own per command), even the one that must exit before any Ray
starts (``local_ray.start`` fails that test if called). ``mmpipe`` below, a real
subprocess, is for other files' tests (tests/e2e/test_append.py, test_frame_dedup.py).

``SPEC`` runs one partition worker and one dedup actor (each a Ray worker process, ~1-2
CPU-s to start): what these tests claim is the pass's result, resumption and replay, not
how many actors did the work; the exact pass's test runs the same output from scratch on
1 and on 3 actors (in reverse task order), which must give the same table."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dedup.groups import PAIRS_SCHEMA
from pipeline.dedup.store import DedupStore, latest_duplicates
from pipeline.read import read_output
from pipeline.runtime import local_ray
from tests.conftest import REPO
from tests.dedup.copies import PHOTOS, SOME, byte_copies, near_copies, stem
from tests.inproc import command, json_out
from tests.inproc import mmpipe as mmpipe_here
from tests.e2e.jobs import clean_ray_env

SPEC = """\
name: dedup-copies
source: {{kind: files, uri: {inp}, partition_size: 32}}
sink: {{uri: {out}}}
resize: {{size_px: 32}}
text_embedding: {{enabled: false}}
dedup:
  dataset: {{enabled: true, buckets: 4, workers: 1}}
runtime: {{batch_size: 16, num_workers: 1, max_attempts: 1}}
"""


def mmpipe(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``mmpipe ARGS`` as a user runs it (its own local Ray, HOME isolated)."""
    home.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=600,
                          env=clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1", **(env or {})))


def task_attempts(out: Path, generation: int) -> dict[str, str]:
    return {t: m.attempt_id for t, m in DedupStore(str(out)).markers(generation).items()}


def as_map(table: pa.Table) -> dict[str, tuple]:
    return {r["key"]: (r["duplicate_of"], r["kind"], r["hamming"]) for r in table.to_pylist()}


def test_exact_dedup_across_partitions_is_incremental_and_independent_of_workers(
        tmp_path, ray_local, capsys):
    inp = byte_copies(tmp_path / "in", photos=SOME)       # 192 files, 12 partitions of 16
    out = tmp_path / "out"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=inp, out=out).replace("partition_size: 32",
                                                          "partition_size: 16"))

    # partition 3 fails (its worker dies): the job is incomplete, so no dedup pass yet
    run = mmpipe_here(capsys, "run", str(spec),
                      env={"MMPIPE_CHAOS_KILL_WORKER_ON": "p-000003"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert not (out / "_dedup").exists()
    done = mmpipe_here(capsys, "dedup", str(out), "--json")   # generation 1: 11 partitions
    assert done.returncode == 0, done.stdout + done.stderr
    gen1 = json_out(done.stdout)
    assert (gen1["generation"], gen1["partitions"], gen1["complete"]) == (1, 11, True)
    first = task_attempts(out, 1)

    # the rerun commits partition 3, then dedups it against what is indexed: generation 2
    run = mmpipe_here(capsys, "run", str(spec))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "dedup" in run.stdout and "generation 2, 12 partitions (1 new)" in run.stdout
    assert task_attempts(out, 1) == first                  # generation 1 was not redone
    store = DedupStore(str(out))
    gen2_pairs = store.read_tables([f for t, m in store.markers(2).items() if "-b-" in t
                                    for f in m.files], PAIRS_SCHEMA)
    assert gen2_pairs.num_rows > 0
    assert all("p-000003" in (a, b) for a, b in zip(gen2_pairs["a_partition_id"].to_pylist(),
                                                     gen2_pairs["b_partition_id"].to_pylist()))

    # 12 byte copies of 16 photos: 176 duplicates of the first copy (c00), 16 survivors
    dups = latest_duplicates(str(out))
    assert dups.num_rows == 192 - 16
    assert all(d == f"c00-{stem(k)}" and kind == "exact" and ham == 0
               for k, (d, kind, ham) in as_map(dups).items())
    view = read_output(str(out), ["key"], deduplicated=True).to_table()
    assert sorted(view["key"].to_pylist()) == sorted(f"c00-{p.stem}" for p in SOME)

    # from scratch, 1 worker in plan order and 3 workers in reverse: the same table
    from pipeline.runtime.dedup_pass import run_dedup
    from pipeline.spec import DatasetDedupSpec

    for workers, order in ((1, "plan"), (3, "reversed")):
        again = tmp_path / f"out-{workers}"
        shutil.copytree(out, again, ignore=shutil.ignore_patterns("_dedup"))
        report = run_dedup(str(again), DatasetDedupSpec(enabled=True, workers=workers),
                           task_order=order)
        assert report.complete and report.generation == 1
        assert latest_duplicates(str(again)).equals(dups)


def test_near_and_semantic_dedup_and_a_killed_pass_replays_only_its_bucket(
        tmp_path, ray_local, capsys):
    from pipeline.testing.tiny_models import build_tiny_models

    clip = build_tiny_models(tmp_path / "models", ("tiny-clip",))["tiny-clip"]
    # 112 files, 7 partitions of 16: each variant in a partition of its own (copies in one
    # partition are the in-partition dedup's, not this pass's)
    inp = near_copies(tmp_path / "in", photos=SOME)
    out = tmp_path / "out"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=inp, out=out).replace(
        "partition_size: 32", "partition_size: 16") + f"""\
image_embedding: {{enabled: true, model: {clip}, score: false}}
""")
    sets = ["--set", "dedup.dataset.semantic=true", "--set", "dedup.dataset.semantic_clusters=4",
            "--set", "dedup.dataset.semantic_threshold=0.9995"]
    # the pass after the main pass: every attempt of one near bucket's task is killed
    run = mmpipe_here(capsys, "run", str(spec), *sets,
                      env={"MMPIPE_CHAOS_KILL_WORKER_ON": "near-b-0002"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAILED near-b-0002" in run.stdout and "incomplete" in run.stdout, run.stdout
    store = DedupStore(str(out))
    before = task_attempts(out, 1)
    assert "near-b-0002" not in before and "duplicates" not in before
    assert {"exact-b-0000", "near-b-0000", "semantic-files"} <= set(before)
    assert store.marker(None, "centroids") is not None

    rerun = mmpipe_here(capsys, "dedup", str(out), "--json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    report = json_out(rerun.stdout)
    assert report["tasks_run"] == ["near-b-0002"] and report["complete"]
    after = task_attempts(out, 1)
    assert {t: after[t] for t in before} == before           # nothing else was redone

    dups = as_map(latest_duplicates(str(out)))
    # every byte copy and JPEG re-encode is grouped with its own original (c00), and
    # nothing groups two different photos
    for prefix in ("c01", "q60", "q75", "q90"):
        for p in SOME:
            assert dups[f"{prefix}-{p.stem}"][0] == f"c00-{p.stem}", prefix
    assert all(stem(k) == stem(d) for k, (d, _, _) in dups.items())
    kinds = Counter(kind for _, kind, _ in dups.values())
    assert kinds["exact"] == len(SOME) and kinds["near"] >= 3 * len(SOME)
    crops = Counter(k[:3] for k in dups if k[0] == "k")
    print("crops grouped:", dict(crops))                     # pHash moves with the crop

    # semantic pairs: identical embeddings (byte copies) pair at cosine 1 in their cluster
    files = [f for t, m in store.markers(1).items() if t.startswith("semantic-b-")
             for f in m.files]
    sem = store.read_tables(files, PAIRS_SCHEMA).to_pylist()
    assert {(r["a_key"], r["b_key"]) for r in sem if r["similarity"] >= 0.99999} >= \
        {(f"c00-{p.stem}", f"c01-{p.stem}") for p in SOME}
    assert all(stem(r["a_key"]) == stem(r["b_key"]) for r in sem)

    # gc removes a lost attempt's pairs file and nothing any marker names
    stray = out / "_dedup/pairs/near/b-0002/g-000001.a-00000000dead.parquet"
    stray.write_bytes(b"PAR1 lost attempt")
    before_gc = latest_duplicates(str(out))
    gc = mmpipe_here(capsys, "gc", str(out), "--min-age-s", "0")
    assert gc.returncode == 0 and f"delete {stray}" in gc.stdout, gc.stdout + gc.stderr
    assert "1 unreferenced files deleted" in gc.stdout and not stray.exists()
    assert latest_duplicates(str(out)).equals(before_gc)

    # status and export see the result
    status = mmpipe_here(capsys, "status", str(out), "--json")
    assert json_out(status.stdout)["dedup"]["duplicates"] == len(dups)
    exported = mmpipe_here(capsys, "export", str(out), str(tmp_path / "export"),
                           "--deduplicated")
    assert exported.returncode == 0, exported.stderr
    table = pq.read_table(tmp_path / "export")
    assert table.num_rows == 7 * len(SOME) - len(dups) == len(set(table["key"].to_pylist()))
    assert set(table["status"].to_pylist()) == {"ok"}


def test_dedup_of_an_output_without_an_index_fails_naming_the_setting(
        tmp_path, ray_local, capsys, monkeypatch):
    """``mmpipe dedup`` exits 2 naming the setting, before any Ray starts: it runs in this
    process (``cli.main``, whose return is the process's exit code, ``pipeline/__main__``)
    with ``local_ray.start`` failing the test if called; an exception it let through (a
    shell's traceback) would fail it too."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    for p in PHOTOS[:3]:
        shutil.copyfile(p, inp / p.name)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=inp, out=out).replace("enabled: true, ", ""))
    run = mmpipe_here(capsys, "run", str(spec))
    assert run.returncode == 0, run.stderr

    def no_ray(*args, **kwargs):
        raise AssertionError("mmpipe dedup started Ray")

    monkeypatch.setattr(local_ray, "start", no_ray)
    done = command(capsys, "dedup", str(out))              # exits before any Ray starts
    assert done.returncode == 2, done.stdout + done.stderr
    assert "dedup.dataset.enabled" in done.stderr and "Traceback" not in done.stderr
    assert not (out / "_dedup").exists()


def test_dedup_pass_on_s3(s3_server, s3_env, tmp_path, ray_local, capsys):
    """Index files, bucket tasks, markers and the duplicates table through a real S3 API."""
    from tests.conftest import upload_dir

    local = tmp_path / "copies"
    local.mkdir()
    for c in range(3):
        for p in PHOTOS[:4]:
            shutil.copyfile(p, local / f"c{c:02d}-{p.stem}.jpg")
    upload_dir(s3_server.client(), s3_env, "in", local)
    out = f"s3://{s3_env}/out"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=f"s3://{s3_env}/in", out=out).replace("partition_size: 32", "partition_size: 3"))
    # the actors get the S3 credentials as a subprocess's would: in their environment
    run = mmpipe_here(capsys, "run", str(spec), env=s3_server.env())
    assert run.returncode == 0, run.stdout + run.stderr
    assert "duplicates: 8 (exact 8)" in run.stdout, run.stdout
    dups = as_map(latest_duplicates(out))
    assert dups == {f"c{c:02d}-{p.stem}": (f"c00-{p.stem}", "exact", 0)
                    for c in (1, 2) for p in PHOTOS[:4]}
    assert read_output(out, ["key"], deduplicated=True).count_rows() == 4
