"""Progress of a run, counted in records (``Progress``).

On a terminal (the stream is a TTY) one tqdm bar counts records: its total is the records
the plan expects from the partitions this run processes (unknown, so no total, for
WebDataset input, whose samples are known only once read), the postfix the partitions
finished. While the bar is shown the driver's and Ray's log lines go through
``tqdm.write`` (``tqdm.contrib.logging.logging_redirect_tqdm``), so they print above it
instead of shredding it. Off a terminal (a file, a pipe, a Ray job's log) it logs one plain
line at the start, every ``interval_s`` seconds and at the end, with no ANSI codes::

    progress: 30/57 records (12 in flight, 2/4 partitions), 12.3 records/s, elapsed 8s
    workers: PartitionWorker-0 p-000002 (12 records); 1 idle

Records move per batch: the count is the records of finished partitions (committed, or
failed after their last attempt) plus those the attempts still running have written so
far ("in flight": not committed yet, and lost if their attempt fails), which the driver
polls from its workers every tick (``in_flight``). The driver calls ``tick()`` about once a
second so the time-based lines come even while no partition finishes.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger(__name__)

TICK_S = 1.0  # how often the driver calls tick() while it waits for partitions


class Progress:
    """Records and partitions finished by this run, shown on ``stream`` (default stderr).

    ``records_total``: records planned for the partitions of this run, or None if unknown;
    ``partitions_total``: partitions this run processes; ``interval_s``: seconds between
    plain lines off a terminal (``runtime.progress_interval_s``). Call ``update`` per
    finished partition, ``in_flight`` with the running attempts' records, ``tick`` while
    waiting, ``close`` once at the end (also after an error or an interrupt: it prints the
    final line).
    """

    def __init__(self, records_total: int | None, partitions_total: int, interval_s: float,
                 stream: TextIO | None = None):
        self.records_total, self.partitions_total = records_total, partitions_total
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.records = self.partitions = self.flight = 0
        self.workers = self.wait = ""
        self.t0 = self.last = time.monotonic()
        self.bar: tqdm | None = None
        self._redirect = contextlib.ExitStack()
        if _is_tty(self.stream):
            self.bar = tqdm(total=records_total, unit=" records", file=self.stream,
                            dynamic_ncols=True, desc="progress", unit_scale=False)
            self.bar.set_postfix_str(self._partitions(), refresh=True)
            self._redirect.enter_context(logging_redirect_tqdm(
                [logging.root, logging.getLogger("ray")]))
        else:
            self._line()

    def update(self, partition_id: str, records: int) -> None:
        """Count one finished partition (``records`` rows out; 0 for a failed one)."""
        self.partitions += 1
        self.records += records
        self._show()

    def in_flight(self, records: int, workers: str = "") -> None:
        """Set the records written so far by the attempts still running (not committed);
        ``workers`` (what each worker holds) is logged under each plain line."""
        self.workers = workers
        if records != self.flight:
            self.flight = records
            if self.bar is not None:
                self._show()

    def waiting(self, line: str) -> None:
        """Show ``line`` (``waiting for resources: needs {...}; the cluster has {...} free``)
        on the progress line until called with ``""`` (the job was admitted)."""
        changed = line != self.wait
        self.wait = line
        if self.bar is not None:
            self.bar.set_postfix_str(self._partitions(), refresh=True)
        elif changed and line:
            self._line()
        else:
            self.tick()

    def _show(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self._partitions(), refresh=False)
            self.bar.update(self.records + self.flight - self.bar.n)
        else:
            self.tick()

    def tick(self) -> None:
        """Refresh the bar's clock, or log a line if ``interval_s`` passed since the last."""
        if self.bar is not None:
            self.bar.refresh()
        elif time.monotonic() - self.last >= self.interval_s:
            self._line()

    def close(self) -> None:
        """Close the bar (and the log redirection), or log the final line."""
        if self.bar is not None:
            self._redirect.close()
            self.bar.close()
            self.bar = None
        else:
            self._line()

    def line(self) -> str:
        """The plain progress line (what is logged off a terminal)."""
        elapsed = time.monotonic() - self.t0
        of = "" if self.records_total is None else f"/{self.records_total}"
        done = self.records + self.flight
        return (f"progress: {done}{of} records ({self._partitions()}), "
                f"{done / max(elapsed, 1e-9):.1f} records/s, elapsed {elapsed:.0f}s")

    def _partitions(self) -> str:
        flight = f"{self.flight} in flight, " if self.flight else ""
        wait = f"; {self.wait}" if self.wait else ""
        return f"{flight}{self.partitions}/{self.partitions_total} partitions{wait}"

    def _line(self) -> None:
        self.last = time.monotonic()
        log.info("%s", self.line())
        if self.workers:
            log.info("workers: %s", self.workers)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
