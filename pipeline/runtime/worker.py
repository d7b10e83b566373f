"""``PartitionWorker``: owns one partition at a time, end to end - as a Ray actor
(``executors.remote_worker()``) or in a worker process of the driver's own
(``executors.ProcessWorkers``)."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from pipeline.assembly import assemble
from pipeline.storage import fs
from pipeline.output.plan import read_partition
from pipeline.runtime import chaos, job_env, metrics, scratch, threads
from pipeline.runtime.partition import AttemptOutcome, run_partition
from pipeline.runtime.report import objects_phrase
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)


class PartitionWorker:
    """Assembles the pipeline once (models bound to the pools), then runs
    ``run(partition, attempt_id)`` calls one by one.

    ``model_pools`` are the started ``ModelPool``s (empty when no model step is enabled,
    or with ``own_models``: a worker process loads each enabled model itself, on CPU,
    served by a ``BatchServer`` in its own threads - ``models.local``);
    ``fingerprint`` is the driver's, checked against this worker's assembly; ``run_id``
    the driver's run id, recorded in each commit marker's ``ran_on``. Storage settings
    (endpoint, region, retries) come from the spec, never this process's environment.

    Progress: each batch written adds to ``records`` (the running attempt's rows so far,
    0 between attempts), which ``status()`` returns (on Ray from the ``status``
    concurrency group, so the driver can ask while ``run`` works), a worker process
    copies into ``shared_records`` (a ``multiprocessing.Value`` the driver reads) and
    the ``mmpipe_worker_records`` gauge shows.
    """

    def __init__(self, spec_json: str, fingerprint: str, index: int, model_pools: list,
                 run_id: str = "", own_models: bool = False):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        job_env.apply()  # `mmpipe submit --env` values, before storage is configured
        self.spec = JobSpec.model_validate_json(spec_json)
        # stage temp files in a directory of our own; dead workers' ones are removed now
        self.staging = scratch.claim(self.spec.video.temp_dir)
        if self.spec.video.temp_dir:
            self.spec = self.spec.model_copy(update={"video": self.spec.video.model_copy(
                update={"temp_dir": str(self.staging.path)})})
        fs.configure(**self.spec.storage.model_dump(), from_env=False)
        self.index, self.run_id = index, run_id
        self.metrics = metrics.WorkerMetrics(self.spec.name, index)
        # CPU work stays within the CPUs Ray gave this actor (``threads`` module docstring):
        # native pools capped, row steps in at most that many threads; reads, which wait
        # on storage, keep ``decode_threads`` threads
        cpus = threads.assigned_cpus()
        threads.cap_threads(cpus)
        self.pool = ThreadPoolExecutor(self.spec.runtime.decode_threads,
                                       thread_name_prefix="read")
        self.step_pool = ThreadPoolExecutor(
            threads.step_threads(self.spec.runtime.decode_threads, cpus),
            thread_name_prefix="step")
        models = {}
        self.model_clients: dict = {}   # section -> its bare ModelClient (set_replicas)
        if model_pools:   # Ray actors: model_pool imports Ray, which worker processes skip
            from pipeline.runtime.model_pool import worker_models

            models = worker_models(model_pools, index, wrap=self.metrics.count_model_calls,
                                   clients=self.model_clients)
        elif own_models:  # a worker process: its own copy of each model, on this CPU
            from pipeline.models.local import local_models

            t0 = time.time()
            loaded = local_models(self.spec)
            self.own_models = {s: client.server for s, (client, _) in loaded.items()}
            self.models_loaded = (time.time() - t0, time.time())
            models = {section: (self.metrics.count_model_calls(client), info)
                      for section, (client, info) in loaded.items()}
        self.pipeline = assemble(self.spec, models, self.step_pool, setup=True)
        if self.pipeline.fingerprint != fingerprint:
            raise RuntimeError(f"worker assembled fingerprint {self.pipeline.fingerprint}, "
                               f"the driver {fingerprint}: different mmpipe versions?")
        self.pipeline.datasource = self.metrics.count_reads(self.pipeline.datasource)
        self.current = "idle"
        self.attempt, self.records = "", 0
        self.shared_records = None   # a worker process: its multiprocessing.Value

    def run(self, partition_id: str, attempt_id: str) -> AttemptOutcome:
        """Read partition ``partition_id`` from the plan, process and commit it; return
        the outcome (the commit marker and whether this attempt committed it)."""
        self.current = f"{partition_id}/a-{attempt_id}"
        self.attempt = attempt_id
        metrics.show_actor_state(self)  # the log prefix names the partition in hand
        started = time.perf_counter()
        chaos.maybe_kill_worker(partition_id)
        chaos.maybe_hang(partition_id)
        partition = read_partition(self.spec.sink.uri, partition_id)
        planned = self.pipeline.datasource.rows_planned(partition)
        log.info("partition %s: attempt %s started (%s records from %s)",
                 partition.partition_id, attempt_id,
                 "?" if planned is None else planned,
                 objects_phrase(len({i.uri for i in partition.inputs})))
        try:
            out = run_partition(self.pipeline, partition, attempt_id, self.pool,
                                ran_on={"worker": f"PartitionWorker-{self.index}",
                                        "node_id": _node_id(),
                                        "run_id": self.run_id}, on_rows=self._rows)
        except BaseException:
            self.metrics.partition_failed(time.perf_counter() - started)
            raise
        finally:
            self.current, self.attempt = "idle", ""
            self._rows(-self.records)
        self.metrics.partition_done(out, time.perf_counter() - started)
        if getattr(self, "own_models", None):
            out = dataclasses.replace(out, models=self.model_stats())
        log.info("partition %s: attempt %s %s in %.2fs", partition.partition_id, attempt_id,
                 f"committed {out.marker.rows_in} records" if out.committed
                 else "lost the commit race", out.marker.duration_s)
        return out

    def _rows(self, n: int) -> None:
        """Count ``n`` more rows written by the running attempt (``-records``: reset)."""
        self.records += n
        if self.shared_records is not None:
            self.shared_records.value = self.records
        self.metrics.attempt_records(self.records)

    def status(self) -> dict:
        """What this worker does now: ``{"worker": "PartitionWorker-<i>", "state":
        "idle" | "p-000042/a-<attempt>", "attempt": attempt id ("" when idle),
        "records": rows its running attempt has written}``."""
        return {"worker": f"PartitionWorker-{self.index}", "state": self.current,
                "attempt": self.attempt, "records": self.records}

    def model_stats(self) -> list[dict]:
        """The statistics of this worker's own model copies (``serving.server_stats``,
        named ``PartitionWorker-<i>/<section>``); empty on Ray, where the model actors
        report theirs."""
        from pipeline.models.serving import server_stats

        load_s, started = getattr(self, "models_loaded", (0.0, 0.0))
        return [server_stats(server, f"PartitionWorker-{self.index}/{section}", section,
                             load_s, started)
                for section, server in getattr(self, "own_models", {}).items()]

    def set_replicas(self, section: str, actors: list) -> int:
        """Send this worker's ``section`` batches to the ModelActor handles ``actors`` from
        now on (the driver's ``pool_scaler`` grew or shrank the pool; on Ray called from the
        ``status`` concurrency group while ``run`` works); returns how many there are."""
        self.model_clients[section].replace(actors)
        return len(actors)

    def ping(self) -> bool:
        return True

    def __repr__(self) -> str:
        """``PartitionWorker-3(p-000042/a-<attempt>)`` while an attempt runs, else
        ``PartitionWorker-3``: Ray reads it once, after ``__init__``, for the dashboard's
        actors table (where a state would stay frozen); ``metrics.show_actor_state``
        re-announces it as the prefix of the actor's log lines."""
        current = getattr(self, "current", "idle")
        return f"PartitionWorker-{self.index}" + ("" if current == "idle" else f"({current})")


def _node_id() -> str:
    """The Ray node this worker runs on, or ``local:<host name>`` in a worker process of
    the driver (``executors.ProcessWorkers``), as a commit marker's ``ran_on.node_id``."""
    if metrics.ray_initialized():   # never imported by a worker process (0.3 s)
        import ray

        return ray.get_runtime_context().get_node_id()
    return f"local:{socket.gethostname()}"
