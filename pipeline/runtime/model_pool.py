"""``ModelActor``: one replica of one model step; ``ModelPool``s; ``ModelClient``: a worker's handle.

One mechanism for every model step (``text_embedding``, ``image_embedding``,
``image_classification``, ``captioning``): each enabled section gets a pool of
``replicas`` ModelActors (``replicas.min`` at start; ``pool_scaler`` adds and removes
replicas up to ``replicas.max`` and pushes the new set to the workers' ``ModelClient``s) (``num_gpus`` each, fractional allowed) that load their backend
once (``models.registry``) and serve it with a ``BatchServer`` (coalescing,
prepare/compute overlap, OOM halving). Actors are
threaded (``actor_concurrency`` requests at once), so several batches are in flight per
actor. Workers send whole batches by object reference (one actor call per batch, never per
record), keep at most ``max_in_flight`` outstanding, and retry a batch on another replica
if its actor died (DESIGN.md failure model).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import ray
from ray.exceptions import RayActorError

from pipeline.errors import MmpipeError
from pipeline.contracts import ModelInfo
from pipeline.runtime.metrics import ModelMetrics, job_namespace
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)

WAIT_TICK_S = 1.0  # seconds between looks at actors that are not up yet


class ResourceWaitError(MmpipeError):
    """An actor waited ``runtime.resource_wait_s`` seconds for a node that offers (or has
    free) its resources; the message names the actor, the request and the cluster."""


def waiting_for_resources(actor) -> bool:
    """True while ``actor`` waits to be placed on a node (its GCS state is
    ``PENDING_CREATION``); also True when the state cannot be read (then only the time
    waited counts)."""
    try:
        from ray._private import state  # Ray has no public per-actor state without a dashboard

        info = state.actors(actor_id=actor._actor_id.hex())  # noqa: SLF001
    except Exception:  # noqa: BLE001 - unknown: let the time decide
        return True
    return (info or {}).get("State") in (None, "PENDING_CREATION", "DEPENDENCIES_UNREADY")


def resource_wait_error(name: str, request: dict[str, float], waited_s: float) -> ResourceWaitError:
    """The error for actor ``name`` whose ``request`` (e.g. ``{'GPU': 1.0}``) no node
    offered, or had free, within ``waited_s`` seconds; names the cluster's resources."""
    alive = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    offered = any(all(res.get(k, 0) >= v for k, v in request.items()) for res in alive)
    what = "no node has free" if offered else "no node offers"
    return ResourceWaitError(
        f"{what} {request} for {name} after {waited_s:g} s; the cluster has "
        f"{brief(ray.cluster_resources())} ({brief(ray.available_resources())} free) on "
        f"{len(alive)} node{'' if len(alive) == 1 else 's'}")


def brief(resources: dict[str, float]) -> dict[str, float]:
    """Resources without Ray's per-node labels, memory sizes and placement group
    resources (``CPU_group_<id>``, ``bundle_group_<i>_<id>``)."""
    return {k: v for k, v in sorted(resources.items())
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")
            and "_group_" not in k}


def actor_request(num_cpus: float, num_gpus: float = 0.0,
                  resources: dict[str, float] | None = None) -> dict[str, float]:
    """The resources an actor asks for, zeros left out (``{'CPU': 1.0, 'GPU': 1.0}``)."""
    req = {"CPU": float(num_cpus), "GPU": float(num_gpus), **(resources or {})}
    return {k: v for k, v in req.items() if v}


