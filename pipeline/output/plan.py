"""The ``PartitionPlan``: inputs cut once into fixed partitions, persisted in ``_plan/``.

``_plan/plan.parquet`` has a row per input item (``partition_id``, ``uri``, ``size_bytes``,
``caption_uri``, ``row_start``, ``row_stop``, ``key``, ``error``, ``byte_start``,
``line_start``), written incrementally in
row groups while the listing streams in, so planning 10 million objects never holds them in
memory at once. ``uri`` and ``caption_uri`` are stored as bytes (UTF-8 with
``surrogateescape``), so a local file name that is not valid UTF-8 survives the plan.
``_plan/partitions.parquet`` has a row per partition (``partition_id``, ``rows_planned``,
``inputs``): all the driver reads. Workers read their own partition's rows (row groups
are pruned by ``partition_id`` statistics).

The footer metadata of ``plan.parquet`` holds the sha256 of the listing and of the source
spec (so a resumed job can say whether the input changed since planning, and refuse a plan
made for another source spec), the input totals (``inputs``: objects listed — media files, shards, manifest files; ``rows``:
records planned, or null when some are known only once read, as WebDataset samples) and
the datasource's own planning record (``Datasource.plan_metadata``: objects not read by
extension, a manifest's carried columns), handed to every ``Partition``.

Append-only extensions (``runtime.mode: append``, ``extend``): the objects a later listing
holds that no planned input names (by ``uri``) are packed into new partitions whose ids
continue the numbering, written to ``_plan/extension-0001.parquet`` (the plan's schema and
footer keys, for that listing) and then recorded in ``_plan/extension-0001.json`` (when,
how many objects and records, which partition ids, the listing's sha256); a record
makes the extension part of the plan, so an extension file without one (a crash
between the two) is written again by the next extension. ``plan.parquet``,
``partitions.parquet`` and earlier extensions are never rewritten.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.output.layout import PLAN_DIR, OutputLayout
from pipeline.records import InputItem, Partition, partition_name
from pipeline.spec import SourceSpec

log = logging.getLogger(__name__)

ROWS_PER_ROW_GROUP = 65_536
_SCHEMA = pa.schema([("partition_id", pa.string()), ("uri", pa.binary()),
                     ("size_bytes", pa.int64()), ("caption_uri", pa.binary()),
                     ("row_start", pa.int64()), ("row_stop", pa.int64()),
                     ("key", pa.string()), ("error", pa.string()),
                     ("byte_start", pa.int64()), ("line_start", pa.int64())])
_DATASOURCE_PREFIX = "datasource."
_INDEX_SCHEMA = pa.schema([("partition_id", pa.string()), ("rows_planned", pa.int64()),
                           ("inputs", pa.int64())])


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
    """The partitions of a job (ids and planned rows, O(partitions) memory) and its hashes."""

    output_uri: str
    partition_ids: tuple[str, ...]
    rows_planned: tuple[int, ...]
    listing_sha256: str
    source_sha256: str
    inputs_total: int = 0
    rows_total: int | None = None
    datasource: dict[str, str] = dataclasses.field(default_factory=dict)
    extensions: tuple[dict, ...] = ()
    listing: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)

    def __len__(self) -> int:
        return len(self.partition_ids)

    def totals(self) -> dict:
        """The input totals for reports: ``inputs`` and ``rows`` planned, and objects
        under the input that are not read, by extension (``unread_by_extension``);
        ``extensions``: the plan's extension records (``extend``); after a listing was
        compared with the plan (``load_or_create``), ``not_planned`` (listed objects no
        planned input names) and ``missing`` (planned objects no longer listed)."""
        unread = json.loads(self.datasource.get("unread_by_extension", "{}"))
        return {"inputs": self.inputs_total, "rows": self.rows_total,
                "unread_by_extension": unread, "unread": sum(unread.values()),
                "warnings": json.loads(self.datasource.get("warnings", "[]")),
                "extensions": list(self.extensions), **self.listing}


def source_sha256(spec: SourceSpec) -> str:
    """sha256 of the source spec (what the plan depends on)."""
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _rows(item: InputItem) -> int:
    return item.row_stop - item.row_start if item.row_start >= 0 else 1


def _encode(uri: str | None) -> bytes | None:
    return None if uri is None else fs.uri_to_bytes(uri)


def _decode(value: bytes | str | None) -> str | None:
    """A stored URI (bytes; a plan written before they were bytes: str) as the str."""
    return fs.uri_from_bytes(value) if isinstance(value, bytes) else value


#: Most records ``pack`` holds to decide whether an input is small (``target_partitions``):
#: an input it has not seen the end of by then is cut as if it had exactly this many.
LOOKAHEAD_RECORDS = 100_000
#: Fewest records ``pack`` cuts a partition to for ``target_partitions`` (a partition
#: costs a data file, a commit marker and a lease: a few ms locally, more on S3).
MIN_PARTITION_RECORDS = 4
#: Fewest listed bytes a partition is cut to by bytes (the bytes rule is for large files).
MIN_PARTITION_BYTES = 64 * 2**20


def pack(items: Iterable[InputItem], partition_size: int,
         target_partitions: int = 0, first_index: int = 0) -> Iterator[Partition]:
    """Pack items, in order, into partitions of at most ``partition_size`` records
    (a media file, a WebDataset shard or an input unreadable at planning counts as one;
    a manifest row range as its rows).

    ``target_partitions`` (the workers times ``runtime.partitions_per_worker``; 0: off):
    an input too small to give every worker that many partitions of ``partition_size``
    is cut finer, so no worker idles while another holds the whole input (issue 32). It
    reads ahead up to ``LOOKAHEAD_RECORDS`` records (or ``partition_size *
    target_partitions``, if fewer). If the input ends there, a partition closes at
    ``ceil(records / target)`` records (at least ``MIN_PARTITION_RECORDS``) or at
    ``ceil(bytes / target)`` listed bytes (at least ``MIN_PARTITION_BYTES``; a manifest
    row range counts none), whichever comes first, so that many small files and a few
    large ones both spread out; a longer input is cut at ``ceil(LOOKAHEAD_RECORDS /
    target)`` records. Never more than ``partition_size``. Partition ids start at
    ``first_index`` (an extension's continue the plan's numbering). A manifest row range larger
    than a partition is split into ranges (the later ones read from the start of the
    file: ``byte_start`` -1). The plan is written once and kept: a stored plan is never
    cut again.
    """
    items = iter(items)
    ahead: list[InputItem] = []
    max_rows, max_bytes = partition_size, None
    if target_partitions > 0:
        horizon = min(LOOKAHEAD_RECORDS, partition_size * target_partitions)
        seen = 0
        for item in items:
            ahead.append(item)
            seen += _rows(item)
            if seen >= horizon:
                break
        else:    # the whole input is in ``ahead``
            total_bytes = sum(_bytes(i) for i in ahead)
            max_bytes = max(MIN_PARTITION_BYTES, -(-total_bytes // target_partitions))
            horizon = seen
        max_rows = min(partition_size, max(MIN_PARTITION_RECORDS,
                                           -(-horizon // target_partitions)))
    current: list[InputItem] = []
    rows = nbytes = 0
    index = first_index
    for item in (piece for i in itertools.chain(ahead, items) for piece in _split(i, max_rows)):
        full = rows + _rows(item) > max_rows or (
            max_bytes is not None and nbytes + _bytes(item) > max_bytes)
        if current and full:
            yield Partition(partition_name(index), tuple(current))
            index, current, rows, nbytes = index + 1, [], 0, 0
        current.append(item)
        rows += _rows(item)
        nbytes += _bytes(item)
    if current:
        yield Partition(partition_name(index), tuple(current))


def _bytes(item: InputItem) -> int:
    """Listed bytes of a media file or shard; 0 for a manifest row range (its
    ``size_bytes`` is the whole manifest's)."""
    return max(0, item.size_bytes) if item.row_start < 0 else 0


def _split(item: InputItem, max_rows: int) -> Iterator[InputItem]:
    """``item``, or its manifest row range cut into ranges of at most ``max_rows``."""
    if item.row_start < 0 or item.row_stop - item.row_start <= max_rows:
        yield item
        return
    for start in range(item.row_start, item.row_stop, max_rows):
        first = start == item.row_start
        yield dataclasses.replace(item, row_start=start,
                                  row_stop=min(item.row_stop, start + max_rows),
                                  byte_start=item.byte_start if first else -1,
                                  line_start=item.line_start if first else -1)


class _ListingHash:
    """sha256 over every item's ``(uri, size_bytes, caption_uri, row range)``, streaming."""

    def __init__(self):
        self.h = hashlib.sha256()

    def add(self, i: InputItem) -> InputItem:
        self.h.update(f"{i.uri}\0{i.size_bytes}\0{i.caption_uri}\0{i.row_start}\0{i.row_stop}"
                      f"\0{i.key}\0{i.error}\n".encode("utf-8", "surrogateescape"))
        return i

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def listing_sha256(items: Iterable[InputItem]) -> str:
    """sha256 of a listing (see ``_ListingHash``)."""
    h = _ListingHash()
    for i in items:
        h.add(i)
    return h.hexdigest()


def _writer(uri: str, schema: pa.Schema) -> pq.ParquetWriter:
    fsys, path = fs.resolve(uri)
    if fs.is_local(uri):   # created with storage.local_permissions' modes; pyarrow keeps them
        fs.open_new_local(path).close()
    return pq.ParquetWriter(path, schema, filesystem=fsys, compression="zstd")


def write_plan(output_uri: str, items: Iterable[InputItem], spec: SourceSpec,
               items_per_partition: int | None = None,
               datasource_metadata: Callable[[], dict[str, str]] | None = None,
               rows_known: bool = True, target_partitions: int = 0) -> PartitionPlan:
    """Plan ``items`` (already in deterministic order) and write ``_plan/`` incrementally.

    ``items_per_partition``: the datasource's (``Datasource.items_per_partition``; default
    ``spec.partition_size``). ``datasource_metadata``: called once the items are
    exhausted (``Datasource.plan_metadata``); stored in the plan. ``rows_known``: False
    when the records are known only once read (``rows_total`` is then None).
    ``target_partitions``: cut a small input finer (``pack``). Raises ``PlanError`` if
    there are no items.
    """
    listing = _ListingHash()
    parts = pack((listing.add(i) for i in items), items_per_partition or spec.partition_size,
                 target_partitions)

    def footer(packed: _Packed) -> dict[str, str]:
        if not packed.ids:
            raise PlanError(f"nothing to plan: the input {spec.uri!r} is empty")
        extra = datasource_metadata() if datasource_metadata else {}
        return {"listing_sha256": listing.hexdigest(), "source_sha256": source_sha256(spec),
                "inputs_total": str(packed.objects),
                "rows_total": str(sum(packed.rows)) if rows_known else "",
                **{_DATASOURCE_PREFIX + k: v for k, v in extra.items()}}

    packed = _write_rows(OutputLayout(output_uri).plan, parts, footer)
    index = _writer(OutputLayout(output_uri).plan_index, _INDEX_SCHEMA)
    index.write_table(pa.table({"partition_id": packed.ids, "rows_planned": packed.rows,
                                "inputs": packed.inputs}, schema=_INDEX_SCHEMA))
    index.close()
    kv = packed.footer
    return PartitionPlan(output_uri, tuple(packed.ids), tuple(packed.rows),
                         kv["listing_sha256"], kv["source_sha256"], packed.objects,
                         sum(packed.rows) if rows_known else None,
                         _datasource_metadata(kv))


@dataclasses.dataclass
class _Packed:
    """What ``_write_rows`` wrote: partition ids, their planned rows and inputs, distinct
    objects (a manifest's row ranges are one) and the footer metadata."""

    ids: list[str] = dataclasses.field(default_factory=list)
    rows: list[int] = dataclasses.field(default_factory=list)
    inputs: list[int] = dataclasses.field(default_factory=list)
    objects: int = 0
    footer: dict[str, str] = dataclasses.field(default_factory=dict)


def _write_rows(uri: str, parts: Iterable[Partition],
                footer: Callable[[_Packed], dict[str, str]]) -> _Packed:
    """Write the plan rows of ``parts`` to the Parquet file ``uri`` in row groups, then
    ``footer(packed)`` (called once ``parts`` is exhausted; it may raise) as its
    key-value metadata."""
    packed, last_uri = _Packed(), None
    buffer: dict[str, list] = {n: [] for n in _SCHEMA.names}
    writer = _writer(uri, _SCHEMA)
    try:
        for part in parts:
            packed.ids.append(part.partition_id)
            packed.rows.append(part.rows_planned)
            packed.inputs.append(len(part.inputs))
            for i in part.inputs:
                packed.objects, last_uri = packed.objects + (i.uri != last_uri), i.uri
                for name, value in zip(_SCHEMA.names, (
                        part.partition_id, _encode(i.uri), i.size_bytes, _encode(i.caption_uri),
                        i.row_start, i.row_stop, i.key, i.error, i.byte_start, i.line_start)):
                    buffer[name].append(value)
            if len(buffer["uri"]) >= ROWS_PER_ROW_GROUP:
                writer.write_table(pa.table(buffer, schema=_SCHEMA))
                buffer = {n: [] for n in _SCHEMA.names}
        if buffer["uri"]:
            writer.write_table(pa.table(buffer, schema=_SCHEMA))
        packed.footer = footer(packed)
        writer.add_key_value_metadata(packed.footer)
    finally:
        writer.close()
    return packed


def _resolved(output_uri: str) -> tuple[str, object]:
    fsys, path = fs.resolve(OutputLayout(output_uri).plan)
    return path, fsys


def read_plan(output_uri: str) -> PartitionPlan | None:
    """Read the stored plan's index and hashes, with its extensions (``extend``), or
    return None if there is none. ``listing_sha256`` and the datasource's record are the
    newest listing's (the last extension's, else the plan's)."""
    if fs.file_size(OutputLayout(output_uri).plan_index) is None:
        return None
    path, fsys = _resolved(output_uri)
    meta = fs.with_retries(output_uri, "read plan", lambda: pq.read_metadata(path, filesystem=fsys))
    kv = {k.decode(): v.decode() for k, v in (meta.metadata or {}).items()}
    ipath = fs.resolve(OutputLayout(output_uri).plan_index)
    index = fs.with_retries(output_uri, "read plan",
                            lambda: pq.read_table(ipath[1], filesystem=ipath[0]))
    rows = tuple(index.column("rows_planned").to_pylist())
    plan = PartitionPlan(output_uri, tuple(index.column("partition_id").to_pylist()), rows,
                         kv.get("listing_sha256", ""), kv.get("source_sha256", ""),
                         int(kv.get("inputs_total") or sum(index.column("inputs").to_pylist())),
                         int(kv["rows_total"]) if kv.get("rows_total") else None,
                         _datasource_metadata(kv))
    for ext in read_extensions(output_uri):
        plan = _with_extension(plan, ext)
    return plan


def _with_extension(plan: PartitionPlan, ext: dict) -> PartitionPlan:
    """``plan`` with the extension record ``ext`` appended."""
    rows_total = None if plan.rows_total is None or ext["rows"] is None \
        else plan.rows_total + ext["rows"]
    return dataclasses.replace(
        plan, partition_ids=plan.partition_ids + tuple(ext["partition_ids"]),
        rows_planned=plan.rows_planned + tuple(ext["rows_planned"]),
        listing_sha256=ext["listing_sha256"], inputs_total=plan.inputs_total + ext["objects"],
        rows_total=rows_total, datasource=ext["datasource"],
        extensions=plan.extensions + ({k: ext[k] for k in _EXTENSION_SUMMARY},))


#: The keys of an extension record that ``PartitionPlan.extensions`` (and reports) keep.
_EXTENSION_SUMMARY = ("extension", "created_at", "objects", "rows", "first_partition",
                      "last_partition", "partitions")
_EXTENSION_NAME = re.compile(r"extension-(\d{4,})\.json$")


def read_extensions(output_uri: str) -> list[dict]:
    """The extension records under ``_plan/`` in order (``extend``). Raises ``PlanError``
    if their numbers have a gap (a record was deleted: the partition ids would not
    continue)."""
    found = []
    for entry in fs.list_files(OutputLayout(output_uri).uri(PLAN_DIR)):
        m = _EXTENSION_NAME.search(entry.uri)
        if m:
            found.append((int(m.group(1)), entry.uri))
    found.sort()
    if [n for n, _ in found] != list(range(1, len(found) + 1)):
        raise PlanError(f"{output_uri}: plan extension records "
                        f"{[n for n, _ in found]} are not numbered 1..{len(found)}")
    return [json.loads(fs.read_bytes(uri)) for _, uri in found]


def _datasource_metadata(kv: dict[str, str]) -> dict[str, str]:
    return {k[len(_DATASOURCE_PREFIX):]: v for k, v in kv.items()
            if k.startswith(_DATASOURCE_PREFIX)}


def read_partition(output_uri: str, partition_id: str) -> Partition:
    """The inputs of one partition, from ``_plan/plan.parquet`` or the extension that
    planned it. Raises ``PlanError``."""
    layout = OutputLayout(output_uri)
    table, kv = _partition_rows(output_uri, layout.plan, partition_id)
    if table.num_rows == 0:
        ext = next((e for e in read_extensions(output_uri)
                    if partition_id in e["partition_ids"]), None)
        if ext is not None:
            table, kv = _partition_rows(
                output_uri, layout.plan_extension(ext["extension"], "parquet"), partition_id)
    if table.num_rows == 0:
        raise PlanError(f"{output_uri}: partition {partition_id} is not in the plan")
    rows = table.drop_columns(["partition_id"]).to_pylist()
    for r in rows:
        r["uri"], r["caption_uri"] = _decode(r["uri"]), _decode(r["caption_uri"])
    return Partition(partition_id, tuple(InputItem(**r) for r in rows),
                     _datasource_metadata(kv))


def _partition_rows(output_uri: str, uri: str, partition_id: str) -> tuple[pa.Table, dict]:
    """The rows of ``partition_id`` in the plan file ``uri`` and its footer metadata."""
    fsys, path = fs.resolve(uri)
    table = fs.with_retries(output_uri, "read plan", lambda: pq.read_table(
        path, filesystem=fsys, filters=[("partition_id", "=", partition_id)]))
    footer = fs.with_retries(output_uri, "read plan",
                             lambda: pq.read_metadata(path, filesystem=fsys))
    return table, {k.decode(): v.decode() for k, v in (footer.metadata or {}).items()}


def check_stored_plan(output_uri: str, spec: SourceSpec) -> PartitionPlan | None:
    """The stored plan of ``output_uri`` (None if there is none). Raises ``PlanError`` if
    it was made for another source spec (``mmpipe run`` checks this before Ray starts)."""
    stored = read_plan(output_uri)
    if stored is not None and stored.source_sha256 != source_sha256(spec):
        raise PlanError(f"{output_uri}: the stored plan was made for another source spec; "
                        f"use --mode overwrite or a new output location")
    return stored


def load_or_create(output_uri: str, spec: SourceSpec,
                   list_items: Callable[[], Iterable[InputItem]],
                   items_per_partition: int | None = None,
                   datasource_metadata: Callable[[], dict[str, str]] | None = None,
                   rows_known: bool = True,
                   target_partitions: int = 0, append: bool = False) -> tuple[PartitionPlan, str]:
    """Return ``(plan, how)``: the stored plan if there is one, else a new written plan.

    ``how`` is ``"new"``, ``"stored"``, ``"stored, input listing changed"``,
    ``"stored, input not listable"`` or, with ``append``, ``"stored, extension <n>"``.
    A stored plan is compared with the listing (listed twice when its sha256 differs from
    the newest planned listing's: once to hash, once to find what differs); the plan's
    ``listing`` then holds ``not_planned`` (listed objects that no planned input names by
    URI: new media files, shards or manifest files; a manifest planned before is never
    read again, so rows added to it are not seen) and ``missing`` (planned objects no
    longer listed: read as ``input_missing`` error rows). Without ``append`` the stored
    plan is used as it is and a change is logged as a warning naming ``--mode append``;
    with ``append`` the objects not planned become an extension (``extend``). Raises
    ``PlanError`` if the stored plan was made for another source spec.
    """
    stored = check_stored_plan(output_uri, spec)
    if stored is None:
        return write_plan(output_uri, list_items(), spec, items_per_partition,
                          datasource_metadata, rows_known, target_partitions), "new"
    try:
        current = listing_sha256(list_items())
    except PlanError as e:
        log.warning("cannot list the input again to compare with the stored plan (%s); "
                    "using the stored plan", e)
        return stored, "stored, input not listable"
    if stored.listing_sha256 == current:
        return dataclasses.replace(stored, listing={"not_planned": 0, "missing": 0}), "stored"
    new, missing = _not_planned(output_uri, list_items())
    objects = _objects(new)
    listing = {"not_planned": 0 if append else objects, "missing": missing}
    if append and new:
        ext = extend(stored, new, current, spec, items_per_partition, datasource_metadata,
                     rows_known, target_partitions)
        log.info("plan of %s extended (extension %d): %d objects not in the plan as "
                 "partitions %s..%s; %d planned objects are no longer listed", output_uri,
                 ext["extension"], ext["objects"], ext["first_partition"],
                 ext["last_partition"], missing)
        return (dataclasses.replace(_with_extension(stored, ext), listing=listing),
                f"stored, extension {ext['extension']}")
    if objects:
        log.warning("input listing has changed since the plan in %s was written: %d listed "
                    "objects are not in the plan (%d planned ones are no longer listed); "
                    "using the stored plan (%d partitions); run with --mode append to plan "
                    "them as new partitions", output_uri, objects, missing, len(stored))
    else:
        log.warning("input listing has changed since the plan in %s was written (%d planned "
                    "objects are no longer listed, none new); using the stored plan "
                    "(%d partitions)", output_uri, missing, len(stored))
    return dataclasses.replace(stored, listing=listing), "stored, input listing changed"


def _objects(items: list[InputItem]) -> int:
    """Distinct objects of ``items`` (a manifest's row ranges of one file are one)."""
    return len({i.uri for i in items})


def _not_planned(output_uri: str, items: Iterable[InputItem]) -> tuple[list[InputItem], int]:
    """``(items whose uri no planned input names, planned objects not among items)``.
    Holds the planned URIs in memory (one set, read a column at a time)."""
    layout = OutputLayout(output_uri)
    files = [layout.plan] + [layout.plan_extension(e["extension"], "parquet")
                             for e in read_extensions(output_uri)]
    planned: set[bytes] = set()
    for uri in files:
        fsys, path = fs.resolve(uri)
        column = fs.with_retries(output_uri, "read plan", lambda p=path, f=fsys: pq.read_table(
            p, filesystem=f, columns=["uri"])).column("uri")
        planned.update(v for v in column.to_pylist() if v is not None)
    seen: set[bytes] = set()
    new = []
    for item in items:
        raw = _encode(item.uri)
        if raw in planned:
            seen.add(raw)
        else:
            new.append(item)
    return new, len(planned) - len(seen)


def extend(plan: PartitionPlan, items: list[InputItem], listing: str, spec: SourceSpec,
           items_per_partition: int | None = None,
           datasource_metadata: Callable[[], dict[str, str]] | None = None,
           rows_known: bool = True, target_partitions: int = 0) -> dict:
    """Plan ``items`` (objects no partition of ``plan`` names, in listing order) as new
    partitions after ``plan``'s, append-only: ``_plan/extension-<n>.parquet`` (their plan
    rows; footer: the datasource's record of this listing), then the record
    ``_plan/extension-<n>.json``: ``extension`` (n), ``created_at`` (UTC, ISO 8601),
    ``objects`` and ``rows`` (records planned, None when known only once read),
    ``partition_ids`` with ``rows_planned`` and ``inputs`` each, ``first_partition``,
    ``last_partition``, ``partitions``, ``listing_sha256`` (the whole listing's, ``listing``)
    and ``datasource``. Returns the record. The caller holds the output's job lease.
    Raises ``PlanError`` if the record already exists (another writer)."""
    number = len(plan.extensions) + 1
    layout = OutputLayout(plan.output_uri)
    parts = pack(items, items_per_partition or spec.partition_size, target_partitions,
                 first_index=len(plan))
    extra = datasource_metadata() if datasource_metadata else {}
    packed = _write_rows(layout.plan_extension(number, "parquet"), parts, lambda _: {
        "listing_sha256": listing, "source_sha256": source_sha256(spec),
        **{_DATASOURCE_PREFIX + k: v for k, v in extra.items()}})
    record = {"extension": number,
              "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "objects": packed.objects, "rows": sum(packed.rows) if rows_known else None,
              "partition_ids": packed.ids, "rows_planned": packed.rows,
              "inputs": packed.inputs, "first_partition": packed.ids[0],
              "last_partition": packed.ids[-1], "partitions": len(packed.ids),
              "listing_sha256": listing, "datasource": extra}
    if not fs.create_exclusive(layout.plan_extension(number, "json"),
                               json.dumps(record, indent=1).encode()):
        raise PlanError(f"{plan.output_uri}: plan extension {number} exists already "
                        "(another run extended the plan); run again")
    return record
