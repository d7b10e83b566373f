"""The dataset-wide dedup pass (``mmpipe dedup``): plan a generation, run its tasks on
``DedupWorker`` actors that each own a range of buckets, then the union step.

Resumable like the main pass: every task commits a marker (``pipeline.dedup.store``), a
rerun runs only tasks without one, and a generation left incomplete is finished before a
new one starts; the pass then plans again, generation after generation, until the newest
complete one covers every committed partition (a generation finished for a stopped pass
does not cover partitions committed since). A task that keeps failing (``max_attempts``)
is reported; the generation then stays incomplete and the command exits non-zero, naming
it. Every file the pass writes is written under an attempt lease (``store.DedupStore.lease``)
and verified before the marker or generation that names it is created.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from pipeline.dedup import groups, tasks
from pipeline.dedup.index import INDEX_ROOT, KINDS
from pipeline.dedup.store import (FILES_SCHEMA, LEASE_RENEW_S, LEASE_S, DedupStore, Generation,
                                  TaskMarker, new_id)
from pipeline.errors import SpecError
from pipeline.storage import fs
from pipeline.output.committed import check_file_names
from pipeline.output.generations import attempt_roots_of, read_root
from pipeline.output.checkpoint import CheckpointStore
from pipeline.output.table import publish_duplicates
from pipeline.runtime import chaos, job_env
from pipeline.spec import DatasetDedupSpec, StorageSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DedupReport:
    """What one ``mmpipe dedup`` did: the newest generation, partitions it covers
    (``new``: not covered before), ``generations_run`` (every generation this call worked
    on: an old incomplete one it finished, then new ones), tasks run / already committed /
    failed (task -> error), the result (duplicates by kind) and wall time (seconds).
    ``complete``: the newest generation is complete and covers every committed partition."""

    output_uri: str
    generation: int = 0
    generations_run: list[int] = dataclasses.field(default_factory=list)
    partitions: int = 0
    new_partitions: int = 0
    tasks_run: list[str] = dataclasses.field(default_factory=list)
    tasks_skipped: int = 0
    tasks_failed: dict[str, str] = dataclasses.field(default_factory=dict)
    duplicates: int = 0
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    complete: bool = False
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def format(self) -> str:
        """A few lines for the terminal."""
        lines = [f"dedup {self.output_uri}: generation {self.generation}, "
                 f"{self.partitions} partitions ({self.new_partitions} new), "
                 f"{len(self.tasks_run)} tasks run, {self.tasks_skipped} already committed, "
                 f"{self.wall_s:.1f}s"]
        if len(self.generations_run) > 1:
            lines.append(f"  generations run: {', '.join(map(str, self.generations_run))} "
                         "(an unfinished one first, then one over the partitions it did "
                         "not cover)")
        if self.complete:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items())) or "none"
            lines.append(f"  duplicates: {self.duplicates} ({kinds})")
        for task, err in sorted(self.tasks_failed.items()):
            lines.append(f"  FAILED {task}: {err}")
        if not self.complete:
            lines.append("  incomplete: run `mmpipe dedup` again to resume")
        return "\n".join(lines)


def index_settings(markers: dict) -> dict[str, Any]:
    """The index settings the partitions were written with (every marker's must agree).
    Raises ``SpecError`` if no marker has an index (the job ran without
    ``dedup.dataset.enabled``) or two disagree."""
    seen = {tuple(sorted(m.settings.get("datasinks", {}).get("index", {}).items()))
            for m in markers.values()}
    seen.discard(())
    if not seen:
        raise SpecError("no hash index in this output: the job ran without "
                        "dedup.dataset.enabled (run it with that set, into a new output)",
                        "dedup.dataset.enabled", False)
    if len(seen) > 1:
        raise SpecError(f"partitions were indexed with different settings: {sorted(seen)}",
                        "dedup.dataset", None)
    return dict(next(iter(seen)))


def plan_generation(output_uri: str, spec: DatasetDedupSpec, lease_s: float = LEASE_S,
                    lease_renew_s: float = LEASE_RENEW_S) -> Generation | None:
    """The generation to run: the newest one if it is incomplete, else a new one over
    every committed partition, or None if no partition is new since the newest complete
    one. A new generation's file list is written under a lease (``lease_s``, renewed
    every ``lease_renew_s`` seconds) and verified before the generation is created.
    Raises ``SpecError`` (see ``index_settings``), ``FileNotFoundError`` if nothing is
    committed, ``CommitError`` if the list is gone before the create or a marker names a
    file outside its attempt's directories (``output.committed.check_file_names``)."""
    store = DedupStore(output_uri)
    gens = store.generations()
    if gens and store.marker(gens[-1].generation, "duplicates") is None:
        return gens[-1]
    checkpoints = CheckpointStore(output_uri)
    markers = checkpoints.markers()
    if not markers:
        raise FileNotFoundError(f"{output_uri}: no committed partition to dedup")
    roots = attempt_roots_of(output_uri)
    for pid, m in markers.items():   # a name outside its attempt's directories is never read
        check_file_names(m, checkpoints.layout.marker(pid), roots)
    settings = index_settings(markers)
    covered = set(gens[-1].partitions) if gens else set()
    new = sorted(set(markers) - covered)
    if not new:
        return None
    settings.update(semantic=spec.semantic, semantic_clusters=spec.semantic_clusters,
                    semantic_threshold=spec.semantic_threshold,
                    semantic_sample_size=spec.semantic_sample_size)
    if gens:   # the semantic settings stay those of the first generation
        for k in ("semantic", "semantic_clusters", "semantic_threshold",
                  "semantic_sample_size"):
            settings[k] = gens[0].settings.get(k, settings[k])
    rows, task_set = [], set()
    for pid in sorted(markers):
        for f in markers[pid].files:
            if f.startswith(INDEX_ROOT + "/"):
                _, kind, b, _ = f.split("/", 3)
                bucket = int(b[2:])
                rows.append((kind, bucket, pid, f, pid in new))
                if pid in new:
                    task_set.add(tasks.bucket_task(kind, bucket))
    n = gens[-1].generation + 1 if gens else 1
    gen = Generation(generation=n, created_at=time.time(),
                     partitions={p: m.attempt_id for p, m in sorted(markers.items())},
                     new=new, files=f"_dedup/generations/g-{n:06d}.a-{new_id()}.parquet",
                     settings=settings, tasks=sorted(task_set))
    table = pa.table([list(c) for c in zip(*rows)] if rows else [[]] * 5, schema=FILES_SCHEMA)
    attempt = gen.files.rsplit(".a-", 1)[1].split(".")[0]
    lease = store.lease(f"generation-{n:06d}", attempt, lease_s, lease_renew_s)
    try:
        created = store.create_generation(gen, table, lease)
    finally:
        lease.release()
    if not created:
        raise RuntimeError(f"{output_uri}: dedup generation {n} was created by another "
                           "dedup pass at the same time; run again when it has finished")
    return gen


