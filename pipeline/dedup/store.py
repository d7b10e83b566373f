"""What the dedup pass keeps in the output (``_dedup/``), and reading its result.

```
_dedup/generations/g-000001.json                         the generation (exclusive create)
_dedup/generations/g-000001.a-<id>.parquet               its index files: kind, bucket,
                                                         partition_id, file, new
_dedup/pairs/<kind>/b-0003/g-000001.a-<id>.parquet       pairs found by one bucket task
_dedup/semantic/centroids.a-<id>.npy                     k-means centroids (float32, k x d)
_dedup/semantic/index/b-0003/<pid>.a-<id>.parquet        a partition's rows of one cluster
_dedup/duplicates/g-000001.a-<id>.parquet                the result of generation 1
_dedup/_checkpoints/g-000001/<task>.json                 a task's commit marker
_dedup/_checkpoints/centroids.json, assign/<pid>.json    semantic markers (any generation)
_dedup/_leases/<task>.<attempt>.json                     a running task attempt's lease
```

A generation is one run of the pass over the partitions committed when it started; it
compares only pairs with a row of a partition that no earlier generation covered (``new``)
and is complete when its ``duplicates`` marker exists. Every task commits like a
partition (DESIGN.md commit protocol): attempt-unique files, then an exclusive marker that
names them; files no marker names are never read. Like a partition attempt, a task attempt
holds a lease (``_dedup/_leases/``, ``pipeline.output.lease.AttemptLease``) from before its
first file until after its marker exists, and its commit re-reads every file it names
(``verify``) and checks that its lease has at least a quarter of ``lease_s`` left, so
``mmpipe gc`` (``unreferenced``: files, then leases, then markers) never deletes a file a
running task will name. ``latest_duplicates`` reads the newest complete generation's
table; ``covered_duplicates`` also refuses one that does not cover every committed
partition (the deduplicated view).
"""

from __future__ import annotations

import posixpath
import re
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import CommitError
from pipeline.output import lease as leases
from pipeline.output.checkpoint import verify_file
from pipeline.output.layout import DEDUP_DIR, OutputLayout
from pipeline.storage import fs

ROOT = DEDUP_DIR
CHECKPOINTS = f"{ROOT}/_checkpoints"
#: Default lease of a task attempt (seconds) and its renewal period: ``runtime.lease_s`` and
#: ``runtime.lease_renew_s``'s defaults (``mmpipe run``/``dedup`` pass the job's values).
LEASE_S, LEASE_RENEW_S = 60.0, 10.0
#: The name of a file an attempt of the pass writes (``<name>.a-<12 hex>.parquet|npy``);
#: group 1 is the attempt id. Nothing else under ``_dedup/`` is the pass's: gc leaves it.
_ATTEMPT_FILE = re.compile(r"^[^/]+\.a-([0-9a-f]{12})\.(?:parquet|npy)$")


class IncompleteDedupError(FileNotFoundError):
    """The newest complete dedup generation does not cover every committed partition
    (a pass was stopped, or partitions were committed after it): its duplicates table
    would leave the duplicates in the uncovered partitions in a deduplicated view."""


#: Rows of a generation's index-file list.
FILES_SCHEMA = pa.schema([("kind", pa.string()), ("bucket", pa.int32()),
                          ("partition_id", pa.string()), ("file", pa.string()),
                          ("new", pa.bool_())])


def new_id() -> str:
    """A random 12-hex-digit attempt id."""
    return uuid.uuid4().hex[:12]


class Generation(BaseModel):
    """``_dedup/generations/g-<n>.json``: what one run of the pass covers.

    ``partitions``: partition id -> attempt id of every committed partition it covers;
    ``new``: those no earlier generation covered; ``files``: its index-file list
    (``FILES_SCHEMA``, relative path); ``settings``: the index settings (buckets, kinds,
    ``max_hamming_distance``) and the semantic settings; ``tasks``: the task ids to run
    (``<kind>-b-0003``)."""

    model_config = ConfigDict(extra="ignore")

    generation: int
    created_at: float = 0.0
    partitions: dict[str, str]
    new: list[str]
    files: str
    settings: dict[str, Any]
    tasks: list[str] = Field(default_factory=list)


class TaskMarker(BaseModel):
    """A committed dedup task: ``files`` it wrote (relative to the output root) with their
    ``sha256``; ``rows_in``: index rows read; ``pairs``: pairs written; ``seconds``;
    ``peak_rss_bytes``: the peak resident memory of the process that ran it, so far
    (``resource.getrusage``; an actor runs its tasks one after another)."""

    model_config = ConfigDict(extra="ignore")

    task: str
    generation: int
    attempt_id: str
    files: list[str]
    sha256: dict[str, str] = Field(default_factory=dict)
    rows_in: int = 0
    pairs: int = 0
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    ran_on: dict[str, str] = Field(default_factory=dict)


