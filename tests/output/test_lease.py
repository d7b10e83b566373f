"""Leases, gc by liveness and commit verification, without Ray, on the local filesystem
and on a real S3 API (SeaweedFS on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline import cli
from pipeline.assembly import assemble
from pipeline.errors import CommitError
from pipeline.storage import fs
from pipeline.output import gc, job_lease, lease
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore, verify_files
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    """An output root on the storage under test."""
    if request.param == "local":
        return str(tmp_path / "out")
    return f"s3://{request.getfixturevalue('s3_env')}/out"


def test_job_lease_one_holder_named_then_free_after_release_or_expiry(root):
    first = job_lease.JobLease.acquire(root, lease_s=2.0, renew_s=0.5, run_id="run-a",
                                   fingerprint="fp-a", job="a")
    try:
        for fp in ("fp-b", "fp-a"):       # another spec, or a resume of the same one
            with pytest.raises(job_lease.OutputBusy) as e:
                job_lease.JobLease.acquire(root, 2.0, 0.5, "run-b", fp)
            msg = str(e.value)
            assert f"host {socket.gethostname()}" in msg and f"pid {os.getpid()}" in msg
            assert "run run-a" in msg and "started 20" in msg and "fingerprint fp-a" in msg
        time.sleep(2.5)                   # renewed in the background: still held
        assert first.held() and not first.lost.is_set()
        job_lease.check_job_lease(root, "run-a", "fp-a")
        with pytest.raises(CommitError, match="does not hold the job lease"):
            job_lease.check_job_lease(root, "run-b", "fp-a")
        with pytest.raises(CommitError, match="fingerprint fp-a"):
            job_lease.check_job_lease(root, "run-a", "fp-b")
    finally:
        first.release()
    second = job_lease.JobLease.acquire(root, 2.0, 0.5, "run-b", "fp-b")
    second.release()
    with pytest.raises(CommitError, match="released"):
        job_lease.check_job_lease(root, "run-b", "fp-b")


def test_a_dead_holder_frees_the_output_at_once_here_and_after_expiry_elsewhere(root):
    # a driver on this host killed with SIGKILL: its pid no longer runs
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = lease.holder_record("job", 3600.0, run_id="dead").model_copy(
        update={"pid": proc.pid, "pid_started_at": lease._process_started_at(proc.pid)})
    proc.kill()
    proc.wait()
    fs.create_exclusive(fs.join(fs.normalize(root), "_job/lease-000001.json"), dead.to_json())
    taken = job_lease.JobLease.acquire(root, 60.0, 10.0, "run-new")
    assert taken.number == 2
    # a driver on another host: live until its lease expires
    other = taken.record.model_copy(update={"host": "elsewhere", "run_id": "far",
                                            "expires_at": time.time() + 1.5})
    taken._renewer.stop()
    lease.put_atomic(taken.uri, other.to_json())
    with pytest.raises(job_lease.OutputBusy, match="host elsewhere"):
        job_lease.JobLease.acquire(root, 60.0, 10.0, "run-3")
    time.sleep(2.7)    # expired by the storage's clock (S3 Last-Modified: whole seconds)
    job_lease.JobLease.acquire(root, 60.0, 10.0, "run-3").release()
    # the taken-over run notices at its next renewal and stops committing
    taken.renew()
    assert taken.lost.is_set()


def _one_attempt(root: str, src, lease_s: float = 60.0, renew_s: float = 10.0):
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(src), "partition_size": 10},
        "sink": {"uri": root}, "text_embedding": {"enabled": False},
        "runtime": {"lease_s": lease_s, "lease_renew_s": renew_s}})
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    plan, _ = planning.load_or_create(root, spec.source, pipeline.datasource.list_inputs)
    part = planning.read_partition(root, plan.partition_ids[0])
    return pipeline, part, pool


def test_gc_spares_live_attempts_and_marked_files_deletes_expired(root, mixed_input):
    pipeline, part, pool = _one_attempt(root, mixed_input)
    done = run_partition(pipeline, part, "aaaa", pool)
    assert done.committed
    assert lease.attempt_leases(root) == {}              # released after the commit
    out = fs.normalize(root)
    running = f"{out}/data/{part.partition_id}/a-live/part-00000.parquet"
    crashed = f"{out}/quarantine/{part.partition_id}/a-gone/part-00000.parquet"
    index = f"{out}/_index/exact/b-0001/{part.partition_id}.a-gone.parquet"
    live = lease.AttemptLease(root, part.partition_id, "live", 2.0, 0.5).start()
    expired = lease.AttemptLease(root, part.partition_id, "gone", 0.5, 0.2).start()
    expired._renewer.stop()                              # a worker that died
    for uri in (running, crashed, index):
        fs.write_bytes(uri, b"partial")
    try:
        time.sleep(1.2)
        found = gc.collect(root, margin_s=0.5)
        assert sorted(found.garbage) == sorted([crashed, index])
        assert found.live == [running]
        assert found.stale_leases == [fs.join(out, "_leases", f"{part.partition_id}.gone.json")]
        assert cli.main(["gc", root, "--lease-margin-s", "0.5"]) == 0
        assert fs.exists(running) and not fs.exists(crashed) and not fs.exists(index)
        assert set(lease.attempt_leases(root)) == {(part.partition_id, "live")}
        for rel in done.marker.files:                   # never a file a marker names
            assert fs.exists(fs.join(out, rel)), rel
        verify_files(root, done.marker)
    finally:
        live.release()


def test_gc_refuses_a_location_that_is_not_an_output(tmp_path, capsys):
    folder = tmp_path / "photos"
    (folder / "data" / "p-000000" / "a-x").mkdir(parents=True)
    (folder / "cat.jpg").write_bytes(b"\xff\xd8 not really")
    (folder / "list.csv").write_text("path,caption\ncat.jpg,a cat\n")
    (folder / "data" / "p-000000" / "a-x" / "part-00000.parquet").write_bytes(b"mine")
    before = sorted(p for p in folder.rglob("*"))
    assert cli.main(["gc", str(folder)]) == 2
    assert "is not an mmpipe output" in capsys.readouterr().err
    assert sorted(p for p in folder.rglob("*")) == before


def test_commit_refuses_a_deleted_or_changed_file(root, mixed_input):
    pipeline, part, pool = _one_attempt(root, mixed_input)
    done = run_partition(pipeline, part, "aaaa", pool)
    verify_files(root, done.marker)
    data = [f for f in done.marker.files if f.startswith("data/")][0]
    uri = fs.join(fs.normalize(root), data)
    blob = fs.read_bytes(uri)
    fs.write_bytes(uri, blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(CommitError, match="sha256"):
        verify_files(root, done.marker)
    fs.delete_file(uri)
    with pytest.raises(CommitError, match="is gone before the commit"):
        verify_files(root, done.marker)


def test_an_attempt_whose_files_vanish_before_commit_fails_and_writes_no_marker(
        root, mixed_input, monkeypatch):
    """gc (or anyone) deletes a file between the write and the commit: no marker names it,
    the attempt raises (the driver retries it) and its other files are gone."""
    from pipeline.output import checkpoint

    pipeline, part, pool = _one_attempt(root, mixed_input)
    real = checkpoint.verify_files

    def delete_then_verify(r, marker, *a):
        fs.delete_file(fs.join(fs.normalize(r), marker.files[0]))
        return real(r, marker, *a)
    monkeypatch.setattr("pipeline.runtime.partition.verify_files", delete_then_verify)
    with pytest.raises(CommitError, match="gone before the commit"):
        run_partition(pipeline, part, "aaaa", pool)
    assert CheckpointStore(root).marker(part.partition_id) is None
    assert list(fs.list_files(fs.join(fs.normalize(root), "data"))) == []
    assert lease.attempt_leases(root) == {}


def test_an_attempt_whose_lease_ran_out_does_not_commit(root, mixed_input, monkeypatch):
    pipeline, part, pool = _one_attempt(root, mixed_input, lease_s=1.0, renew_s=0.5)

    def stalled(self):            # renewals that never reach the store
        raise OSError("store unreachable")
    monkeypatch.setattr(lease.AttemptLease, "renew", stalled)
    real = __import__("pipeline.runtime.partition", fromlist=["x"]).verify_files

    def slow_verify(*a):
        time.sleep(1.0)
        return real(*a)
    monkeypatch.setattr("pipeline.runtime.partition.verify_files", slow_verify)
    with pytest.raises(CommitError, match="lease has"):
        run_partition(pipeline, part, "aaaa", pool)
    assert CheckpointStore(root).marker(part.partition_id) is None


def test_lease_files_are_json_naming_the_attempt(root):
    att = lease.AttemptLease(root, "p-000003", "abcd", 30.0, 10.0, run_id="r1").start()
    try:
        uri = fs.join(fs.normalize(root), "_leases", "p-000003.abcd.json")
        rec = json.loads(fs.read_bytes(uri))
        assert (rec["kind"], rec["partition_id"], rec["attempt_id"], rec["run_id"]) == (
            "attempt", "p-000003", "abcd", "r1")
        assert rec["expires_at"] > time.time() + 20
    finally:
        att.release()
    assert not fs.exists(uri)


def test_a_run_that_does_not_hold_the_job_lease_cannot_commit(root, mixed_input):
    """How the second job of the finding adopted the first one's output: its workers
    committed beside the first job's. A worker now commits only for the lease holder."""
    pipeline, part, pool = _one_attempt(root, mixed_input)
    holder = job_lease.JobLease.acquire(root, 60.0, 10.0, "holder", pipeline.fingerprint)
    try:
        with pytest.raises(CommitError, match="run intruder does not hold the job lease"):
            run_partition(pipeline, part, "aaaa", pool, ran_on={"run_id": "intruder"})
        assert CheckpointStore(root).marker(part.partition_id) is None
        assert run_partition(pipeline, part, "bbbb", pool, ran_on={"run_id": "holder"}).committed
    finally:
        holder.release()
