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
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.output.layout import OutputLayout
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

    def __len__(self) -> int:
        return len(self.partition_ids)

    def totals(self) -> dict:
        """The input totals for reports: ``inputs`` and ``rows`` planned, and objects
        under the input that are not read, by extension (``unread_by_extension``)."""
        unread = json.loads(self.datasource.get("unread_by_extension", "{}"))
        return {"inputs": self.inputs_total, "rows": self.rows_total,
                "unread_by_extension": unread, "unread": sum(unread.values()),
                "warnings": json.loads(self.datasource.get("warnings", "[]"))}


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
         target_partitions: int = 0) -> Iterator[Partition]:
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
    target)`` records. Never more than ``partition_size``. A manifest row range larger
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
    index = 0
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
    ids: list[str] = []
    rows: list[int] = []
    n_inputs: list[int] = []
    objects, last_uri = 0, None  # distinct objects: a manifest's row ranges are one
    extra: dict[str, str] = {}
    buffer: dict[str, list] = {n: [] for n in _SCHEMA.names}
    writer = _writer(OutputLayout(output_uri).plan, _SCHEMA)
    try:
        for part in pack((listing.add(i) for i in items),
                         items_per_partition or spec.partition_size, target_partitions):
            ids.append(part.partition_id)
            rows.append(part.rows_planned)
            n_inputs.append(len(part.inputs))
            for i in part.inputs:
                objects, last_uri = objects + (i.uri != last_uri), i.uri
                for name, value in zip(_SCHEMA.names, (
                        part.partition_id, _encode(i.uri), i.size_bytes, _encode(i.caption_uri),
                        i.row_start, i.row_stop, i.key, i.error, i.byte_start, i.line_start)):
                    buffer[name].append(value)
            if len(buffer["uri"]) >= ROWS_PER_ROW_GROUP:
                writer.write_table(pa.table(buffer, schema=_SCHEMA))
                buffer = {n: [] for n in _SCHEMA.names}
        if buffer["uri"]:
            writer.write_table(pa.table(buffer, schema=_SCHEMA))
        if not ids:
            raise PlanError(f"nothing to plan: the input {spec.uri!r} is empty")
        extra = datasource_metadata() if datasource_metadata else {}
        plan = PartitionPlan(output_uri, tuple(ids), tuple(rows), listing.hexdigest(),
                             source_sha256(spec), objects,
                             sum(rows) if rows_known else None, extra)
        writer.add_key_value_metadata({
            "listing_sha256": plan.listing_sha256, "source_sha256": plan.source_sha256,
            "inputs_total": str(plan.inputs_total),
            "rows_total": "" if plan.rows_total is None else str(plan.rows_total),
            **{_DATASOURCE_PREFIX + k: v for k, v in extra.items()}})
    finally:
        writer.close()
    index = _writer(OutputLayout(output_uri).plan_index, _INDEX_SCHEMA)
    index.write_table(pa.table({"partition_id": ids, "rows_planned": rows, "inputs": n_inputs},
                               schema=_INDEX_SCHEMA))
    index.close()
    return plan


def _resolved(output_uri: str) -> tuple[str, object]:
    fsys, path = fs.resolve(OutputLayout(output_uri).plan)
    return path, fsys


def read_plan(output_uri: str) -> PartitionPlan | None:
    """Read the stored plan's index and hashes, or return None if there is none."""
    if fs.file_size(OutputLayout(output_uri).plan_index) is None:
        return None
    path, fsys = _resolved(output_uri)
    meta = fs.with_retries(output_uri, "read plan", lambda: pq.read_metadata(path, filesystem=fsys))
    kv = {k.decode(): v.decode() for k, v in (meta.metadata or {}).items()}
    ipath = fs.resolve(OutputLayout(output_uri).plan_index)
    index = fs.with_retries(output_uri, "read plan",
                            lambda: pq.read_table(ipath[1], filesystem=ipath[0]))
    rows = tuple(index.column("rows_planned").to_pylist())
    return PartitionPlan(output_uri, tuple(index.column("partition_id").to_pylist()), rows,
                         kv.get("listing_sha256", ""), kv.get("source_sha256", ""),
                         int(kv.get("inputs_total") or sum(index.column("inputs").to_pylist())),
                         int(kv["rows_total"]) if kv.get("rows_total") else None,
                         _datasource_metadata(kv))


def _datasource_metadata(kv: dict[str, str]) -> dict[str, str]:
    return {k[len(_DATASOURCE_PREFIX):]: v for k, v in kv.items()
            if k.startswith(_DATASOURCE_PREFIX)}


def read_partition(output_uri: str, partition_id: str) -> Partition:
    """The inputs of one partition, from ``_plan/plan.parquet``. Raises ``PlanError``."""
    path, fsys = _resolved(output_uri)
    table = fs.with_retries(output_uri, "read plan", lambda: pq.read_table(
        path, filesystem=fsys, filters=[("partition_id", "=", partition_id)]))
    if table.num_rows == 0:
        raise PlanError(f"{output_uri}: partition {partition_id} is not in the plan")
    rows = table.drop_columns(["partition_id"]).to_pylist()
    for r in rows:
        r["uri"], r["caption_uri"] = _decode(r["uri"]), _decode(r["caption_uri"])
    footer = fs.with_retries(output_uri, "read plan",
                             lambda: pq.read_metadata(path, filesystem=fsys))
    kv = {k.decode(): v.decode() for k, v in (footer.metadata or {}).items()}
    return Partition(partition_id, tuple(InputItem(**r) for r in rows),
                     _datasource_metadata(kv))


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
                   target_partitions: int = 0) -> tuple[PartitionPlan, str]:
    """Return ``(plan, how)``: the stored plan if there is one, else a new written plan.

    ``how`` is ``"new"``, ``"stored"``, ``"stored, input listing changed"`` or
    ``"stored, input not listable"``; a changed listing is logged as a warning and the
    stored plan is still used. Raises ``PlanError`` if the stored plan was made for
    another source spec.
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
    if stored.listing_sha256 != current:
        log.warning("input listing has changed since the plan in %s was written; "
                    "using the stored plan (%d partitions)", output_uri, len(stored))
        return stored, "stored, input listing changed"
    return stored, "stored"
