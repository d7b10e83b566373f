"""The step contract: a callable class over batches (dicts of equal-length lists).

``__init__(spec)`` is cheap, ``setup()`` loads heavy state once per worker,
``__call__(batch) -> batch`` maps a batch. ``RowStep`` applies ``process_row`` to the rows
whose ``status`` is ``ok``; an exception there turns that row into ``status="error"``
(this is one of the two places broad exceptions are caught).
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline.errors import RecordError
from pipeline.records import ERROR, STATUS, Batch, ErrorReason, Status

log = logging.getLogger(__name__)


class Step:
    """A batch-to-batch transform. Subclasses override ``__call__`` (and ``setup``)."""

    def setup(self) -> None:
        """Load heavy state once (models, tables); the default does nothing."""

    def start_partition(self, partition_id: str) -> None:
        """Reset per-partition state (e.g. dedup tables); the default does nothing."""

    def __call__(self, batch: Batch) -> Batch:
        raise NotImplementedError


class RowStep(Step):
    """A step that processes each ``ok`` row; subclasses implement ``process_row``.

    ``process_row(batch, i)`` reads row ``i`` and returns a dict of column values to set
    on it (columns in ``outputs`` that it does not set become None). It may raise
    ``RecordError`` (the row becomes ``status="error"`` with that reason) - any other
    exception becomes ``step_failed``.
    """

    outputs: tuple[str, ...] = ()
    executor = None  # a concurrent.futures executor: rows run in its threads if set

    def process_row(self, batch: Batch, i: int) -> dict[str, Any]:
        raise NotImplementedError

    def __call__(self, batch: Batch) -> Batch:
        n = len(batch[STATUS])
        for col in self.outputs:
            batch.setdefault(col, [None] * n)
        rows = [i for i in range(n) if batch[STATUS][i] == Status.OK.value]
        mapper = self.executor.map if self.executor is not None else map
        for i, (values, err) in zip(rows, mapper(lambda i: self._safe_row(batch, i), rows)):
            if err is not None:
                mark_error(batch, i, *err)
                continue
            for col, value in values.items():
                batch[col][i] = value
        return batch

    def _safe_row(self, batch: Batch, i: int) -> tuple[dict[str, Any], tuple[str, str] | None]:
        try:
            return self.process_row(batch, i), None
        except RecordError as e:
            return {}, (e.reason, e.message)
        except Exception as e:  # noqa: BLE001 - boundary: a failing row, not a failing job
            log.debug("step %s failed on row %d", type(self).__name__, i, exc_info=True)
            return {}, (ErrorReason.STEP_FAILED.value,
                        f"{type(self).__name__}: {type(e).__name__}: {e}")


def mark_error(batch: Batch, i: int, reason: str, message: str) -> None:
    """Set row ``i`` to ``status="error"`` with ``error = "<reason>: <message>"``."""
    batch[STATUS][i] = Status.ERROR.value
    batch[ERROR][i] = f"{reason}: {message}"
