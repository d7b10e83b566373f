"""Processing one partition attempt end to end: read -> steps -> models -> write -> commit.

``run_partition`` is plain Python (no Ray), so the same assembled ``Pipeline`` runs
inside a ``PartitionWorker`` actor, in a plain loop (benchmarks) and in tests. Model steps
go through ``pipeline.steps.model.ModelStages``: at most ``max_in_flight`` batches wait on
the models while the CPU steps go on with the next ones. A batch read is cut by the
estimated bytes of its decoded arrays (``runtime.max_batch_bytes``, ``runtime.budget``)
before the CPU steps run; with ``video.clips`` the pipeline's ``splitter`` first turns its
video rows into clip rows, in sub-batches, and the attempt counts the rows of each input. Every datasink follows the
``Datasink`` lifecycle; the commit marker is built from this attempt's ``AttemptStats``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import Any, Callable

from pipeline import __version__
from pipeline.assembly import Pipeline
from pipeline.columns import (ERROR, ERROR_REASON, PARTITION_ID, READ_ERROR, REJECT_REASON,
                              STATUS, Batch)
from pipeline.errors import AssemblyError, PartitionError
from pipeline.keys import PartitionKeys
from pipeline.storage import retry
from pipeline.output.checkpoint import MARKER_VERSION, CheckpointStore, CommitMarker, verify_files
from pipeline.output.generations import output_of
from pipeline.output.job_lease import check_job_lease
from pipeline.output.lease import AttemptLease
from pipeline.output.sinks.base import WriteResult
from pipeline.stats import AttemptStats
from pipeline.records import Partition, Status
from pipeline.runtime.budget import cut_batch
from pipeline.steps.clips import remove_clip_files

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AttemptOutcome:
    """An attempt's ``marker``, whether it ``committed`` (False: another attempt of the
    partition committed first, and this one deleted its files), and its ``rows`` by typed
    ``(status, reason)`` (for the metrics). ``models``: a worker with its own copies of
    the models (a worker process) adds their statistics so far, one dict per model in
    the form of ``ModelActor.get_stats`` (for the job report). ``first_errors``: the
    first few error rows as ``key: error`` (``AttemptStats.first_errors``), which the
    driver logs."""

    marker: CommitMarker
    committed: bool
    rows: dict[tuple[str, str], int]
    models: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    first_errors: list[str] = dataclasses.field(default_factory=list)


def new_attempt_id() -> str:
    """A random 12-hex-digit attempt id."""
    return uuid.uuid4().hex[:12]


def _start_batch(batch: Batch, partition_id: str) -> Batch:
    """Outcome columns from the datasource's typed read errors."""
    n = len(batch[READ_ERROR])
    batch[PARTITION_ID] = [partition_id] * n
    batch[STATUS] = [Status.OK.value if e is None else Status.ERROR.value
                     for e in batch[READ_ERROR]]
    batch[REJECT_REASON] = [None] * n
    batch[ERROR_REASON] = [None if e is None else e.reason.value for e in batch[READ_ERROR]]
    batch[ERROR] = [None if e is None else str(e) for e in batch[READ_ERROR]]
    return batch


