"""Gang admission: a job's minimum as one Ray placement group, taken before any actor starts.

A job's minimum is every model stage's minimum replicas (``replicas``, or ``replicas.min``)
and one PartitionWorker. ``admit`` asks Ray for all of it at once as one placement group
named ``mmpipe-<job>-<run id>`` (one bundle per actor, ``PACK``): until Ray reserves the
whole group the job holds nothing, so two jobs on a cluster too small for both never each
hold half (the first waits for the whole, the second for the first to finish or shrink),
and an autoscaler sees one pending request, not a stream of single actors. While it waits,
the progress line and ``mmpipe status`` say ``waiting for resources: needs {...}; the
cluster has {...} free``; after ``runtime.resource_wait_s`` the group is removed and the
job fails naming the request (``ResourceWaitError``).

Fair sharing: ``waiting_demand`` sums the bundles of the other jobs' placement groups that
Ray has not placed yet (``ray.util.placement_group_table``); a running job's elastic growth
(more PartitionWorkers, more model replicas) only takes what is free beyond them
(``spare``), so it never takes the last free resources a waiting job needs for its minimum.
Nor more than its equal share of the growth room (``fair_share``: the cluster less every
placement group's bundles, divided among the admitted mmpipe jobs; ``Admission.room``):
two jobs admitted together grow alike, whichever looked at the free resources first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from pipeline.runtime.model_pool import (
    ResourceWaitError,
    actor_request,
    brief,
    resource_wait_error,
)
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)

WAIT_TICK_S = 1.0  # seconds between looks at a pending placement group
WORKER = "PartitionWorker-0"  # the admitted PartitionWorker's bundle


def minimum(spec: JobSpec) -> dict[str, dict[str, float]]:
    """The job's minimum, actor name -> its request (``{'CPU': 1.0}``): every enabled model
    stage's minimum replicas (``ModelActor-<section>-<i>``) and ``PartitionWorker-0``.
    An actor that asks for nothing (``num_cpus: 0`` on CPU) needs no bundle and is left out."""
    from pipeline.models.registry import enabled_sections

    out = {}
    for section in enabled_sections(spec):
        sspec = getattr(spec, section)
        for i in range(sspec.pool.min):
            out[f"ModelActor-{section}-{i}"] = actor_request(sspec.num_cpus, sspec.num_gpus)
    out[WORKER] = actor_request(1, 0, spec.runtime.worker_resources)
    return {name: request for name, request in out.items() if request}


def total(requests) -> dict[str, float]:
    """The sum of resource requests (an iterable of ``{resource: amount}``)."""
    out: dict[str, float] = {}
    for request in requests:
        for k, v in request.items():
            out[k] = out.get(k, 0.0) + v
    return out


def waiting_line(need: dict[str, float]) -> str:
    """``waiting for resources: needs {...}; the cluster has {...} free`` (each needed
    resource named, 0.0 when none is free)."""
    free = dict({k: 0.0 for k in need}, **brief(ray.available_resources()))
    return f"waiting for resources: needs {need}; the cluster has {dict(sorted(free.items()))} free"


class Admission:
    """A job's admitted minimum: its placement group and the bundle of each actor in it."""

    def __init__(self, group, bundles: dict[str, int], waited_s: float):
        self.group, self.bundles, self.waited_s = group, bundles, waited_s
        self.grown: dict[str, float] = {}   # resources of this job's actors outside the group

    def strategy(self, name: str) -> PlacementGroupSchedulingStrategy | None:
        """The scheduling strategy that puts actor ``name`` in its bundle, or None when it
        has none (a replica or worker beyond the minimum: placed as the cluster allows)."""
        if name not in self.bundles:
            return None
        return PlacementGroupSchedulingStrategy(
            self.group, placement_group_bundle_index=self.bundles[name],
            placement_group_capture_child_tasks=False)

    def took(self, request: dict[str, float], sign: int = 1) -> None:
        """Count an actor started outside the group (growth) asking ``request``;
        ``sign=-1`` when it goes."""
        for k, v in request.items():
            self.grown[k] = self.grown.get(k, 0.0) + sign * v

    def room(self) -> dict[str, float]:
        """What this job's growth may take now: ``spare`` (free beyond other jobs'
        waiting minimums), capped by its ``fair_share`` less what it has grown already,
        so two admitted jobs grow alike whichever looked first."""
        share = fair_share()
        return {k: max(0.0, min(v, share.get(k, 0.0) - self.grown.get(k, 0.0)))
                for k, v in spare(self.group).items()}

    def release(self) -> None:
        """Remove the placement group (its actors must be killed first)."""
        remove_placement_group(self.group)


