"""``ModelActor``: one model replica in a Ray actor; ``ModelClient``: a worker's handle.

Workers send whole batches by object reference (one actor call per batch, never per
record), keep at most ``max_in_flight`` calls outstanding, and retry a batch on another
replica if its actor died (DESIGN.md failure model).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from pipeline.spec import TextEmbedSpec

log = logging.getLogger(__name__)


@ray.remote
class ModelActor:
    """Holds one text-embedding model replica; ``embed(texts) -> (n, D) float32``."""

    def __init__(self, model: str, batch_size: int, num_gpus: float):
        from pipeline.models.text import TextEmbedder

        self.name = ray.get_runtime_context().get_actor_name()
        self.embedder = TextEmbedder(model, device="cuda" if num_gpus > 0 else "cpu")
        self.batch_size = batch_size
        self.stats = {"batches": 0, "records": 0, "busy_s": 0.0, "started_s": time.time()}

    def embed(self, texts: list[str]) -> np.ndarray:
        t0 = time.perf_counter()
        out = self.embedder(texts, batch_size=self.batch_size)
        self.stats["busy_s"] += time.perf_counter() - t0
        self.stats["batches"] += 1
        self.stats["records"] += len(texts)
        return out

    def get_stats(self) -> dict[str, Any]:
        return dict(self.stats, name=self.name, alive_s=time.time() - self.stats["started_s"])

    def ready(self) -> int:
        return self.embedder.dim

    def __repr__(self) -> str:
        return f"ModelActor({self.name}, batches={self.stats['batches']})"


def start_model_pool(spec: TextEmbedSpec, job_name: str) -> list[ray.actor.ActorHandle]:
    """Start ``spec.replicas`` ModelActors and wait until each has loaded its model.

    Raises the actor's error (e.g. ``FileNotFoundError`` naming the model location) if a
    model cannot load, so a bad model fails at job start, not in the middle of a partition.
    """
    actors = [ModelActor.options(name=f"ModelActor-minilm-{i}-{job_name}",
                                 num_cpus=spec.num_cpus, num_gpus=spec.num_gpus,
                                 max_restarts=2).remote(spec.model, spec.batch_size, spec.num_gpus)
              for i in range(spec.replicas)]
    ray.get([a.ready.remote() for a in actors])
    return actors


class ModelClient:
    """A worker's view of the pool: ``submit`` a batch (round-robin over replicas, the
    texts put once in the object store) and later ``result`` it. The caller bounds how
    many are in flight (``process_partition``: ``text_embedding.max_in_flight``).
    """

    def __init__(self, actors: list, first: int = 0):
        self.actors = actors
        self.next = first % max(1, len(actors))

    def _call(self, texts_ref, attempt: int):
        actor = self.actors[(self.next + attempt) % len(self.actors)]
        return actor.embed.remote(texts_ref)

    def submit(self, texts: list[str]) -> tuple:
        ref = ray.put(texts)
        out = self._call(ref, 0)
        self.next = (self.next + 1) % len(self.actors)
        return ref, out

    def result(self, handle) -> np.ndarray:
        """Wait for a submitted batch; retry on the other replicas if its actor died."""
        texts_ref, out = handle
        for attempt in range(1, len(self.actors) + 2):
            try:
                return ray.get(out)
            except RayActorError:
                log.warning("model actor died; retrying the batch on another replica")
                out = self._call(texts_ref, attempt)
        return ray.get(out)