@ray.remote(num_cpus=1)
class DedupWorker:
    """Runs dedup tasks (``pipeline.dedup.tasks.run_task``) one at a time."""

    def __init__(self, storage_json: str, index: int, lease_s: float = LEASE_S,
                 lease_renew_s: float = LEASE_RENEW_S):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        job_env.apply()  # `mmpipe submit --env` values, before storage is configured
        fs.configure(**StorageSpec.model_validate_json(storage_json).model_dump(), from_env=False)
        self.index = index
        self.lease_s, self.lease_renew_s = lease_s, lease_renew_s

    def ping(self) -> bool:
        """Returns once the actor is up (it has its CPU)."""
        return True

    def run(self, output_uri: str, generation_json: str, task: str) -> str:
        chaos.maybe_kill_worker(task)
        gen = Generation.model_validate_json(generation_json)
        marker = tasks.run_task(output_uri, gen, task, {
            "worker": f"DedupWorker-{self.index}",
            "node_id": ray.get_runtime_context().get_node_id()},
            lease_s=self.lease_s, lease_renew_s=self.lease_renew_s)
        log.info("dedup task %s: %d index rows, %d pairs, %.2fs", task, marker.rows_in,
                 marker.pairs, marker.seconds)
        return marker.model_dump_json()


def _run_tasks(output_uri: str, gen: Generation, todo: list[str], n_workers: int,
               storage: StorageSpec, max_attempts: int, report: DedupReport,
               lease: tuple[float, float] = (LEASE_S, LEASE_RENEW_S)) -> None:
    """Run ``todo`` on up to ``n_workers`` actors. ``todo`` is cut into ``n_workers``
    contiguous ranges; an actor owns one range at a time, and is handed one only once it
    is up (its ``ping`` returned), so an actor waiting for a CPU holds no range hostage.
    A failed task is retried (on a fresh actor if its actor died), then recorded in the
    report and skipped. ``lease``: ``(lease_s, lease_renew_s)`` of each task attempt."""
    if not todo:
        return
    n_workers = max(1, min(n_workers, len(todo)))
    ranges = [list(r) for r in np.array_split(np.array(todo, dtype=object), n_workers)]
    gen_json, storage_json = gen.model_dump_json(), storage.model_dump_json()
    workers = [DedupWorker.remote(storage_json, i, *lease) for i in range(n_workers)]
    owned: dict[int, list[str]] = {}
    attempts: dict[str, int] = {}
    starts: dict[int, int] = {}
    in_flight = {w.ping.remote(): (i, None) for i, w in enumerate(workers)}

    def submit(i: int) -> None:
        if not owned.get(i):
            owned[i] = ranges.pop(0) if ranges else []
        if owned[i]:
            ref = workers[i].run.remote(output_uri, gen_json, owned[i][0])
            in_flight[ref] = (i, owned[i][0])

    try:
        # until every range is done: pings of actors still waiting for a CPU don't count
        while in_flight and (ranges or any(owned.values())):
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            i, task = in_flight.pop(ready[0])
            try:
                ray.get(ready[0])
                if task is not None:
                    report.tasks_run.append(task)
                    owned[i].pop(0)
            except (ray.exceptions.RayError, OSError) as e:
                first = (str(e).splitlines() or [type(e).__name__])[0]
                if isinstance(e, ray.exceptions.RayActorError):
                    workers[i] = DedupWorker.remote(storage_json, i, *lease)
                if task is None:       # the actor could not start: a fresh one, or give up
                    starts[i] = starts.get(i, 0) + 1
                    if starts[i] < max_attempts:
                        in_flight[workers[i].ping.remote()] = (i, None)
                    elif not in_flight:   # no actor left: what is left fails
                        for t in owned.get(i, []) + [t for r in ranges for t in r]:
                            report.tasks_failed[t] = f"no DedupWorker could start: {first}"
                    continue
                attempts[task] = attempts.get(task, 0) + 1
                log.warning("dedup task %s: attempt %d failed: %s", task, attempts[task], first)
                if attempts[task] >= max_attempts:
                    report.tasks_failed[task] = first
                    owned[i].pop(0)
                if isinstance(e, ray.exceptions.RayActorError):
                    in_flight[workers[i].ping.remote()] = (i, None)
                    continue
            submit(i)
    finally:
        for w in workers:
            ray.kill(w)