@ray.remote
class ModelActor:
    """Holds one replica of the model of spec section ``section``; ``run(inputs) -> columns``."""

    def __init__(self, section: str, spec_json: str):
        from pipeline.storage import fs
        from pipeline.models.registry import load_backend
        from pipeline.models.serving import BatchServer
        from pipeline.models.torch_util import pick_device

        from pipeline.runtime import job_env

        t0 = time.time()
        job_env.apply()  # `mmpipe submit --env` values (tokens, keys for the weights)
        spec = JobSpec.model_validate_json(spec_json)
        fs.configure(**spec.storage.model_dump(), from_env=False)  # s3:// weights
        self.section = section
        self.name = ray.get_runtime_context().get_actor_name()
        section_spec = getattr(spec, section)
        device = pick_device(section_spec.num_gpus)
        if section_spec.num_gpus > 0 and device == "cpu":
            log.warning("%s: %s.num_gpus=%s but CUDA is not available here; running on CPU",
                        self.name, section, section_spec.num_gpus)
        self.backend = load_backend(section, spec, device)
        self.metrics = ModelMetrics(section, self.name, job_name=spec.name)
        self.server = BatchServer(self.backend, section_spec.batch_size,
                                  on_batch=self.metrics.on_batch,
                                  batch_wait_s=section_spec.batch_wait_s)
        self.started = time.time()
        self.load_s = self.started - t0
        self.pending = 0   # run() calls here now (computing or queued)
        self.lock = threading.Lock()
        log.info("%s: loaded %s in %.1fs", self.name, self.backend.info.description, self.load_s)

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run one worker batch (coalesced with others queued here); return its columns."""
        with self.lock:
            self.pending += 1
        try:
            return self.server(inputs)
        finally:
            with self.lock:
                self.pending -= 1

    def ready(self) -> ModelInfo:
        return self.backend.info

    def get_stats(self) -> dict[str, Any]:
        from pipeline.models.serving import server_stats

        return dict(server_stats(self.server, self.name, self.section, self.load_s,
                                 self.started), pending=self.pending)

    def __repr__(self) -> str:
        return f"ModelActor({getattr(self, 'name', 'starting')})"


@dataclasses.dataclass
class ModelPool:
    """The replicas of one model step and what they told at start-up; ``started``: how
    many replicas were ever started (the next one is ``ModelActor-<section>-<started>``)."""

    section: str
    actors: list
    info: ModelInfo
    started: int = 0


def reserved_cpus(spec: JobSpec) -> float:
    """CPUs the enabled model pools reserve at start (``replicas.min * num_cpus`` summed)."""
    from pipeline.models.registry import enabled_sections

    return sum(getattr(spec, s).pool.min * getattr(spec, s).num_cpus
               for s in enabled_sections(spec))


def start_replica(spec: JobSpec, section: str, index: int, run_id: str = "",
                  strategy=None):
    """Ask Ray for replica ``ModelActor-<section>-<index>`` of the run's namespace (in a
    placement group bundle when ``strategy`` is one); returns its handle at once."""
    sspec = getattr(spec, section)
    return ModelActor.options(
        name=f"ModelActor-{section}-{index}", namespace=job_namespace(spec.name, run_id),
        num_cpus=sspec.num_cpus, num_gpus=sspec.num_gpus, scheduling_strategy=strategy,
        max_concurrency=sspec.actor_concurrency + 2, max_restarts=2,
    ).remote(section, spec.model_dump_json())


def start_model_pools(spec: JobSpec, run_id: str = "", admission=None) -> list[ModelPool]:
    """Start every enabled section's minimum replicas together and wait until each has loaded.

    The actors are named ``ModelActor-<section>-<i>`` in the run's namespace
    (``job_namespace(spec.name, run_id)``); with ``admission`` (``admission.Admission``)
    each goes into its bundle of the job's placement group. An actor that no node takes within
    ``runtime.resource_wait_s`` raises ``ResourceWaitError`` (e.g. ``num_gpus=1`` on a
    cluster without GPUs); loading the model itself has no time limit.

    Raises the first actor's error (e.g. ``ModelLoadError`` naming the model location, or
    an out-of-memory while loading), after killing what was started, so a bad model fails
    at job start, not in the middle of a partition.
    """
    from pipeline.models.registry import enabled_sections

    started: dict[str, list] = {}
    for section in enabled_sections(spec):
        started[section] = [
            start_replica(spec, section, i, run_id, admission and admission.strategy(
                f"ModelActor-{section}-{i}")) for i in range(getattr(spec, section).pool.min)]
    try:
        infos = _wait_loaded(spec, started)
    except Exception:
        stop_model_pools([ModelPool(s, a, None) for s, a in started.items()])
        raise
    return [ModelPool(s, actors, infos[s][0], len(actors))
            for s, actors in started.items()]


def _wait_loaded(spec: JobSpec, started: dict[str, list]) -> dict[str, list[ModelInfo]]:
    """Each section's ``ready()`` answers; raises the first actor error, or
    ``ResourceWaitError`` for an actor still unplaced after ``runtime.resource_wait_s``."""
    refs = {a.ready.remote(): (s, i, a) for s, actors in started.items()
            for i, a in enumerate(actors)}
    answers: dict = {}
    pending, t0 = dict(refs), time.monotonic()
    while pending:
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=WAIT_TICK_S)
        for ref in done:
            answers[pending.pop(ref)[:2]] = ray.get(ref)  # a load error raises here
        if pending and time.monotonic() - t0 >= spec.runtime.resource_wait_s:
            for section, i, actor in pending.values():
                if waiting_for_resources(actor):
                    sspec = getattr(spec, section)
                    raise resource_wait_error(f"ModelActor-{section}-{i}",
                                              actor_request(sspec.num_cpus, sspec.num_gpus),
                                              spec.runtime.resource_wait_s)
    return {s: [answers[s, i] for i in range(len(actors))] for s, actors in started.items()}


def stop_model_pools(pools: list[ModelPool]) -> None:
    for pool in pools:
        for actor in pool.actors:
            ray.kill(actor)


def model_stats(pools: list[ModelPool], timeout_s: float = 10) -> list[dict[str, Any]]:
    """Each actor's ``get_stats()`` (best effort: an actor that does not answer is left out)."""
    out = []
    for pool in pools:
        for actor in pool.actors:
            try:
                out.append(ray.get(actor.get_stats.remote(), timeout=timeout_s))
            except Exception:  # noqa: BLE001 - stats are best effort at shutdown
                log.warning("no stats from a %s model actor", pool.section)
    return out


