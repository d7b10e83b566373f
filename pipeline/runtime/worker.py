"""``PartitionWorker``: the Ray actor that owns one partition at a time, end to end."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import ray

from pipeline.assembly import assemble
from pipeline.io import fs
from pipeline.io.plan import read_partition
from pipeline.runtime import chaos, metrics
from pipeline.runtime.model_pool import worker_models
from pipeline.runtime.partition import AttemptOutcome, run_partition
from pipeline.runtime.report import objects_phrase
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)


@ray.remote
class PartitionWorker:
    """Assembles the pipeline once (models bound to the pools), then runs
    ``run(partition, attempt_id)`` calls one by one.

    ``model_pools`` are the started ``ModelPool``s (empty when no model step is enabled);
    ``fingerprint`` is the driver's, checked against this worker's assembly.
    """

    def __init__(self, spec_json: str, fingerprint: str, index: int, model_pools: list):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        self.spec = JobSpec.model_validate_json(spec_json)
        fs.configure(**self.spec.storage.model_dump())
        self.index = index
        self.metrics = metrics.WorkerMetrics(self.spec.name, index)
        self.pool = ThreadPoolExecutor(self.spec.runtime.decode_threads)
        models = worker_models(model_pools, index, wrap=self.metrics.count_model_calls)
        self.pipeline = assemble(self.spec, models, self.pool, setup=True)
        if self.pipeline.fingerprint != fingerprint:
            raise RuntimeError(f"worker assembled fingerprint {self.pipeline.fingerprint}, "
                               f"the driver {fingerprint}: different mmpipe versions?")
        self.pipeline.datasource = self.metrics.count_reads(self.pipeline.datasource)
        self.current = "idle"

    def run(self, partition_id: str, attempt_id: str) -> AttemptOutcome:
        """Read partition ``partition_id`` from the plan, process and commit it; return
        the outcome (the commit marker and whether this attempt committed it)."""
        self.current = f"{partition_id}/a-{attempt_id}"
        metrics.show_actor_state(self)  # the log prefix names the partition in hand
        started = time.perf_counter()
        chaos.maybe_kill_worker(partition_id)
        partition = read_partition(self.spec.sink.uri, partition_id)
        planned = self.pipeline.datasource.rows_planned(partition)
        log.info("partition %s: attempt %s started (%s records from %s)",
                 partition.partition_id, attempt_id,
                 "?" if planned is None else planned,
                 objects_phrase(len({i.uri for i in partition.inputs})))
        try:
            out = run_partition(self.pipeline, partition, attempt_id, self.pool,
                                ran_on={"worker": f"PartitionWorker-{self.index}",
                                        "node_id": ray.get_runtime_context().get_node_id()})
        except BaseException:
            self.metrics.partition_failed(time.perf_counter() - started)
            raise
        finally:
            self.current = "idle"
        self.metrics.partition_done(out, time.perf_counter() - started)
        log.info("partition %s: attempt %s %s in %.2fs", partition.partition_id, attempt_id,
                 f"committed {out.marker.rows_in} records" if out.committed
                 else "lost the commit race", out.marker.duration_s)
        return out

    def ping(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"PartitionWorker-{self.index}({getattr(self, 'current', 'starting')})"
