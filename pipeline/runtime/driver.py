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
from pipeline.errors import PlanError
from pipeline.io import fs, plan as planning
from pipeline.io.checkpoint import CheckpointStore, CommitMarker
from pipeline.models.registry import check_models
from pipeline.runtime.metrics import DriverMetrics, job_namespace
from pipeline.runtime.model_pool import (model_stats, reserved_cpus, start_model_pools,
                                         stop_model_pools)
from pipeline.runtime.partition import AttemptOutcome, new_attempt_id
from pipeline.runtime.progress import Progress
from pipeline.runtime.report import JobReport
from pipeline.runtime.worker import PartitionWorker
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)


def prepare_output(spec: JobSpec) -> None:
    """Apply ``runtime.mode`` to the output location. Raises ``PlanError``."""
    out = spec.sink.uri
    if spec.runtime.mode == "overwrite":
        fs.delete_tree(out)
    elif spec.runtime.mode == "error-if-exists" and any(True for _ in fs.list_files(out)):
        raise PlanError(f"sink.uri {out!r} is not empty and runtime.mode is error-if-exists")


def default_workers(spec: JobSpec) -> int:
    """Cluster CPUs minus those reserved for model actors, at least 1."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, int(cpus - reserved_cpus(spec)))


def run_job(spec: JobSpec) -> JobReport:
    """Run a job on the connected Ray cluster (``ray.init`` done by the caller)."""
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
    done, foreign = store.committed(fp)
    if foreign:
        raise PlanError(foreign_output_message(spec.sink.uri, foreign, fp, pipeline.settings()))
    report = JobReport(spec.name, spec.sink.uri, fp, f"{how}, {len(plan)} partitions",
                       partitions_total=len(plan), inputs=plan.totals())
    for pid in sorted(done):
        report.add_marker(done[pid], this_run=False)
    todo = [pid for pid in plan.partition_ids if pid not in done]
    log.info("job %s: %d partitions planned (%s), %d already committed, %d to run",
             spec.name, len(plan), how, len(done), len(todo))
    if todo:
        _run_partitions(spec, fp, todo, report)
    report.wall_s = time.time() - t0
    if report.complete:
        store.write_success(report.to_dict())
    return report


def _start_worker(spec: JobSpec, fp: str, index: int, pools: list, restarts: int = 0):
    name = f"PartitionWorker-{index}" + (f"-r{restarts}" if restarts else "")
    return PartitionWorker.options(name=name,
                                   namespace=job_namespace(spec.name),
                                   num_cpus=1).remote(spec.model_dump_json(), fp, index, pools)


def _run_partitions(spec: JobSpec, fp: str, todo: list, report: JobReport) -> None:
    pools = start_model_pools(spec)
    n_workers = min(len(todo), spec.runtime.num_workers or default_workers(spec))
    scheduler = _Scheduler(spec, fp, todo, report, pools)
    try:
        for i in range(n_workers):
            scheduler.start_worker(i)
        scheduler.loop()
    finally:
        scheduler.close()
        report.model_actors = model_stats(pools)
        stop_model_pools(pools)


class _Scheduler:
    """Hands partition ids to ready workers and handles each attempt's outcome.

    A worker is handed work only once its actor is up (its ``ping`` returned), so a
    replacement for a worker lost with its node waits for resources without holding a
    partition hostage. A worker death or a raised attempt re-queues the partition until
    ``max_attempts``; then it is recorded in ``_failures/`` and the job goes on.
    """

    def __init__(self, spec: JobSpec, fp: str, todo: list, report: JobReport, pools: list):
        self.spec, self.fp, self.report, self.pools = spec, fp, report, pools
        self.store = CheckpointStore(spec.sink.uri)
        self.queue = collections.deque(todo)
        self.attempts: collections.Counter = collections.Counter()
        self.workers: dict[int, Any] = {}
        self.restarts: collections.Counter = collections.Counter()
        self.starting: dict = {}   # ping ObjectRef -> worker index
        self.in_flight: dict = {}  # run ObjectRef -> (worker index, partition id, attempt id)
        self.idle: collections.deque = collections.deque()
        self.progress = Progress(len(todo), spec.runtime.progress_interval_s)
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
            ready, _ = ray.wait(list(self.in_flight) + list(self.starting), num_returns=1)
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
        task = self.workers[i].run.options(name=f"PartitionWorker-{i}.run({pid}/a-{attempt})")
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
        self.progress.close()
        for w in self.workers.values():
            ray.kill(w)


def foreign_output_message(output_uri: str, foreign: dict[str, CommitMarker], fingerprint: str,
                           settings: dict) -> str:
    """Why an output committed under another fingerprint is refused: how many partitions,
    which settings differ (from the markers' ``settings``), and what to do."""
    marker = foreign[min(foreign)]
    if marker.settings:
        changed = _diff(marker.settings, settings)
        why = "; settings changed: " + ", ".join(changed[:8]) + (
            f" (and {len(changed) - 8} more)" if len(changed) > 8 else "")
    else:
        why = (f"; they were written by mmpipe {marker.mmpipe_version or '< 0.1'} (commit "
               f"marker version {marker.version}), whose fingerprint covers other settings")
    return (f"{output_uri}: {len(foreign)} partitions were committed under another spec "
            f"fingerprint ({marker.fingerprint}; this spec has {fingerprint}){why}. Resuming "
            "would mix two outputs: use --mode overwrite or a new output location")


def _diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths where two settings trees differ, with old -> new values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new))
                for d in _diff(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in _diff(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def _short(e: BaseException) -> str:
    text = str(e.cause) if isinstance(e, RayTaskError) and e.cause else str(e)
    return text.strip().splitlines()[-1][:500] if text.strip() else type(e).__name__
