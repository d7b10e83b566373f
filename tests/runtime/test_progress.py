"""The progress display, stop signals and stale local-Ray clean-up, without Ray: a real PTY
for the bar, real signals, real processes holding files of a session directory."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import time

import psutil
import pytest

from pipeline.runtime import local_ray, stops
from pipeline.runtime.preflight import Preflight
from pipeline.runtime.progress import Progress
from pipeline.runtime.report import JobReport

LINE = re.compile(r"progress: (\d+)(?:/(\d+))? records \((\d+)/(\d+) partitions\), "
                  r"[\d.]+ records/s, elapsed \d+s")


def progress_lines(caplog) -> list[tuple]:
    return [LINE.fullmatch(r.getMessage()).groups() for r in caplog.records
            if r.getMessage().startswith("progress:")]


def test_off_a_terminal_plain_lines_at_start_every_interval_and_at_the_end(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="pipeline.runtime.progress")
    with open(tmp_path / "err.txt", "w") as stream:           # a file: not a TTY
        p = Progress(57, 4, interval_s=0.2, stream=stream)
        p.update("p-000000", 15)
        p.tick()                                              # interval not over: no line
        time.sleep(0.25)
        p.tick()
        p.update("p-000001", 15)
        p.close()
    assert progress_lines(caplog) == [("0", "57", "0", "4"), ("15", "57", "1", "4"),
                                      ("30", "57", "2", "4")]
    assert (tmp_path / "err.txt").read_text() == ""          # lines go through logging
    unknown = Progress(None, 2, interval_s=60, stream=open(os.devnull, "w"))
    unknown.update("p-000000", 7)
    assert unknown.line().startswith("progress: 7 records (1/2 partitions), ")


def test_on_a_terminal_one_bar_in_records_with_log_lines_above_it(caplog, monkeypatch):
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    with os.fdopen(slave, "w") as tty:
        monkeypatch.setattr(sys, "stderr", tty)              # as `mmpipe run` on a terminal
        console = logging.StreamHandler(tty)
        logging.root.addHandler(console)
        try:
            p = Progress(57, 4, interval_s=0.01)
            assert p.bar is not None
            p.update("p-000000", 15)
            logging.getLogger("pipeline.runtime.driver").warning("partition p-000001 retrying")
            p.update("p-000001", 15)
            p.tick()
            p.close()
        finally:
            logging.root.removeHandler(console)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    text = out.decode()
    assert "30/57" in text and "2/4 partitions" in text and "records" in text
    assert "\r" in text                                     # redrawn in place
    assert "partition p-000001 retrying" in text             # printed through tqdm.write
    assert not [r for r in caplog.records if r.getMessage().startswith("progress:")]


def test_a_signal_raises_keyboard_interrupt_and_the_summary_says_what_is_committed():
    report = JobReport("quickstart", "out", "fp", "new, 4 partitions", partitions_total=4)
    report.partitions_skipped, report.partitions_committed = ["p-000000"], ["p-000002"]
    report.rows_out = 30
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as caught:
        with stops.on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)                                    # the handler raises first
    assert signal.getsignal(signal.SIGTERM) is before
    assert stops.received() == signal.SIGTERM and stops.exit_code() == 143
    assert stops.summary(stops.Stopped(report)) == (
        "stopped (SIGTERM): 2 of 4 partitions committed (30 records); run or submit the same "
        "spec again to resume")
    assert stops.summary(caught.value).startswith("stopped (SIGTERM) before any partition ran")
    with pytest.raises(KeyboardInterrupt):
        with stops.on_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert stops.exit_code() == 130
    assert stops.summary(stops.Stopped(report)).startswith(
        "interrupted (Ctrl-C): 2 of 4 partitions committed (30 records); run the same command")


def _holder(path) -> subprocess.Popen:
    """A process that keeps ``path`` open, like a Ray process its session's log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'a');"
                             " print('ready', flush=True); time.sleep(120)", str(path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_stale_local_ray_of_a_killed_driver_is_stopped_and_nothing_else(tmp_path, caplog):
    state = tmp_path / "state"
    state.mkdir()
    stale, other, live = (tmp_path / "ray" / f"session_{n}" for n in ("stale", "user", "live"))
    procs = [_holder(stale / "logs" / "raylet.out"), _holder(other / "logs" / "raylet.out"),
             _holder(live / "logs" / "raylet.out")]
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()                                          # a driver that is gone
        (state / f"{dead.pid}.json").write_text(json.dumps(
            {"driver_pid": dead.pid, "driver_started": time.time() - 5,
             "session_dir": str(stale)}))
        me = psutil.Process()                                # a driver that still runs
        (state / f"{me.pid}.json").write_text(json.dumps(
            {"driver_pid": me.pid, "driver_started": me.create_time(), "session_dir": str(live)}))
        assert [p.pid for p in local_ray.session_processes(str(stale))] == [procs[0].pid]

        assert local_ray.cleanup_stale(state) == 1
        assert procs[0].wait(timeout=10) is not None         # the stale session's process
        assert procs[1].poll() is None and procs[2].poll() is None   # the others are untouched
        assert sorted(p.name for p in state.iterdir()) == [f"{me.pid}.json"]
        assert any("stopped 1 processes of a local Ray left by a killed mmpipe run" in
                   r.getMessage() for r in caplog.records)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_run_without_an_address_starts_its_own_ray_never_joins_one(monkeypatch):
    """Issue 16's trial: ``ray.init(address=None)`` joins a cluster started with ``ray start``
    on the machine, which mmpipe then recorded as its own and a later run killed. Without
    ``--address``/``RAY_ADDRESS`` the run asks for ``"local"`` (always a new Ray)."""
    from pipeline import cli

    seen = []

    def fake_start(address, **kwargs):
        seen.append(address)
        raise KeyboardInterrupt  # stop before any Ray starts

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(local_ray, "start", fake_start)
    # no Ray was started: a real shutdown would stop the session's shared `ray_local`
    monkeypatch.setattr(local_ray, "shutdown", lambda session: None)
    monkeypatch.setattr("pipeline.runtime.preflight.preflight",
                        lambda spec: Preflight(None, nothing_to_run=False))
    args = ["run", "examples/quickstart.yaml", "--executor", "ray", "--output", "/nonexistent/out"]
    assert cli.main(args) == 130 and seen == ["local"]
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    assert cli.main(args) == 130 and seen == ["local", "127.0.0.1:6390"]


def test_records_in_flight_move_the_count_before_a_partition_commits(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="pipeline.runtime.progress")
    with open(tmp_path / "err.txt", "w") as stream:
        p = Progress(57, 4, interval_s=0, stream=stream)
        p.in_flight(12, "PartitionWorker-0 p-000000 (12 records); 1 idle or starting")
        p.tick()
        p.in_flight(3, "PartitionWorker-1 p-000001 (3 records); 1 idle or starting")
        p.update("p-000000", 15)                          # p-000000 done: 15 + 3
        p.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[1].startswith("progress: 12/57 records (12 in flight, 0/4 partitions), ")
    assert lines[2] == "workers: PartitionWorker-0 p-000000 (12 records); 1 idle or starting"
    assert lines[3].startswith("progress: 18/57 records (3 in flight, 1/4 partitions), ")
