"""Datasources: list the input, plan it into fixed partitions, read one partition.

``FilesDatasource``: media files under a prefix, each with an optional sidecar caption of
the same stem (``.txt``: the caption; ``.json``: an object whose ``caption_column`` key is
the caption and whose other keys go to ``metadata_json``) - the WebDataset/img2dataset
convention. ``ManifestDatasource``: Parquet/CSV/JSONL rows that name the media by ``url``
or ``path``; other columns are carried to the output.

``read_batches`` yields batches (dicts of equal-length lists) with the columns ``key``,
``source_uri``, ``_source_bytes`` (bytes or None), ``_raw_caption`` (any JSON value or
bytes), ``error`` (a read error, else None) and the carried columns.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from pipeline.errors import PartitionError, PlanError
from pipeline.io import fs, manifest
from pipeline.records import (ERROR, KEY, RAW_CAPTION, RESERVED, SOURCE_BYTES, SOURCE_URI,
                              Batch, ErrorReason, InputItem, Partition)
from pipeline.spec import DecodeSpec, SourceSpec

log = logging.getLogger(__name__)

SIDECAR_EXTENSIONS = (".txt", ".json")


class Datasource:
    """Base of the datasources: ``list_inputs`` (planning) and ``read_batches`` (workers)."""

    def __init__(self, spec: SourceSpec, decode: DecodeSpec):
        self.spec = spec
        self.max_bytes = decode.max_bytes

    def list_inputs(self) -> Iterator[InputItem]:
        """Yield every input item in a deterministic order. Raises ``PlanError``."""
        raise NotImplementedError

    def extra_fields(self, partition: Partition) -> list[pa.Field]:
        """Arrow fields of the carried columns this partition's batches contain."""
        raise NotImplementedError

    def read_batches(self, partition: Partition, batch_size: int,
                     pool: ThreadPoolExecutor) -> Iterator[Batch]:
        """Yield the partition's records as batches of at most ``batch_size`` rows."""
        raise NotImplementedError

    def _fetch(self, uri: str, size_bytes: int) -> tuple[bytes | None, str | None]:
        """Read one media object; return ``(bytes, None)`` or ``(None, error text)``."""
        if size_bytes > self.max_bytes:
            return None, f"{ErrorReason.TOO_LARGE.value}: {size_bytes} bytes > max_bytes {self.max_bytes}"
        try:
            return fs.read_bytes(uri), None
        except Exception as e:  # noqa: BLE001 - a read failure is this record's error
            return None, f"{ErrorReason.READ_FAILED.value}: {uri}: {e}"


class FilesDatasource(Datasource):
    """Media files under ``spec.uri`` with sidecar captions of the same stem."""

    def list_inputs(self) -> Iterator[InputItem]:
        """Stream the sorted listing, pairing each media file with its sidecar.

        All keys of one stem ``s`` start with ``s.`` and so are contiguous in a sorted
        listing: a stem is complete (and emitted) once a key outside ``s.`` arrives, so
        only a handful of stems are ever pending, whatever the listing's size.
        """
        exts = self.spec.media_extensions
        pending: dict[str, dict] = {}
        found = 0
        last = ""
        for entry in fs.list_files(self.spec.uri):
            if entry.uri < last:
                raise PlanError(f"source.uri {self.spec.uri!r}: listing is not in key order")
            last = entry.uri
            for stem in [s for s in pending if not entry.uri.startswith(s + ".")]:
                for item in _group_items(pending.pop(stem)):
                    found += 1
                    yield item
            stem, ext = posixpath.splitext(entry.uri)
            group = pending.setdefault(stem, {"media": [], "side": {}})
            if ext.lower() in SIDECAR_EXTENSIONS:
                group["side"][ext.lower()] = entry.uri
            elif ext.lower() in exts:
                group["media"].append(entry)
        for group in pending.values():
            for item in _group_items(group):
                found += 1
                yield item
        if not found:
            raise PlanError(f"source.uri {self.spec.uri!r}: no files with extensions {list(exts)}")

    def extra_fields(self, partition: Partition) -> list[pa.Field]:
        return [pa.field("metadata_json", pa.string())]

    def read_batches(self, partition, batch_size, pool):
        root = fs.normalize(self.spec.uri)
        for start in range(0, len(partition.inputs), batch_size):
            items = partition.inputs[start:start + batch_size]
            rows = list(pool.map(self._read_item, items))
            batch: Batch = {k: [r[k] for r in rows] for k in rows[0]}
            batch[KEY] = [_key_from_uri(i.uri, root) for i in items]
            yield batch

    def _read_item(self, item: InputItem) -> dict[str, Any]:
        data, error = self._fetch(item.uri, item.size_bytes)
        caption, meta = None, None
        if item.caption_uri:
            try:
                raw = fs.read_bytes(item.caption_uri)
                if item.caption_uri.endswith(".json"):
                    obj = json.loads(raw)
                    if isinstance(obj, dict):
                        caption = obj.pop(self.spec.caption_column, None)
                        meta = json.dumps(obj, sort_keys=True, ensure_ascii=False)
                    else:
                        caption = obj
                else:
                    caption = raw
            except Exception as e:  # noqa: BLE001 - a bad sidecar is this record's error
                error = error or f"{ErrorReason.READ_FAILED.value}: {item.caption_uri}: {e}"
        return {SOURCE_URI: item.uri, SOURCE_BYTES: data, RAW_CAPTION: caption, ERROR: error,
                "metadata_json": meta}


