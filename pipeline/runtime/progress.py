"""Progress: a tqdm bar on a terminal, one log line every few seconds otherwise."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger(__name__)


class Progress:
    """Tracks finished partitions and rows; ``update(pid, rows)`` per finished partition."""

    def __init__(self, total: int, interval_s: float):
        self.total, self.interval_s = total, interval_s
        self.done = self.rows = 0
        self.t0 = self.last = time.time()
        self.bar = tqdm(total=total, unit="partition", file=sys.stderr) if sys.stderr.isatty() else None

    def update(self, partition_id: str, rows: int) -> None:
        self.done += 1
        self.rows += rows
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(rows=self.rows, last=partition_id)
        elif time.time() - self.last >= self.interval_s or self.done == self.total:
            self.last = time.time()
            rate = self.rows / max(1e-9, self.last - self.t0)
            log.info("progress: %d/%d partitions, %d rows, %.1f rows/s (last %s)",
                     self.done, self.total, self.rows, rate, partition_id)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
