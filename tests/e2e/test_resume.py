"""SIGKILL the driver mid-job, run again on a fresh Ray: only uncommitted partitions run,
and the output equals a clean run's - on the local filesystem and on S3 (markers alone)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from pipeline.io import fs
from tests.conftest import PHOTOS, upload_dir
from tests.e2e.jobs import PARTITIONS, assert_same_output, finish, markers, mmpipe_run


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """``(output root, input uri or None, env)`` for the storage under test."""
    if request.param == "local":
        return str(tmp_path), None, {}
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_env")
    upload_dir(server.client(), bucket, "photos", PHOTOS)
    return f"s3://{bucket}", f"s3://{bucket}/photos/captions.jsonl", server.env()


def test_killed_driver_resumes_only_uncommitted_partitions(storage, tmp_path):
    root, input_uri, env = storage
    home = tmp_path / "home"
    home.mkdir()
    out = f"{root}/killed"
    proc = mmpipe_run(out, home, env, input_uri, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(markers(out)) < 3:
        assert proc.poll() is None, "the job ended before it could be killed"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)          # the driver only, mid-job
    proc.wait()
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)        # then the whole local Ray it started
    time.sleep(1)
    before = markers(out)
    assert 3 <= len(before) < PARTITIONS, f"{len(before)} partitions committed before the kill"
    assert not fs.exists(f"{out}/_SUCCESS")

    report_path = tmp_path / "report.json"
    finish(mmpipe_run(out, home, env, input_uri, report_path, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True))
    report = json.loads(report_path.read_text())
    assert sorted(report["partitions_skipped"]) == sorted(before)
    assert len(report["partitions_committed"]) == PARTITIONS - len(before)
    assert not set(report["partitions_committed"]) & set(before)
    after = markers(out)
    assert len(after) == PARTITIONS
    assert {p: after[p] for p in before} == before       # committed work was not redone
    assert json.loads(fs.read_bytes(f"{out}/_SUCCESS"))["complete"] is True

    clean = f"{root}/clean"
    finish(mmpipe_run(clean, home, env, input_uri, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True))
    assert_same_output(out, clean)
