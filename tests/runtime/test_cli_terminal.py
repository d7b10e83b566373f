"""``mmpipe run`` as a user sees it off a terminal, stopped by Ctrl-C and by SIGTERM: two
real runs of the quickstart (without its model step) on a fresh local Ray each (19
partitions of 3 records)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.local_ray import session_processes
from tests.conftest import REPO
from tests.e2e.jobs import PARTITIONS, clean_ray_env

STOP_LINE = re.compile(r"^(interrupted \(Ctrl-C\)|stopped \(SIGTERM\)): (\d+) of 19 partitions "
                       r"committed \((\d+) records\); (.*)$", re.M)


def start(out: Path, home: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml", "--address",
           "local", "--executor", "ray", "--output", str(out), "--set", "source.partition_size=3",
           "--set", "runtime.num_workers=1", "--set", "runtime.batch_size=3",
           "--set", "runtime.progress_interval_s=0.05",   # a line per partition
           "--set", "text_embedding.enabled=false"]     # no model to load: a shorter test
    with open(log, "w") as f:   # a file, as in a CI log: not a terminal
        return subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                env=clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1"),
                                start_new_session=True)


def wait_for_markers(proc: subprocess.Popen, out: Path, n: int, timeout_s: float = 240) -> None:
    deadline = time.time() + timeout_s
    while len(CheckpointStore(str(out)).markers()) < n:
        assert proc.poll() is None, "the job ended before it could be stopped"
        assert time.time() < deadline, f"fewer than {n} partitions committed in {timeout_s}s"
        time.sleep(0.2)


def wait_for_progress(proc: subprocess.Popen, log: Path, records: int,
                      timeout_s: float = 60) -> None:
    """Wait until the driver's own progress line counts at least ``records`` records: a
    commit marker can exist before the driver has taken that partition's result."""
    deadline = time.time() + timeout_s
    while not any(int(n) >= records for n in
                  re.findall(r"progress: (\d+)/57 records", log.read_text())):
        assert proc.poll() is None, "the job ended before it could be stopped"
        assert time.time() < deadline, f"no progress line with {records} records in {timeout_s}s"
        time.sleep(0.2)


def stopped(proc: subprocess.Popen, log: Path, out: Path) -> tuple[str, re.Match]:
    """Wait for the stopped run; check what every stop must show; return its output and
    its stop line."""
    proc.wait(timeout=60)
    text = log.read_text()
    lines = STOP_LINE.findall(text)
    assert len(lines) == 1, text
    match = STOP_LINE.search(text)
    markers = CheckpointStore(str(out)).markers()
    assert int(match.group(2)) == len(markers) < PARTITIONS, text
    assert int(match.group(3)) == sum(m.rows_in for m in markers.values()), text
    assert "Traceback" not in text and "SIGTERM received" not in text, text   # no stack dump
    assert "\x1b[" not in text, text                                         # no ANSI codes
    assert "Token authentication is enabled" not in text, text
    assert "(PartitionWorker" not in text, text        # worker lines stay in the log files
    logs = re.search(r"worker logs: (\S+)", text).group(1)
    assert os.path.isdir(logs)
    assert not session_processes(str(Path(logs).parent)), "Ray was not shut down"
    return text, match


def test_ctrl_c_then_sigterm_stop_cleanly_and_the_rerun_resumes(tmp_path):
    out, home = tmp_path / "out", tmp_path / "home"
    home.mkdir()

    # Ctrl-C: a terminal sends SIGINT to the whole foreground process group
    proc = start(out, home, tmp_path / "run1.log")
    wait_for_markers(proc, out, 2)
    wait_for_progress(proc, tmp_path / "run1.log", 6)
    os.killpg(proc.pid, signal.SIGINT)
    text, line = stopped(proc, tmp_path / "run1.log", out)
    assert proc.returncode == 130, text
    assert line.group(4) == "run the same command again to resume"
    assert "progress: 0/57 records (0/19 partitions)" in text, text
    progress = [tuple(map(int, m)) for m in
                re.findall(r"progress: (\d+)/57 records \((\d+)/19 partitions\)", text)]
    assert len(progress) >= 3 and progress[-1][0] >= 6, text         # counted in records
    logs = Path(re.search(r"worker logs: (\S+)", text).group(1))
    worker_lines = "".join(f.read_text(errors="replace") for f in logs.glob("worker-*"))
    assert re.search(r"partition p-\d+: attempt \w+ started \(3 records from 1 object\)",
                     worker_lines)                    # the worker's lines, in its log file
    first = {p: m.attempt_id for p, m in CheckpointStore(str(out)).markers().items()}

    # SIGTERM (what `mmpipe stop` / Ray's job stop sends the driver), on the resumed run
    proc = start(out, home, tmp_path / "run2.log")
    wait_for_markers(proc, out, len(first) + 1)
    os.kill(proc.pid, signal.SIGTERM)
    text, line = stopped(proc, tmp_path / "run2.log", out)
    assert proc.returncode == 143, text
    assert line.group(4) == "run or submit the same spec again to resume"
    assert (f"19 partitions planned (stored), {len(first)} already committed, "
            f"{PARTITIONS - len(first)} to run") in text, text
    assert f"progress: 0/{57 - 3 * len(first)} records (0/{PARTITIONS - len(first)} " \
           "partitions)" in text, text
    after = {p: m.attempt_id for p, m in CheckpointStore(str(out)).markers().items()}
    assert {p: after[p] for p in first} == first          # committed work was not redone
