"""SIGKILL the driver mid-job, run again: only uncommitted partitions run, output equals a clean run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.io.checkpoint import CheckpointStore, committed_files
from tests.conftest import REPO

PARTITIONS = 19  # 57 photos / partition_size 3


def mmpipe(out: Path, home: Path, report: Path | None = None, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--output", str(out), "--set", "source.partition_size=3",
           "--set", "runtime.num_workers=1", "--set", "runtime.batch_size=3"]
    if report:
        cmd += ["--report-json", str(report)]
    env = dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)                # a fresh local Ray, as a new user gets it
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, **popen)


def finish(proc: subprocess.Popen, timeout_s: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return out


def markers(out: Path) -> dict[str, str]:
    return {p: m["attempt_id"] for p, m in CheckpointStore(str(out)).markers().items()}


def rows_by_key(out: Path) -> dict[str, dict]:
    table = pq.ParquetDataset(committed_files(str(out))).read()
    return {r["key"]: r for r in table.to_pylist()}


def test_killed_driver_resumes_only_uncommitted_partitions(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "killed"
    proc = mmpipe(out, home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = out / "_checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and len(list(ckpt.glob("p-*.json"))) < 3:
        assert proc.poll() is None, "the job ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)          # the driver only, mid-job
    proc.wait()
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)        # then the local Ray it started
    time.sleep(1)
    before = markers(out)
    assert 3 <= len(before) < PARTITIONS, f"{len(before)} partitions committed before the kill"
    assert not (out / "_SUCCESS").exists()

    report_path = tmp_path / "report.json"
    finish(mmpipe(out, home, report_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    report = json.loads(report_path.read_text())
    assert sorted(report["partitions_skipped"]) == sorted(before)
    assert len(report["partitions_committed"]) == PARTITIONS - len(before)
    assert not set(report["partitions_committed"]) & set(before)
    after = markers(out)
    assert len(after) == PARTITIONS
    assert {p: after[p] for p in before} == before       # committed work was not redone
    assert json.loads((out / "_SUCCESS").read_text())["complete"] is True

    clean = tmp_path / "clean"
    finish(mmpipe(clean, home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    got, want = rows_by_key(out), rows_by_key(clean)
    assert sorted(got) == sorted(want) and len(got) == 57
    for key, w in want.items():
        g = w and got[key]
        for col in ("status", "reject_reason", "sha256", "phash", "caption", "width", "height",
                    "image_width", "image_height", "partition_id"):
            assert g[col] == w[col], (key, col)
        np.testing.assert_allclose(g["text_embedding"], w["text_embedding"], atol=1e-5)
