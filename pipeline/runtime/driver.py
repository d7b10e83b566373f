"""The driver: plan, list markers, hand partition ids to workers, report.

The driver holds O(partitions) state and is never on the data path: workers read their
partition's input and write its output themselves. A partition whose attempt raises (or
whose worker dies) is queued again until ``max_attempts``; then it is reported failed and
the other partitions still complete.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from pipeline.assembly import assemble
from pipeline.io import fs, plan as planning
from pipeline.io.checkpoint import CheckpointStore
from pipeline.models.registry import check_models
from pipeline.runtime.metrics import DriverMetrics, job_namespace
from pipeline.runtime.model_pool import (model_stats, reserved_cpus, start_model_pools,
                                         stop_model_pools)
from pipeline.runtime.partition import AttemptOutcome, new_attempt_id
from pipeline.runtime.preflight import check_empty, committed_markers
from pipeline.runtime.progress import TICK_S as PROGRESS_TICK_S, Progress
from pipeline.runtime.report import JobReport
from pipeline.runtime.stops import Stopped
from pipeline.runtime.worker import PartitionWorker
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)


def prepare_output(spec: JobSpec) -> None:
    """Apply ``runtime.mode`` to the output location. Raises ``PlanError``."""
    out = spec.sink.uri
    if spec.runtime.mode == "overwrite":
        fs.delete_tree(out)
    elif spec.runtime.mode == "error-if-exists":
        check_empty(out)


def default_workers(spec: JobSpec) -> int:
    """Cluster CPUs minus those reserved for model actors, at least 1."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, int(cpus - reserved_cpus(spec)))


def run_job(spec: JobSpec) -> JobReport:
    """Run a job on the connected Ray cluster (``ray.init`` done by the caller).

    A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM inside ``stops.on_signals``) while partitions
    run kills the workers and model actors and is raised again as ``stops.Stopped``, carrying
    the report so far and the partitions that were in flight.
    """
    t0 = time.time()
    pipeline = assemble(spec)  # unbound models: the fingerprint, the datasource, the checks
    fp = pipeline.fingerprint
    fs.configure(**spec.storage.model_dump())
    check_models(spec)  # fail now, naming the model location, not in an actor
    prepare_output(spec)
    source = pipeline.datasource
    plan, how = planning.load_or_create(spec.sink.uri, spec.source, source.list_inputs,
                                        source.items_per_partition, source.plan_metadata,
                                        source.rows_known)
    store = CheckpointStore(spec.sink.uri)
    done = committed_markers(spec.sink.uri, pipeline)  # PlanError: another fingerprint
    report = JobReport(spec.name, spec.sink.uri, fp, f"{how}, {len(plan)} partitions",
                       partitions_total=len(plan), inputs=plan.totals())
    for pid in sorted(done):
        report.add_marker(done[pid], this_run=False)
    todo = [pid for pid in plan.partition_ids if pid not in done]
    log.info("job %s: %d partitions planned (%s), %d already committed, %d to run",
             spec.name, len(plan), how, len(done), len(todo))
    planned = dict(zip(plan.partition_ids, plan.rows_planned))
    records = None if plan.rows_total is None else sum(planned[p] for p in todo)
    try:
        if todo:
            _run_partitions(spec, fp, todo, report, records)
    except Stopped:
        raise
    except KeyboardInterrupt:  # SIGINT/SIGTERM (pipeline.runtime.stops): say what is committed
        raise Stopped(report) from None
    report.wall_s = time.time() - t0
    if report.complete:
        store.write_success(report.to_dict())
    return report


def _start_worker(spec: JobSpec, fp: str, index: int, pools: list, restarts: int = 0):
    name = f"PartitionWorker-{index}" + (f"-r{restarts}" if restarts else "")
    return PartitionWorker.options(name=name,
                                   namespace=job_namespace(spec.name),
                                   num_cpus=1).remote(spec.model_dump_json(), fp, index, pools)


def _run_partitions(spec: JobSpec, fp: str, todo: list, report: JobReport,
                    records: int | None = None) -> None:
    """Run the partitions ``todo`` (``records``: the records they plan, None if unknown)."""
    progress = Progress(records, len(todo), spec.runtime.progress_interval_s)  # models load
    pools: list = []
    scheduler = None
    try:
        pools = start_model_pools(spec)
        n_workers = min(len(todo), spec.runtime.num_workers or default_workers(spec))
        scheduler = _Scheduler(spec, fp, todo, report, pools, progress)
        for i in range(n_workers):
            scheduler.start_worker(i)
        scheduler.loop()
        report.model_actors = model_stats(pools)  # not after a stop: it waits on the actors
    except KeyboardInterrupt:  # a stop: the partitions in flight may still have committed
        # every partition handed out and not yet counted (the stop may come between taking
        # a finished attempt off the in-flight list and counting its marker)
        counted = (set(report.partitions_committed) | set(report.partitions_skipped)
                   | set(report.partitions_failed))
        raise Stopped(report, [p for p in report.attempts if p not in counted]) from None
    finally:
        if scheduler is not None:
            scheduler.close()
        progress.close()
        stop_model_pools(pools)


