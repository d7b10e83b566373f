"""``PartitionWorker``: the Ray actor that owns one partition at a time, end to end."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from pipeline.io.sources import make_datasource
from pipeline.records import Partition
from pipeline.runtime.model_pool import ModelClient
from pipeline.runtime.partition import build_steps, process_partition
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)


@ray.remote
class PartitionWorker:
    """Builds the steps once, then runs ``run(partition, attempt_id)`` calls one by one.

    ``model_actors`` is the ModelActor pool (empty when no model step is enabled).
    """

    def __init__(self, spec_json: str, fingerprint: str, index: int, model_actors: list,
                 embedding_dim: int | None):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        self.spec = JobSpec.model_validate_json(spec_json)
        self.fingerprint = fingerprint
        self.index = index
        self.pool = ThreadPoolExecutor(self.spec.runtime.decode_threads)
        self.source = make_datasource(self.spec.source, self.spec.decode)
        self.steps = build_steps(self.spec, self.pool)
        self.embedding_dim = embedding_dim
        self.client = (ModelClient(model_actors, index)
                       if model_actors else None)
        self.current = "idle"

    def run(self, partition: Partition, attempt_id: str) -> dict[str, Any]:
        """Process and commit one partition attempt; return its outcome."""
        self.current = f"{partition.partition_id}/a-{attempt_id}"
        log.info("partition %s: attempt %s started (%d inputs)", partition.partition_id,
                 attempt_id, len(partition.inputs))
        try:
            out = process_partition(partition, attempt_id, self.spec, self.fingerprint,
                                    self.source, self.steps, self.client, self.pool,
                                    self.embedding_dim)
        finally:
            self.current = "idle"
        log.info("partition %s: attempt %s %s in %.2fs", partition.partition_id, attempt_id,
                 "committed" if out["committed"] else "lost the commit race", out["duration_s"])
        return dict(out, worker=f"PartitionWorker-{self.index}")

    def ping(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"PartitionWorker-{self.index}({getattr(self, 'current', 'starting')})"
