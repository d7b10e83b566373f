"""Processing one partition end to end: read -> steps -> models -> write -> commit.

``process_partition`` is plain Python (no Ray), so the same code runs inside a
``PartitionWorker`` actor, in a plain loop (benchmarks) and in tests. Model steps go
through ``pipeline.runtime.model_steps``: each model's client has ``submit(inputs) ->
handle`` and ``result(handle) -> columns``; at most ``max_in_flight`` batches wait on the
models, the rest of the pipeline keeps going meanwhile.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline import __version__
from pipeline.io import retry
from pipeline.io.checkpoint import CheckpointStore
from pipeline.io.sinks import ParquetDatasink, output_schema
from pipeline.io.sources import Datasource
from pipeline.records import (ERROR, PARTITION_ID, REJECT_REASON, STATUS, TEXT_EMBEDDING, Batch,
                              Partition, Status)
from pipeline.runtime.model_steps import ModelPlan, as_model_plan
from pipeline.spec import JobSpec
from pipeline.steps.base import RowStep, Step
from pipeline.steps.caption import CaptionStep
from pipeline.steps.dedup import DedupStep
from pipeline.steps.image import DecodeStep, FilterStep, HashStep, ResizeStep
from pipeline.steps.model_input import ModelInputStep
from pipeline.steps.video import VideoDecodeStep, VideoFramesStep

log = logging.getLogger(__name__)


def build_steps(spec: JobSpec, executor: ThreadPoolExecutor | None = None,
                model_geometries: list | tuple = ()) -> list[Step]:
    """The CPU steps of a job, in order.

    Images: caption, decode, filter, hash, dedup, model inputs (one uint8 array per record
    and ``ImageGeometry``, if any model takes images), resize. JPEG draft decoding keeps
    the pixels large enough for every consumer. Video: caption, video decode (sampled
    frames, sha256 of the file, pHash of the middle frame), filter, dedup, model inputs
    (an (F, h, w, 3) stack per record), frame encoding.
    """
    if spec.source.media == "video":
        steps: list[Step] = [CaptionStep(spec.captions), VideoDecodeStep(spec.video, spec.resize),
                             FilterStep(spec.filters), DedupStep(spec.dedup)]
        if model_geometries:
            steps.append(ModelInputStep(list(model_geometries)))
        steps.append(VideoFramesStep(spec.resize))
    else:
        draft = spec.resize.size_px if spec.resize.mode != "none" else None
        if draft is not None and model_geometries:
            draft = max([draft] + [g.min_side_px for g in model_geometries])
        steps = [CaptionStep(spec.captions), DecodeStep(spec.decode, draft),
                 FilterStep(spec.filters), HashStep(), DedupStep(spec.dedup)]
        if model_geometries:
            steps.append(ModelInputStep(list(model_geometries)))
        steps.append(ResizeStep(spec.resize))
    for step in steps:
        if isinstance(step, RowStep):
            step.executor = executor
        step.setup()
    return steps


class LocalEmbedClient:
    """An in-process caption-embedding client (plain loops and tests): computes on
    ``submit({"text": [...]})``, returns ``{"text_embedding": (n, D) float32}``."""

    def __init__(self, embedder):
        self.embedder = embedder

    def submit(self, inputs: dict[str, Any]):
        return {TEXT_EMBEDDING: self.embedder(inputs["text"])}

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
                      source: Datasource, steps: list[Step], models: Any | None,
                      pool: ThreadPoolExecutor,
                      ran_on: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one attempt of ``partition``; return its outcome (the marker, plus ``committed``).

    ``ran_on`` (e.g. worker name and Ray node id) is recorded in the marker as ``ran_on``.

    ``models``: None, a ``ModelPlan`` or a list of ``ModelTask`` (``model_steps``; in
    process: ``[text_task(LocalEmbedClient(embedder), dim, k)]``).
    Raises whatever the datasource, a model or the sink raises (the caller retries the
    partition); this attempt's files are deleted first.
    """
    started = time.time()
    throttled_before, retried_before = retry.POLICY.throttled_requests, retry.POLICY.retried_requests
    downloads_before = source.download_stats()
    pid = partition.partition_id
    plan = as_model_plan(spec, models)
    schema = output_schema(source.extra_fields(partition), None,
                           [f.arrow() for f in plan.fields], spec.source.media)
    sink = ParquetDatasink(spec.sink.uri, pid, attempt_id, spec.sink, schema,
                           spec.resize.encode_format)
    pending: collections.deque = collections.deque()
    try:
        for step in steps:
            step.start_partition(pid)
        for batch in source.read_batches(partition, spec.runtime.batch_size, pool):
            batch = _start_batch(batch, pid)
            for step in steps:
                batch = step(batch)
            pending.append(plan.start(batch))
            plan.promote(pending)
            _write_ready(plan, pending, sink, plan.max_in_flight)
        _write_ready(plan, pending, sink, 1)
        result = sink.close()
    except BaseException:
        sink.abort()
        raise
    rows_in = sum(result.rows_by_status.values())
    marker = {
        "partition_id": pid, "attempt_id": attempt_id, "fingerprint": fingerprint,
        "files": list(result.files), "sha256": result.sha256, "rows_in": rows_in,
        # WebDataset: samples are unknown until the shards are read
        "rows_planned": None if spec.source.kind == "webdataset" else partition.rows_planned,
        "rows_by_status": {s.value: result.rows_by_status.get(s.value, 0) for s in Status},
        "rows_by_reason": result.rows_by_reason, "bytes_written": result.bytes_written,
        "started_at": started, "finished_at": time.time(),
        "duration_s": round(time.time() - started, 3), "mmpipe_version": __version__,
        "ran_on": ran_on or {},
        "throttled_requests": retry.POLICY.throttled_requests - throttled_before,
        "retried_requests": retry.POLICY.retried_requests - retried_before,
    }
    downloads = {k: v - downloads_before.get(k, 0) for k, v in source.download_stats().items()}
    if any(downloads.values()):  # URL manifests: HTTP requests, retries, failures by kind
        marker["downloads"] = {k: v for k, v in sorted(downloads.items()) if v}
    committed = CheckpointStore(spec.sink.uri).commit(pid, marker)
    if not committed:
        log.warning("partition %s: another attempt committed first; deleting attempt %s",
                    pid, attempt_id)
        sink.abort()
    return dict(marker, committed=committed)


def _write_ready(plan: ModelPlan, pending: collections.deque, sink: ParquetDatasink,
                 max_in_flight: int) -> None:
    """Write finished batches from the front, and complete the oldest ones until fewer
    than ``max_in_flight`` wait (``1``: all of them)."""
    while pending and (plan.done(pending[0]) or len(pending) >= max_in_flight):
        sink.write(plan.finish(pending.popleft()))
