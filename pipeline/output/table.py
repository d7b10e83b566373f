"""The committed output as Delta Lake tables (``deltalake``, delta-rs: no catalog, local or
S3), derived from the commit markers; the markers stay the system of record.

```
<output>/_delta_log/                          the data table: the Parquet data files the
                                              markers of the generation readers use name
<generation root>/quarantine/_delta_log/      that generation's quarantine table
<generation root>/_dedup/duplicates/_delta_log/   its newest complete dedup pass's
                                              duplicates (``publish_duplicates``)
```

The tables show the generation ``read_output`` reads (``generations.read_root``: the
newest complete one, else the newest). Their add actions name the files the markers
name, where they are (no copy): a path relative to the table root, with its size and
per-file statistics from its Parquet footer (``numRecords``; ``nullCount``, and
``minValues``/``maxValues`` of top-level numbers, booleans and strings up to
``MAX_STAT_CHARS``). Delta (delta-rs) resolves add paths only below the table root, so a
later generation's quarantine files (under ``_generations/g-<n>/quarantine/``) cannot be
added to a table at ``<output>/quarantine``: the quarantine and duplicates tables live in
their generation and ``table_uri`` finds them.

Only the holder of the job lease writes (the driver, or ``mmpipe table`` which takes it):
``sync`` adds the files of markers the data table lacks (a partition is added only once
its marker exists), and when readers' generation changed (``--mode overwrite`` complete)
replaces the older generation's files with one overwrite commit, before the older
generation is deleted. ``Publisher`` does that on a thread for a running job, so a
commit of the table never delays or fails a partition; the next ``sync`` catches up.
"""

from __future__ import annotations

import json
import logging
import math
import os
import posixpath
import stat
import threading
import urllib.parse

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import MmpipeError
from pipeline.output import generations
from pipeline.output.checkpoint import CheckpointStore, CommitMarker
from pipeline.output.layout import (DEDUP_DIR, DELTA_LOG, ATTEMPT_ROOTS, OutputLayout,
                                     attempt_of)
from pipeline.spec.output import delta_location_problem
from pipeline.storage import fs, s3

log = logging.getLogger(__name__)

#: The tables of an output, by kind (``table_uri``).
KINDS = ("data", "quarantine", "duplicates")
#: Strings longer than this get no min/max statistics (Delta readers skip files by them).
MAX_STAT_CHARS = 64
DUPLICATES_DIR = f"{DEDUP_DIR}/duplicates"


def table_uri(output: str, kind: str = "data") -> str:
    """Where the ``kind`` table of ``output`` is: ``data``: ``output`` itself;
    ``quarantine``: ``<root>/quarantine``; ``duplicates``: ``<root>/_dedup/duplicates``
    (``<root>``: the generation readers use, ``generations.read_root``). Raises
    ``ValueError`` naming ``kind`` for another value."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {KINDS}")
    if kind == "data":
        return fs.normalize(output)
    root = generations.read_root(output)
    return fs.join(root, ATTEMPT_ROOTS["quarantine"] if kind == "quarantine" else DUPLICATES_DIR)


class TableError(MmpipeError):
    """A Delta table of an output could not be opened or committed: the message names the
    table's location and the cause (one line)."""


def delta_location(uri: str) -> str:
    """``uri`` as deltalake takes a table location: a local path as it is;
    ``s3://bucket/key`` with the key percent-encoded once (delta-rs parses it as a URL, so
    a raw ``#`` or ``?`` would end its path and a raw ``%`` start an escape). Raises
    ``TableError`` for a location no Delta table can have (``delta_location_problem``)."""
    problem = delta_location_problem(uri)
    if problem is not None:
        raise TableError(f"Delta table at {uri}: {problem}")
    if not s3.is_s3(uri):
        return uri
    bucket, key = s3.split(uri)
    return f"s3://{bucket}/{urllib.parse.quote(key, safe='/')}"