def worker_models(pools: list[ModelPool], index: int, wrap=None,
                  clients: dict | None = None) -> dict[str, tuple]:
    """A worker's models for ``assembly.assemble``: section -> ``(client, ModelInfo)``.
    ``wrap(client)`` (optional) decorates each client, e.g. with metrics. Worker ``index``
    picks the first replica (spreads the load). ``clients`` (optional) gets each section's
    bare ``ModelClient``, whose replica set ``ModelClient.replace`` changes."""
    out = {}
    for pool in pools:
        client = ModelClient(list(pool.actors), index)
        if clients is not None:
            clients[pool.section] = client
        out[pool.section] = (wrap(client) if wrap else client, pool.info)
    return out


class ModelClient:
    """A worker's view of one pool: ``submit`` a batch (round-robin over replicas, the
    inputs put once in the object store) and later ``result`` it; ``ready`` polls."""

    def __init__(self, actors: list, first: int = 0):
        self.actors = actors
        self.next = first % max(1, len(actors))

    def replace(self, actors: list) -> None:
        """Serve from the replicas ``actors`` from now on (the pool grew or shrank);
        a batch out on a removed replica is retried on these by ``result``."""
        self.actors = list(actors)

    def _call(self, inputs_ref, replica: int):
        actors = self.actors
        return actors[replica % len(actors)].run.remote(inputs_ref)

    def submit(self, inputs: dict[str, Any]) -> tuple:
        from pipeline.models.serving import SUBMITTED_AT

        ref = ray.put(dict(inputs, **{SUBMITTED_AT: time.time()}))
        replica = self.next
        self.next = (self.next + 1) % max(1, len(self.actors))
        return [ref, self._call(ref, replica), replica]

    def ready(self, handle) -> bool:
        done, _ = ray.wait([handle[1]], timeout=0)
        return bool(done)

    def result(self, handle) -> dict[str, Any]:
        """Wait for a submitted batch; retry on the other replicas if its actor died."""
        inputs_ref, out, replica = handle
        for _ in range(len(self.actors) + 1):
            try:
                return ray.get(out)
            except RayActorError:
                log.warning("model actor %d died; retrying the batch on another replica",
                            replica % len(self.actors))
                replica += 1
                out = handle[1] = self._call(inputs_ref, replica)
        return ray.get(out)