def _semantic_files(store: DedupStore, gen: Generation, report: DedupReport,
                    run, lease: tuple[float, float] = (LEASE_S, LEASE_RENEW_S)
                    ) -> list[str] | None:
    """Centroids, then the cluster assignment of every covered partition that has none,
    then the generation's semantic index-file list; the semantic bucket tasks to run
    (None if a prerequisite task failed)."""
    if store.marker(None, tasks.CENTROIDS) is None:
        run([tasks.CENTROIDS])
        if store.marker(None, tasks.CENTROIDS) is None:
            return None
    assigned = store.markers(None, "assign")
    missing = [f"assign/{p}" for p in gen.partitions if f"assign/{p}" not in assigned]
    run(missing)
    assigned = store.markers(None, "assign")
    if any(t not in assigned for t in missing):
        return None
    marker = store.marker(gen.generation, tasks.SEMANTIC_FILES)
    if marker is None:
        rows = []
        for pid in sorted(gen.partitions):
            for f in assigned[f"assign/{pid}"].files:
                rows.append(("semantic", int(f.split("/")[3][2:]), pid, f, pid in gen.new))
        table = pa.table([list(c) for c in zip(*rows)] if rows else [[]] * 5, schema=FILES_SCHEMA)
        attempt = new_id()
        rel = f"_dedup/generations/g-{gen.generation:06d}.semantic.a-{attempt}.parquet"
        held = store.lease(f"{tasks.SEMANTIC_FILES}-g-{gen.generation:06d}", attempt, *lease)
        try:
            sha, _ = store.write_files_list(rel, table)
            store.commit(gen.generation, TaskMarker(task=tasks.SEMANTIC_FILES,
                                                    generation=gen.generation,
                                                    attempt_id=attempt, files=[rel],
                                                    sha256={rel: sha}), held)
        finally:
            held.release()
        marker = store.marker(gen.generation, tasks.SEMANTIC_FILES)
    listed = store.read_tables(marker.files, FILES_SCHEMA)
    new = listed.filter(listed["new"])
    return sorted({tasks.bucket_task("semantic", b) for b in new["bucket"].to_pylist()})