def _delta_call(uri: str, what: str, fn):
    """``fn()``, a deltalake error raised as ``TableError`` naming ``uri`` and ``what``."""
    from deltalake.exceptions import DeltaError

    try:
        return fn()
    except (DeltaError, OSError) as e:
        raise TableError(f"Delta table at {uri}: {what} failed: {type(e).__name__}: "
                         f"{' '.join(str(e).split())}") from e


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for the table at ``uri`` (None for a local path): the
    fs layer's S3 endpoint and region (``storage.s3.delta_options``)."""
    return s3.delta_options() if s3.is_s3(uri) else None


def open_table(uri: str):
    """The ``deltalake.DeltaTable`` at ``uri``, or None if there is none (no
    ``_delta_log``)."""
    from deltalake import DeltaTable

    location, options = delta_location(uri), storage_options(uri)
    if not _delta_call(uri, "open", lambda: DeltaTable.is_deltatable(location, options)):
        return None
    return _delta_call(uri, "open", lambda: DeltaTable(location, storage_options=options))


def _stats(meta: pq.FileMetaData) -> str:
    """Delta per-file statistics (JSON) from a Parquet footer."""
    out: dict = {"numRecords": meta.num_rows, "nullCount": {}, "minValues": {},
                 "maxValues": {}}
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    leaves = {groups[0].column(j).path_in_schema: j for j in range(meta.num_columns)} \
        if groups else {}
    for field in meta.schema.to_arrow_schema():
        if pa.types.is_nested(field.type) or field.name not in leaves:
            continue
        stats = [g.column(leaves[field.name]).statistics for g in groups]
        if any(s is None or not s.has_null_count for s in stats):
            continue
        out["nullCount"][field.name] = sum(s.null_count for s in stats)
        ranged = [s for s in stats if s.has_min_max]
        t = field.type
        if not ranged or not (pa.types.is_integer(t) or pa.types.is_floating(t) or
                              pa.types.is_boolean(t) or pa.types.is_string(t) or
                              pa.types.is_large_string(t)):
            continue
        lo, hi = min(s.min for s in ranged), max(s.max for s in ranged)
        if isinstance(lo, float) and not (math.isfinite(lo) and math.isfinite(hi)):
            continue
        if isinstance(lo, str) and max(len(lo), len(hi)) > MAX_STAT_CHARS:
            continue
        out["minValues"][field.name], out["maxValues"][field.name] = lo, hi
    return json.dumps(out)


def _add(table_root: str, uri: str, mtime_ms: int):
    """``(AddAction for the file at uri, its Arrow schema)``: size and statistics from
    one open of the file (its footer)."""
    from deltalake.transaction import AddAction

    fsys, path = fs.resolve(uri)

    def read():
        with fsys.open_input_file(path) as f:
            return f.size(), pq.read_metadata(f)
    size, meta = fs.with_retries(uri, "read footer", read)
    rel = uri[len(table_root.rstrip("/")) + 1:]
    return AddAction(rel, size, {}, mtime_ms, True, _stats(meta)), meta.schema.to_arrow_schema()


def _schema(schema: pa.Schema) -> pa.Schema:
    """The table schema of files of ``schema``: without the Parquet key-value metadata."""
    return pa.schema(list(schema))


def _commit(uri: str, adds: list, schema: pa.Schema, replace: bool, what: str) -> int:
    """One commit of ``adds`` to the table at ``uri`` (created if absent; ``replace``: an
    overwrite commit, the table then holds exactly ``adds``); returns the new version."""
    from deltalake import CommitProperties, DeltaTable, Schema
    from deltalake.transaction import create_table_with_add_actions

    props = CommitProperties(custom_metadata={"mmpipe": what})
    table = open_table(uri)
    location, options = delta_location(uri), storage_options(uri)
    if table is None:
        _delta_call(uri, "create", lambda: create_table_with_add_actions(
            location, Schema.from_arrow(_schema(schema)), adds, mode="error",
            storage_options=options, commit_properties=props))
    else:
        _delta_call(uri, "commit", lambda: table.create_write_transaction(
            adds, "overwrite" if replace else "append", _schema(schema),
            commit_properties=props))
    _restrict(uri)
    return _delta_call(uri, "open", lambda: DeltaTable(location,
                                                       storage_options=options).version())


