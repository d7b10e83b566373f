"""Reading Parquet, CSV and JSONL manifests through ``pyarrow`` (and ``pyarrow.fs``)."""

from __future__ import annotations

import posixpath

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from pipeline.errors import PartitionError, PlanError
from pipeline.io import fs

_EXTENSIONS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl",
               ".ndjson": "jsonl"}


def manifest_format(uri: str, declared: str) -> str:
    """Return ``declared`` unless it is ``auto``, else the format from the extension.

    Raises ``PlanError`` for an unknown extension.
    """
    if declared != "auto":
        return declared
    ext = posixpath.splitext(uri)[1].lower()
    if ext not in _EXTENSIONS:
        raise PlanError(f"{uri}: cannot tell the manifest format from {ext!r}; "
                        f"set source.manifest_format")
    return _EXTENSIONS[ext]


def list_manifests(uri: str, declared: str) -> list[tuple[str, int]]:
    """Return ``(uri, size_bytes)`` of the manifest file ``uri`` or the manifests under it, sorted."""
    size = fs.file_size(uri)
    if size is not None:
        return [(fs.normalize(uri), size)]
    found = []
    for entry in fs.list_files(uri):
        ext = posixpath.splitext(entry.uri)[1].lower()
        if (declared == "auto" and ext in _EXTENSIONS) or _EXTENSIONS.get(ext) == declared:
            found.append((entry.uri, entry.size_bytes))
    return found


def _read_table(uri: str, fmt: str, string_columns: tuple[str, ...] = ()) -> pa.Table:
    try:
        data = pa.BufferReader(fs.read_bytes(uri))
        if fmt == "parquet":
            return pq.read_table(data)
        if fmt == "csv":  # keys like 000123 must stay strings, not be inferred as ints
            types = {c: pa.string() for c in string_columns if c}
            return pacsv.read_csv(data, convert_options=pacsv.ConvertOptions(column_types=types))
        return pajson.read_json(data)
    except (pa.ArrowException, OSError) as e:
        raise PartitionError(f"manifest {uri}: cannot read as {fmt}: {e}") from e


def count_rows(uri: str, declared: str) -> int:
    """Rows in a manifest (Parquet: from the footer). Raises ``PlanError`` naming the file."""
    fmt = manifest_format(uri, declared)
    try:
        if fmt == "parquet":
            fsys, path = fs.resolve(uri)
            return fs.with_retries(uri, "read footer",
                                   lambda: pq.read_metadata(path, filesystem=fsys).num_rows)
        return _read_table(uri, fmt).num_rows
    except (pa.ArrowException, OSError, PartitionError) as e:
        raise PlanError(f"manifest {uri}: cannot count rows: {e}") from e


def read_schema(uri: str, declared: str, string_columns: tuple[str, ...] = ()) -> pa.Schema:
    """The manifest's Arrow schema. Raises ``PartitionError`` naming the file."""
    fmt = manifest_format(uri, declared)
    if fmt == "parquet":
        fsys, path = fs.resolve(uri)
        try:
            return fs.with_retries(uri, "read schema",
                                   lambda: pq.read_schema(path, filesystem=fsys))
        except (pa.ArrowException, OSError) as e:
            raise PartitionError(f"manifest {uri}: cannot read schema: {e}") from e
    return _read_table(uri, fmt, string_columns).schema


def read_rows(uri: str, declared: str, start: int, stop: int,
              string_columns: tuple[str, ...] = ()) -> pa.Table:
    """Rows ``[start, stop)`` of a manifest; CSV columns in ``string_columns`` are read as
    strings. Raises ``PartitionError`` naming the file."""
    table = _read_table(uri, manifest_format(uri, declared), string_columns)
    return table.slice(start, stop - start)
