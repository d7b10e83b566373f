"""Model pools that follow the bottleneck: ``replicas: {min, max, idle_s}`` per model stage.

Every scale tick (``driver.SCALE_TICK_S``) the driver's ``PoolScaler`` asks each replica for
its ``get_stats`` (cumulative ``busy_s`` and ``records``, and ``pending``: the ``run`` calls
at the actor now) and measures, per stage, over the time since the last answer:

- busy fraction: seconds computing per second, averaged over the stage's replicas;
- queued: requests waiting at the stage (``pending`` beyond one per replica);
- records/s.

A stage is the bottleneck when it is busy at least ``BUSY_FRACTION`` of the time with
requests queued; of those, the busiest (then the most queued per replica) gets one more
replica, if it is below ``replicas.max`` and ``admission.spare`` (free resources, less what
other jobs waiting for admission need) holds one more actor. One replica per stage starts
at a time; the workers learn it once it has loaded (``PartitionWorker.set_replicas``, pushed
by the driver). A stage above ``replicas.min`` whose replicas, for ``replicas.idle_s``
seconds, had nothing queued and were busy less than ``IDLE_BUSY`` of what one replica fewer
could give (``busy < (n - 1) * IDLE_BUSY``) loses its newest replica: the workers are told
first, then it is killed (a batch still out on it is retried on the others,
``ModelClient.result``). Each change is logged with its reason and kept in ``timeline``
(``JobReport.model_pools``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from pipeline.runtime.admission import fits, spare
from pipeline.runtime.model_pool import (
    ModelPool,
    actor_request,
    start_replica,
    waiting_for_resources,
)
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)

BUSY_FRACTION = 0.8   # a stage busy at least this share of the time (and queued) is saturated
IDLE_BUSY = 0.5       # ... busy below this share of n - 1 replicas (none queued) is idle
STATS_WAIT_S = 0.3    # seconds a tick waits for the replicas' get_stats answers


@dataclasses.dataclass
class _Stage:
    """One model stage's pool as the scaler sees it."""

    pool: ModelPool
    spec: Any                      # the section's spec (``pool``: ReplicasSpec)
    request: dict[str, float]      # what one replica asks for
    last: dict = dataclasses.field(default_factory=dict)   # actor id -> (t, busy_s, records)
    samples: collections.deque = dataclasses.field(default_factory=collections.deque)
    starting: tuple | None = None  # (handle, ready ref, asked at, reason)
    timeline: list = dataclasses.field(default_factory=list)
    busy_s: float = 0.0            # replica-seconds computing, measured
    replica_s: float = 0.0         # replica-seconds alive, measured


