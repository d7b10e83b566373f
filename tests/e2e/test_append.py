"""Continuous ingestion (issue 27): ``--mode append`` plans the objects added under the
input as new partitions after the stored ones and runs only them; the dataset-wide dedup
pass covers them; a planned object deleted since is one ``input_missing`` row; ``resume``
on a grown listing says how many objects are not planned. Locally (with Ray and the
dedup pass) and on S3 (SeaweedFS, worker processes).

Locally the commands run in this process on the session's Ray (``tests/inproc.py``:
the same ``cli.main``, its exit codes and what it prints, without a local Ray start and
stop per command, ~6 s each): what the test claims is the plan, the partitions run, the
reports, the markers and the dedup pass's result, none of which depends on whose Ray it
is. The S3 test runs ``mmpipe`` as a subprocess (worker processes, no Ray)."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.dedup.store import latest_duplicates
from pipeline.read import read_output
from pipeline.storage import fs
from tests.conftest import upload_dir
from tests.dedup.copies import PHOTOS
from tests.inproc import json_out
from tests.inproc import mmpipe as mmpipe_here
from tests.dedup.test_dedup_pass import mmpipe

SPEC = """\
name: append-job
source: {{kind: files, uri: {inp}, partition_size: 4}}
sink: {{uri: {out}}}
resize: {{size_px: 32}}
text_embedding: {{enabled: false}}
dedup:
  dataset: {{enabled: {dedup}, buckets: 2}}
runtime: {{batch_size: 8, num_workers: 2, max_attempts: 1, prices: {{cpu_hour: 0.05}}}}
"""


def marker_bytes(out: str, pids) -> dict[str, bytes]:
    return {p: fs.read_bytes(f"{out}/_checkpoints/{p}.json") for p in pids}


def test_append_runs_only_new_partitions_and_dedup_covers_them(tmp_path, ray_local, capsys):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    first, later = PHOTOS[:8], PHOTOS[8:12]
    for p in first:
        shutil.copyfile(p, inp / p.name)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=inp, out=out, dedup="true"))

    # p-000001 fails (its worker dies; max_attempts 1); then one of its images is deleted
    run = mmpipe_here(capsys, "run", str(spec),
                      env={"MMPIPE_CHAOS_KILL_WORKER_ON": "p-000001"})
    assert run.returncode == 1, run.stdout + run.stderr
    (inp / first[-1].name).unlink()
    run = mmpipe_here(capsys, "run", str(spec))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "input_missing=1" in run.stdout and "planned objects no longer listed: 1" in run.stdout
    assert "cost: " in run.stdout and "per million output rows" in run.stdout
    rows = {r["key"]: r for r in read_output(str(out), ["key", "status", "error"]).to_table()
            .to_pylist()}
    assert len(rows) == 8
    missing = [r for r in rows.values() if r["status"] == "error"]
    assert [r["key"] for r in missing] == [first[-1].stem]
    assert missing[0]["error"].startswith("input_missing: ")
    old = marker_bytes(str(out), ["p-000000", "p-000001"])

    # M = 5 more: 4 new photos and a byte copy of an old one
    for p in later:
        shutil.copyfile(p, inp / p.name)
    shutil.copyfile(first[0], inp / "zz-copy.jpg")
    resumed = mmpipe_here(capsys, "run", str(spec))      # resume: today's plan, a warning
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "5 objects listed under the input are not in the plan" in resumed.stdout
    assert "--mode append" in resumed.stdout
    status = mmpipe_here(capsys, "status", str(out), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    state = json_out(status.stdout)
    assert state["inputs"]["not_planned"] == 5 and state["complete"]
    assert state["cost"]["cpu_s"] == 0.0          # the resume that wrote _SUCCESS ran nothing
    assert "--mode append" in mmpipe_here(capsys, "status", str(out)).stdout

    report_path = tmp_path / "append.json"
    run = mmpipe_here(capsys, "run", str(spec), "--mode", "append", "--report-json",
                      str(report_path))
    assert run.returncode == 0, run.stdout + run.stderr
    (tmp_path / "append-report.txt").write_text(run.stdout)
    report = json.loads(report_path.read_text())
    assert sorted(report["partitions_committed"]) == ["p-000002", "p-000003"]
    assert sorted(report["partitions_skipped"]) == ["p-000000", "p-000001"]
    assert report["rows_out"] == 8 + 5 and report["rows_processed"] == 5
    assert report["inputs"]["extensions"][0]["objects"] == 5
    assert report["cost"]["stages"]["partition_workers"]["cpu_s"] > 0
    assert report["cost"]["per_million_rows"] > 0
    assert marker_bytes(str(out), ["p-000000", "p-000001"]) == old
    ext = json.loads((out / "_plan" / "extension-0001.json").read_text())
    assert (ext["partition_ids"], ext["objects"]) == (["p-000002", "p-000003"], 5)
    assert len(read_output(str(out), ["key"]).to_table()) == 13
    state = json_out(mmpipe_here(capsys, "status", str(out), "--json").stdout)
    assert state["inputs"]["not_planned"] == 0 and state["inputs"]["extensions"][0]["objects"] == 5
    assert state["cost"] == report["cost"]

    done = mmpipe_here(capsys, "dedup", str(out), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json_out(done.stdout)["complete"]
    dups = {r["key"]: r["duplicate_of"] for r in latest_duplicates(str(out)).to_pylist()}
    assert dups == {"zz-copy": first[0].stem}

    again = mmpipe_here(capsys, "run", str(spec), "--mode", "append")   # nothing new runs
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 committed now" in again.stdout and "plan extension 2" not in again.stdout


@pytest.mark.parametrize("count", [4])
def test_append_on_s3(tmp_path, s3_server, s3_env, count):
    client = s3_server.client()
    src, more = tmp_path / "src", tmp_path / "more"
    src.mkdir(), more.mkdir()
    for p in PHOTOS[:count]:
        shutil.copyfile(p, src / p.name)
    for p in PHOTOS[count:count + 3]:
        shutil.copyfile(p, more / p.name)
    upload_dir(client, s3_env, "in", src)
    out = f"s3://{s3_env}/out"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=f"s3://{s3_env}/in", out=out, dedup="false"))
    home, env = tmp_path / "home", s3_server.env()
    run = mmpipe(home, "run", str(spec), env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    old = marker_bytes(out, ["p-000000"])
    upload_dir(client, s3_env, "in", more)
    client.delete_object(Bucket=s3_env, Key=f"in/{PHOTOS[0].name}")  # committed: untouched
    report_path = tmp_path / "append.json"
    run = mmpipe(home, "run", str(spec), "--mode", "append", "--report-json",
                 str(report_path), env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_path.read_text())
    assert report["partitions_committed"] == ["p-000001"]
    assert report["rows_out"] == count + 3 and report["inputs"]["missing"] == 1
    assert marker_bytes(out, ["p-000000"]) == old
    assert fs.exists(f"{out}/_plan/extension-0001.json")
    assert len(read_output(out, ["key"]).to_table()) == count + 3
