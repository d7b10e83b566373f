"""A hung attempt is cancelled after ``runtime.attempt_timeout_s``: its worker is killed
and replaced, the partition retried up to ``max_attempts``, then reported failed, while
the other partitions commit (issue 12: there was no per-attempt timeout at all).

The job has no model stage, so ``--executor auto`` (the default) runs it in worker
processes of the driver (issue 32): this test also holds the claim that a hung attempt
there is cancelled (it was ``test_process_executor``'s own run before)."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.output.checkpoint import CheckpointStore
from tests.conftest import REPO
from tests.e2e.jobs import check_accounting, clean_ray_env, markers

HUNG = "p-000001"
# seconds: a normal 19-record partition here takes about 2 s on a loaded 2-core machine
# (10: room for a slower one under pytest-xdist);
# the hung one is cancelled twice (max_attempts), so the test lasts about 2 x this longer
TIMEOUT_S = 10


def test_hung_partition_is_cancelled_retried_and_reported(tmp_path):
    out, report_path = str(tmp_path / "out"), tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", "local", "--output", out, "--report-json", str(report_path),
           "--set", "source.partition_size=19", "--set", "text_embedding.enabled=false",
           "--set", "runtime.num_workers=2", "--set", "runtime.max_attempts=2",
           "--set", f"runtime.attempt_timeout_s={TIMEOUT_S}"]
    env = clean_ray_env(HOME=str(tmp_path), HF_HUB_OFFLINE="1", MMPIPE_CHAOS_HANG_ON=HUNG)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
                          start_new_session=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log
    assert "(worker processes, no Ray)" in proc.stderr, log
    assert f"ran longer than runtime.attempt_timeout_s={TIMEOUT_S} s" in proc.stderr, log
    report = json.loads(report_path.read_text())
    assert list(report["partitions_failed"]) == [HUNG]
    assert f"runtime.attempt_timeout_s={TIMEOUT_S}" in report["partitions_failed"][HUNG]
    assert len(report["attempts"][HUNG]) == 2                       # max_attempts
    assert sorted(report["partitions_committed"]) == ["p-000000", "p-000002"]
    assert HUNG not in markers(out)
    assert sorted(CheckpointStore(out).markers()) == ["p-000000", "p-000002"]
    assert CheckpointStore(out).failures()[HUNG]["attempts"] == report["attempts"][HUNG]
    check_accounting(out)
