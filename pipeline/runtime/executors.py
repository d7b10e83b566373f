"""Where the driver's ``PartitionWorker``s run: Ray actors, or plain processes on this machine.

The driver's scheduler (``driver._Scheduler``: queue, retries, timeouts, outages, the
failure record) is one mechanism; it starts, calls, waits on and kills workers through one
of these two backends, which offer the same handful of operations:

- ``RayWorkers``: each worker a Ray actor (``PartitionWorker`` under ``ray.remote``), named
  ``PartitionWorker-<i>`` in the run's namespace, placed by Ray on any node with one CPU and
  ``runtime.worker_resources`` free; model stages are Ray actor pools the workers call.
  The engine for clusters, model stages, the dashboard and the dataset-wide dedup pass.
- ``ProcessWorkers``: each worker a child process of the driver (``multiprocessing``,
  ``forkserver`` where the platform has it, else ``spawn``), talking over a pipe; no Ray
  is started. For a local job it removes Ray's
  fixed cost (about 2.5 s of ``ray.init`` and 1.2 s of ``ray.shutdown`` on a 2-core
  machine, bench/peers.py; 5-6 s with a model stage, bench/throughput.py) while every
  partition still runs the same ``PartitionWorker`` code and commit protocol. One worker
  per CPU this process may run on (``os.sched_getaffinity``), each capped to one CPU's
  threads; a job with CPU model stages loads each model in every worker process
  (``models.local``: a ``BatchServer`` in the worker's own threads, as the plain loop
  does), so memory grows with the workers by one copy of each model. ``needs_ray`` names
  what only Ray runs.

A call returns a *ref*; ``wait(refs, timeout)`` returns those that finished and ``get(ref)``
their value, raising ``WorkerLost`` when the worker died (a killed process, a lost node,
a constructor that raised) and the attempt's own error otherwise (a ``RayTaskError`` from
Ray, the original exception from a process). ``records(calls)`` says, without waiting,
how many rows each running attempt has written so far (the driver's progress per batch):
a Ray actor answers a ``status`` call from its own concurrency group while ``run`` works
(one outstanding per actor; without task events, so these calls never crowd the
dashboard's task tables nor Ray's task event store); a worker process keeps the count in
a shared ``multiprocessing.Value``.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import tempfile
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0  # seconds to wait for a killed worker process to be reaped
EXIT_GRACE_S = 2.0  # seconds a worker process whose pipe was closed has to exit by itself


def new_run_id() -> str:
    """A fresh run id: 8 hex digits, unique per ``run_job`` call in practice."""
    return uuid.uuid4().hex[:8]


def needs_ray(spec) -> list[str]:
    """The spec's settings that worker processes cannot honour, each as ``field=value``:
    a model section on GPUs (``num_gpus`` > 0: GPU model actors are shared by the
    workers) and the dataset-wide dedup pass (Ray tasks). Empty: the job may run on
    ``ProcessWorkers``, each worker with its own CPU copy of every enabled model."""
    from pipeline.models.registry import enabled_sections

    return [*(f"{s}.num_gpus={getattr(spec, s).num_gpus:g}" for s in enabled_sections(spec)
              if getattr(spec, s).num_gpus > 0),
            *(["dedup.dataset.enabled=true"] if spec.dedup.dataset.enabled else [])]


def planned_workers(spec, processes: ProcessWorkers | None) -> int:
    """How many PartitionWorkers a run plans for (the plan's cut by
    ``runtime.partitions_per_worker``, the worker processes spawned ahead):
    ``runtime.num_workers``, else the worker processes' CPUs or the Ray cluster's CPUs
    (one per worker, as ``RayWorkers`` asks), capped by ``runtime.max_workers``."""
    rt = spec.runtime
    if rt.num_workers:
        return rt.num_workers
    if processes is not None:
        n = processes.capacity
    else:
        import ray

        n = int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(n, rt.max_workers or n))


@functools.cache
def remote_worker():
    """``PartitionWorker`` as a Ray actor class (``ray.remote``), made once; worker.py
    does not import Ray, so worker processes never load it."""
    import ray

    from pipeline.runtime.worker import PartitionWorker

    return ray.remote(concurrency_groups={STATUS_GROUP: 1})(PartitionWorker)


STATUS_GROUP = "status"  # the actor's concurrency group for status(), apart from run()
PARTITION_TASK_NAMES_ENV = "MMPIPE_PARTITION_TASK_NAMES"  # "1": tasks named by partition
POLL_WAIT_S = 0.1  # seconds records() waits for the actors' status answers


class WorkerLost(Exception):
    """A partition worker died (its process exited or was killed, its node was lost, or
    its constructor raised) before answering a call."""


class RayWorkers:
    """Partition workers as Ray actors (the caller did ``ray.init``).

    ``spec`` and ``fingerprint`` as the driver has them, ``pools`` the started model pools,
    ``run_id`` names the namespace ``mmpipe-<job>-<run id>``. Each attempt is a task named
    ``PartitionWorker.run`` (one name for every partition: Ray labels its ``ray_tasks``
    series by task name, so they stay bounded on a long-lived cluster); with
    ``partition_task_names`` (``PARTITION_TASK_NAMES_ENV=1``: set by ``mmpipe run
    --dashboard`` for the local head that lives only for its run) it is named
    ``p-000042 a-<attempt>``, so the dashboard's task tables say which partition each
    worker holds. With ``admission`` (the job's admitted placement group), one worker
    at a time takes the group's PartitionWorker bundle, and growth beyond it takes only
    ``Admission.room`` resources (fair sharing: beyond other jobs' waiting minimums,
    within this job's equal share of the growth room)."""

    def __init__(self, spec, fingerprint: str, pools: list, run_id: str,
                 partition_task_names: bool | None = None, admission=None):
        from pipeline.runtime.model_pool import actor_request

        self.spec, self.fp, self.pools, self.run_id = spec, fingerprint, pools, run_id
        # the job's placement group (admission.Admission): one worker at a time runs in
        # its PartitionWorker bundle (``bundle_index``), the others as resources allow
        self.admission = admission
        self.bundle_index: int | None = None
        self.bundle_actor = None
        self.grown: dict[int, object] = {}   # worker index -> actor id, outside the group
        self.request = actor_request(1, 0, spec.runtime.worker_resources)
        self.partition_task_names = (os.environ.get(PARTITION_TASK_NAMES_ENV) == "1"
                                     if partition_task_names is None else partition_task_names)
        self._polls: dict = {}      # actor id -> its outstanding status() ref
        self._records: dict[str, int] = {}   # attempt id -> rows written, last answer

    def start(self, index: int, restarts: int = 0):
        """Ask Ray for worker ``index`` (``-r<n>`` after ``n`` restarts); returns its handle."""
        from pipeline.runtime.metrics import job_namespace

        from pipeline.runtime.admission import WORKER

        name = f"PartitionWorker-{index}" + (f"-r{restarts}" if restarts else "")
        strategy = None
        if self.admission is not None and self.bundle_index in (None, index):
            strategy, self.bundle_index = self.admission.strategy(WORKER), index
        handle = remote_worker().options(
            name=name, namespace=job_namespace(self.spec.name, self.run_id), num_cpus=1,
            resources=dict(self.spec.runtime.worker_resources), scheduling_strategy=strategy,
        ).remote(self.spec.model_dump_json(), self.fp, index, self.pools, self.run_id)
        if strategy is not None:
            self.bundle_actor = handle._actor_id   # noqa: SLF001 - see records()
            if self.grown.pop(index, None) is not None:   # a growth index took the bundle
                self.admission.took(self.request, -1)
        elif self.admission is not None:
            if index not in self.grown:   # not a replacement of a lost growth worker
                self.admission.took(self.request)
            self.grown[index] = handle._actor_id   # noqa: SLF001
        return handle

    def ping(self, handle):
        """A ref that is ready once the worker is up."""
        return handle.ping.remote()

    def run(self, handle, partition_id: str, attempt_id: str):
        """A ref to the worker's attempt of ``partition_id`` (its task name: see the class)."""
        name = (f"{partition_id} a-{attempt_id}" if self.partition_task_names
                else "PartitionWorker.run")
        return handle.run.options(name=name).remote(partition_id, attempt_id)

    def records(self, calls: dict) -> dict[str, int]:
        """Rows written so far by each running attempt, ``{attempt id: worker handle}``
        -> ``{attempt id: rows}``: each actor is asked (``status``, unless an earlier ask
        is still out) and the answers back within ``POLL_WAIT_S`` are read; an attempt
        whose actor has not answered yet keeps its last count (0 before the first)."""
        import ray

        for handle in calls.values():
            key = handle._actor_id   # noqa: SLF001 - a handle's only hashable identity
            if key not in self._polls:
                self._polls[key] = handle.status.options(   # no task events: one a second
                    concurrency_group=STATUS_GROUP, enable_task_events=False).remote()
        by_ref = {ref: key for key, ref in self._polls.items()}
        ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=POLL_WAIT_S)
        for ref in ready:
            del self._polls[by_ref[ref]]
            try:
                status = ray.get(ref)
            except Exception:  # noqa: BLE001 - a dead actor: the scheduler sees it
                continue
            self._records[status["attempt"]] = status["records"]
        self._records = {a: n for a, n in self._records.items() if a in calls}
        return {a: self._records.get(a, 0) for a in calls}

    def wait(self, refs: list, timeout: float) -> list:
        """The first of ``refs`` to finish within ``timeout`` seconds (or none)."""
        import ray

        return ray.wait(refs, num_returns=1, timeout=timeout)[0]

    def get(self, ref):
        """The value of a finished ref; ``WorkerLost`` if its actor died."""
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(ref)
        except RayActorError as e:
            raise WorkerLost(str(e)) from e

    def kill(self, handle) -> None:
        import ray

        self._polls.pop(handle._actor_id, None)   # noqa: SLF001 - see records()
        if handle._actor_id == self.bundle_actor:   # noqa: SLF001
            self.bundle_index = self.bundle_actor = None
        for index, actor in list(self.grown.items()):
            if actor == handle._actor_id:   # noqa: SLF001
                del self.grown[index]
                self.admission.took(self.request, -1)
        ray.kill(handle)

    def set_replicas(self, handles: list, section: str, actors: list,
                     timeout_s: float = 10.0) -> None:
        """Tell the workers ``handles`` that model stage ``section`` is served by
        ``actors`` now (``PartitionWorker.set_replicas``, on the ``status`` concurrency
        group); waits up to ``timeout_s`` seconds for their answers (a dead or still
        starting worker is not waited for longer)."""
        import ray

        refs = [h.set_replicas.options(concurrency_group=STATUS_GROUP).remote(section, actors)
                for h in handles]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)

    def fits_now(self) -> int:
        """How many workers the cluster's free resources hold now (summed over nodes),
        less what other jobs waiting for admission need, within this job's fair share
        of the growth room (``Admission.room``), plus the job's own PartitionWorker
        bundle when no worker holds it."""
        from pipeline.runtime.admission import fits, spare

        if self.admission is None:
            return fits(self.request, spare())
        return fits(self.request, self.admission.room()) + int(self.bundle_index is None)

    def surplus(self) -> int:
        """How many of this job's growth workers are beyond its ``fair_share`` now (a job
        admitted, or waiting for its minimum, since they started): they go once idle."""
        from pipeline.runtime.admission import fair_share

        if self.admission is None or not self.grown:
            return 0
        share = fair_share()
        over = max(math.ceil((self.admission.grown.get(k, 0.0) - share.get(k, 0.0)) / v
                             - 1e-9) for k, v in self.request.items() if v > 0)
        return max(0, min(over, len(self.grown)))

    def is_growth(self, index: int) -> bool:
        """Whether worker ``index`` runs outside the job's placement group."""
        return index in self.grown

    def free(self) -> dict[str, float]:
        """The free amount of each resource a worker asks for (for the log)."""
        import ray

        available = ray.available_resources()
        return {k: available.get(k, 0) for k in self.request}

    def ask(self, workers: int) -> None:
        """``request_resources``: the autoscaler keeps room for ``workers`` workers (0
        clears this run's demand); a cluster without an autoscaler ignores it."""
        from ray.autoscaler.sdk import request_resources

        try:
            request_resources(bundles=[self.request] * workers)
        except Exception as e:  # noqa: BLE001 - only a hint to the autoscaler
            log.debug("request_resources failed: %s", e)

    def unplaced(self, handle) -> bool:
        """True while the worker's actor waits for a node with its resources."""
        from pipeline.runtime.model_pool import waiting_for_resources

        return waiting_for_resources(handle)

    def wait_error(self, index: int, waited_s: float) -> Exception:
        """The error for a job none of whose workers found room in ``waited_s`` seconds."""
        from pipeline.runtime.model_pool import resource_wait_error

        return resource_wait_error(f"PartitionWorker-{index}", self.request, waited_s)

    def close(self) -> None:
        """Clear this run's demand on the autoscaler."""
        self.ask(0)