def _restrict(uri: str) -> None:
    """Give a local table's ``_delta_log`` folders and files the modes of the output's other
    files (``fs.local_modes``: owner-only by default); delta-rs creates them by the umask."""
    if not fs.is_local(uri):
        return
    file_mode, dir_mode = fs.local_modes()
    log_dir = os.path.join(fs.resolve(uri)[1], DELTA_LOG)
    for here, dirs, files in os.walk(log_dir):
        for path, mode in [(here, dir_mode)] + [(os.path.join(here, f), file_mode) for f in files]:
            if stat.S_IMODE(os.lstat(path).st_mode) != mode:
                os.chmod(path, mode)


def _paths(table) -> list[str]:
    """The add paths of ``table`` (relative to its root), or [] for None."""
    if table is None:
        return []
    return pa.table(table.get_add_actions()).column("path").to_pylist()


def _gen_prefix(output: str, root: str) -> str:
    """The add-path prefix of the generation at ``root`` in the data table: ``""`` for
    generation 1, ``_generations/g-000002/`` for a later one."""
    out, root = fs.normalize(output), fs.normalize(root)
    return root[len(out) + 1:] + "/" if root != out else ""


def _shown(files, output: str, root: str) -> tuple[set[str], bool]:
    """``(partition ids, True if every path is a data file of the generation at root)``
    of the data table's add paths ``files``."""
    gp = _gen_prefix(output, root)
    data = gp + ATTEMPT_ROOTS["parquet"] + "/"
    files = list(files)
    shown = {k[0] for f in files if f.startswith(data)
             and (k := attempt_of(f[len(gp):])) is not None}
    return shown, all(f.startswith(data) for f in files)


def publish(output: str, markers: list[CommitMarker], root: str | None = None,
            replace: bool = False) -> dict[str, int]:
    """Add the data and quarantine files of ``markers`` (of the generation at ``root``,
    default ``read_root(output)``) that their tables lack: the quarantine table first,
    then the data table (whose paths say which partitions are published). ``replace``:
    one overwrite commit each, leaving exactly these markers' files (another generation's
    files removed). Returns the new versions by kind (only the tables committed).
    Raises what ``deltalake`` and the store raise."""
    out = fs.normalize(output)
    root = fs.normalize(root or generations.read_root(out))
    layout = OutputLayout(root)
    versions = {}
    for kind, top in (("quarantine", ATTEMPT_ROOTS["quarantine"]),
                      ("data", ATTEMPT_ROOTS["parquet"])):
        base = out if kind == "data" else fs.join(root, top)
        table = None if replace else open_table(base)
        have = set(_paths(table))
        adds, schema = [], None
        for m in markers:
            for rel in m.files:
                uri = layout.uri(rel)
                if rel.startswith(top + "/") and rel.endswith(".parquet") and \
                        uri[len(base) + 1:] not in have:
                    add, schema = _add(base, uri, int(m.finished_at * 1000))
                    adds.append(add)
        if adds:    # (no quarantine file: no error row, no table yet)
            what = (f"{'overwrite' if replace else 'append'} generation {_number(root)}: "
                    f"{len({m.partition_id for m in markers})} partitions")
            versions[kind] = _commit(base, adds, schema, replace, what)
    return versions


def _number(root: str) -> int:
    """The generation number of the generation root ``root``."""
    root = fs.normalize(root)
    return 1 if generations.output_of(root) == root else int(posixpath.basename(root)[2:])


def sync(output: str) -> dict:
    """Bring the tables in step with the markers of the generation readers use: add the
    files of markers the data table lacks (one commit per table), or, if the data table
    shows another generation, replace it with one overwrite commit. Returns ``{"generation",
    "partitions" (committed), "added" (partitions published now), "versions"}``. Only
    the job lease's holder may call it. Raises what ``deltalake`` and the store raise."""
    out = fs.normalize(output)
    root = generations.read_root(out)
    store = CheckpointStore(root)
    committed = store.committed_ids()
    table = open_table(out)
    shown, same = _shown(_paths(table), out, root)
    replace = table is not None and not same
    todo = sorted(committed if replace else committed - shown)
    markers = [m for m in (store.marker(pid) for pid in todo) if m is not None]
    versions = publish(out, markers, root, replace) if markers else {}
    return {"generation": _number(root), "partitions": len(committed),
            "added": len(markers), "versions": versions}


