"""The ``PartitionPlan``: inputs cut once into fixed partitions, persisted in ``_plan/``.

``_plan/plan.parquet`` has a row per input item (``partition_id``, ``uri``, ``size_bytes``,
``caption_uri``, ``row_start``, ``row_stop``), written incrementally in row groups while the
listing streams in, so planning 10 million objects never holds them in memory at once.
``_plan/partitions.parquet`` has a row per partition (``partition_id``, ``rows_planned``,
``inputs``): all the driver reads. Workers read their own partition's rows (row groups
are pruned by ``partition_id`` statistics). The footer metadata of ``plan.parquet`` holds
the sha256 of the listing and of the source spec, so a resumed job can say whether the
input changed since planning, and refuse a plan made for another source spec.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import PlanError
from pipeline.io import fs
from pipeline.io.layout import OutputLayout
from pipeline.records import InputItem, Partition, partition_name
from pipeline.spec import SourceSpec

log = logging.getLogger(__name__)

ROWS_PER_ROW_GROUP = 65_536
_SCHEMA = pa.schema([("partition_id", pa.string()), ("uri", pa.string()),
                     ("size_bytes", pa.int64()), ("caption_uri", pa.string()),
                     ("row_start", pa.int64()), ("row_stop", pa.int64())])
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

    def __len__(self) -> int:
        return len(self.partition_ids)


def source_sha256(spec: SourceSpec) -> str:
    """sha256 of the source spec (what the plan depends on)."""
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _rows(item: InputItem) -> int:
    return item.row_stop - item.row_start if item.row_start >= 0 else 1


def pack(items: Iterable[InputItem], partition_size: int) -> Iterator[Partition]:
    """Pack items, in order, into partitions of at most ``partition_size`` records
    (a media file or a WebDataset shard counts as one).

    An item with an empty row range (a manifest that could not be read at planning) is
    a partition of its own, so its failure takes no readable input with it.
    """
    current: list[InputItem] = []
    rows = 0
    index = 0
    for item in items:
        alone = _rows(item) == 0
        if current and (alone or rows + _rows(item) > partition_size):
            yield Partition(partition_name(index), tuple(current))
            index, current, rows = index + 1, [], 0
        current.append(item)
        rows += _rows(item)
        if alone:
            yield Partition(partition_name(index), tuple(current))
            index, current, rows = index + 1, [], 0
    if current:
        yield Partition(partition_name(index), tuple(current))


class _ListingHash:
    """sha256 over every item's ``(uri, size_bytes, caption_uri, row range)``, streaming."""

    def __init__(self):
        self.h = hashlib.sha256()

    def add(self, i: InputItem) -> InputItem:
        self.h.update(f"{i.uri}\0{i.size_bytes}\0{i.caption_uri}\0{i.row_start}\0{i.row_stop}\n".encode())
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
    if fs.is_local(uri):
        fsys.create_dir(path.rsplit("/", 1)[0], recursive=True)
    return pq.ParquetWriter(path, schema, filesystem=fsys, compression="zstd")


def write_plan(output_uri: str, items: Iterable[InputItem], spec: SourceSpec,
               items_per_partition: int | None = None) -> PartitionPlan:
    """Plan ``items`` (already in deterministic order) and write ``_plan/`` incrementally.

    ``items_per_partition``: the datasource's (``Datasource.items_per_partition``; default
    ``spec.partition_size``). Raises ``PlanError`` if there are no items.
    """
    listing = _ListingHash()
    ids: list[str] = []
    rows: list[int] = []
    n_inputs: list[int] = []
    buffer: dict[str, list] = {n: [] for n in _SCHEMA.names}
    writer = _writer(OutputLayout(output_uri).plan, _SCHEMA)
    try:
        for part in pack((listing.add(i) for i in items),
                         items_per_partition or spec.partition_size):
            ids.append(part.partition_id)
            rows.append(part.rows_planned)
            n_inputs.append(len(part.inputs))
            for i in part.inputs:
                for name, value in zip(_SCHEMA.names, (part.partition_id, i.uri, i.size_bytes,
                                                       i.caption_uri, i.row_start, i.row_stop)):
                    buffer[name].append(value)
            if len(buffer["uri"]) >= ROWS_PER_ROW_GROUP:
                writer.write_table(pa.table(buffer, schema=_SCHEMA))
                buffer = {n: [] for n in _SCHEMA.names}
        if buffer["uri"]:
            writer.write_table(pa.table(buffer, schema=_SCHEMA))
        if not ids:
            raise PlanError(f"nothing to plan: the input {spec.uri!r} is empty")
        plan = PartitionPlan(output_uri, tuple(ids), tuple(rows), listing.hexdigest(),
                             source_sha256(spec))
        writer.add_key_value_metadata({"listing_sha256": plan.listing_sha256,
                                       "source_sha256": plan.source_sha256})
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
    kv = meta.metadata or {}
    ipath = fs.resolve(OutputLayout(output_uri).plan_index)
    index = fs.with_retries(output_uri, "read plan",
                            lambda: pq.read_table(ipath[1], filesystem=ipath[0]))
    return PartitionPlan(output_uri, tuple(index.column("partition_id").to_pylist()),
                         tuple(index.column("rows_planned").to_pylist()),
                         kv.get(b"listing_sha256", b"").decode(),
                         kv.get(b"source_sha256", b"").decode())


def read_partition(output_uri: str, partition_id: str) -> Partition:
    """The inputs of one partition, from ``_plan/plan.parquet``. Raises ``PlanError``."""
    path, fsys = _resolved(output_uri)
    table = fs.with_retries(output_uri, "read plan", lambda: pq.read_table(
        path, filesystem=fsys, filters=[("partition_id", "=", partition_id)]))
    if table.num_rows == 0:
        raise PlanError(f"{output_uri}: partition {partition_id} is not in the plan")
    rows = table.drop_columns(["partition_id"]).to_pylist()
    return Partition(partition_id, tuple(InputItem(**r) for r in rows))


def load_or_create(output_uri: str, spec: SourceSpec,
                   list_items: Callable[[], Iterable[InputItem]],
                   items_per_partition: int | None = None) -> tuple[PartitionPlan, str]:
    """Return ``(plan, how)``: the stored plan if there is one, else a new written plan.

    ``how`` is ``"new"``, ``"stored"``, ``"stored, input listing changed"`` or
    ``"stored, input not listable"``; a changed listing is logged as a warning and the
    stored plan is still used. Raises ``PlanError`` if the stored plan was made for
    another source spec.
    """
    stored = read_plan(output_uri)
    if stored is None:
        return write_plan(output_uri, list_items(), spec, items_per_partition), "new"
    if stored.source_sha256 != source_sha256(spec):
        raise PlanError(f"{output_uri}: the stored plan was made for another source spec; "
                        f"use --mode overwrite or a new output location")
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
