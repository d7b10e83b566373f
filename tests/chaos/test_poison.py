"""A poison partition whose every attempt kills its worker process: reported failed after
``max_attempts``, the rest committed, non-zero exit; a rerun retries only that partition.

No model stage (``NO_MODEL``): the claim is about partition workers dying, not embeddings.
The poisoned run is ``mmpipe run`` (its exit code is part of the claim); the rerun is the
same job in this process on the session's Ray (``ray_local``): what it runs, not the CLI."""

from __future__ import annotations

import contextlib
import json
import subprocess

from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.driver import run_job
from pipeline.spec.load import load_spec
from tests.conftest import REPO
from tests.e2e.jobs import NO_MODEL, PARTITIONS, markers, mmpipe_run


def test_poison_partition_then_rerun(ray_local, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = str(tmp_path / "out")
    report_path = tmp_path / "report.json"
    proc = mmpipe_run(out, home, {"MMPIPE_CHAOS_KILL_WORKER_ON": "p-000004"}, None, report_path,
                      sets=NO_MODEL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      text=True)
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

    # the same job again (mmpipe_run's settings), without the fault
    overrides = ["source.partition_size=3", "runtime.num_workers=1", "runtime.batch_size=3",
                 *NO_MODEL]
    with contextlib.chdir(REPO):      # the quickstart's relative source.uri, as the CLI's
        again = run_job(load_spec(REPO / "examples/quickstart.yaml", overrides, None, out))
    assert again.complete, again.format()
    assert again.partitions_committed == ["p-000004"]
    assert len(again.partitions_skipped) == PARTITIONS - 1
    after = markers(out)
    assert {p: after[p] for p in committed_before} == committed_before
    assert CheckpointStore(out).failures() == {}               # the marker supersedes it