class _Scheduler:
    """Hands partition ids to ready workers and handles each attempt's outcome.

    A worker is handed work only once its actor is up (its ``ping`` returned), so a
    replacement for a worker lost with its node waits for resources without holding a
    partition hostage. A worker death or a raised attempt re-queues the partition until
    ``max_attempts``; then it is recorded in ``_failures/`` and the job goes on.
    """

    def __init__(self, spec: JobSpec, fp: str, todo: list, report: JobReport, pools: list,
                 progress: Progress):
        self.spec, self.fp, self.report, self.pools = spec, fp, report, pools
        self.store = CheckpointStore(spec.sink.uri)
        self.queue = collections.deque(todo)
        self.attempts: collections.Counter = collections.Counter()
        self.workers: dict[int, Any] = {}
        self.restarts: collections.Counter = collections.Counter()
        self.starting: dict = {}   # ping ObjectRef -> worker index
        self.in_flight: dict = {}  # run ObjectRef -> (worker index, partition id, attempt id)
        self.idle: collections.deque = collections.deque()
        self.progress = progress
        self.metrics = DriverMetrics(spec.name)

    def start_worker(self, i: int) -> None:
        restarts = self.restarts[i]
        self.restarts[i] += 1
        self.workers[i] = _start_worker(self.spec, self.fp, i, self.pools, restarts)
        self.starting[self.workers[i].ping.remote()] = i

    def loop(self) -> None:
        while self.queue or self.in_flight:
            self.metrics.remaining(len(self.queue) + len(self.in_flight))
            while self.queue and self.idle:
                self._dispatch(self.idle.popleft(), self.queue.popleft())
            ready, _ = ray.wait(list(self.in_flight) + list(self.starting), num_returns=1,
                                timeout=PROGRESS_TICK_S)
            if not ready:
                self.progress.tick()
                continue
            ref = ready[0]
            if ref in self.starting:
                i = self.starting.pop(ref)
                try:
                    ray.get(ref)
                    self.idle.append(i)
                except RayActorError:
                    log.warning("worker %d could not start; starting it again", i)
                    self.start_worker(i)
                continue
            i, pid, attempt = self.in_flight.pop(ref)
            try:
                outcome = ray.get(ref)
            except (RayActorError, RayTaskError) as e:
                self._failed(i, pid, attempt, e)
                continue
            self.idle.append(i)
            self._done(pid, outcome)

    def _dispatch(self, i: int, pid: str) -> None:
        attempt = new_attempt_id()
        self.attempts[pid] += 1
        self.report.attempts.setdefault(pid, []).append(attempt)
        task = self.workers[i].run.options(name="PartitionWorker.run")  # bounded metric series
        self.in_flight[task.remote(pid, attempt)] = (i, pid, attempt)

    def _done(self, pid: str, outcome: AttemptOutcome | None) -> None:
        """Count the partition's marker: this outcome's, or - if it lost the commit race
        (or there is no outcome: its worker died after a zombie committed) - the stored one."""
        marker = outcome.marker if outcome is not None and outcome.committed else self.store.marker(pid)
        # an attempt of this run (a zombie of a lost worker included) committed it
        this_run = marker.attempt_id in self.report.attempts.get(pid, [])
        self.report.add_marker(marker, this_run=this_run)
        self.progress.update(pid, marker.rows_in)

    def _failed(self, i: int, pid: str, attempt: str, e: BaseException) -> None:
        if isinstance(e, RayActorError):
            log.warning("worker %d died during %s/a-%s; starting a new one", i, pid, attempt)
            self.start_worker(i)
        else:
            self.idle.append(i)
        final = self.attempts[pid] >= self.spec.runtime.max_attempts
        self.metrics.attempt_failed(final=final)
        if self.store.marker(pid) is not None:  # a zombie attempt committed it meanwhile
            self._done(pid, None)
        elif not final:
            log.warning("partition %s attempt %s failed (%s); retrying", pid, attempt, _short(e))
            self.queue.append(pid)
        else:
            log.error("partition %s failed after %d attempts: %s", pid, self.attempts[pid], _short(e))
            self.report.partitions_failed[pid] = _short(e)
            self.store.record_failure(pid, {
                "partition_id": pid, "error": _short(e), "attempts": self.report.attempts[pid],
                "fingerprint": self.fp, "failed_at": time.time()})
            self.progress.update(pid, 0)

    def close(self) -> None:
        self.metrics.remaining(len(self.queue) + len(self.in_flight))
        for w in self.workers.values():
            ray.kill(w)


def _short(e: BaseException) -> str:
    text = str(e.cause) if isinstance(e, RayTaskError) and e.cause else str(e)
    return text.strip().splitlines()[-1][:500] if text.strip() else type(e).__name__
