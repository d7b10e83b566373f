"""The driver: plan, list markers, hand partition ids to workers, report.

The driver holds O(partitions) state and is never on the data path: workers read their
partition's input and write its output themselves. A partition whose attempt raises (or
whose worker dies, or which runs past ``runtime.attempt_timeout_s``: its worker is killed
and replaced) is queued again until ``max_attempts``; then it is reported failed and
the other partitions still complete. An attempt lost to a storage outage (an error
``pipeline.storage.retry`` calls transient or throttling) is queued again after
``OUTAGE_RETRY_S`` without counting, for ``storage.outage_s`` from the partition's first
such loss; a storage request of the driver itself that gives up raises ``StorageError``
(``gave_up``), which ``mmpipe run`` turns into exit 3.
"""

from __future__ import annotations

import collections
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline.assembly import assemble
from pipeline.errors import PartitionError
from pipeline.storage import fs, retry
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.models.registry import check_models
from pipeline.runtime.cost import run_cost
from pipeline.runtime.executors import (ProcessWorkers, RayWorkers, WorkerLost, needs_ray,
                                        new_run_id, planned_workers)
from pipeline.runtime.metrics import DriverMetrics, job_namespace
from pipeline.runtime.partition import AttemptOutcome, new_attempt_id
from pipeline.runtime.output_session import OutputSession, open_output
from pipeline.runtime.preflight import committed_markers
from pipeline.runtime.progress import TICK_S as PROGRESS_TICK_S, Progress
from pipeline.runtime.report import JobReport
from pipeline.runtime.stops import Stopped
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)


def run_job(spec: JobSpec, run_id: str | None = None,
            processes: ProcessWorkers | None = None) -> JobReport:
    """Run a job: its partition workers as Ray actors on the connected Ray cluster
    (``ray.init`` done by the caller), or, given ``processes``, as those worker processes
    of this machine (a job without model stages; no Ray; their run id is the run's).
    ``executors`` says what each runs; both run the same ``PartitionWorker`` and commit
    protocol.

    ``run_id`` (default: ``new_run_id()``) names this run: its actors live in the Ray
    namespace ``mmpipe-<job>-<run_id>``, so runs of the same spec share a cluster; it is
    logged at start and recorded in the report (``_SUCCESS``, ``--report-json``).

    A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM inside ``stops.on_signals``) while partitions
    run kills the workers and model actors and is raised again as ``stops.Stopped``, carrying
    the report so far and the partitions that were in flight.
    """
    t0 = time.time()
    run_id = processes.run_id if processes is not None else run_id or new_run_id()
    if processes is not None and needs_ray(spec):
        raise ValueError(f"worker processes cannot run {', '.join(needs_ray(spec))}: "
                         f"run it on Ray")
    fs.configure(**spec.storage.model_dump())  # first: assembling may read (flagged words)
    pipeline = assemble(spec)  # unbound models: the fingerprint, the datasource, the checks
    # the endpoint and region as resolved here travel in the spec: actors never take
    # them from their node's environment (fs.configure(from_env=False) there)
    spec = spec.model_copy(update={"storage": spec.storage.model_copy(
        update=fs.resolved_storage())})
    check_models(spec)  # fail now, naming the model location, not in an actor
    # the job lease (one writer per output) and the generation to write (overwrite: a new
    # one, the old ones deleted once it is complete); sink.uri becomes its root
    output = open_output(spec, pipeline, run_id)
    try:
        return _run_job(output, pipeline, run_id, t0, processes)
    finally:
        output.close()


