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
```

A generation is one run of the pass over the partitions committed when it started; it
compares only pairs with a row of a partition that no earlier generation covered (``new``)
and is complete when its ``duplicates`` marker exists. Every task commits like a
partition (DESIGN.md commit protocol): attempt-unique files, then an exclusive marker that
names them; files no marker names are never read. ``latest_duplicates`` reads the newest
complete generation's table.
"""

from __future__ import annotations

import posixpath
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import CommitError
from pipeline.storage import fs
from pipeline.output.layout import DEDUP_DIR, OutputLayout

ROOT = DEDUP_DIR
CHECKPOINTS = f"{ROOT}/_checkpoints"

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

    def create_generation(self, gen: Generation, files: pa.Table) -> bool:
        """Write the index-file list, then create the generation exclusively; False (and
        the list deleted) if that generation number exists (another pass made it)."""
        self.write_files_list(gen.files, files)
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

    def commit(self, generation: int | None, marker: TaskMarker) -> bool:
        """Create a task's marker; False if another attempt of it committed first."""
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


def unreferenced(output_uri: str, min_age_s: float) -> tuple[list[str], list[str]]:
    """``(old, young)``: files under ``_dedup/`` that no dedup marker or generation names
    (the files of failed or lost task attempts), last modified at least ``min_age_s``
    seconds ago, and the younger ones (a running pass may still be writing them).
    Markers and generation files themselves are never listed."""
    store = DedupStore(output_uri)
    named = set()
    gens = store.generations()
    for gen in gens:
        named.add(store.uri(gen.files))
        for m in store.markers(gen.generation).values():
            named.update(store.uri(f) for f in m.files)
    for under in ("", "assign"):
        for m in store.markers(None, under).values():
            named.update(store.uri(f) for f in m.files)
    cutoff = time.time() - min_age_s
    old, young = [], []
    for top in ("pairs", "duplicates", "semantic", "generations"):
        for e in fs.list_files(store.uri(f"{ROOT}/{top}")):
            if e.uri in named or e.uri.endswith(".json"):
                continue
            (old if e.mtime_s is None or e.mtime_s <= cutoff else young).append(e.uri)
    return old, young


def latest_duplicates(output_uri: str) -> pa.Table | None:
    """The ``duplicates`` table (``groups.DUPLICATES_SCHEMA``) of the newest complete
    dedup generation in the newest complete output generation of ``output_uri``, or None if the dedup pass never completed there."""
    from pipeline.dedup.groups import DUPLICATES_SCHEMA
    from pipeline.output.generations import read_root

    store = DedupStore(read_root(output_uri))   # the newest complete generation's pass
    done = store.complete()
    if done is None:
        return None
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
