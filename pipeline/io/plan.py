"""The ``PartitionPlan``: inputs cut once into fixed partitions, persisted in ``_plan/``.

The plan is one Parquet file with a row per input item (``partition_id``, ``uri``,
``size_bytes``, ``caption_uri``, ``row_start``, ``row_stop``). Its schema metadata holds
the sha256 of the input listing and of the source spec, so a resumed job can say whether
the input changed since planning, and refuse a plan made for another source spec.
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
from pipeline.records import InputItem, Partition, partition_name
from pipeline.spec import SourceSpec

log = logging.getLogger(__name__)

PLAN_FILE = "_plan/plan.parquet"
_SCHEMA = pa.schema([("partition_id", pa.string()), ("uri", pa.string()),
                     ("size_bytes", pa.int64()), ("caption_uri", pa.string()),
                     ("row_start", pa.int64()), ("row_stop", pa.int64())])


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
    """All partitions of a job, in id order, with the hashes they were planned from."""

    partitions: tuple[Partition, ...]
    listing_sha256: str
    source_sha256: str

    def by_id(self) -> dict[str, Partition]:
        """Partitions keyed by ``partition_id``."""
        return {p.partition_id: p for p in self.partitions}


def source_sha256(spec: SourceSpec) -> str:
    """sha256 of the source spec (what the plan depends on)."""
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _rows(item: InputItem) -> int:
    return item.row_stop - item.row_start if item.row_start >= 0 else 1


def pack(items: Iterable[InputItem], partition_size: int) -> Iterator[Partition]:
    """Pack items, in order, into partitions of at most ``partition_size`` records."""
    current: list[InputItem] = []
    rows = 0
    index = 0
    for item in items:
        if current and rows + _rows(item) > partition_size:
            yield Partition(partition_name(index), tuple(current))
            index, current, rows = index + 1, [], 0
        current.append(item)
        rows += _rows(item)
    if current:
        yield Partition(partition_name(index), tuple(current))


def listing_sha256(items: Iterable[InputItem]) -> str:
    """sha256 over every item's ``(uri, size_bytes, caption_uri, row range)``."""
    h = hashlib.sha256()
    for i in items:
        h.update(f"{i.uri}\0{i.size_bytes}\0{i.caption_uri}\0{i.row_start}\0{i.row_stop}\n".encode())
    return h.hexdigest()


def make_plan(items: list[InputItem], spec: SourceSpec) -> PartitionPlan:
    """Plan ``items`` (already in deterministic order) into partitions."""
    return PartitionPlan(tuple(pack(items, spec.partition_size)), listing_sha256(items),
                         source_sha256(spec))


def write_plan(output_uri: str, plan: PartitionPlan) -> None:
    """Write the plan to ``<output>/_plan/plan.parquet``."""
    cols: dict[str, list] = {name: [] for name in _SCHEMA.names}
    for p in plan.partitions:
        for i in p.inputs:
            cols["partition_id"].append(p.partition_id)
            cols["uri"].append(i.uri)
            cols["size_bytes"].append(i.size_bytes)
            cols["caption_uri"].append(i.caption_uri)
            cols["row_start"].append(i.row_start)
            cols["row_stop"].append(i.row_stop)
    meta = {b"listing_sha256": plan.listing_sha256.encode(),
            b"source_sha256": plan.source_sha256.encode()}
    table = pa.table(cols, schema=_SCHEMA.with_metadata(meta))
    fsys, path = fs.resolve(fs.join(output_uri, PLAN_FILE))
    fsys.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(table, path, filesystem=fsys)


def read_plan(output_uri: str) -> PartitionPlan | None:
    """Read the stored plan, or return None if there is none."""
    uri = fs.join(output_uri, PLAN_FILE)
    if not fs.exists(uri):
        return None
    fsys, path = fs.resolve(uri)
    table = pq.read_table(path, filesystem=fsys)
    meta = table.schema.metadata or {}
    groups: dict[str, list[InputItem]] = {}
    for row in table.to_pylist():
        groups.setdefault(row.pop("partition_id"), []).append(InputItem(**row))
    parts = tuple(Partition(pid, tuple(items)) for pid, items in sorted(groups.items()))
    return PartitionPlan(parts, meta.get(b"listing_sha256", b"").decode(),
                         meta.get(b"source_sha256", b"").decode())


def load_or_create(output_uri: str, spec: SourceSpec,
                   list_items: Callable[[], Iterable[InputItem]]) -> tuple[PartitionPlan, str]:
    """Return ``(plan, how)``: the stored plan if there is one, else a new written plan.

    ``how`` is ``"new"``, ``"stored"`` or ``"stored, input listing changed"``.

    Logs a warning when the current listing differs from the one the plan was made from
    (the stored plan is still used). Raises ``PlanError`` if the stored plan was made for
    another source spec.
    """
    stored = read_plan(output_uri)
    if stored is None:
        plan = make_plan(list(list_items()), spec)
        write_plan(output_uri, plan)
        return plan, "new"
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
                    "using the stored plan (%d partitions)", output_uri, len(stored.partitions))
        return stored, "stored, input listing changed"
    return stored, "stored"
