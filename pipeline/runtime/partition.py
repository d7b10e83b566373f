"""Processing one partition end to end: read -> steps -> model -> write -> commit.

``process_partition`` is plain Python (no Ray), so the same code runs inside a
``PartitionWorker`` actor, in a plain loop (benchmarks) and in tests. Model calls go
through an ``embed_client`` with ``submit(texts) -> handle`` and ``result(handle) ->
(n, D) float32``; at most ``max_in_flight`` batches wait on it, the rest of the
pipeline keeps going meanwhile.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline import __version__
from pipeline.io.checkpoint import CheckpointStore
from pipeline.io.sinks import ParquetDatasink, output_schema
from pipeline.io.sources import Datasource
from pipeline.records import (CAPTION, ERROR, PARTITION_ID, REJECT_REASON, STATUS, TEXT_EMBEDDING,
                              Batch, Partition, Status)
from pipeline.spec import JobSpec
from pipeline.steps.base import RowStep, Step
from pipeline.steps.caption import CaptionStep
from pipeline.steps.dedup import DedupStep
from pipeline.steps.image import DecodeStep, FilterStep, HashStep, ResizeStep

log = logging.getLogger(__name__)


def build_steps(spec: JobSpec, executor: ThreadPoolExecutor | None = None) -> list[Step]:
    """The CPU steps of a job, in order: caption, decode, filter, hash, dedup, resize."""
    draft = spec.resize.size_px if spec.resize.mode != "none" else None
    steps: list[Step] = [CaptionStep(spec.captions), DecodeStep(spec.decode, draft),
                         FilterStep(spec.filters), HashStep(), DedupStep(spec.dedup),
                         ResizeStep(spec.resize)]
    for step in steps:
        if isinstance(step, RowStep):
            step.executor = executor
        step.setup()
    return steps


class LocalEmbedClient:
    """An in-process ``embed_client`` (plain loops and tests): computes on ``submit``."""

    def __init__(self, embedder):
        self.embedder = embedder

    def submit(self, texts: list[str]):
        return self.embedder(texts)

    def result(self, handle):
        return handle


def new_attempt_id() -> str:
    """A random 12-hex-digit attempt id."""
    return uuid.uuid4().hex[:12]


def _start_batch(batch: Batch, partition_id: str) -> Batch:
    n = len(batch["key"])
    batch[PARTITION_ID] = [partition_id] * n
    batch[STATUS] = [Status.ERROR.value if e else Status.OK.value for e in batch[ERROR]]
    batch[REJECT_REASON] = [None] * n
    return batch


def process_partition(partition: Partition, attempt_id: str, spec: JobSpec, fingerprint: str,
                      source: Datasource, steps: list[Step], embed_client: Any | None,
                      pool: ThreadPoolExecutor, embedding_dim: int | None = None) -> dict[str, Any]:
    """Run one attempt of ``partition``; return its outcome (the marker, plus ``committed``).

    Raises whatever the datasource or sink raises (the caller retries the partition);
    this attempt's files are deleted first.
    """
    started = time.time()
    pid = partition.partition_id
    schema = output_schema(source.extra_fields(partition), embedding_dim)
    sink = ParquetDatasink(spec.sink.uri, pid, attempt_id, spec.sink, schema)
    pending: collections.deque = collections.deque()
    try:
        for step in steps:
            step.start_partition(pid)
        for batch in source.read_batches(partition, spec.runtime.batch_size, pool):
            batch = _start_batch(batch, pid)
            for step in steps:
                batch = step(batch)
            if embed_client is None:
                sink.write(batch)
                continue
            rows = [i for i, s in enumerate(batch[STATUS])
                    if s == Status.OK.value and batch[CAPTION][i] is not None]
            handle = embed_client.submit([batch[CAPTION][i] for i in rows]) if rows else None
            pending.append((batch, rows, handle))
            while len(pending) >= spec.text_embedding.max_in_flight:
                _finish(pending.popleft(), embed_client, sink)
        while pending:
            _finish(pending.popleft(), embed_client, sink)
        result = sink.close()
    except BaseException:
        sink.abort()
        raise
    rows_in = sum(result.rows_by_status.values())
    marker = {
        "partition_id": pid, "attempt_id": attempt_id, "fingerprint": fingerprint,
        "files": list(result.files), "sha256": result.sha256, "rows_in": rows_in,
        "rows_planned": partition.rows_planned,
        "rows_by_status": {s.value: result.rows_by_status.get(s.value, 0) for s in Status},
        "rows_by_reason": result.rows_by_reason, "bytes_written": result.bytes_written,
        "started_at": started, "finished_at": time.time(),
        "duration_s": round(time.time() - started, 3), "mmpipe_version": __version__,
    }
    committed = CheckpointStore(spec.sink.uri).commit(pid, marker)
    if not committed:
        log.warning("partition %s: another attempt committed first; deleting attempt %s",
                    pid, attempt_id)
        sink.abort()
    return dict(marker, committed=committed)


def _finish(item, embed_client, sink: ParquetDatasink) -> None:
    batch, rows, handle = item
    n = len(batch[STATUS])
    batch[TEXT_EMBEDDING] = [None] * n
    if handle is not None:
        vectors = embed_client.result(handle)
        for j, i in enumerate(rows):
            batch[TEXT_EMBEDDING][i] = vectors[j]
    sink.write(batch)
