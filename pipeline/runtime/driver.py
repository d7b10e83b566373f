"""The driver: plan, list markers, hand partition ids to workers, report.

The driver holds O(partitions) state and is never on the data path: workers read their
partition's input and write its output themselves. A partition whose attempt raises (or
whose worker dies) is queued again until ``max_attempts``; then it is reported failed and
the other partitions still complete.
"""

from __future__ import annotations

import collections
import logging
import time

import ray
from ray.exceptions import RayActorError, RayTaskError

from pipeline.errors import PlanError
from pipeline.io import fs, plan as planning
from pipeline.io.checkpoint import CheckpointStore
from pipeline.io.sources import make_datasource
from pipeline.models.text import resolve_model_dir
from pipeline.runtime.model_pool import start_model_pool
from pipeline.runtime.partition import new_attempt_id
from pipeline.runtime.progress import Progress
from pipeline.runtime.report import JobReport
from pipeline.runtime.worker import PartitionWorker
from pipeline.spec import JobSpec, fingerprint

log = logging.getLogger(__name__)


def prepare_output(spec: JobSpec) -> None:
    """Apply ``runtime.mode`` to the output location. Raises ``PlanError``."""
    out = spec.sink.uri
    if spec.runtime.mode == "overwrite":
        fs.delete_tree(out)
    elif spec.runtime.mode == "error-if-exists" and any(True for _ in fs.list_files(out)):
        raise PlanError(f"sink.uri {out!r} is not empty and runtime.mode is error-if-exists")


def default_workers(spec: JobSpec) -> int:
    """Cluster CPUs minus those reserved for model actors, at least 1."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    te = spec.text_embedding
    reserved = te.replicas * te.num_cpus if te.enabled else 0
    return max(1, int(cpus - reserved))


def run_job(spec: JobSpec) -> JobReport:
    """Run a job on the connected Ray cluster (``ray.init`` done by the caller)."""
    t0 = time.time()
    fp = fingerprint(spec)
    if spec.text_embedding.enabled:
        resolve_model_dir(spec.text_embedding.model)  # fail now, not in an actor
    prepare_output(spec)
    source = make_datasource(spec.source, spec.decode)
    plan, how = planning.load_or_create(spec.sink.uri, spec.source, source.list_inputs)
    store = CheckpointStore(spec.sink.uri)
    done, foreign = store.committed(fp)
    if foreign:
        raise PlanError(f"{spec.sink.uri}: {len(foreign)} partitions were committed under another "
                        f"spec fingerprint ({next(iter(foreign.values())).get('fingerprint')}, "
                        f"now {fp}); use --mode overwrite or a new output location")
    report = JobReport(spec.name, spec.sink.uri, fp, f"{how}, {len(plan.partitions)} partitions",
                       partitions_total=len(plan.partitions))
    for pid in sorted(done):
        report.add_marker(done[pid], this_run=False)
    todo = [p for p in plan.partitions if p.partition_id not in done]
    log.info("job %s: %d partitions planned (%s), %d already committed, %d to run",
             spec.name, len(plan.partitions), how, len(done), len(todo))
    if todo:
        _run_partitions(spec, fp, todo, report)
    report.wall_s = time.time() - t0
    if report.complete:
        store.write_success(report.to_dict())
    return report


def _start_worker(spec: JobSpec, fp: str, index: int, actors: list, dim: int | None):
    return PartitionWorker.options(name=f"PartitionWorker-{index}-{spec.name}",
                                   num_cpus=1).remote(spec.model_dump_json(), fp, index, actors, dim)


def _run_partitions(spec: JobSpec, fp: str, todo: list, report: JobReport) -> None:
    actors, dim = [], None
    if spec.text_embedding.enabled:
        actors = start_model_pool(spec.text_embedding, spec.name)
        dim = ray.get(actors[0].ready.remote())
    n_workers = min(len(todo), spec.runtime.num_workers or default_workers(spec))
    workers = {i: _start_worker(spec, fp, i, actors, dim) for i in range(n_workers)}
    queue = collections.deque(todo)
    attempts: collections.Counter = collections.Counter()
    in_flight: dict = {}  # ObjectRef -> (worker index, partition, attempt id)
    progress = Progress(len(todo), spec.runtime.progress_interval_s)
    idle = collections.deque(workers)
    try:
        while queue or in_flight:
            while queue and idle:
                i, part = idle.popleft(), queue.popleft()
                attempt = new_attempt_id()
                attempts[part.partition_id] += 1
                report.attempts.setdefault(part.partition_id, []).append(attempt)
                in_flight[workers[i].run.remote(part, attempt)] = (i, part, attempt)
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            ref = ready[0]
            i, part, attempt = in_flight.pop(ref)
            pid = part.partition_id
            try:
                outcome = ray.get(ref)
            except (RayActorError, RayTaskError) as e:
                if isinstance(e, RayActorError):
                    log.warning("worker %d died during %s; starting a new one", i, pid)
                    workers[i] = _start_worker(spec, fp, i, actors, dim)
                idle.append(i)
                if attempts[pid] < spec.runtime.max_attempts:
                    log.warning("partition %s attempt %s failed (%s); retrying", pid, attempt,
                                _short(e))
                    queue.append(part)
                else:
                    log.error("partition %s failed after %d attempts: %s", pid, attempts[pid],
                              _short(e))
                    report.partitions_failed[pid] = _short(e)
                    progress.update(pid, 0)
                continue
            idle.append(i)
            if outcome["committed"]:
                report.add_marker(outcome, this_run=True)
            else:  # a zombie or concurrent attempt won; its marker is the truth
                report.add_marker(CheckpointStore(spec.sink.uri).markers()[pid], this_run=False)
            progress.update(pid, outcome["rows_in"])
    finally:
        progress.close()
        report.model_actors = _model_stats(actors)
        for w in workers.values():
            ray.kill(w)
        for a in actors:
            ray.kill(a)


def _model_stats(actors: list) -> list[dict]:
    try:
        return ray.get([a.get_stats.remote() for a in actors], timeout=10)
    except Exception:  # noqa: BLE001 - stats are best effort at shutdown
        return []


def _short(e: BaseException) -> str:
    text = str(e.cause) if isinstance(e, RayTaskError) and e.cause else str(e)
    return text.strip().splitlines()[-1][:500] if text.strip() else type(e).__name__
