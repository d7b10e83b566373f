"""What a run used, per stage, and what it cost (``runtime.prices``).

``run_cost`` turns the driver's measurements into the report's ``cost``: partition
workers use ``WORKER_CPUS`` CPU cores for the wall time of every attempt (committed,
failed or timed out, from hand-out to outcome); each model stage's replicas use their
section's ``num_cpus``/``num_gpus`` for their lifetime (``alive_s``, from start to the
end of the job: an idle replica still holds its GPU), and ``busy_s`` is the time they
computed. With prices, ``cost`` is ``cpu_s / 3600 * cpu_hour + gpu_s / 3600 * gpu_hour``
and ``per_million_rows`` that over the rows this run committed.
"""

from __future__ import annotations

from typing import Any

from pipeline.spec import JobSpec

#: CPU cores of one PartitionWorker (``executors``: ``num_cpus=1``; a worker process: one).
WORKER_CPUS = 1.0
#: The stage name of the partition workers in ``stages``.
WORKERS = "partition_workers"


def run_cost(spec: JobSpec, attempt_s: float, model_actors: list[dict[str, Any]],
             rows: int, models_in_workers: bool = False) -> dict[str, Any]:
    """The ``cost`` of a run as a JSON-ready dict.

    ``attempt_s``: wall seconds of every partition attempt of this run, summed;
    ``model_actors``: the model replicas' statistics (``serving.server_stats``: ``model``
    section, ``alive_s``, ``busy_s``); ``rows``: rows this run committed;
    ``models_in_workers``: the models ran inside the worker processes (no Ray), whose
    CPU time is the workers'. Keys: ``stages`` (stage -> ``cpu_s``, ``gpu_s``,
    ``busy_s``, and ``replicas`` for a model stage), ``cpu_s``, ``gpu_s``, and with a
    price in ``runtime.prices``: ``prices``, ``cost`` and ``per_million_rows`` (None when
    no row was committed). Seconds are rounded to 0.01.
    """
    stages: dict[str, dict[str, float]] = {
        WORKERS: {"cpu_s": attempt_s * WORKER_CPUS, "gpu_s": 0.0, "busy_s": attempt_s}}
    for actor in [] if models_in_workers else model_actors:
        section = actor.get("model", "?")
        sspec = getattr(spec, section, None)
        alive = float(actor.get("alive_s", 0.0))
        stage = stages.setdefault(section, {"replicas": 0, "cpu_s": 0.0, "gpu_s": 0.0,
                                            "busy_s": 0.0})
        stage["replicas"] += 1
        stage["cpu_s"] += alive * getattr(sspec, "num_cpus", 0.0)
        stage["gpu_s"] += alive * getattr(sspec, "num_gpus", 0.0)
        stage["busy_s"] += float(actor.get("busy_s", 0.0))
    stages = {name: {k: round(v, 2) if k != "replicas" else v for k, v in s.items()}
              for name, s in stages.items()}
    out: dict[str, Any] = {"stages": stages,
                           "cpu_s": round(sum(s["cpu_s"] for s in stages.values()), 2),
                           "gpu_s": round(sum(s["gpu_s"] for s in stages.values()), 2)}
    prices = spec.runtime.prices
    if prices.cpu_hour or prices.gpu_hour:
        cost = out["cpu_s"] / 3600 * prices.cpu_hour + out["gpu_s"] / 3600 * prices.gpu_hour
        out.update(prices=prices.model_dump(), cost=round(cost, 6),
                   per_million_rows=round(cost / rows * 1e6, 4) if rows else None)
    return out


def format_cost(cost: dict[str, Any]) -> str:
    """One report line: ``cost: 12.3 CPU-core-s, 0.0 GPU-s (partition_workers: ...; ...)``
    and, with prices, ``= 0.0012 (0.41 per million rows)``."""
    parts = "; ".join(
        f"{name}: {s['cpu_s']:.1f} CPU-s, {s['gpu_s']:.1f} GPU-s, busy {s['busy_s']:.1f} s"
        + (f", {s['replicas']} replicas" if "replicas" in s else "")
        for name, s in cost["stages"].items())
    line = f"  cost: {cost['cpu_s']:.1f} CPU-core-s, {cost['gpu_s']:.1f} GPU-s ({parts})"
    if "cost" in cost:
        per = cost["per_million_rows"]
        line += (f"; at {cost['prices']['cpu_hour']:g}/CPU-hour, "
                 f"{cost['prices']['gpu_hour']:g}/GPU-hour: {cost['cost']:.6g}"
                 + (f" ({per:.6g} per million output rows)" if per is not None else ""))
    return line