class ManifestDatasource(Datasource):
    """Rows of Parquet/CSV/JSONL manifests naming media by path or URL."""

    def list_inputs(self) -> Iterator[InputItem]:
        files = manifest.list_manifests(self.spec.uri, self.spec.manifest_format)
        if not files:
            raise PlanError(f"source.uri {self.spec.uri!r}: no manifest files found")
        step = self.spec.partition_size
        for uri, size in files:
            rows = manifest.count_rows(uri, self.spec.manifest_format)
            # Row ranges are cut at partition_size; the planner packs them into partitions.
            for start in range(0, rows, step):
                yield InputItem(uri=uri, size_bytes=size, row_start=start,
                                row_stop=min(rows, start + step))

    def extra_fields(self, partition: Partition) -> list[pa.Field]:
        schema = manifest.read_schema(partition.inputs[0].uri, self.spec.manifest_format,
                                      self._string_columns())
        skip = {self._path_column(schema), self.spec.caption_column, self.spec.key_column}
        return [pa.field(carried_name(f.name), f.type) for f in schema if f.name not in skip]

    def _string_columns(self) -> tuple[str, ...]:
        return ("url", "path", self.spec.path_column or "", self.spec.caption_column,
                self.spec.key_column or "")

    def _path_column(self, schema: pa.Schema) -> str:
        if self.spec.path_column:
            return self.spec.path_column
        for name in ("url", "path"):
            if name in schema.names:
                return name
        raise PartitionError(f"manifest has neither a 'url' nor a 'path' column "
                             f"(columns: {schema.names}); set source.path_column")

    def read_batches(self, partition, batch_size, pool):
        for item in partition.inputs:
            table = manifest.read_rows(item.uri, self.spec.manifest_format, item.row_start,
                                       item.row_stop, self._string_columns())
            path_col = self._path_column(table.schema)
            for col in (path_col, self.spec.key_column):
                if col and col not in table.column_names:
                    raise PartitionError(f"{item.uri}: column {col!r} not found "
                                         f"(columns: {table.column_names})")
            base = posixpath.dirname(item.uri)
            for chunk in table.to_batches(max_chunksize=batch_size):
                yield self._batch(chunk.to_pydict(), path_col, base, pool)

    def _batch(self, cols: dict[str, list], path_col: str, base: str,
               pool: ThreadPoolExecutor) -> Batch:
        uris = [_resolve_media(p, base) for p in cols[path_col]]
        fetched = list(pool.map(lambda u: self._fetch(u, 0) if u else (None, "read_failed: "
                                f"empty {path_col!r} value"), uris))
        if self.spec.key_column:
            keys = [str(k) for k in cols[self.spec.key_column]]
        else:
            keys = [posixpath.splitext(posixpath.basename(u or ""))[0] for u in uris]
        batch: Batch = {KEY: keys, SOURCE_URI: [u or "" for u in uris],
                        SOURCE_BYTES: [d for d, _ in fetched], ERROR: [e for _, e in fetched],
                        RAW_CAPTION: cols.get(self.spec.caption_column, [None] * len(uris))}
        skip = {path_col, self.spec.caption_column, self.spec.key_column}
        for name, values in cols.items():
            if name not in skip:
                batch[carried_name(name)] = values
        return batch


def _group_items(group: dict) -> Iterator[InputItem]:
    caption = group["side"].get(".txt") or group["side"].get(".json")
    for entry in group["media"]:
        yield InputItem(uri=entry.uri, size_bytes=entry.size_bytes, caption_uri=caption)


def carried_name(name: str) -> str:
    """Output name of a carried manifest column: ``meta_<name>`` if ``name`` is reserved."""
    return f"meta_{name}" if name in RESERVED or name.startswith("_") else name


def _resolve_media(value: Any, base: str) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    if "://" in value or value.startswith("/"):
        return value
    return fs.join(base, value)


def _key_from_uri(uri: str, root: str) -> str:
    rel = uri[len(root):].lstrip("/") if uri.startswith(root) else posixpath.basename(uri)
    return posixpath.splitext(rel)[0]


def make_datasource(spec: SourceSpec, decode: DecodeSpec) -> Datasource:
    """Return the datasource for ``spec.kind``."""
    return {"files": FilesDatasource, "manifest": ManifestDatasource}[spec.kind](spec, decode)
