"""Cutting a batch by the bytes its decoded arrays will hold (``runtime.max_batch_bytes``).

A datasource yields batches of ``runtime.batch_size`` records; a few huge images (small
files that decode to hundreds of MiB each) would make one such batch hold GiBs of pixels
at once. ``cut_batch`` asks the steps for each row's estimated decoded size
(``Step.decoded_bytes``, from headers, before anything is decoded) and splits the batch
where the running total would pass the budget. A row larger than the whole budget goes
alone (its own size limits, e.g. ``decode.max_pixels``, bound it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pipeline.columns import STATUS, Batch
from pipeline.records import Status
from pipeline.steps.base import Step


def row_bytes(batch: Batch, steps: Sequence[Step]) -> list[int]:
    """Estimated decoded bytes of each row of ``batch`` (0 for rows that are not ``ok``)."""
    return [sum(step.decoded_bytes(batch, i) for step in steps)
            if status == Status.OK.value else 0
            for i, status in enumerate(batch[STATUS])]


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``start:stop`` of every column (lists or arrays) of ``batch``."""
    return {name: column[start:stop] for name, column in batch.items()}


def cut_batch(batch: Batch, steps: Sequence[Step], max_bytes: int) -> Iterator[Batch]:
    """Yield consecutive slices of ``batch`` whose estimated decoded bytes
    (``row_bytes``) stay within ``max_bytes`` (bytes); a row over ``max_bytes`` is a
    slice of its own. Yields ``batch`` itself when it fits. Rows keep their order."""
    sizes = row_bytes(batch, steps)
    if sum(sizes) <= max_bytes:
        yield batch
        return
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > max_bytes:
            yield slice_batch(batch, start, i)
            start, total = i, 0
        total += size
    yield slice_batch(batch, start, len(sizes))