def union(store: DedupStore, gen: Generation,
          lease: tuple[float, float] = (LEASE_S, LEASE_RENEW_S)) -> TaskMarker:
    """The union step: pairs of every generation up to ``gen`` -> ``duplicates`` table,
    committed as the generation's ``duplicates`` marker (its file written under a lease
    of ``lease`` = ``(lease_s, lease_renew_s)`` and verified before the commit; raises
    ``CommitError`` if it is gone)."""
    files = []
    for g in range(1, gen.generation + 1):
        for task, m in sorted(store.markers(g).items()):
            if task.rpartition("-b-")[1]:
                files += m.files
    frames = bool(gen.settings.get("frames"))
    table = groups.duplicates(store.read_tables(files, groups.pairs_schema(frames)), frames)
    attempt = new_id()
    rel = f"_dedup/duplicates/g-{gen.generation:06d}.a-{attempt}.parquet"
    held = store.lease(f"duplicates-g-{gen.generation:06d}", attempt, *lease)
    try:
        sha, _ = store.write_table(rel, table)
        marker = TaskMarker(task="duplicates", generation=gen.generation, attempt_id=attempt,
                            files=[rel], sha256={rel: sha}, rows_in=len(files),
                            pairs=table.num_rows)
        if not store.commit(gen.generation, marker, held):
            fs.delete_file(store.uri(rel))
            marker = store.marker(gen.generation, "duplicates")
    finally:
        held.release()
    return marker