class PoolScaler:
    """Grows and shrinks the model pools of a run (see the module docstring).

    ``pools``: the started ``ModelPool``s (their ``actors`` lists are changed in place, so
    workers started later get the current set); ``push(section, actors)``: tells every
    worker the new replica set and returns once they answered; ``own_group``: this job's
    placement group (left out of the waiting demand)."""

    def __init__(self, spec: JobSpec, pools: list[ModelPool], run_id: str,
                 push: Callable[[str, list], None], own_group=None):
        self.spec, self.run_id, self.push, self.own_group = spec, run_id, push, own_group
        self.t0 = time.monotonic()
        self.stages = {}
        for pool in pools:
            sspec = getattr(spec, pool.section)
            self.stages[pool.section] = _Stage(pool, sspec,
                                               actor_request(sspec.num_cpus, sspec.num_gpus))
            self._record(self.stages[pool.section], "started (replicas.min)")
        self.retired: list[dict] = []   # get_stats of removed replicas, for the report

    def _record(self, stage: _Stage, reason: str) -> None:
        stage.timeline.append({"at_s": round(time.monotonic() - self.t0, 2),
                               "replicas": len(stage.pool.actors), "reason": reason})

    def tick(self) -> None:
        """Measure every stage, finish starting replicas, then make at most one change
        per stage (no stage with a fixed pool, ``min == max``, is ever changed)."""
        now = time.monotonic()
        self._measure(now)
        for stage in self.stages.values():
            self._check_starting(stage, now)
        self._grow(now)
        for stage in self.stages.values():
            self._shrink(stage, now)

    def _measure(self, now: float) -> None:
        """One sample per stage (``(t, busy, queued, records/s)``, ``busy`` in replicas'
        worth) from the replicas that answered within ``STATS_WAIT_S``."""
        refs = {a.get_stats.remote(): (s, a) for s in self.stages.values()
                for a in s.pool.actors}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=STATS_WAIT_S)
        per_stage: dict[str, list] = collections.defaultdict(list)
        for ref in ready:
            stage, actor = refs[ref]
            try:
                stats = ray.get(ref)
            except Exception:  # noqa: BLE001 - a dead replica: its workers retry elsewhere
                continue
            key = actor._actor_id  # noqa: SLF001 - a handle's only hashable identity
            prev = stage.last.get(key)
            stage.last[key] = (now, stats["busy_s"], stats["records"])
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                per_stage[stage.pool.section].append(
                    (dt, stats["busy_s"] - prev[1], stats["records"] - prev[2],
                     stats.get("pending", 0)))
        for section, rows in per_stage.items():
            stage = self.stages[section]
            dt = max(r[0] for r in rows)
            busy = min(len(rows), sum(r[1] for r in rows) / dt)   # busy_s lands per batch
            stage.busy_s += sum(r[1] for r in rows)
            stage.replica_s += sum(r[0] for r in rows)
            queued = max(0, sum(r[3] for r in rows) - len(rows))
            stage.samples.append((now, busy, queued, sum(r[2] for r in rows) / dt, len(rows)))
            while stage.samples and stage.samples[0][0] < now - stage.spec.pool.idle_s - 5:
                stage.samples.popleft()

    def _grow(self, now: float) -> None:
        """One replica more for the busiest saturated stage below its max, if it fits."""
        candidates = []
        for stage in self.stages.values():
            if not stage.samples or stage.starting is not None:
                continue
            _, busy, queued, rate, n = stage.samples[-1]
            if (busy / n >= BUSY_FRACTION and queued > 0
                    and len(stage.pool.actors) < stage.spec.pool.max):
                candidates.append((busy / n, queued / n, stage, rate))
        if not candidates:
            return
        fraction, per_replica, stage, rate = max(candidates, key=lambda c: c[:2])
        if stage.request and fits(stage.request, spare(self.own_group)) < 1:
            return
        n = len(stage.pool.actors)
        reason = (f"busy {fraction:.0%} of the time with {per_replica * n:.0f} requests "
                  f"queued, {rate:.1f} records/s: the bottleneck")
        index = stage.pool.started
        stage.pool.started += 1
        handle = start_replica(self.spec, stage.pool.section, index, self.run_id)
        stage.starting = (handle, handle.ready.remote(), now, reason)
        log.info("model stage %s: adding replica ModelActor-%s-%d (%d -> %d): %s",
                 stage.pool.section, stage.pool.section, index, n, n + 1, reason)

    def _check_starting(self, stage: _Stage, now: float) -> None:
        """A started replica that has loaded joins the pool (and the workers learn it);
        one still unplaced after ``runtime.resource_wait_s`` is given up."""
        if stage.starting is None:
            return
        handle, ref, asked_at, reason = stage.starting
        if ray.wait([ref], timeout=0)[0]:
            stage.starting = None
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a replica that cannot load: do without
                log.warning("model stage %s: a new replica failed to load (%s); going on "
                            "with %d", stage.pool.section, e, len(stage.pool.actors))
                ray.kill(handle)
                return
            stage.pool.actors.append(handle)
            self.push(stage.pool.section, list(stage.pool.actors))
            stage.samples.clear()
            self._record(stage, reason)
            log.info("model stage %s: %d replicas", stage.pool.section, len(stage.pool.actors))
        elif (now - asked_at >= self.spec.runtime.resource_wait_s
              and waiting_for_resources(handle)):
            stage.starting = None
            ray.kill(handle)
            log.info("model stage %s: a new replica found no room in %g s; going on with %d",
                     stage.pool.section, self.spec.runtime.resource_wait_s,
                     len(stage.pool.actors))

    def _shrink(self, stage: _Stage, now: float) -> None:
        """The newest replica goes when the stage was idle for ``replicas.idle_s``."""
        n = len(stage.pool.actors)
        idle_s = stage.spec.pool.idle_s
        if n <= stage.spec.pool.min or stage.starting is not None or not stage.samples:
            return
        window = [s for s in stage.samples if s[0] >= now - idle_s]
        if stage.samples[0][0] > now - idle_s or not window:
            return   # not measured for idle_s yet (since the last change)
        if any(queued > 0 or busy >= (n - 1) * IDLE_BUSY for _, busy, queued, _, _ in window):
            return
        busy = max(s[1] for s in window)
        actor = stage.pool.actors[-1]
        stage.pool.actors.remove(actor)
        self.push(stage.pool.section, list(stage.pool.actors))
        try:
            self.retired.append(ray.get(actor.get_stats.remote(), timeout=STATS_WAIT_S * 10))
        except Exception:  # noqa: BLE001 - stats are best effort
            pass
        ray.kill(actor)
        stage.samples.clear()
        reason = (f"idle for {idle_s:g} s (busy at most {busy / n:.0%} of the time, "
                  f"nothing queued)")
        self._record(stage, reason)
        log.info("model stage %s: removed a replica (%d -> %d): %s", stage.pool.section,
                 n, n - 1, reason)

    def close(self) -> None:
        """Kill a replica still starting."""
        for stage in self.stages.values():
            if stage.starting is not None:
                ray.kill(stage.starting[0])
                stage.starting = None

    def report(self) -> list[dict[str, Any]]:
        """Per stage: ``stage``, ``min``, ``max``, ``timeline`` (``at_s`` since the pools
        started, ``replicas``, ``reason``) and ``busy_fraction`` (measured busy time over
        replica time; None before two answers)."""
        return [{"stage": section, "min": s.spec.pool.min, "max": s.spec.pool.max,
                 "timeline": list(s.timeline),
                 "busy_fraction": round(s.busy_s / s.replica_s, 3) if s.replica_s else None}
                for section, s in self.stages.items()]