def rebuild(output: str) -> dict:
    """Delete the tables' logs (``_delta_log/`` of the data and quarantine tables) and
    ``sync``: the tables again, from the markers alone (readers see no table meanwhile)."""
    out = fs.normalize(output)
    for uri in (out, table_uri(out, "quarantine")):
        fs.delete_tree(fs.join(uri, DELTA_LOG))
    return sync(out)


def state(output: str) -> dict | None:
    """``{"version", "partitions" (data table), "committed", "in_step"}`` of the data
    table for ``mmpipe status``, or None if ``output`` has none."""
    out = fs.normalize(output)
    table = open_table(out)
    if table is None:
        return None
    root = generations.read_root(out)
    shown, same = _shown(_paths(table), out, root)
    committed = CheckpointStore(root).committed_ids()
    return {"version": table.version(), "partitions": len(shown), "committed": len(committed),
            "in_step": same and shown == committed}


def publish_duplicates(root: str, rel: str) -> int:
    """Publish the dedup pass's duplicates file ``rel`` (relative to the generation root
    ``root``, under ``_dedup/duplicates/``) as the whole duplicates table (one overwrite
    commit; none if it is the table already); returns its version. The deduplicated view
    is the data table's ``status == "ok"`` rows without a match on ``(partition_id,
    key)`` in it (an anti-join, docs/output.md "Delta Lake tables")."""
    base = fs.join(fs.normalize(root), DUPLICATES_DIR)
    table = open_table(base)
    if table is not None and _paths(table) == [posixpath.relpath(rel, DUPLICATES_DIR)]:
        return table.version()      # already published
    add, schema = _add(base, fs.join(fs.normalize(root), rel), 0)
    return _commit(base, [add], schema, True, f"duplicates {posixpath.basename(rel)}")


class Publisher:
    """Keeps a running job's tables in step, on a thread: ``committed(marker)`` after a
    partition's marker exists; ``complete()`` after ``_SUCCESS`` (the overwrite commit of a
    new generation). A failed commit is logged, never raised: the next ``sync`` (the next
    run, or ``mmpipe table``) catches up. ``close()`` waits for what is queued."""

    def __init__(self, output: str, root: str):
        self.output, self.root = fs.normalize(output), fs.normalize(root)
        self._queue: list[CommitMarker] = []
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="delta-table", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Reconcile before the run (``sync``), on the thread."""
        self._submit(None)

    def committed(self, marker: CommitMarker) -> None:
        """Publish ``marker``'s files (if the tables show this run's generation)."""
        self._submit(marker)

    def _submit(self, marker: CommitMarker | None) -> None:
        with self._wake:
            self._queue.append(marker)
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                batch, self._queue = self._queue, []
                if not batch and self._closed:
                    return
            markers = [m for m in batch if m is not None]
            try:
                if None in batch:
                    sync(self.output)
                elif generations.read_root(self.output) == self.root:
                    publish(self.output, markers, self.root)
            except Exception as e:  # noqa: BLE001 - the table is derived: never fail a run
                log.warning("%s: Delta table not updated (%s: %s); `mmpipe table %s` or the "
                            "next run catches up", self.output, type(e).__name__, e,
                            self.output)

    def complete(self) -> None:
        """Wait for the queue, then ``sync`` (a complete new generation: one overwrite
        commit); a failure is logged."""
        self.close()
        try:
            sync(self.output)
        except Exception as e:  # noqa: BLE001 - as in _run
            log.warning("%s: Delta table not switched to the new generation (%s: %s); run "
                        "`mmpipe table %s`", self.output, type(e).__name__, e, self.output)

    def close(self) -> None:
        """Publish what is queued and stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()