class _Process:
    """One worker process: the ``multiprocessing`` process and the driver's end of its pipe."""

    def __init__(self, index: int, process, conn, records):
        self.index, self.process, self.conn = index, process, conn
        self.records = records   # multiprocessing.Value: rows the running attempt wrote


class _Call:
    """A call outstanding on a worker process (each worker has at most one at a time)."""

    def __init__(self, worker: _Process):
        self.worker = worker


class ProcessWorkers:
    """Partition workers as child processes of the driver, no Ray (see the module docstring).

    ``job`` and ``run_id`` name the log directory (``mmpipe-<job>-<run id>-*`` under the
    system's temp dir, one ``PartitionWorker-<i>.log`` per worker); with ``verbose`` the
    workers log to this terminal instead. ``cpus``: how many workers run at once (default
    the CPUs this process may run on). ``prestart(n)`` starts processes while the driver
    plans; ``bind`` gives them the spec and fingerprint once the driver has assembled it.
    Each starts with this process's environment of the moment (``serve`` applies it: a
    forked process would otherwise have the fork server's) and working directory
    (``multiprocessing`` passes that)."""

    def __init__(self, job: str, run_id: str, *, verbose: bool = False,
                 cpus: int | None = None):
        self.run_id = run_id
        self.capacity = cpus or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                 else os.cpu_count() or 1)
        self.logs_dir = None if verbose else Path(
            tempfile.mkdtemp(prefix=f"mmpipe-{job}-{run_id}-"))
        self.live: dict[int, _Process] = {}
        self.spare: list[_Process] = []
        self.fp = ""
        self._spec_json = ""
        self._context = worker_context()

    def prestart(self, n: int) -> None:
        """Spawn ``n`` processes (at most ``cpus``) that load the worker's modules and wait
        for ``start``."""
        for _ in range(min(n, self.capacity) - len(self.spare)):
            self.spare.append(self._spawn())

    def bind(self, spec, fingerprint: str) -> None:
        """The job every worker started from now on runs."""
        self._spec_json, self.fp = spec.model_dump_json(), fingerprint
        if self.logs_dir is not None:
            log.info("worker logs: %s (--verbose shows them here)", self.logs_dir)

    def _spawn(self) -> _Process:
        ours, theirs = self._context.Pipe()
        log_file = None if self.logs_dir is None else str(
            self.logs_dir / f"spare-{len(self.live) + len(self.spare)}-{os.urandom(3).hex()}.log")
        records = self._context.Value("q", 0, lock=False)   # one writer: the worker
        process = self._context.Process(target=serve, name="PartitionWorker", daemon=True,
                                        args=(theirs, log_file, records, dict(os.environ)))
        process.start()
        theirs.close()
        return _Process(-1, process, ours, records)

    def start(self, index: int, restarts: int = 0) -> _Process:
        """Worker ``index``: a spare process if one is up, else a new one; it builds its
        ``PartitionWorker`` and answers the first ``ping`` once that is done."""
        worker = self.spare.pop() if self.spare else self._spawn()
        worker.index = index
        name = f"PartitionWorker-{index}" + (f"-r{restarts}" if restarts else "")
        log_file = None if self.logs_dir is None else str(self.logs_dir / f"{name}.log")
        try:
            worker.conn.send(("init", self._spec_json, self.fp, index, self.run_id, log_file))
        except OSError:    # it died while spare: get() says so
            pass
        self.live[id(worker)] = worker
        return worker

    def ping(self, handle: _Process) -> _Call:
        return _Call(handle)   # the worker answers once its PartitionWorker is built

    def run(self, handle: _Process, partition_id: str, attempt_id: str) -> _Call:
        try:
            handle.conn.send(("run", partition_id, attempt_id))
        except OSError:    # it died since its last answer: get() says so
            pass
        return _Call(handle)

    def records(self, calls: dict) -> dict[str, int]:
        """Rows written so far by each running attempt, ``{attempt id: worker}`` ->
        ``{attempt id: rows}``, read from the workers' shared counters."""
        return {attempt: worker.records.value for attempt, worker in calls.items()}

    def wait(self, refs: list, timeout: float) -> list:
        by_conn = {ref.worker.conn: ref for ref in refs}
        ready = multiprocessing.connection.wait(list(by_conn), timeout)
        return [by_conn[c] for c in ready][:1]

    def get(self, ref: _Call):
        worker = ref.worker
        try:
            kind, value = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join(KILL_GRACE_S)
            raise WorkerLost(f"PartitionWorker-{worker.index} (pid {worker.process.pid}) "
                             f"exited with code {worker.process.exitcode}") from None
        if kind == "lost":   # its constructor raised: the worker is gone
            worker.process.join(KILL_GRACE_S)
            raise WorkerLost(f"PartitionWorker-{worker.index} could not start: {value}")
        if kind == "error":
            raise value
        return value

    def kill(self, handle: _Process) -> None:
        """Stop a worker: ``_stop``."""
        self.live.pop(id(handle), None)
        _stop([handle])

    def fits_now(self) -> int:
        return max(0, self.capacity - len(self.live))

    def surplus(self) -> int:
        """No other job shares this machine's worker processes."""
        return 0

    def is_growth(self, index: int) -> bool:
        return False

    def free(self) -> dict[str, float]:
        return {"CPU": float(self.fits_now())}

    def ask(self, workers: int) -> None:
        """No autoscaler on this machine."""

    def unplaced(self, handle: _Process) -> bool:
        return False    # a process starts at once

    def wait_error(self, index: int, waited_s: float) -> Exception:
        return RuntimeError(f"PartitionWorker-{index} did not start in {waited_s:g} s")

    def close(self) -> None:
        """Stop the worker processes still running, spare ones included (``_stop``)."""
        _stop([*self.live.values(), *self.spare])
        self.live.clear()
        self.spare.clear()


