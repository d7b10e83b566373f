"""Job metrics on the Ray dashboard, through ``ray.util.metrics``.

Each process records into Ray's metrics agent on its node, which serves Prometheus text
on the node's ``--metrics-export-port`` (KubeRay: port 8080, named ``metrics``). Ray adds
the prefix ``ray_`` and, for counters, the suffix ``_total``; every series carries Ray's
own labels (``WorkerId``, ``NodeAddress``, ``SessionName``, ...), so sum over them.

Exported names (labels; who records):
- ``ray_mmpipe_records_total`` (job_name, status, reason; worker at commit: equals the markers)
- ``ray_mmpipe_records_flagged_total`` (job_name, flag; worker at commit: the markers'
  ``rows_by_flag``: signal-filter flags, e.g. ``score_only`` would-be reject reasons)
- ``ray_mmpipe_records_read_total``, ``ray_mmpipe_bytes_read_total`` (job_name; worker per batch
  read, every attempt; bytes are media bytes)
- ``ray_mmpipe_bytes_written_total``, ``ray_mmpipe_partitions_committed_total`` (job_name; worker
  at commit)
- ``ray_mmpipe_partition_attempts_failed_total``, ``ray_mmpipe_partitions_failed_total``
  (job_name; driver: every failed attempt, and partitions that used up ``max_attempts``)
- ``ray_mmpipe_partitions_remaining`` gauge (job_name; driver)
- ``ray_mmpipe_worker_records`` gauge (job_name, worker=PartitionWorker-<i>; worker per
  batch written: the records its running attempt has written, 0 when idle)
- ``ray_mmpipe_partition_duration_s`` histogram (job_name, outcome=committed|lost_race|failed;
  worker)
- ``ray_mmpipe_model_batches_in_flight`` gauge (job_name, worker) and
  ``ray_mmpipe_model_batch_roundtrip_s`` histogram (job_name): worker side of the model pool
- ``ray_mmpipe_model_batch_latency_s`` histogram, ``ray_mmpipe_model_records_total``,
  ``ray_mmpipe_model_busy_seconds_total``, ``ray_mmpipe_model_busy_fraction`` gauge over
  the last ``window_s`` (model, actor; ModelActor)

The job label is ``job_name`` (the spec's ``name``): Prometheus keeps ``job`` for its scrape
job. ``reason`` is ``none`` for ok rows, the reject reason (``too_small``, ``duplicate``, ...)
for rejected rows and the error reason (``truncated``, ``not_an_image``, ...) for error rows.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Iterator


PARTITION_BOUNDARIES_S = [0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600]
BATCH_BOUNDARIES_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]

#: name -> (``ray.util.metrics`` class name, description, tag keys, histogram boundaries)
_DEFS: dict[str, tuple[str, str, tuple[str, ...], list[float] | None]] = {
    "mmpipe_records": ("Counter", "Committed records by status and reason.",
                       ("job_name", "status", "reason"), None),
    "mmpipe_records_flagged": ("Counter", "Committed records by signal-filter flag.",
                               ("job_name", "flag"), None),
    "mmpipe_records_read": ("Counter", "Records read (every attempt).", ("job_name",), None),
    "mmpipe_bytes_read": ("Counter", "Media bytes read (every attempt).", ("job_name",), None),
    "mmpipe_bytes_written": ("Counter", "Bytes of committed output files.", ("job_name",), None),
    "mmpipe_partitions_committed": ("Counter", "Partitions committed.", ("job_name",), None),
    "mmpipe_partition_attempts_failed": ("Counter", "Partition attempts that raised or whose "
                                         "worker died.", ("job_name",), None),
    "mmpipe_partitions_failed": ("Counter", "Partitions failed after max_attempts.",
                                 ("job_name",), None),
    "mmpipe_partitions_remaining": ("Gauge", "Partitions of this run not yet committed or "
                                    "failed.", ("job_name",), None),
    "mmpipe_worker_records": ("Gauge", "Records the worker's running attempt has written "
                              "(0: idle).", ("job_name", "worker"), None),
    "mmpipe_partition_duration_s": ("Histogram", "Seconds per partition attempt.",
                                    ("job_name", "outcome"), PARTITION_BOUNDARIES_S),
    "mmpipe_model_batches_in_flight": ("Gauge", "Batches a worker has sent to the model "
                                       "pool and not yet received.", ("job_name", "worker"), None),
    "mmpipe_model_batch_roundtrip_s": ("Histogram", "Seconds from a worker sending a batch "
                                       "to the model pool to its result.", ("job_name",),
                                       BATCH_BOUNDARIES_S),
    "mmpipe_model_batch_latency_s": ("Histogram", "Seconds a model actor computes one batch.",
                                     ("job_name", "model", "actor"), BATCH_BOUNDARIES_S),
    "mmpipe_model_records": ("Counter", "Records run through a model actor.",
                             ("job_name", "model", "actor"), None),
    "mmpipe_model_busy_seconds": ("Counter", "Seconds a model actor spent computing.",
                                  ("job_name", "model", "actor"), None),
    "mmpipe_model_busy_fraction": ("Gauge", "Fraction of the last window a model actor "
                                   "spent computing.", ("job_name", "model", "actor"), None),
}
METRIC_NAMES = tuple(_DEFS)


class _Unrecorded:
    """A metric of a process without Ray (a worker process of the driver's,
    ``runtime.executors``): there is no dashboard to show it, so it records nothing."""

    def inc(self, *args, **kwargs) -> None:
        """Nothing."""

    set = observe = inc


def ray_initialized() -> bool:
    """Whether this process is connected to Ray, without importing Ray (it costs 0.3 s)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@functools.cache
