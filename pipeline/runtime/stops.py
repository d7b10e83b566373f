"""Clean stops of ``mmpipe run``: Ctrl-C (SIGINT) and ``mmpipe stop`` / Ray job stop (SIGTERM).

Inside ``on_signals()`` the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` in the main
thread, the one exception Ray's blocking calls (``ray.wait``, ``ray.get``) turn into their
own ``KeyboardInterrupt`` when a signal handler raises (Ray's ``check_signals``); anything
else would be lost there. So the driver's ``finally`` blocks run (workers and model actors
killed, the progress bar closed), the caller shuts Ray down and prints ``summary(...)``, one
line, and exits ``exit_code()`` (``128 + signal``, the shell's convention: 130 for SIGINT,
143 for SIGTERM). A second signal during that clean-up exits at once with the same code.
The Python handler also replaces the fatal-signal handler Ray's core worker installs for
SIGTERM, which would print a stack dump; so enter ``on_signals`` after ``ray.init``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Iterator

WHAT = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "stopped (SIGTERM)"}
RESUME = {signal.SIGINT: "run the same command again to resume",
          signal.SIGTERM: "run or submit the same spec again to resume"}

_received: list[int] = []  # signals received inside on_signals (first one counts)


class Stopped(KeyboardInterrupt):
    """A stop that reached the driver: ``report`` is the ``JobReport`` so far (partitions
    committed or skipped, rows out) and ``in_flight`` the partitions whose attempts were
    running (they may have committed before their workers were killed); ``summary`` says
    what is committed from both."""

    def __init__(self, report, in_flight: list[str] | None = None):
        super().__init__()
        self.report, self.in_flight = report, list(in_flight or [])


def received() -> int:
    """The signal that stopped the run (SIGINT if none was caught: a plain Ctrl-C)."""
    return _received[0] if _received else signal.SIGINT


def exit_code() -> int:
    """``128 + received()``: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + received()


def _handler(signum: int, _frame) -> None:
    if _received:
        print(f"{WHAT.get(signum, signal.Signals(signum).name)} again: exiting now",
              file=sys.stderr, flush=True)
        os._exit(128 + _received[0])
    _received.append(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def on_signals() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise ``KeyboardInterrupt`` (the first one) or
    exit at once (a later one); the previous handlers are restored after. Main thread only."""
    _received.clear()
    previous = {s: signal.signal(s, _handler) for s in WHAT}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def summary(stop: BaseException) -> str:
    """The one line printed after a stop, e.g. ``interrupted (Ctrl-C): 2 of 4 partitions
    committed (30 records); run the same command again to resume``. ``stop`` is the
    ``KeyboardInterrupt`` caught; a ``Stopped`` carries the report, and the commit markers
    of its partitions in flight are read (call this once their workers are gone)."""
    signum = received()
    what = WHAT.get(signum, signal.Signals(signum).name)
    resume = RESUME.get(signum, RESUME[signal.SIGINT])
    report = getattr(stop, "report", None)
    if report is None:
        return f"{what} before any partition ran; {resume}"
    done = len(report.partitions_committed) + len(report.partitions_skipped)
    records = report.rows_out
    for marker in _late_markers(report.output_uri, getattr(stop, "in_flight", [])):
        done, records = done + 1, records + marker.rows_in
    return (f"{what}: {done} of {report.partitions_total} partitions committed "
            f"({records} records); {resume}")


def _late_markers(output_uri: str, partition_ids: list[str]) -> list:
    """The commit markers of ``partition_ids`` that exist (best effort: none if the
    store cannot be read)."""
    from pipeline.output.checkpoint import CheckpointStore

    if not partition_ids:
        return []
    try:
        store = CheckpointStore(output_uri)
        return [m for m in (store.marker(p) for p in partition_ids) if m is not None]
    except Exception:  # noqa: BLE001 - the stop line must come out anyway
        return []
