"""A poison partition whose every attempt kills its worker process: reported failed after
``max_attempts``, the rest committed, non-zero exit; a rerun retries only that partition."""

from __future__ import annotations

import json
import subprocess

from pipeline.output.checkpoint import CheckpointStore
from tests.e2e.jobs import PARTITIONS, markers, mmpipe_run


def test_poison_partition_then_rerun(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = str(tmp_path / "out")
    report_path = tmp_path / "report.json"
    proc = mmpipe_run(out, home, {"MMPIPE_CHAOS_KILL_WORKER_ON": "p-000004"}, None, report_path,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, log
    assert "FAILED p-000004" in log
    report = json.loads(report_path.read_text())
    assert list(report["partitions_failed"]) == ["p-000004"]
    assert len(report["attempts"]["p-000004"]) == 3           # runtime.max_attempts default
    assert len(report["partitions_committed"]) == PARTITIONS - 1
    assert "p-000004" not in markers(out)
    failure = CheckpointStore(out).failures()["p-000004"]
    assert failure["attempts"] == report["attempts"]["p-000004"]
    committed_before = markers(out)

    rerun = tmp_path / "rerun.json"
    proc = mmpipe_run(out, home, None, None, rerun, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log
    again = json.loads(rerun.read_text())
    assert again["partitions_committed"] == ["p-000004"]
    assert len(again["partitions_skipped"]) == PARTITIONS - 1
    after = markers(out)
    assert {p: after[p] for p in committed_before} == committed_before
    assert CheckpointStore(out).failures() == {}               # the marker supersedes it
