"""Staged temp files of a killed worker are removed when a worker next starts (issue 12:
they survived a worker crash). Real processes holding real locks; one is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.runtime import scratch
from tests.conftest import REPO

WORKER = """
import sys, tempfile
from pipeline.runtime import scratch
s = scratch.claim(sys.argv[1])
fd, path = tempfile.mkstemp(prefix="mmpipe-stage-", suffix=".mp4")  # as io.fs stages
print(path, flush=True)
sys.stdin.read()          # runs until killed
"""


def _worker(base: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(base)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_workers_staged_files_go_at_the_next_start(tmp_path):
    base = tmp_path / "stage"
    dead, dead_file = _worker(base)
    alive, alive_file = _worker(base)
    try:
        assert dead_file.parent.parent == base and dead_file.is_file()
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait(timeout=30)
        assert dead_file.is_file()                     # nothing removed it at the crash
        saved = tempfile.tempdir
        try:
            mine = scratch.claim(str(base))
            assert tempfile.gettempdir() == str(mine.path)
        finally:
            tempfile.tempdir = saved
        assert mine.removed == [dead_file.parent.name]
        assert not dead_file.parent.exists()
        assert alive_file.is_file()                    # a live worker's files stay
        assert sorted(p.name for p in base.iterdir()) == sorted(
            [alive_file.parent.name, mine.path.name])
    finally:
        alive.kill()
        alive.wait(timeout=30)