def run_dedup(output_uri: str, spec: DatasetDedupSpec, storage: StorageSpec | None = None,
              max_attempts: int = 3, task_order: str = "plan", lease_s: float = LEASE_S,
              lease_renew_s: float = LEASE_RENEW_S) -> DedupReport:
    """Run (or resume) the dedup pass over ``output_uri`` on the connected Ray cluster
    (over its newest complete generation, ``generations.read_root``: its files go under
    that generation's root).

    An incomplete generation is finished first; then generations are planned and run
    until the newest complete one covers every committed partition (``report.complete``)
    or a generation stays incomplete (a task failed: ``report.tasks_failed``).
    ``spec``: the semantic settings and worker count (the index settings come from the
    commit markers). ``task_order``: ``"plan"`` or ``"reversed"`` (tests: the result must
    not depend on it). ``lease_s``/``lease_renew_s``: each task attempt's lease
    (``runtime.lease_s``/``lease_renew_s``, seconds). Raises ``SpecError`` if the output
    has no hash index or semantic dedup is asked without embeddings,
    ``FileNotFoundError`` if nothing is committed.
    """
    t0 = time.time()
    storage = storage or StorageSpec()
    fs.configure(**storage.model_dump())
    storage = storage.model_copy(update=fs.resolved_storage())  # what the actors use
    output_uri = read_root(output_uri)   # the newest complete generation of the output
    store = DedupStore(output_uri)
    report = DedupReport(store.output_uri)
    lease = (lease_s, lease_renew_s)
    while True:
        gen = plan_generation(output_uri, spec, *lease)
        if gen is None:   # nothing new since the newest complete generation: it stands
            done = store.complete()
            report.generation, report.partitions = done[0].generation, len(done[0].partitions)
            _result(store, report)
            _publish(store)
            break
        report.generation, report.partitions, report.new_partitions = (
            gen.generation, len(gen.partitions), len(gen.new))
        report.generations_run.append(gen.generation)
        if not _run_generation(store, gen, spec, storage, max_attempts, task_order, lease,
                               report):
            break          # a task failed: the generation stays incomplete
    report.wall_s = round(time.time() - t0, 3)
    return report


def _run_generation(store: DedupStore, gen: Generation, spec: DatasetDedupSpec,
                    storage: StorageSpec, max_attempts: int, task_order: str,
                    lease: tuple[float, float], report: DedupReport) -> bool:
    """Run the tasks of ``gen`` that have no marker, then its union; True if the
    generation is complete."""
    output_uri = store.output_uri
    n_workers = spec.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))

    def run(todo: list[str]) -> None:
        if task_order == "reversed":
            todo = list(reversed(todo))
        _run_tasks(output_uri, gen, todo, n_workers, storage, max_attempts, report, lease)

    planned = [t for t in gen.tasks if tasks.parse_bucket_task(t)[0] in KINDS
               and (gen.settings.get(tasks.parse_bucket_task(t)[0]) is not False)]
    if gen.settings.get("semantic"):
        semantic = _semantic_files(store, gen, report, run, lease)
        planned += semantic if semantic is not None else []
    committed = set(store.markers(gen.generation))
    report.tasks_skipped += len([t for t in planned if t in committed])
    run([t for t in planned if t not in committed])
    committed = set(store.markers(gen.generation))
    for task in planned:   # the union runs only over every planned task's committed pairs
        if task not in committed:
            report.tasks_failed.setdefault(task, "not committed")
    if report.tasks_failed or (gen.settings.get("semantic") and
                               not store.marker(gen.generation, tasks.SEMANTIC_FILES)):
        return False
    union(store, gen, lease)
    return store.marker(gen.generation, "duplicates") is not None


def _publish(store: DedupStore) -> None:
    """Publish the newest complete duplicates table as a Delta table
    (``output.table.publish_duplicates``); a failure is logged (``mmpipe dedup`` again
    publishes it)."""
    done = store.complete()
    if done is None:
        return
    try:
        publish_duplicates(store.output_uri, done[1].files[0])
    except Exception as e:  # noqa: BLE001 - the table is derived: never fail the pass
        log.warning("%s: duplicates Delta table not published (%s: %s)", store.output_uri,
                    type(e).__name__, e)


def _result(store: DedupStore, report: DedupReport) -> None:
    done = store.complete()
    if done is None or done[0].generation != report.generation:
        return
    table = store.read_tables(done[1].files, groups.DUPLICATES_SCHEMA, ["kind"])
    report.complete, report.duplicates = True, table.num_rows
    report.by_kind = {k["values"]: k["counts"] for k in table["kind"].value_counts().to_pylist()}