def admit(spec: JobSpec, run_id: str, on_wait: Callable[[str], None]) -> Admission:
    """Reserve the job's ``minimum`` as one placement group ``mmpipe-<job>-<run id>`` and
    wait until Ray has placed it. ``on_wait(line)`` is called about once a second while it
    waits with ``waiting_line`` (and with ``""`` once admitted). Raises ``ResourceWaitError``
    naming the request after ``runtime.resource_wait_s`` seconds (the group removed first)."""
    need = minimum(spec)
    name = f"mmpipe-{spec.name}-{run_id}"
    group = placement_group(list(need.values()), strategy="PACK", name=name)
    t0 = time.monotonic()
    announced = False
    limit = spec.runtime.resource_wait_s
    try:
        while not group.wait(timeout_seconds=WAIT_TICK_S):
            line = waiting_line(total(need.values()))
            if not announced:
                log.info("job %s: %s (placement group %s: %s)", spec.name, line, name,
                         ", ".join(f"{k} {v}" for k, v in need.items()))
                announced = True
            on_wait(line)
            if time.monotonic() - t0 >= limit:
                raise _wait_error(need, name, limit)
    except BaseException:   # the wait ran out, or a stop (Ctrl-C): hold nothing
        remove_placement_group(group)
        if announced:
            on_wait("")
        raise
    waited = time.monotonic() - t0
    if announced:
        on_wait("")
        log.info("job %s: admitted after waiting %.1f s for resources (placement group %s)",
                 spec.name, waited, name)
    else:
        log.info("job %s: admitted (placement group %s: %s)", spec.name, name,
                 total(need.values()))
    return Admission(group, {n: i for i, n in enumerate(need)}, waited)


def _wait_error(need: dict[str, dict[str, float]], group: str, waited_s: float) -> ResourceWaitError:
    """The first actor of the minimum that no node offers (``resource_wait_error``), or,
    when each is offered somewhere, the whole request that was never free at once."""
    alive = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for name, request in need.items():
        if not any(all(res.get(k, 0) >= v for k, v in request.items()) for res in alive):
            return resource_wait_error(name, request, waited_s)
    return ResourceWaitError(
        f"the job's minimum {total(need.values())} (placement group {group}: "
        f"{', '.join(f'{k} {v}' for k, v in need.items())}) was not free within "
        f"{waited_s:g} s; the cluster has {brief(ray.cluster_resources())} "
        f"({brief(ray.available_resources())} free)")


def waiting_demand(own_group=None) -> dict[str, float]:
    """What the placement groups Ray has not placed yet (other jobs waiting for their
    minimum; ``own_group`` left out) ask for, summed."""
    own = own_group.id.hex() if own_group is not None else None
    requests = []
    for group_id, info in ray.util.placement_group_table().items():
        if group_id == own or info.get("state") not in ("PENDING", "RESCHEDULING"):
            continue
        requests += list((info.get("bundles") or {}).values())
    return total(requests)


def fair_share() -> dict[str, float]:
    """Each admitted job's equal share of the growth room: the cluster's resources less
    the bundles of every placement group (placed or waiting), divided by the number of
    admitted mmpipe jobs (placed groups named ``mmpipe-*``, at least 1)."""
    reserved, jobs = [], 0
    for info in ray.util.placement_group_table().values():
        if info.get("state") == "REMOVED":
            continue
        reserved += list((info.get("bundles") or {}).values())
        jobs += info.get("state") == "CREATED" and str(info.get("name", "")).startswith(
            "mmpipe-")
    held = total(reserved)
    return {k: max(0.0, v - held.get(k, 0.0)) / max(jobs, 1)
            for k, v in ray.cluster_resources().items()}


def spare(own_group=None) -> dict[str, float]:
    """The cluster's free resources less ``waiting_demand`` (never below 0): what a running
    job's elastic growth may take."""
    waiting = waiting_demand(own_group)
    return {k: max(0.0, v - waiting.get(k, 0.0))
            for k, v in ray.available_resources().items()}


def fits(request: dict[str, float], free: dict[str, float]) -> int:
    """How many actors asking ``request`` the resources ``free`` hold."""
    return int(min((free.get(k, 0.0) // v for k, v in request.items() if v > 0), default=0))