class DedupStore:
    """Paths and markers of the dedup pass inside one output."""

    def __init__(self, output_uri: str):
        self.layout = OutputLayout(output_uri)
        self.output_uri = self.layout.root

    def uri(self, rel: str) -> str:
        return self.layout.uri(rel)

    # --- generations ------------------------------------------------------------------
    @staticmethod
    def generation_rel(n: int) -> str:
        return f"{ROOT}/generations/g-{n:06d}.json"

    def generations(self) -> list[Generation]:
        """Every generation, oldest first. Raises ``CommitError`` for an unreadable one."""
        out = []
        for e in fs.list_files(self.uri(f"{ROOT}/generations")):
            if e.uri.endswith(".json") and ".tmp-" not in e.uri:
                try:
                    out.append(Generation.model_validate_json(fs.read_bytes(e.uri)))
                except (OSError, ValueError) as err:
                    raise CommitError(f"unreadable dedup generation {e.uri}: {err}") from err
        return sorted(out, key=lambda g: g.generation)

    def create_generation(self, gen: Generation, files: pa.Table,
                          lease: leases.AttemptLease | None = None) -> bool:
        """Write the index-file list, then create the generation exclusively; False (and
        the list deleted) if that generation number exists (another pass made it). The
        list is verified before the create and ``lease`` (held by the caller since before
        the list was written) must have a quarter of its time left, as in ``commit``;
        raises ``CommitError`` otherwise."""
        sha, _ = self.write_files_list(gen.files, files)
        self.verify(TaskMarker(task=f"generation-{gen.generation}", generation=gen.generation,
                               attempt_id="", files=[gen.files], sha256={gen.files: sha}))
        if lease is not None:
            lease.check(lease.lease_s / 4)
        if fs.create_exclusive(self.uri(self.generation_rel(gen.generation)),
                               gen.model_dump_json(indent=1).encode()):
            return True
        fs.delete_file(self.uri(gen.files))
        return False

    def generation_files(self, gen: Generation, kind: str, bucket: int) -> pa.Table:
        """The index files of one bucket (``FILES_SCHEMA``), read with a row filter: from
        the generation's list, or for ``semantic`` from the list its ``semantic-files``
        marker names (made once the partitions' cluster assignments exist)."""
        rel = gen.files
        if kind == "semantic":
            rel = self.marker(gen.generation, "semantic-files").files[0]
        fsys, path = fs.resolve(self.uri(rel))
        return fs.with_retries(self.uri(rel), "read", lambda: pq.read_table(
            path, filesystem=fsys, filters=[("kind", "=", kind), ("bucket", "=", bucket)]))

    def write_files_list(self, rel: str, files: pa.Table) -> tuple[str, int]:
        """Write an index-file list (``FILES_SCHEMA``) sorted by kind, bucket, partition,
        in row groups, so a bucket task reads only its rows; ``(sha256, bytes)``."""
        files = files.sort_by([("kind", "ascending"), ("bucket", "ascending"),
                               ("partition_id", "ascending")])
        out = fs.HashingOutput(self.uri(rel))
        pq.write_table(files, out, row_group_size=65536)
        out.close()
        return out.sha256, out.size

    # --- task markers -----------------------------------------------------------------
    @staticmethod
    def marker_rel(generation: int | None, task: str) -> str:
        """``_dedup/_checkpoints/g-000001/<task>.json``; generation None: an
        output-wide task (centroids, assign/<pid>)."""
        where = CHECKPOINTS if generation is None else f"{CHECKPOINTS}/g-{generation:06d}"
        return f"{where}/{task}.json"

    def lease(self, task: str, attempt_id: str, lease_s: float = LEASE_S,
              renew_s: float = LEASE_RENEW_S) -> leases.AttemptLease:
        """Start the lease of one attempt of ``task`` (``_dedup/_leases/<task>.<attempt>
        .json``, ``/`` in the task id written ``~``), renewed every ``renew_s`` seconds for
        ``lease_s`` more; the caller releases it after its commit or clean-up. Raises what
        storage raises."""
        return leases.AttemptLease(self.uri(ROOT), task.replace("/", "~"), attempt_id,
                                   lease_s, renew_s).start()

    def verify(self, marker: TaskMarker) -> None:
        """Re-read every file ``marker`` names (streamed sha256) and compare with the
        digest it records. Raises ``CommitError`` naming the first file missing or changed
        (a marker must never name a file that is gone: ``checkpoint.verify_files``'s rule)."""
        for rel in marker.files:
            verify_file(self.uri(rel), marker.sha256.get(rel), f"dedup task {marker.task}")

    def commit(self, generation: int | None, marker: TaskMarker,
               lease: leases.AttemptLease | None = None) -> bool:
        """Create a task's marker; False if another attempt of it committed first.
        First every file it names is verified (``verify``) and, with ``lease``, the
        attempt's lease must have at least a quarter of its ``lease_s`` left
        (``AttemptLease.check``). Raises ``CommitError`` if either fails."""
        self.verify(marker)
        if lease is not None:
            lease.check(lease.lease_s / 4)
        uri = self.uri(self.marker_rel(generation, marker.task))
        if fs.create_exclusive(uri, marker.model_dump_json(indent=1).encode()):
            return True
        return TaskMarker.model_validate_json(fs.read_bytes(uri)).attempt_id == marker.attempt_id

    def marker(self, generation: int | None, task: str) -> TaskMarker | None:
        """A task's marker, or None if it is not committed."""
        try:
            return TaskMarker.model_validate_json(
                fs.read_bytes(self.uri(self.marker_rel(generation, task))))
        except FileNotFoundError:
            return None

    def markers(self, generation: int | None, under: str = "") -> dict[str, TaskMarker]:
        """The committed task markers of a generation (or output-wide ones ``under`` a
        sub-directory such as ``assign``), keyed by task id."""
        rel = posixpath.dirname(self.marker_rel(generation, posixpath.join(under, "x")))
        out = {}
        for e in fs.list_files(self.uri(rel)):
            name = posixpath.basename(e.uri)
            if name.endswith(".json") and ".tmp-" not in name and \
                    posixpath.dirname(e.uri) == self.uri(rel):
                m = TaskMarker.model_validate_json(fs.read_bytes(e.uri))
                out[m.task] = m
        return out

    def write_table(self, rel: str, table: pa.Table) -> tuple[str, int]:
        """Write ``table`` as Parquet at ``rel``; return ``(sha256, bytes)``."""
        out = fs.HashingOutput(self.uri(rel))
        pq.write_table(table, out)
        out.close()
        return out.sha256, out.size

    def read_tables(self, rels: list[str], schema: pa.Schema,
                    columns: list[str] | None = None) -> pa.Table:
        """The Parquet files ``rels`` as one table of ``schema`` (empty if none)."""
        if not rels:
            return schema.empty_table() if columns is None else \
                pa.schema([schema.field(c) for c in columns]).empty_table()
        fsys, _ = fs.resolve(self.uri(rels[0]))
        paths = [fs.resolve(self.uri(r))[1] for r in rels]
        return fs.with_retries(self.uri(rels[0]), "read", lambda: pq.ParquetDataset(
            paths, filesystem=fsys, schema=schema).read(columns=columns))

    # --- the result -------------------------------------------------------------------
    def complete(self) -> tuple[Generation, TaskMarker] | None:
        """The newest generation whose ``duplicates`` marker exists, with that marker."""
        for gen in reversed(self.generations()):
            m = self.marker(gen.generation, "duplicates")
            if m is not None:
                return gen, m
        return None