def _ray_metric(name: str):
    from ray.util import metrics as raym

    kind, description, tags, boundaries = _DEFS[name]
    kind = getattr(raym, kind)
    if boundaries is not None:
        return kind(name, description=description, boundaries=boundaries, tag_keys=tags)
    return kind(name, description=description, tag_keys=tags)


def metric(name: str):
    """The process-wide ``ray.util.metrics`` object for ``name`` (created on first use);
    outside Ray one that records nothing (``_Unrecorded``)."""
    return _ray_metric(name) if ray_initialized() else _Unrecorded()


def job_namespace(job: str, run_id: str = "") -> str:
    """The Ray namespace of one run's named actors (``PartitionWorker-3``, ``ModelActor-...``):
    ``mmpipe-<job>-<run_id>`` (``mmpipe-<job>`` without a run id). Short names on the
    dashboard, unique per run, so two runs of the same spec share a cluster side by side."""
    return f"mmpipe-{job}-{run_id}" if run_id else f"mmpipe-{job}"


class WorkerMetrics:
    """What a ``PartitionWorker`` records: reads per batch, outcomes per partition."""

    def __init__(self, job: str, index: int):
        self.tags = {"job_name": job}
        self.worker = f"PartitionWorker-{index}"
        self._in_flight = 0

    def partition_done(self, outcome, duration_s: float) -> None:
        """Record a finished attempt (``runtime.partition.AttemptOutcome``); counts only
        what this attempt committed, rows by their typed ``(status, reason)``."""
        metric("mmpipe_partition_duration_s").observe(
            duration_s, dict(self.tags, outcome="committed" if outcome.committed else "lost_race"))
        if not outcome.committed:
            return
        for (status, reason), n in outcome.rows.items():
            metric("mmpipe_records").inc(n, dict(self.tags, status=status, reason=reason))
        for flag, n in outcome.marker.rows_by_flag.items():
            metric("mmpipe_records_flagged").inc(n, dict(self.tags, flag=flag))
        if outcome.marker.bytes_written:
            metric("mmpipe_bytes_written").inc(outcome.marker.bytes_written, self.tags)
        metric("mmpipe_partitions_committed").inc(1, self.tags)

    def attempt_records(self, records: int) -> None:
        """Set the records this worker's running attempt has written (0: idle)."""
        metric("mmpipe_worker_records").set(records, dict(self.tags, worker=self.worker))

    def partition_failed(self, duration_s: float) -> None:
        metric("mmpipe_partition_duration_s").observe(duration_s,
                                                      dict(self.tags, outcome="failed"))

    def count_reads(self, source) -> "CountingSource":
        return CountingSource(source, self.tags)

    def count_model_calls(self, client) -> "CountingModelClient":
        """Wrap a model client (``submit``/``ready``/``result``); all of this worker's
        clients share one in-flight count."""
        return CountingModelClient(client, self)

    def in_flight(self, delta: int) -> None:
        self._in_flight += delta
        metric("mmpipe_model_batches_in_flight").set(self._in_flight,
                                                      dict(self.tags, worker=self.worker))