def run_partition(pipeline: Pipeline, partition: Partition, attempt_id: str,
                  pool: ThreadPoolExecutor, ran_on: dict[str, str] | None = None,
                  on_rows: Callable[[int], None] | None = None) -> AttemptOutcome:
    """Run attempt ``attempt_id`` of ``partition`` through ``pipeline`` and commit it.

    ``pool``: threads for reads and row steps. ``ran_on`` (e.g. worker name, Ray node
    id and the driver's ``run_id``) is recorded in the marker. ``on_rows(n)`` is called
    with each batch's row count as it is handed to the datasinks (the worker's progress,
    which the driver polls). The attempt holds a lease
    (``lease.AttemptLease``, renewed every ``runtime.lease_renew_s`` seconds) from before
    its first file until after its commit, so ``mmpipe gc`` spares its files. Before the
    commit it verifies every file it wrote (``checkpoint.verify_files``), that its lease
    has at least a quarter of ``runtime.lease_s`` left and, with a ``run_id``, that the
    run holds the output's job lease (``job_lease.check_job_lease``); any of these failing
    raises ``CommitError``. Raises whatever the datasource, a step, a model or a
    datasink raises (the caller retries the partition), after this attempt's files are
    deleted; ``AssemblyError`` if a step wrote a column it did not declare;
    ``PartitionError`` if the rows written differ from the records read or planned (the
    accounting invariant: such an attempt never commits).
    """
    rt = pipeline.spec.runtime
    run_id = (ran_on or {}).get("run_id", "")
    lease = AttemptLease(pipeline.spec.sink.uri, partition.partition_id, attempt_id,
                         rt.lease_s, rt.lease_renew_s, run_id).start()
    try:
        return _attempt(pipeline, partition, attempt_id, pool, ran_on, lease,
                        on_rows or (lambda n: None))
    finally:
        lease.release()


def _attempt(pipeline: Pipeline, partition: Partition, attempt_id: str,
             pool: ThreadPoolExecutor, ran_on: dict[str, str] | None,
             lease: AttemptLease, on_rows: Callable[[int], None]) -> AttemptOutcome:
    started = time.time()
    pid = partition.partition_id
    spec = pipeline.spec
    stats = AttemptStats()
    schema = pipeline.schema(partition)
    known = pipeline.writes | set(schema.names)
    pending: collections.deque = collections.deque()
    read = 0
    counts: list[int] = []   # rows each input became, in input order
    keys = PartitionKeys()   # clip keys unique in the partition (steps.clips, "Keys")
    for sink in pipeline.datasinks:
        sink.on_write_start(pid, attempt_id, schema)
    try:
        with retry.POLICY.observe(stats):
            for step in pipeline.parts:
                step.start_partition(pid)
            for batch in pipeline.datasource.read_partition(partition, spec.runtime.batch_size,
                                                            pool, stats):
                batch = _start_batch(batch, pid)
                read += len(batch[STATUS])
                for rows in _fan_out(pipeline, batch, counts, keys):
                    for part in cut_batch(rows, pipeline.steps, spec.runtime.max_batch_bytes):
                        _run_steps(pipeline, part, known, pending, stats, on_rows)
            _write_ready(pipeline, pending, stats, 1, on_rows)
            _check_accounting(pid, pipeline.datasource.rows_planned(partition), read,
                              counts, stats.rows_in)
            result = sum((s.on_write_complete() for s in pipeline.datasinks), WriteResult())
    except BaseException as e:
        for sink in pipeline.datasinks:
            sink.on_write_failed(e)
        raise
    marker = _marker(pipeline, partition, attempt_id, result, stats, started, ran_on,
                     counts)
    try:
        _check_commit(pipeline, marker, lease)
    except BaseException as e:
        for sink in pipeline.datasinks:
            sink.on_write_failed(e)
        raise
    committed = CheckpointStore(spec.sink.uri).commit(marker)
    if not committed:
        log.warning("partition %s: another attempt committed first; deleting attempt %s",
                    pid, attempt_id)
        for sink in pipeline.datasinks:
            sink.on_write_failed(None)
    return AttemptOutcome(marker, committed, dict(stats.rows), first_errors=stats.first_errors)


def _fan_out(pipeline: Pipeline, batch: Batch, counts: list[int],
             keys: PartitionKeys) -> Iterator[Batch]:
    """``batch`` as the rows the steps take: its clip rows in bounded sub-batches with a
    clip splitter (``video.clips``; ``keys``: the attempt's), else itself; appends each
    input's row count."""
    if pipeline.splitter is None:
        counts.extend([1] * len(batch[STATUS]))
        yield batch
        return
    yield from pipeline.splitter.split(batch, counts, keys)