def _run_job(output: OutputSession, pipeline, run_id: str, t0: float,
             processes: ProcessWorkers | None) -> JobReport:
    """``run_job`` inside the generation ``output`` writes (``output.spec``). The rows of
    partitions already committed are read on a thread while the others run."""
    spec, fp = output.spec, pipeline.fingerprint
    source = pipeline.datasource
    with ThreadPoolExecutor(1, thread_name_prefix="list-markers") as lister:
        # the marker listing (a resume of 100k partitions: 100 pages) while the plan loads
        listing = lister.submit(committed_markers, spec.sink.uri, pipeline)
        plan, how = planning.load_or_create(
            spec.sink.uri, spec.source, source.list_inputs, source.items_per_partition,
            source.plan_metadata, source.rows_known,
            target_partitions(spec, processes), append=spec.runtime.mode == "append")
        done = listing.result()  # PlanError: another fingerprint
    report = JobReport(spec.name, spec.sink.uri, fp, f"{how}, {len(plan)} partitions",
                       partitions_total=len(plan), inputs=plan.totals(), run_id=run_id)
    report.partitions_skipped.extend(sorted(done))   # from the listing of marker names
    skipped_rows = done.count_in_background()        # their rows: markers read on a thread
    todo = [pid for pid in plan.partition_ids if pid not in done]
    where = (f"Ray namespace {job_namespace(spec.name, run_id)}" if processes is None
             else "worker processes, no Ray")
    log.info("job %s: run %s (%s): %d partitions planned (%s), %d already committed, %d to "
             "run", spec.name, run_id, where, len(plan), how, len(done), len(todo))
    # the progress total in rows: unknown where a video fans out into clip rows
    records = None if plan.rows_total is None or spec.video.clips.enabled else sum(
        n for p, n in zip(plan.partition_ids, plan.rows_planned) if p not in done)
    try:
        if todo:
            _run_partitions(spec, fp, todo, report, records, processes,
                            on_commit=output.tables.committed, on_wait=output.lease.set_state)
    except Stopped:
        raise
    except KeyboardInterrupt:  # SIGINT/SIGTERM (pipeline.runtime.stops): say what is committed
        raise Stopped(report) from None
    finally:
        skipped_rows.add_to(report)
    report.cost = run_cost(spec, report.attempt_s, report.model_actors, report.rows_processed,
                           models_in_workers=processes is not None)
    report.wall_s = time.time() - t0
    if report.complete:
        output.complete(report.to_dict())   # _SUCCESS; older generations deleted
    return report


def target_partitions(spec: JobSpec, processes: ProcessWorkers | None) -> int:
    """The partitions a new plan of a small input is cut into (``output.plan.pack``):
    ``runtime.partitions_per_worker`` times ``planned_workers``; 0 (cut at the size as
    given) when the spec sets ``source.partition_size`` (``shards_per_partition`` for
    WebDataset) itself: only the default size is a cap that a small input goes under."""
    size_field = "shards_per_partition" if spec.source.kind == "webdataset" else "partition_size"
    if size_field in spec.source.model_fields_set:
        return 0
    return spec.runtime.partitions_per_worker * planned_workers(spec, processes)


def _run_partitions(spec: JobSpec, fp: str, todo: list, report: JobReport,
                    records: int | None, processes: ProcessWorkers | None,
                    on_commit=None, on_wait=None) -> None:
    """Run the partitions ``todo`` (``records``: the records they plan, None if unknown;
    ``on_commit(marker)``: called once a partition's marker exists, e.g. the Delta tables'
    ``Publisher.committed``; ``on_wait(line)``: told ``waiting for resources: ...`` while
    the job waits for admission and ``""`` once admitted, e.g. ``JobLease.set_state``).
    On Ray the job is first admitted (``admission.admit``: its minimum as one placement
    group), then its model pools follow the bottleneck (``pool_scaler``).
    Raises ``ResourceWaitError`` if the job's minimum, or any PartitionWorker, finds no
    room within ``runtime.resource_wait_s``."""
    progress = Progress(records, len(todo), spec.runtime.progress_interval_s)  # models load
    pools: list = []
    scheduler = admission = scaler = None

    def waiting(line: str) -> None:
        progress.waiting(line)
        if on_wait is not None:
            on_wait(line)

    try:
        if processes is None:
            from pipeline.runtime.admission import admit  # Ray: only here
            from pipeline.runtime.model_pool import start_model_pools
            from pipeline.runtime.pool_scaler import PoolScaler

            admission = admit(spec, report.run_id, waiting)
            report.admission_wait_s = round(admission.waited_s, 2)
            pools = start_model_pools(spec, report.run_id, admission)
            workers = RayWorkers(spec, fp, pools, report.run_id, admission=admission)
        else:
            workers = processes
            workers.bind(spec, fp)
        scheduler = _Scheduler(spec, todo, report, workers, progress, on_commit)
        if pools:
            scaler = scheduler.scaler = PoolScaler(
                spec, pools, report.run_id, own_group=admission.group,
                push=lambda section, actors: workers.set_replicas(
                    list(scheduler.workers.values()), section, actors))
        scheduler.start_initial()
        scheduler.loop()
        if pools:
            from pipeline.runtime.model_pool import model_stats

            # not after a stop: it waits on them
            report.model_actors = model_stats(pools) + scaler.retired
            report.model_pools = scaler.report()
        else:   # worker processes' own model copies, as of their last attempt
            report.model_actors = [s for worker in sorted(scheduler.model_stats)
                                   for s in scheduler.model_stats[worker]]
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
        if scaler is not None:
            scaler.close()
        if pools:
            from pipeline.runtime.model_pool import stop_model_pools

            stop_model_pools(pools)
        if admission is not None:
            admission.release()


