"""SIGKILL the driver mid-job (a real ``mmpipe run``), run again: only uncommitted
partitions run, and the output equals a clean run's - on the local filesystem and on S3
(markers alone).

Locally the killed run and the rerun are ``mmpipe run`` each on a fresh local Ray (the Ray
path): the rerun also stops the processes the killed run's local Ray left. On S3 both are
``mmpipe run`` with worker processes (the default executor of a job without a model stage;
no Ray: ~5 s less per run): what S3 adds is the resume from its markers, which is the same
driver code on either executor, and the leftover Ray's cleanup does not depend on the
storage (the local variant's claim). The killed run's workers may commit the partition they
had in hand after the kill: the test waits until they are gone, then reads the markers.

No text embedding (``NO_MODEL``): the claims are about the driver, its workers and the
commit markers, not the model. Both variants compare with ``clean_reference`` on the local
filesystem (one per process, run in this process on worker processes, no Ray: what a clean
run commits does not depend on its executor): the S3 variant read the same photos from S3
(``shared_photos``), so every column is the same but ``source_uri``, checked row by row
below."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.local_ray import session_processes
from pipeline.storage import fs
from tests.conftest import coco_captions
from tests.e2e.jobs import (NO_MODEL, PARTITIONS, assert_same_output, clean_reference, finish,
                            markers, mmpipe_run, rows_by_key, shared_photos,
                            wait_for_workers_gone)


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """``(output root, input uri or None, env, S3 server or None)`` for the storage under
    test."""
    if request.param == "local":
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
    executor = "processes" if server else "ray"
    with open(killed_log, "w") as log:
        proc = mmpipe_run(out, home, env, input_uri, stdout=log, stderr=subprocess.STDOUT,
                          sets=NO_MODEL, executor=executor)
    deadline = time.time() + 240
    committed = CheckpointStore(out).committed_ids   # one listing of marker names, no reads
    while time.time() < deadline and len(committed()) < 3:
        assert proc.poll() is None, "the job ended before it could be killed"
        time.sleep(0.05)
    children = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)          # the driver only, mid-job
    proc.wait()
    if server is None:
        # its PartitionWorker actor may still commit the partition in hand, then exits;
        # the local Ray it started outlives it (its agents), until the next local run
        session = str(Path(re.search(r"worker logs: (\S+)",
                                     killed_log.read_text()).group(1)).parent)
        left = wait_for_workers_gone(session)
        assert left, "kill -9 of the driver left no Ray process to clean up"
    else:
        # its worker processes may still commit the partition in hand, then exit by
        # themselves (their pipe to the driver is closed)
        assert children, "no worker process of the killed driver"
        _, alive = psutil.wait_procs(children, timeout=120)
        for p in alive:
            p.kill()
        assert not alive, [p.pid for p in alive]
    before = markers(out)
    assert 3 <= len(before) < PARTITIONS, f"{len(before)} partitions committed before the kill"
    assert not fs.exists(f"{out}/_SUCCESS")

    report_path = tmp_path / "report.json"
    try:
        rerun = finish(mmpipe_run(out, home, env, input_uri, report_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, sets=NO_MODEL,
                                  executor=executor))
    finally:
        if server is None:
            left = session_processes(session)
            for p in left:
                p.kill()
    if server is None:                         # the next local Ray stopped them
        assert not left, [p.name() for p in left]
        assert "processes of a local Ray left by a killed mmpipe run" in rerun, rerun
    else:
        assert "worker processes, no Ray" in rerun, rerun
    report = json.loads(report_path.read_text())
    assert sorted(report["partitions_skipped"]) == sorted(before)
    assert len(report["partitions_committed"]) == PARTITIONS - len(before)
    assert not set(report["partitions_committed"]) & set(before)
    after = markers(out)
    assert len(after) == PARTITIONS
    assert {p: after[p] for p in before} == before       # committed work was not redone
    assert json.loads(fs.read_bytes(f"{out}/_SUCCESS"))["complete"] is True

    # every caption of the manifest; source_uri as the input was given: relative to the
    # working directory for the quickstart's relative source.uri, else s3://
    base = input_uri.rsplit("/", 1)[0] + "/" if input_uri else "data/photos/"
    assert_same_output(out, clean_reference(tmp_path_factory, executor="processes"),
                       embeddings=False,
                       input_bases=(base, "data/photos/"))
    want = {r["key"]: r for r in coco_captions()}
    for key, row in rows_by_key(out).items():
        assert row["captions"] == want[key]["captions"] and len(row["captions"]) == 5
        assert row["source_uri"] == base + want[key]["file"]