def _run_steps(pipeline: Pipeline, batch: Batch, known: set[str],
               pending: collections.deque, stats: AttemptStats,
               on_rows: Callable[[int], None]) -> None:
    """Run the CPU steps over ``batch``, hand it to the models, write what is ready."""
    models = pipeline.models
    for step in pipeline.steps:
        batch = step(batch)
        _check_columns(batch, known, step.name)
    pending.append(models.start(batch))
    models.promote(pending)
    _write_ready(pipeline, pending, stats, models.max_in_flight, on_rows)


def _check_commit(pipeline: Pipeline, marker: CommitMarker, lease: AttemptLease) -> None:
    """Before the marker: its files are intact, the attempt lease has time left, and the
    run (if any) holds the job lease. Raises ``CommitError``."""
    root = pipeline.spec.sink.uri
    verify_files(root, marker)
    run_id = marker.ran_on.get("run_id", "")
    if run_id:
        check_job_lease(output_of(root), run_id, marker.fingerprint)
    lease.check(pipeline.spec.runtime.lease_s / 4)


def _check_accounting(pid: str, planned: int | None, read: int, counts: list[int],
                      written: int) -> None:
    """Every planned input is read, every input becomes >= 1 row (``counts``: rows per
    input, in input order; more than one when a video fans out into clips) and every row
    is written; else raise ``PartitionError`` (the attempt is retried, then reported; it
    never commits)."""
    empty = sum(1 for n in counts if n < 1)
    if (written != sum(counts) or len(counts) != read or empty
            or (planned is not None and read != planned)):
        raise PartitionError(f"partition {pid}: {planned if planned is not None else '?'} "
                             f"inputs planned, {read} read ({len(counts)} counted, {empty} "
                             f"with no row), {sum(counts)} rows made, {written} written; "
                             "not committed")


def _check_columns(batch: Batch, known: set[str], step: str) -> None:
    undeclared = set(batch) - known
    if undeclared:
        raise AssemblyError(f"{step} wrote undeclared columns {sorted(undeclared)}")


def _write_ready(pipeline: Pipeline, pending: collections.deque, stats: AttemptStats,
                 max_in_flight: int, on_rows: Callable[[int], None]) -> None:
    """Write finished batches from the front, and complete the oldest ones until fewer
    than ``max_in_flight`` wait (``1``: all of them)."""
    models = pipeline.models
    while pending and (models.done(pending[0]) or len(pending) >= max_in_flight):
        batch = models.finish(pending.popleft())
        stats.count_rows(batch)
        for sink in pipeline.datasinks:
            sink.write(batch)
        remove_clip_files(batch)
        on_rows(len(batch[STATUS]))


def _marker(pipeline: Pipeline, partition: Partition, attempt_id: str, result: WriteResult,
            stats: AttemptStats, started: float, ran_on: dict[str, str] | None,
            counts: list[int]) -> CommitMarker:
    finished = time.time()
    fanned = pipeline.splitter is not None
    return CommitMarker(
        version=MARKER_VERSION, job=pipeline.spec.name, partition_id=partition.partition_id,
        attempt_id=attempt_id,
        fingerprint=pipeline.fingerprint, files=list(result.files), sha256=result.sha256,
        rows_in=stats.rows_in,
        rows_planned=pipeline.datasource.rows_planned(partition),
        rows_by_status=stats.rows_by_status, rows_by_reason=stats.rows_by_reason,
        rows_by_flag=stats.rows_by_flag,
        bytes_written=result.bytes_written, started_at=started, finished_at=finished,
        duration_s=round(finished - started, 3), mmpipe_version=__version__,
        ran_on=ran_on or {}, retried_requests=stats.retried_requests,
        throttled_requests=stats.throttled_requests,
        downloads=dict(sorted(stats.downloads.items())), settings=pipeline.settings(),
        inputs_read=len(counts), rows_per_input=counts if fanned else [], clips=stats.clips)