SCALE_TICK_S = 2.0  # seconds between looks at the cluster's free resources


class _Scheduler:
    """Hands partition ids to ready workers and handles each attempt's outcome.

    The pool: ``runtime.num_workers`` fixed workers, else an elastic pool of up to
    ``runtime.max_workers`` (default one per partition remaining): every ``SCALE_TICK_S``
    it asks the autoscaler for a bundle per wanted worker and starts workers the free
    resources hold (nodes that joined mid-job) less what other jobs waiting for admission
    need and within the job's equal share of the growth room (``Admission.room``: fair
    sharing); growth workers beyond that share (a job admitted or waiting since) go as
    soon as they are idle; once the queue is empty, idle workers go.
    The same tick lets ``scaler`` (``pool_scaler.PoolScaler``) resize the model pools.
    A worker is handed work only once its actor is up (its ``ping`` returned), so a
    replacement for a worker lost with its node waits for resources without holding a
    partition hostage; one still unplaced after ``resource_wait_s`` is dropped, or, if no
    worker is up, fails the job (``ResourceWaitError``). A worker death, a raised attempt
    or one running past ``attempt_timeout_s`` (its worker is killed and replaced)
    re-queues the partition until ``max_attempts``; then it is recorded in ``_failures/``
    and the job goes on. A worker that cannot start ``runtime.max_attempts`` times in a
    row (its constructor raises: another mmpipe version, a broken model location) fails
    the job with that error instead of being started for ever.

    ``workers`` (``executors.RayWorkers`` or ``ProcessWorkers``) starts, calls and kills
    the workers; the scheduling is the same for both.
    """

    def __init__(self, spec: JobSpec, todo: list, report: JobReport, workers,
                 progress: Progress, on_commit=None):
        self.spec, self.report, self.backend = spec, report, workers
        self.on_commit = on_commit
        self.fp = workers.fp
        self.store = CheckpointStore(spec.sink.uri)
        self.queue = collections.deque(todo)
        self.attempts: collections.Counter = collections.Counter()
        self.workers: dict[int, Any] = {}
        self.restarts: collections.Counter = collections.Counter()
        self.starting: dict = {}   # ping ObjectRef -> worker index
        self.asked_at: dict[int, float] = {}  # worker index -> when its start was asked
        self.in_flight: dict = {}  # run ObjectRef -> (worker index, partition id, attempt id)
        self.handed_at: dict = {}  # run ObjectRef -> time.monotonic() when handed out
        self.idle: collections.deque = collections.deque()
        self.held: list[tuple[float, str]] = []  # (time.monotonic() to requeue at, pid)
        self.outage_since: dict[str, float] = {}  # pid -> first attempt lost to an outage
        self.progress = progress
        self.metrics = DriverMetrics(spec.name)
        self.start_failures: collections.Counter = collections.Counter()  # in a row, per index
        self.next_index = 0
        self.last_scale = 0.0
        self.model_stats: dict[int, list[dict]] = {}  # worker -> its own models' statistics
        self.last_poll = 0.0
        self.scaler = None   # pool_scaler.PoolScaler: the model pools, every SCALE_TICK_S
        self.shed = 0   # growth workers beyond the fair share (backend.surplus): go when idle

    def wanted(self) -> int:
        """Workers this run can use now: one per partition queued or in flight, capped by
        ``num_workers`` (fixed pool) or ``max_workers``."""
        n = len(self.queue) + len(self.in_flight) + len(self.held)
        cap = self.spec.runtime.num_workers or self.spec.runtime.max_workers
        return min(n, cap) if cap else n

    def start_initial(self) -> None:
        """The first workers: ``num_workers``, else as many as the free resources hold
        (at least one), never more than ``wanted()``."""
        n = self.spec.runtime.num_workers or max(1, self.backend.fits_now())
        for _ in range(min(n, self.wanted())):
            self.start_worker()
        self.last_scale = time.monotonic()
        self.backend.ask(self.wanted())

    def start_worker(self, i: int | None = None) -> None:
        """Start worker ``i`` again (after a death) or, with None, a new one."""
        if i is None:
            i, self.next_index = self.next_index, self.next_index + 1
        restarts = self.restarts[i]
        self.restarts[i] += 1
        self.workers[i] = self.backend.start(i, restarts)
        self.asked_at[i] = time.monotonic()
        self.starting[self.backend.ping(self.workers[i])] = i

    def loop(self) -> None:
        while self.queue or self.in_flight or self.held:
            self.metrics.remaining(len(self.queue) + len(self.in_flight) + len(self.held))
            self._release_held()
            self._scale()
            self._shed_idle()
            while self.queue and self.idle:
                self._dispatch(self.idle.popleft(), self.queue.popleft())
            self._dismiss_idle()
            self._cancel_overdue()
            self._poll_progress()
            ready = self._wait_one()
            if not ready:
                self.progress.tick()
                continue
            ref = ready[0]
            if ref in self.starting:
                self._started(ref)
                continue
            i, pid, attempt = self.in_flight.pop(ref)
            self._attempt_ended(ref)
            try:
                outcome = self.backend.get(ref)
            except Exception as e:  # noqa: BLE001 - a lost worker or the attempt's error
                self._failed(i, pid, attempt, e)
                continue
            self.idle.append(i)
            if outcome is not None and outcome.models:
                self.model_stats[i] = outcome.models
            self._done(pid, outcome)

    def _poll_progress(self, now: bool = False) -> None:
        """Every ``PROGRESS_TICK_S`` (or ``now``): the rows each running attempt has written
        so far (``backend.records``, never waiting) into the progress display, with one
        ``PartitionWorker-<i> p-000042 (<n> records)`` entry per busy worker."""
        if not now and time.monotonic() - self.last_poll < PROGRESS_TICK_S:
            return
        self.last_poll = time.monotonic()
        running = {attempt: (i, pid) for i, pid, attempt in self.in_flight.values()}
        records = self.backend.records({a: self.workers[i] for a, (i, _) in running.items()})
        busy = [f"PartitionWorker-{i} {pid} ({records[a]} records)"
                for a, (i, pid) in sorted(running.items(), key=lambda r: r[1])]
        idle = len(self.workers) - len(busy)
        self.progress.in_flight(sum(records.values()), "; ".join(
            busy + ([f"{idle} idle or starting"] if busy and idle > 0 else [])))

    def _wait_one(self) -> list:
        """The first attempt or worker start that finished within a progress tick."""
        waiting = list(self.in_flight) + list(self.starting)
        if not waiting:  # workers were dropped; _scale starts one at the next turn
            time.sleep(PROGRESS_TICK_S)
            return []
        return self.backend.wait(waiting, PROGRESS_TICK_S)

    def _started(self, ref) -> None:
        i = self.starting.pop(ref)
        try:
            self.backend.get(ref)
        except WorkerLost as e:
            self.start_failures[i] += 1
            if self.start_failures[i] >= self.spec.runtime.max_attempts:
                raise RuntimeError(f"PartitionWorker-{i} could not start "
                                   f"{self.start_failures[i]} times in a row: {e}") from None
            log.warning("worker %d could not start (%s); starting it again", i, _short(e))
            self.start_worker(i)
            return
        self.start_failures[i] = 0
        self.idle.append(i)

    def _scale(self) -> None:
        """Every ``SCALE_TICK_S``: renew the autoscaler demand, time out unplaced
        workers, start the workers the free resources hold (at least one if none)."""
        now = time.monotonic()
        if now - self.last_scale < SCALE_TICK_S and (self.workers or not self.queue):
            return
        self.last_scale = now
        if self.scaler is not None:
            self.scaler.tick()
        wanted = self.wanted()
        self.backend.ask(wanted)
        self.shed = self.backend.surplus()
        self._check_waits(now)
        missing = wanted - len(self.workers)
        if missing <= 0 or not self.queue:
            return
        n = min(missing, self.backend.fits_now() - len(self.starting))
        if n > 0:
            log.info("starting %d more partition worker%s (free: %s)", n, "s"[:n - 1],
                     self.backend.free())
        for _ in range(max(n, 0 if self.workers else 1)):
            self.start_worker()

    def _check_waits(self, now: float) -> None:
        """Drop workers unplaced for ``resource_wait_s``; raise if no worker is up."""
        limit = self.spec.runtime.resource_wait_s
        for ref, i in list(self.starting.items()):
            if now - self.asked_at[i] < limit or not self.backend.unplaced(self.workers[i]):
                continue
            if len(self.workers) == len(self.starting):  # none up: the job cannot go on
                raise self.backend.wait_error(i, limit)
            log.info("PartitionWorker-%d found no room in %g s; going on without it", i, limit)
            self._drop(i, ref)

    def _shed_idle(self) -> None:
        """Let idle growth workers go while the job holds more than its fair share of the
        cluster (``self.shed``, from ``backend.surplus`` every ``SCALE_TICK_S``): another
        job was admitted or waits for its minimum since they started."""
        for i in [i for i in self.idle if self.backend.is_growth(i)][:max(self.shed, 0)]:
            self.idle.remove(i)
            self._drop(i)
            self.shed -= 1
            log.info("PartitionWorker-%d goes: beyond this job's fair share of the cluster "
                     "(another job waits or was admitted)", i)

    def _release_held(self) -> None:
        """Queue again the partitions held back after a storage outage whose wait is over."""
        now = time.monotonic()
        for item in [h for h in self.held if h[0] <= now]:
            self.held.remove(item)
            self.queue.append(item[1])

    def _dismiss_idle(self) -> None:
        """With the queue empty (and nothing held back), let idle (and not yet started)
        workers go."""
        if self.queue or self.held:
            return
        while self.idle:
            self._drop(self.idle.popleft())
        for ref, i in list(self.starting.items()):
            self._drop(i, ref)

    def _drop(self, i: int, starting_ref=None) -> None:
        if starting_ref is not None:
            self.starting.pop(starting_ref, None)
        self.backend.kill(self.workers.pop(i))

    def _dispatch(self, i: int, pid: str) -> None:
        attempt = new_attempt_id()
        self.attempts[pid] += 1
        self.report.attempts.setdefault(pid, []).append(attempt)
        ref = self.backend.run(self.workers[i], pid, attempt)
        self.in_flight[ref] = (i, pid, attempt)
        self.handed_at[ref] = time.monotonic()

    def _cancel_overdue(self) -> None:
        """Cancel attempts running longer than ``runtime.attempt_timeout_s``: kill the
        worker (a hung attempt may never return), start a replacement, and count the
        attempt as failed (retried until ``max_attempts``, then reported)."""
        limit = self.spec.runtime.attempt_timeout_s
        now = time.monotonic()
        for ref, (i, pid, attempt) in list(self.in_flight.items()):
            if now - self.handed_at.get(ref, now) <= limit:
                continue
            del self.in_flight[ref]
            self._attempt_ended(ref)
            self.backend.kill(self.workers[i])
            self._failed(i, pid, attempt, AttemptTimeout(
                f"partition {pid} attempt {attempt} ran longer than "
                f"runtime.attempt_timeout_s={limit:g} s; cancelled"))

    def _attempt_ended(self, ref) -> None:
        """Add the wall time of the attempt ``ref`` (hand-out to outcome) to the report's
        ``attempt_s`` (the partition workers' cost, ``runtime.cost``)."""
        handed = self.handed_at.pop(ref, None)
        if handed is not None:
            self.report.attempt_s += time.monotonic() - handed

    def _done(self, pid: str, outcome: AttemptOutcome | None) -> None:
        """Count the partition's marker: this outcome's, or - if it lost the commit race
        (or there is no outcome: its worker died after a zombie committed) - the stored one."""
        marker = outcome.marker if outcome is not None and outcome.committed else self.store.marker(pid)
        # an attempt of this run (a zombie of a lost worker included) committed it
        this_run = marker.attempt_id in self.report.attempts.get(pid, [])
        self.report.add_marker(marker, this_run=this_run)
        if outcome is not None and outcome.committed:
            _log_errors(pid, outcome)
        self._poll_progress(now=True)     # its records leave the in-flight count ...
        self.progress.update(pid, marker.rows_in)   # ... and join the finished ones
        if self.on_commit is not None:
            self.on_commit(marker)

    def _failed(self, i: int, pid: str, attempt: str, e: BaseException) -> None:
        if isinstance(e, WorkerLost):
            log.warning("worker %d died during %s/a-%s; starting a new one", i, pid, attempt)
            self.start_worker(i)
        elif isinstance(e, AttemptTimeout):
            log.warning("worker %d killed: %s; starting a new one", i, e)
            self.start_worker(i)
        else:
            self.idle.append(i)
        outage = self._outage_retry(pid, e)
        final = not outage and self.attempts[pid] >= self.spec.runtime.max_attempts
        self.metrics.attempt_failed(final=final)
        if self.store.marker(pid) is not None:  # a zombie attempt committed it meanwhile
            self._done(pid, None)
        elif outage:
            log.warning("partition %s attempt %s failed on a storage outage (%s); retrying "
                        "in %g s, not counted against runtime.max_attempts", pid, attempt,
                        _short(e), OUTAGE_RETRY_S)
            self.held.append((time.monotonic() + OUTAGE_RETRY_S, pid))
        elif not final:
            log.warning("partition %s attempt %s failed (%s); retrying", pid, attempt, _short(e))
            self.queue.append(pid)
        else:
            log.error("partition %s failed after %d attempts: %s", pid, self.attempts[pid], _short(e))
            self.report.partitions_failed[pid] = _short(e)
            self.store.record_failure(pid, {
                "partition_id": pid, "error": _short(e), "attempts": self.report.attempts[pid],
                "fingerprint": self.fp, "failed_at": time.time()})
            self._poll_progress(now=True)
            self.progress.update(pid, 0)

    def _outage_retry(self, pid: str, e: BaseException) -> bool:
        """True if the attempt of ``pid`` failed on a storage outage (an error
        ``pipeline.storage.retry`` calls transient or throttling, or one that gave up)
        that began less than ``storage.outage_s`` ago for this partition: it is retried
        without counting against ``runtime.max_attempts``. Any other outcome ends the
        partition's outage clock."""
        if not _is_storage_outage(e):
            self.outage_since.pop(pid, None)
            return False
        since = self.outage_since.setdefault(pid, time.monotonic())
        if time.monotonic() - since >= self.spec.storage.outage_s:
            return False
        self.attempts[pid] -= 1
        return True

    def close(self) -> None:
        """Kill the workers and clear this run's demand on the autoscaler."""
        self.metrics.remaining(len(self.queue) + len(self.in_flight))
        for w in self.workers.values():
            self.backend.kill(w)
        self.backend.close()


