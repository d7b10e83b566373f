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


def _open_batches(uri: str, fmt: str, string_columns: tuple[str, ...] = ()):
    """A streaming reader (``.schema``, iterable of record batches) over a CSV or JSONL
    manifest, and the stream to close. Types are inferred from the first block, as
    ``pyarrow.csv.read_csv`` does; CSV columns in ``string_columns`` are strings (keys like
    000123 must not become ints)."""
    fsys, path = fs.resolve(uri)
    stream = fsys.open_input_stream(path)
    try:
        if fmt == "csv":
            types = {c: pa.string() for c in string_columns if c}
            return pacsv.open_csv(stream, convert_options=pacsv.ConvertOptions(
                column_types=types)), stream
        return pajson.open_json(stream), stream
    except BaseException:
        stream.close()
        raise


def _scan(uri: str, fmt: str, string_columns: tuple[str, ...], start: int, stop: int | None
          ) -> tuple[pa.Schema, list[pa.RecordBatch], int]:
    """Stream a CSV/JSONL manifest: its schema, the batches of rows ``[start, stop)``
    (``stop=None``: none kept, just count), and the rows seen (all of them if
    ``stop`` is None). Memory: one block plus the kept rows."""
    reader, stream = _open_batches(uri, fmt, string_columns)
    kept, offset = [], 0
    try:
        for batch in reader:
            n = batch.num_rows
            if stop is not None and offset + n > start and offset < stop:
                lo = max(0, start - offset)
                kept.append(batch.slice(lo, min(n, stop - offset) - lo))
            offset += n
            if stop is not None and offset >= stop:
                break
        return reader.schema, kept, offset
    finally:
        stream.close()


def _guard(uri: str, fmt: str, what: str, fn):
    """Run ``fn`` with retries; an unreadable file raises ``PartitionError`` naming it."""
    try:
        return fs.with_retries(uri, what, fn)
    except (pa.ArrowException, OSError) as e:
        raise PartitionError(f"manifest {uri}: cannot read as {fmt}: {e}") from e


def count_rows(uri: str, declared: str) -> int:
    """Rows in a manifest (Parquet: from the footer; CSV/JSONL: one streaming pass).
    Raises ``PlanError`` naming the file."""
    fmt = manifest_format(uri, declared)
    try:
        if fmt == "parquet":
            fsys, path = fs.resolve(uri)
            return _guard(uri, fmt, "read footer",
                          lambda: pq.read_metadata(path, filesystem=fsys).num_rows)
        return _guard(uri, fmt, "count rows", lambda: _scan(uri, fmt, (), 0, None)[2])
    except PartitionError as e:
        raise PlanError(str(e)) from e


def read_schema(uri: str, declared: str, string_columns: tuple[str, ...] = ()) -> pa.Schema:
    """The manifest's Arrow schema (Parquet: the footer; CSV/JSONL: the first block).
    Raises ``PartitionError`` naming the file."""
    fmt = manifest_format(uri, declared)
    if fmt == "parquet":
        fsys, path = fs.resolve(uri)
        return _guard(uri, fmt, "read schema", lambda: pq.read_schema(path, filesystem=fsys))

    def first_block() -> pa.Schema:
        reader, stream = _open_batches(uri, fmt, string_columns)
        stream.close()
        return reader.schema
    return _guard(uri, fmt, "read schema", first_block)


def read_rows(uri: str, declared: str, start: int, stop: int,
              string_columns: tuple[str, ...] = ()) -> pa.Table:
    """Rows ``[start, stop)`` of a manifest; CSV columns in ``string_columns`` are read as
    strings. Parquet reads only the row groups that overlap the range; CSV/JSONL stream
    up to ``stop`` and keep only the range. Raises ``PartitionError`` naming the file."""
    fmt = manifest_format(uri, declared)
    if fmt == "parquet":
        fsys, path = fs.resolve(uri)

        def read() -> pa.Table:
            with fsys.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                groups, offset, first = [], 0, 0
                for g in range(pf.num_row_groups):
                    n = pf.metadata.row_group(g).num_rows
                    if offset + n > start and offset < stop:
                        first = offset if not groups else first
                        groups.append(g)
                    offset += n
                table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
                return table.slice(start - first, stop - start)
        return _guard(uri, fmt, "read rows", read)

    def scan() -> pa.Table:
        schema, kept, _ = _scan(uri, fmt, string_columns, start, stop)
        return pa.Table.from_batches(kept, schema=schema)
    return _guard(uri, fmt, "read rows", scan)
