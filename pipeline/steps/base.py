"""The step contract: a callable class over batches (dicts of equal-length lists).

``__init__(spec)`` is cheap, ``setup()`` loads heavy state once per worker,
``start_partition(pid)`` resets per-partition state, ``__call__(batch) -> batch`` maps a
batch. Every step declares itself to the assembler (``pipeline.assembly``):

* ``writes``: the columns it sets (names from ``pipeline.columns``; an undeclared name
  fails when the pipeline is assembled), and ``fields()``: Arrow fields for the columns
  whose type it sets at assembly (model outputs);
* ``settings()``: the settings that change its output rows (hashed into the fingerprint).

``RowStep`` applies ``process_row`` to the rows whose ``status`` is ``ok``; an exception
there turns that row into ``status="error"`` (one of the two places broad exceptions are
caught). ``Filter`` owns keep/reject: ``reject_reason(batch, i)`` returns a
``RejectReason`` or None, the base sets ``status``/``reject_reason`` and counts rejects by
reason (datatrove's ``BaseFilter``).
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import pyarrow as pa

from pipeline.columns import ERROR, ERROR_REASON, REJECT_REASON, STATUS, Batch
from pipeline.errors import RecordError, error_text
from pipeline.records import ErrorReason, RejectReason, RowError, Status

log = logging.getLogger(__name__)


class Step:
    """A batch-to-batch transform. Subclasses override ``__call__`` (and ``setup``).

    ``reads``: the declared columns the step needs (an earlier part, the runner or the
    datasource must write each: the assembler refuses the pipeline otherwise, naming the
    step and the column); ``writes``: the declared columns it sets."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def settings(self) -> dict[str, Any]:
        """Settings that change this step's output rows (JSON-able); default none."""
        return {}

    def fields(self) -> list[pa.Field]:
        """Arrow fields of the ``writes`` columns typed at assembly; default none."""
        return []

    def setup(self) -> None:
        """Load heavy state once (models, tables); the default does nothing."""

    def start_partition(self, partition_id: str) -> None:
        """Reset per-partition state (e.g. dedup tables); the default does nothing."""

    def decoded_bytes(self, batch: Batch, i: int) -> int:
        """Bytes of decoded arrays this step will hold for row ``i``, estimated before the
        batch runs (from headers; ``runtime.max_batch_bytes`` cuts batches by it); the
        default is 0 (a step that decodes nothing)."""
        return 0

    def __call__(self, batch: Batch) -> Batch:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__


class RowStep(Step):
    """A step that processes each ``ok`` row; subclasses implement ``process_row``.

    ``process_row(batch, i)`` reads row ``i`` and returns a dict of column values to set
    on it (columns in ``writes`` that it does not set become None). It may raise
    ``RecordError`` (the row becomes ``status="error"`` with that reason) - any other
    exception becomes ``step_failed``.
    """

    executor = None  # a concurrent.futures executor: rows run in its threads if set

    def process_row(self, batch: Batch, i: int) -> dict[str, Any]:
        raise NotImplementedError

    def __call__(self, batch: Batch) -> Batch:
        n = len(batch[STATUS])
        for col in self.writes:
            batch.setdefault(col, [None] * n)
        rows = [i for i in range(n) if batch[STATUS][i] == Status.OK.value]
        mapper = self.executor.map if self.executor is not None else map
        for i, (values, err) in zip(rows, mapper(lambda i: self._safe_row(batch, i), rows)):
            if err is not None:
                mark_error(batch, i, err)
                continue
            for col, value in values.items():
                batch[col][i] = value
        return batch

    def _safe_row(self, batch: Batch, i: int) -> tuple[dict[str, Any], RowError | None]:
        try:
            return self.process_row(batch, i), None
        except RecordError as e:
            return {}, RowError(e.reason, e.message)
        except Exception as e:  # noqa: BLE001 - boundary: a failing row, not a failing job
            log.debug("step %s failed on row %d", self.name, i, exc_info=True)
            return {}, RowError(ErrorReason.STEP_FAILED, f"{self.name}: {error_text(e)}")


class Filter(Step):
    """Keeps or rejects each ``ok`` row; never drops one.

    Subclasses implement ``reject_reason(batch, i) -> RejectReason | None`` (they may set
    their own ``writes`` columns on row ``i`` while deciding). A rejected row gets
    ``status="rejected"``, its ``reject_reason`` and None in ``dropped`` columns (e.g. the
    re-encoded image of a row rejected after it was made). ``rejected`` counts this
    partition's rejects by reason.
    """

    writes: tuple[str, ...] = (REJECT_REASON,)
    dropped: tuple[str, ...] = ()

    def __init__(self):
        self.rejected: collections.Counter = collections.Counter()

    def reject_reason(self, batch: Batch, i: int) -> RejectReason | None:
        raise NotImplementedError

    def start_partition(self, partition_id: str) -> None:
        self.rejected = collections.Counter()

    def __call__(self, batch: Batch) -> Batch:
        n = len(batch[STATUS])
        for col in self.writes:
            batch.setdefault(col, [None] * n)
        for i in range(n):
            if batch[STATUS][i] != Status.OK.value:
                continue
            reason = self.reject_reason(batch, i)
            if reason is None:
                continue
            batch[STATUS][i] = Status.REJECTED.value
            batch[REJECT_REASON][i] = RejectReason(reason).value
            self.rejected[RejectReason(reason).value] += 1
            for col in self.dropped:
                if col in batch:
                    batch[col][i] = None
        return batch


def mark_error(batch: Batch, i: int, error: RowError) -> None:
    """Set row ``i`` to ``status="error"``, ``error_reason`` and ``error`` (its text)."""
    n = len(batch[STATUS])
    batch[STATUS][i] = Status.ERROR.value
    batch.setdefault(ERROR_REASON, [None] * n)[i] = error.reason.value
    batch.setdefault(ERROR, [None] * n)[i] = str(error)