def unreferenced(output_uri: str, min_age_s: float = 0.0, margin_s: float = 60.0,
                 clock: leases.StorageClock | None = None
                 ) -> tuple[list[str], list[str], list[str]]:
    """``(garbage, live, young)``: files under ``_dedup/`` that no dedup marker or
    generation names (the files of failed, lost or still running task attempts), split
    into those ``mmpipe gc`` may delete, those of an attempt whose lease is live (not
    expired more than ``margin_s`` seconds ago, or unreadable: being replaced) and those
    modified less than ``min_age_s`` seconds ago. Only files named like the pass's
    (``<name>.a-<attempt>.parquet|npy``) are listed: markers, generation files, leases and
    anything else someone put under ``_dedup/`` never are. The order is ``pipeline.output.gc``'s: files, then
    leases, then markers and generations; a task attempt holds its lease from before its
    first file until its marker exists, so a file listed without a live lease belongs to
    an attempt that ended, and its marker, if any, is in the later listing. Leases and
    ``min_age_s`` are judged by ``clock`` (the storage's, ``pipeline.output.gc.
    storage_clock``; None: this host's), as gc judges attempt leases."""
    store = DedupStore(output_uri)
    files = [(e, m.group(1)) for top in ("pairs", "duplicates", "semantic", "generations")
             for e in fs.list_files(store.uri(f"{ROOT}/{top}"))                 # 1. files
             if (m := _ATTEMPT_FILE.match(posixpath.basename(e.uri)))]
    now = (clock or leases.StorageClock(0.0)).now()   # taken before the leases are listed
    held = {attempt for (_, attempt), rec in leases.attempt_leases(store.uri(ROOT)).items()
            if rec is None or not rec.expired_by(now, margin_s)}                # 2. leases
    named = set()                                                               # 3. markers
    for gen in store.generations():
        named.add(store.uri(gen.files))
        for m in store.markers(gen.generation).values():
            named.update(store.uri(f) for f in m.files)
    for under in ("", "assign"):
        for m in store.markers(None, under).values():
            named.update(store.uri(f) for f in m.files)
    cutoff = now - min_age_s
    garbage, live, young = [], [], []
    for e, attempt in files:
        if e.uri in named:
            continue
        if attempt in held:
            live.append(e.uri)
        elif min_age_s and e.mtime_s is not None and e.mtime_s > cutoff:
            young.append(e.uri)
        else:
            garbage.append(e.uri)
    return garbage, live, young


