"""Helpers to run ``mmpipe run`` as a user does: a subprocess with its own fresh local Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.io import fs
from pipeline.io.checkpoint import CheckpointStore, committed_files
from tests.conftest import REPO

PARTITIONS = 19  # 57 photos / partition_size 3


def mmpipe_run(out: str, home: Path, extra_env: dict | None = None, input_uri: str | None = None,
               report: Path | None = None, **popen) -> subprocess.Popen:
    """Start the quickstart job (19 partitions of 3, one worker) writing to ``out``."""
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", "local",                 # a new local Ray even if others are running
           "--output", out, "--set", "source.partition_size=3",
           "--set", "runtime.num_workers=1", "--set", "runtime.batch_size=3"]
    if input_uri:
        cmd += ["--input", input_uri]
    if report:
        cmd += ["--report-json", str(report)]
    env = dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1", **(extra_env or {}))
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, **popen)


def finish(proc: subprocess.Popen, timeout_s: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return out


def markers(out: str) -> dict[str, str]:
    """partition id -> attempt id of every commit marker."""
    return {p: m["attempt_id"] for p, m in CheckpointStore(out).markers().items()}


def rows_by_key(out: str) -> dict[str, dict]:
    """The committed output rows, keyed by ``key`` (read through the pipeline's fs layer)."""
    rows = {}
    for uri in committed_files(out):
        fsys, path = fs.resolve(uri)
        for r in pq.read_table(path, filesystem=fsys).to_pylist():
            rows[r["key"]] = r
    return rows


COMPARED = ("status", "reject_reason", "sha256", "phash", "caption", "width", "height",
            "image_width", "image_height", "partition_id", "image")
