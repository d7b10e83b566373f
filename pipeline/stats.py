"""``AttemptStats``: what one partition attempt did, counted while it runs.

Rows are counted as the runner hands batches to the datasinks, by status and by typed
reason (``"rejected:duplicate"``, ``"error:not_an_image"``); storage retries are reported
by the retry policy while the attempt observes it (``retry.POLICY.observe``); downloads by
the attempt's own ``HttpFetcher``. The commit marker is built from these counters, never
from deltas of process-wide ones.
"""

from __future__ import annotations

import collections
import threading

from pipeline.columns import (ERROR, ERROR_REASON, KEY, PARENT_KEY, REJECT_REASON, SIGNAL_FLAGS,
                              STATUS, Batch)
from pipeline.records import Status


FIRST_ERRORS = 3  # error rows an attempt keeps as examples (the driver logs them)


class AttemptStats:
    """Counters of one attempt: ``rows`` by ``(status, reason)`` (reason ``"none"`` for ok
    rows), ``flags``: rows by each signal-filter flag they carry (``signal_flags``:
    ``score_only`` would-be reject reasons, ``unscored:<column>``),
    ``retried_requests``/``throttled_requests`` (storage) and ``downloads`` (HTTP
    counters of ``HttpFetcher.stats``), ``first_errors``: the first ``FIRST_ERRORS`` error
    rows as ``key: error``; ``clips``: rows that are clips of a video (``parent_key``
    set; ``video.clips``). Thread-safe for ``storage_retry``."""

    def __init__(self):
        self.rows: collections.Counter[tuple[str, str]] = collections.Counter()
        self.flags: collections.Counter[str] = collections.Counter()
        self.retried_requests = 0
        self.throttled_requests = 0
        self.downloads: collections.Counter = collections.Counter()
        self.first_errors: list[str] = []
        self.clips = 0
        self._lock = threading.Lock()

    def count_rows(self, batch: Batch) -> None:
        """Count a finished batch's rows by ``status`` and by its typed reason column, and
        its rows by each of their ``signal_flags`` (if the batch has the column)."""
        for i, status in enumerate(batch[STATUS]):
            reason = (batch[REJECT_REASON][i] if status == Status.REJECTED.value
                      else batch[ERROR_REASON][i] if status == Status.ERROR.value else None)
            self.rows[(status, reason or "none")] += 1
            if status == Status.ERROR.value and len(self.first_errors) < FIRST_ERRORS:
                self.first_errors.append(f"{batch[KEY][i]}: {batch[ERROR][i]}")
        for flags in batch.get(SIGNAL_FLAGS) or ():
            self.flags.update(flags or ())
        self.clips += sum(1 for k in batch.get(PARENT_KEY) or () if k is not None)

    def storage_retry(self, throttled: bool) -> None:
        """Called by ``retry.RetryPolicy`` for each retried storage request."""
        with self._lock:
            self.retried_requests += 1
            self.throttled_requests += int(throttled)

    def add_downloads(self, counters: dict[str, int]) -> None:
        """Add an ``HttpFetcher``'s counters (zero counters are dropped)."""
        self.downloads.update({k: v for k, v in counters.items() if v})

    @property
    def rows_in(self) -> int:
        return sum(self.rows.values())

    @property
    def rows_by_status(self) -> dict[str, int]:
        """Status -> rows (statuses no row had are absent; the marker adds them as 0)."""
        out: collections.Counter = collections.Counter()
        for (status, _), n in self.rows.items():
            out[status] += n
        return dict(out)

    @property
    def rows_by_reason(self) -> dict[str, int]:
        """``"<status>:<reason>"`` -> rows, for rejected and error rows (the marker's form:
        JSON object keys are strings)."""
        return {f"{s}:{r}": n for (s, r), n in sorted(self.rows.items())
                if s != Status.OK.value}

    @property
    def rows_by_flag(self) -> dict[str, int]:
        """Signal-filter flag -> rows carrying it (the marker's ``rows_by_flag``)."""
        return dict(sorted(self.flags.items()))