OUTAGE_RETRY_S = 5.0  # seconds before a partition lost to a storage outage is queued again


def _log_errors(pid: str, outcome: AttemptOutcome) -> None:
    """One WARNING line for a committed partition with error rows: how many by reason and
    the first few (``key: error``), in the driver's log (the dashboard's job log for a
    submitted job; ``ray_mmpipe_records_total{status="error"}`` counts them by reason)."""
    errors = {reason: n for (status, reason), n in sorted(outcome.rows.items())
              if status == "error"}
    if errors:
        log.warning("partition %s: %d error rows (%s), e.g. %s; their rows are in the "
                    "quarantine output", pid, sum(errors.values()),
                    ", ".join(f"{r}: {n}" for r, n in errors.items()),
                    " | ".join(outcome.first_errors) or "?")


def _is_storage_outage(e: BaseException) -> bool:
    """Whether an attempt's error (a ``RayTaskError``'s cause, and what that was raised
    from) is a storage outage: ``retry.classify`` says transient or throttle, or a
    ``StorageError`` gave up (``gave_up``). A dead worker or a timeout is not."""
    if isinstance(e, (WorkerLost, AttemptTimeout)):
        return False
    cause: BaseException | None = _cause(e)
    seen = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if getattr(cause, "gave_up", False) or retry.classify(cause) != "permanent":
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _cause(e: BaseException) -> BaseException:
    """A ``RayTaskError``'s cause (the exception the actor raised), else ``e``. Ray is
    looked up, not imported: a run on worker processes never loads it."""
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is not None and isinstance(e, ray_exceptions.RayTaskError) and e.cause:
        return e.cause
    return e


class AttemptTimeout(PartitionError):
    """A partition attempt ran past ``runtime.attempt_timeout_s`` and was cancelled."""


def _short(e: BaseException) -> str:
    text = str(_cause(e))
    return text.strip().splitlines()[-1][:500] if text.strip() else type(e).__name__