def stale_leases(output_uri: str, margin_s: float = 60.0,
                 clock: leases.StorageClock | None = None) -> list[str]:
    """URIs of the ``_dedup/_leases/`` files expired more than ``margin_s`` seconds ago by
    ``clock`` (as in ``unreferenced``): their attempts ended without removing them; gc
    deletes them after the files."""
    root = DedupStore(output_uri).uri(ROOT)
    now = (clock or leases.StorageClock(0.0)).now()
    return [fs.join(root, leases.attempt_lease_rel(*k))
            for k, rec in leases.attempt_leases(root).items()
            if rec is not None and rec.expired_by(now, margin_s)]


def latest_duplicates(output_uri: str) -> pa.Table | None:
    """The ``duplicates`` table (``groups.duplicates_schema``: with the frame columns when
    the output's index has frame rows) of the newest complete dedup generation in the newest complete output generation of ``output_uri``, or None if the dedup pass never completed there."""
    from pipeline.dedup.groups import duplicates_schema
    from pipeline.output.generations import read_root

    store = DedupStore(read_root(output_uri))   # the newest complete generation's pass
    done = store.complete()
    if done is None:
        return None
    return store.read_tables(done[1].files,
                             duplicates_schema(bool(done[0].settings.get("frames"))))


def covered_duplicates(output_uri: str) -> pa.Table:
    """``latest_duplicates``, only if its dedup generation covers every partition committed
    in the newest complete output generation (what ``read_output(deduplicated=True)`` and
    ``mmpipe export --deduplicated`` use). Raises ``FileNotFoundError`` if no dedup pass
    completed there, ``IncompleteDedupError`` (a ``FileNotFoundError``) naming the
    partitions it does not cover (their duplicates would be kept): run ``mmpipe dedup``."""
    from pipeline.dedup.groups import DUPLICATES_SCHEMA
    from pipeline.output.checkpoint import CheckpointStore
    from pipeline.output.generations import read_root

    root = read_root(output_uri)
    store = DedupStore(root)
    done = store.complete()
    if done is None:
        raise FileNotFoundError(f"{output_uri}: no complete dedup pass (run `mmpipe dedup "
                                f"{output_uri}`)")
    committed = CheckpointStore(root).committed_ids()
    missing = sorted(committed - set(done[0].partitions))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise IncompleteDedupError(
            f"{output_uri}: the newest complete dedup pass (generation {done[0].generation}) "
            f"covers {len(committed) - len(missing)} of {len(committed)} committed partitions "
            f"(not {shown}): a deduplicated view would keep their duplicates; run "
            f"`mmpipe dedup {output_uri}`")
    return store.read_tables(done[1].files, DUPLICATES_SCHEMA)


def summary(output_uri: str) -> dict[str, Any] | None:
    """For ``mmpipe status``: the newest generation (number, partitions covered, complete
    or not, tasks committed of planned) and, if one is complete, its duplicates by kind."""
    from pipeline.dedup.groups import DUPLICATES_SCHEMA

    store = DedupStore(output_uri)
    gens = store.generations()
    if not gens:
        return None
    last = gens[-1]
    out: dict[str, Any] = {"generation": last.generation, "partitions": len(last.partitions),
                           "tasks": len(last.tasks),
                           "tasks_committed": len(set(store.markers(last.generation))
                                                  & set(last.tasks)),
                           "complete": store.marker(last.generation, "duplicates") is not None}
    done = store.complete()
    if done is not None:
        table = store.read_tables(done[1].files, DUPLICATES_SCHEMA, ["kind"])
        kinds = table["kind"].value_counts().to_pylist()
        out["complete_generation"] = done[0].generation
        out["duplicates"] = table.num_rows
        out["by_kind"] = {k["values"]: k["counts"] for k in kinds}
    return out
