"""Leases judged by the storage's clock, not the host's (finding 17c): a host whose clock
runs ahead is simulated by a subprocess with ``time.time`` moved (``skewed_host``); the
storage's clock (file mtimes, S3 Last-Modified) stays real. Local filesystem and a real S3
API (SeaweedFS on 127.0.0.1); no Ray."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from pipeline.output import gc, job_lease, lease
from pipeline.output.lease import LeaseRecord
from pipeline.storage import fs
from tests.conftest import REPO


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    return f"s3://{request.getfixturevalue('s3_env')}/out"


def skewed(skew_s: float, *args: str) -> subprocess.CompletedProcess:
    """Run ``tests.output.skewed_host`` with this process's environment (the S3 endpoint
    of ``s3_env`` included)."""
    return subprocess.run([sys.executable, "-m", "tests.output.skewed_host", str(skew_s),
                           *args], cwd=REPO, env=dict(os.environ), capture_output=True,
                          text=True, timeout=120, check=False)


def skewed_together(*calls: tuple) -> list[subprocess.CompletedProcess]:
    """``skewed(*call)`` for every call, the subprocesses running at the same time (each
    takes ~1 s to import; none of these calls changes what the others see)."""
    procs = [(call, subprocess.Popen(
        [sys.executable, "-m", "tests.output.skewed_host", str(call[0]), *call[1:]], cwd=REPO,
        env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for call in calls]
    done = []
    for call, proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_lease_lasts_from_when_the_storage_stored_it():
    rec = LeaseRecord(kind="attempt", renewed_at=5000.0, expires_at=5010.0, stored_at=100.0)
    assert rec.duration_s() == 10.0
    assert not rec.expired_by(109.0) and rec.expired_by(110.5)
    assert not rec.expired_by(110.5, margin_s=1.0)
    assert rec.model_copy(update={"released": True}).expired_by(0.0)
    assert "stored_at" not in json.loads(rec.to_json())        # never written to the file


def test_the_storage_clock_is_measured_and_a_skewed_host_refused(root, monkeypatch):
    clock = lease.StorageClock.measure(fs.join(fs.normalize(root), "_job"), max_skew_s=5.0)
    assert abs(clock.offset_s) < 2.0 and abs(clock.now() - time.time()) < 2.0
    assert list(fs.list_files(fs.join(fs.normalize(root), "_job"))) == []   # probe deleted
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 300)
    clock = lease.StorageClock.measure(fs.join(fs.normalize(root), "_job"))
    assert -302 < clock.offset_s < -298 and abs(clock.now() - real()) < 2.0
    with pytest.raises(lease.ClockSkewError, match=r"30[01] s ahead of the storage's"):
        lease.StorageClock.measure(fs.join(fs.normalize(root), "_job"), max_skew_s=30.0)


def test_a_driver_whose_clock_runs_ahead_cannot_take_over_a_live_job(root):
    """The finding: a driver 300 s ahead took over a live job's output. Now it is refused
    for its clock; one 20 s ahead (within the allowed skew) sees the live lease as live."""
    holder = job_lease.JobLease.acquire(root, lease_s=10.0, renew_s=1.0, run_id="live-run",
                                        fingerprint="fp-live")
    try:
        ahead, near = map(_json, skewed_together((300, "acquire", root), (20, "acquire", root)))
        assert ahead["refused"] == "ClockSkewError", ahead
        assert re.search(r"30[01] s ahead of the storage's", ahead["message"])
        assert near["refused"] == "OutputBusy" and "run live-run" in near["message"], near
        assert job_lease.current_job_lease(root)[0] == holder.number == 1
        time.sleep(1.5)                                  # renewed since: still ours
        assert holder.held() and not holder.lost.is_set()
        job_lease.check_job_lease(root, "live-run", "fp-live")
    finally:
        holder.release()
    assert _json(skewed(20, "acquire", root)) == {"taken": 2}     # free: taken
    assert _json(skewed(-300, "acquire", root))["refused"] == "ClockSkewError"


def _attempt_files(root: str):
    out = fs.normalize(root)
    running = f"{out}/data/p-000000/a-live/part-00000.parquet"
    crashed = f"{out}/quarantine/p-000000/a-gone/part-00000.parquet"
    fs.write_bytes(f"{out}/_checkpoints/p-000009.json.tmp-0", b"")   # an output: gc runs
    live = lease.AttemptLease(root, "p-000000", "live", 2.0, 0.5).start()
    gone = lease.AttemptLease(root, "p-000000", "gone", 0.5, 0.2).start()
    gone._renewer.stop()                                # a worker that died
    for uri in (running, crashed):
        fs.write_bytes(uri, b"partial")
    return live, running, crashed


@pytest.mark.parametrize("skew_s", [120, -120])
def test_gc_on_a_host_whose_clock_is_off_judges_leases_by_the_storage(root, skew_s):
    """The finding: a gc host 120 s ahead deleted the files of every running attempt. By
    the storage's clock: 120 s ahead keeps the live attempt's files, 120 s behind still
    deletes the dead attempt's."""
    live, running, crashed = _attempt_files(root)
    try:
        time.sleep(1.2)                                 # the dead one expired 0.7 s ago
        proc = skewed(skew_s, "cli", "gc", root, "--lease-margin-s", "0.5")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"delete {crashed}" in proc.stdout and running not in proc.stdout, proc.stdout
        assert fs.exists(running) and not fs.exists(crashed)
        assert set(lease.attempt_leases(root)) == {("p-000000", "live")}
        found = gc.collect(root, margin_s=0.5)          # this host agrees
        assert found.live == [running] and found.garbage == []
    finally:
        live.release()