def _stop(workers: list[_Process]) -> None:
    """Close each worker's pipe, so an idle one returns from ``serve`` and exits normally
    (its ``multiprocessing`` finalizers run: no "leaked semaphore" warning at the driver's
    exit); kill those still running after ``EXIT_GRACE_S`` (a busy or hung attempt)."""
    for worker in workers:
        worker.conn.close()
    deadline = time.monotonic() + EXIT_GRACE_S
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(KILL_GRACE_S)


#: what the fork server imports once, so that each worker forked from it starts with the
#: worker's modules loaded (``import pipeline.runtime.worker``: about 0.5 CPU-s that a
#: spawned process pays each time, with Python's own start)
PRELOAD = ["pipeline.runtime.worker"]


def worker_context():
    """The ``multiprocessing`` context worker processes start from: ``forkserver`` (Python's
    fork server, ``multiprocessing.set_forkserver_preload``: one process that imports
    ``PRELOAD`` and forks each worker from that state, safe where this process has threads,
    as a connected Ray driver does) where the platform offers it, else ``spawn``."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def serve(conn, log_file: str | None, records=None, environ: dict[str, str] | None = None
          ) -> None:
    """A worker process's main loop: take the driver's ``environ`` (that of the moment it
    was started, as a spawned process would have), load the worker's modules, wait for
    ``("init", spec JSON, fingerprint, index, run id, log file)``, build the
    ``PartitionWorker`` (answering the driver's ``ping``), then run ``("run", partition id,
    attempt id)`` requests until the driver closes the pipe. ``records``: the shared
    counter of rows the running attempt has written (``PartitionWorker.shared_records``).
    Ctrl-C is the driver's to handle (it kills this process); logs go to the log file
    given (none: this terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    _log_to(log_file)
    from pipeline.runtime.threads import ASSIGNED_CPUS_ENV
    from pipeline.runtime.worker import PartitionWorker

    os.environ[ASSIGNED_CPUS_ENV] = "1"   # one CPU's threads, as Ray's num_cpus=1 gives

    try:
        _kind, spec_json, fingerprint, index, run_id, worker_log = conn.recv()
    except (EOFError, OSError):   # a spare the driver did not need
        _drop_log(log_file)
        return
    if worker_log is not None:
        _log_to(worker_log)
        _drop_log(log_file)
    try:
        worker = PartitionWorker(spec_json, fingerprint, index, [], run_id, own_models=True)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which starts another
        conn.send(("lost", f"{type(e).__name__}: {e}"))
        return
    worker.shared_records = records
    conn.send(("ok", True))
    while True:
        try:
            _kind, partition_id, attempt_id = conn.recv()
        except (EOFError, OSError):   # the driver is gone or closed the pipe
            return
        try:
            conn.send(("ok", worker.run(partition_id, attempt_id)))
        except Exception as e:  # noqa: BLE001 - the attempt's error is the driver's to judge
            conn.send(("error", _picklable(e)))


def _log_to(path: str | None) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``path``."""
    if path is None:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _drop_log(path: str | None) -> None:
    """Remove a spare process's log file if nothing was written to it."""
    if path is not None and os.path.exists(path) and os.path.getsize(path) == 0:
        os.unlink(path)


def _picklable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (its class, attributes and causes), else a
    ``RuntimeError`` carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(e).__name__}: {e}")