class CountingSource:
    """A ``Datasource`` that records records and media bytes read, batch by batch."""

    def __init__(self, source, tags: dict[str, str]):
        self.source, self.tags = source, tags

    def __getattr__(self, name: str):
        return getattr(self.source, name)

    def read_partition(self, partition, batch_size: int, pool, stats=None) -> Iterator[dict]:
        from pipeline.columns import KEY, SOURCE_BYTES

        for batch in self.source.read_partition(partition, batch_size, pool, stats):
            metric("mmpipe_records_read").inc(len(batch[KEY]), self.tags)
            nbytes = sum(len(b) for b in batch.get(SOURCE_BYTES) or [] if b)
            if nbytes:
                metric("mmpipe_bytes_read").inc(nbytes, self.tags)
            yield batch


class CountingModelClient:
    """A worker's model client that records batches in flight and their round trip.
    Its handles are ``(sent_at, inner handle)``."""

    def __init__(self, client, owner: WorkerMetrics):
        self.client, self.owner = client, owner

    def __getattr__(self, name: str):
        return getattr(self.client, name)

    def submit(self, *args, **kwargs):
        handle = self.client.submit(*args, **kwargs)
        self.owner.in_flight(+1)
        return (time.perf_counter(), handle)

    def ready(self, handle) -> bool:
        return self.client.ready(handle[1])

    def result(self, handle):
        sent, inner = handle
        try:
            return self.client.result(inner)
        finally:
            self.owner.in_flight(-1)
            metric("mmpipe_model_batch_roundtrip_s").observe(time.perf_counter() - sent,
                                                             self.owner.tags)


class DriverMetrics:
    """What the driver records: partitions remaining, failed attempts and partitions."""

    def __init__(self, job: str):
        self.tags = {"job_name": job}

    def remaining(self, n: int) -> None:
        metric("mmpipe_partitions_remaining").set(n, self.tags)

    def attempt_failed(self, final: bool) -> None:
        metric("mmpipe_partition_attempts_failed").inc(1, self.tags)
        if final:
            metric("mmpipe_partitions_failed").inc(1, self.tags)


class ModelMetrics:
    """What a ``ModelActor`` records: batch latency, records, busy time and busy fraction.

    ``batch(rows, busy_s)`` after each batch (``on_batch`` has the ``BatchServer`` callback
    signature). A daemon thread refreshes the busy fraction every ``window_s`` seconds, so
    an idle actor shows 0 rather than its last busy value.
    """

    def __init__(self, model: str, actor: str, window_s: float = 5.0, job_name: str = ""):
        self.tags = {"job_name": job_name, "model": model.rstrip("/").rsplit("/", 1)[-1],
                     "actor": actor}
        self.window_s = window_s
        self._lock = threading.Lock()
        self._busy_in_window = 0.0
        self._window_start = time.monotonic()
        threading.Thread(target=self._refresh_loop, name="mmpipe-metrics", daemon=True).start()

    def batch(self, rows: int, busy_s: float) -> None:
        metric("mmpipe_model_batch_latency_s").observe(busy_s, self.tags)
        metric("mmpipe_model_records").inc(rows, self.tags)
        metric("mmpipe_model_busy_seconds").inc(busy_s, self.tags)
        with self._lock:
            self._busy_in_window += busy_s

    def on_batch(self, rows: int, busy_s: float, queue_waits_s: list[float] | None = None) -> None:
        self.batch(rows, busy_s)

    def busy_fraction(self) -> float:
        """Busy seconds over elapsed seconds since the last refresh (0..1); starts a new window."""
        with self._lock:
            now = time.monotonic()
            elapsed = max(1e-9, now - self._window_start)
            fraction = min(1.0, self._busy_in_window / elapsed)
            self._busy_in_window, self._window_start = 0.0, now
        return fraction

    def _refresh_loop(self) -> None:
        while True:
            time.sleep(self.window_s)
            metric("mmpipe_model_busy_fraction").set(self.busy_fraction(), self.tags)


def show_actor_state(actor) -> None:
    """Make ``repr(actor)`` (e.g. ``PartitionWorker-3(p-000042/a-1f2e...)``) the prefix of
    the actor's following log lines. Ray reads ``__repr__`` once, when the actor is
    created; this re-announces it the way Ray itself does (a magic line the log monitor
    consumes), so the dashboard's logs say which partition each worker holds."""
    if not ray_initialized():  # a worker process of the driver's (runtime.executors)
        return
    try:
        from ray._private.ray_constants import LOG_PREFIX_ACTOR_NAME
    except ImportError:  # a Ray without it: keep the creation-time prefix
        return
    token = f"{LOG_PREFIX_ACTOR_NAME}{actor!r}\n"
    for stream in (sys.stdout, sys.stderr):
        stream.write(token)
        stream.flush()
