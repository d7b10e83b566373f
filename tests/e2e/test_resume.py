"""SIGKILL the driver mid-job, run again on a fresh Ray: the killed run's leftover local Ray
is stopped, only uncommitted partitions run, and the output equals a clean run's - on the
local filesystem and on S3 (markers alone).

No text embedding (``NO_MODEL``): the claims are about the driver, its Ray and the commit
markers, not the model; the clean run compared with is ``clean_reference`` (one per
process and storage, shared with tests/s3/test_s3_faults.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.storage import fs
from pipeline.runtime.local_ray import session_processes
from tests.conftest import coco_captions
from tests.e2e.jobs import (NO_MODEL, PARTITIONS, assert_same_output, clean_reference, finish,
                            markers, mmpipe_run, rows_by_key, shared_photos)


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """``(output root, input uri or None, env, S3 server or None)`` for the storage under
    test."""
    if request.param == "local":
        request.getfixturevalue("ray_local")      # clean_reference runs in this process
        return str(tmp_path), None, {}, None
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_env")
    return f"s3://{bucket}", shared_photos(server), server.env(), server


def test_killed_driver_resumes_only_uncommitted_partitions(storage, tmp_path, tmp_path_factory):
    root, input_uri, env, server = storage
    home = tmp_path / "home"
    home.mkdir()
    out = f"{root}/killed"
    killed_log = tmp_path / "killed.log"
    with open(killed_log, "w") as log:
        proc = mmpipe_run(out, home, env, input_uri, stdout=log, stderr=subprocess.STDOUT,
                          sets=NO_MODEL)
    deadline = time.time() + 240
    while time.time() < deadline and len(markers(out)) < 3:
        assert proc.poll() is None, "the job ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)          # the driver only, mid-job
    proc.wait()
    time.sleep(2)
    before = markers(out)
    assert 3 <= len(before) < PARTITIONS, f"{len(before)} partitions committed before the kill"
    assert not fs.exists(f"{out}/_SUCCESS")
    # the local Ray it started outlives it (its agents and workers), until the next local run
    session = str(Path(re.search(r"worker logs: (\S+)", killed_log.read_text()).group(1)).parent)
    assert session_processes(session), "kill -9 of the driver left no Ray process to clean up"

    report_path = tmp_path / "report.json"
    try:
        rerun = finish(mmpipe_run(out, home, env, input_uri, report_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, sets=NO_MODEL))
    finally:
        left = session_processes(session)
        for p in left:
            p.kill()
    assert not left, [p.name() for p in left]
    assert "processes of a local Ray left by a killed mmpipe run" in rerun, rerun
    report = json.loads(report_path.read_text())
    assert sorted(report["partitions_skipped"]) == sorted(before)
    assert len(report["partitions_committed"]) == PARTITIONS - len(before)
    assert not set(report["partitions_committed"]) & set(before)
    after = markers(out)
    assert len(after) == PARTITIONS
    assert {p: after[p] for p in before} == before       # committed work was not redone
    assert json.loads(fs.read_bytes(f"{out}/_SUCCESS"))["complete"] is True

    assert_same_output(out, clean_reference(tmp_path_factory, server), embeddings=False)
    # every caption of the manifest; source_uri as the input was given: relative to the
    # working directory for the quickstart's relative source.uri, else s3://
    base = input_uri.rsplit("/", 1)[0] + "/" if input_uri else "data/photos/"
    want = {r["key"]: r for r in coco_captions()}
    for key, row in rows_by_key(out).items():
        assert row["captions"] == want[key]["captions"] and len(row["captions"]) == 5
        assert row["source_uri"] == base + want[key]["file"]
