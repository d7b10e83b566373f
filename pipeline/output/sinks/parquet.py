"""The Parquet datasink: every row of an attempt, with its status.

``ParquetDatasink`` streams every row of an attempt to
``data/<pid>/a-<attempt>/part-00000.parquet`` (``quarantine.QuarantineDatasink`` derives
from it for the error rows and their bytes). Both carry the job's key-value
metadata (``on_write_start``). Rows are buffered up to ``rows_per_row_group`` or
``sink.max_buffer_bytes`` (quarantine: also ``sink.quarantine_buffer_bytes``), whichever
comes first, and written as a row group, so neither a partition nor 256 rows of large
cells are held in memory whole; a batch is converted to Arrow in pieces of at most that
many bytes (``row_chunks``). The file's sha256 and size come from the stream
(``fs.HashingOutput``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.columns import SOURCE_BYTES, SOURCE_BYTES_OUT, STATUS, Batch
from pipeline.storage import fs
from pipeline.output.sinks.base import FileDatasink
from pipeline.output.layout import OutputLayout
from pipeline.spec import SinkSpec


def _column(values: list[Any], field: pa.Field) -> pa.Array:
    if pa.types.is_list(field.type) and pa.types.is_fixed_size_list(field.type.value_type):
        values = [None if v is None else [np.asarray(x).tolist() for x in v] for v in values]
        return pa.array(values, type=field.type)
    if pa.types.is_fixed_size_list(field.type):
        dim = field.type.list_size
        mask = np.array([v is None for v in values], dtype=bool)
        flat = np.zeros((len(values), dim), dtype=field.type.value_type.to_pandas_dtype())
        for i, v in enumerate(values):
            if v is not None:
                flat[i] = v
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), dim,
                                                 mask=pa.array(mask))
    return pa.array(values, type=field.type)


def _cell_bytes(value: Any) -> int:
    """Estimated Arrow bytes of one cell: buffer length of bytes/str/arrays, the sum over
    a list, 8 for any other scalar."""
    if value is None:
        return 1
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return len(value) + 4
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 4
    if isinstance(value, (list, tuple)):
        return sum(_cell_bytes(v) for v in value) + 4
    return 8


def row_chunks(batch: Batch, schema: pa.Schema, rows: list[int],
               max_bytes: int) -> list[list[int]]:
    """``rows`` cut, in order, into runs whose cells of ``schema``'s columns add up to at
    most ``max_bytes`` (estimated by ``_cell_bytes``); a row larger than that is a run of
    its own."""
    columns = [batch.get(SOURCE_BYTES if f.name == SOURCE_BYTES_OUT else f.name)
               for f in schema]
    columns = [c for c in columns if c is not None]
    chunks: list[list[int]] = []
    run: list[int] = []
    size = 0
    for i in rows:
        row = sum(_cell_bytes(c[i]) for c in columns)
        if run and size + row > max_bytes:
            chunks.append(run)
            run, size = [], 0
        run.append(i)
        size += row
    if run:
        chunks.append(run)
    return chunks


def to_table(batch: Batch, schema: pa.Schema, rows: list[int]) -> pa.Table:
    """Rows ``rows`` of ``batch`` as a table of ``schema`` (missing columns become null;
    ``source_bytes`` is read from the internal ``_source_bytes`` column)."""
    n = len(rows)
    cols = []
    for field in schema:
        src = batch.get(SOURCE_BYTES if field.name == SOURCE_BYTES_OUT else field.name)
        values = [src[i] for i in rows] if src is not None else [None] * n
        cols.append(_column(values, field))
    return pa.Table.from_arrays(cols, schema=schema)


class _StreamingFile:
    """One Parquet file written row group by row group through a hashing stream."""

    def __init__(self, open_out, schema: pa.Schema, spec: SinkSpec,
                 max_buffer_bytes: int | None = None):
        self.open_out, self.schema, self.spec = open_out, schema, spec
        self.max_buffer_bytes = max_buffer_bytes
        self.out: fs.HashingOutput | None = None
        self.writer: pq.ParquetWriter | None = None
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.buffered_bytes = 0
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self.buffer.append(table)
        self.buffered += table.num_rows
        self.buffered_bytes += table.nbytes
        if (self.buffered >= self.spec.rows_per_row_group or
                (self.max_buffer_bytes is not None
                 and self.buffered_bytes >= self.max_buffer_bytes)):
            self._flush()

    def _flush(self) -> None:
        if not self.buffered:
            return
        if self.writer is None:
            self.out = self.open_out()
            codec = None if self.spec.compression == "none" else self.spec.compression
            self.writer = pq.ParquetWriter(self.out, self.schema, compression=codec)
        self.writer.write_table(pa.concat_tables(self.buffer),
                                row_group_size=self.spec.rows_per_row_group)
        self.rows += self.buffered
        self.buffer, self.buffered, self.buffered_bytes = [], 0, 0

    def close(self) -> bool:
        """Flush and close; return True if a file was written."""
        self._flush()
        if self.writer is None:
            return False
        self.writer.close()
        return True


class ParquetDatasink(FileDatasink):
    """Every row of an attempt, in input order, to one Parquet file of the data schema."""

    name = "parquet"
    directory = "data"

    def __init__(self, output_uri: str, spec: SinkSpec):
        super().__init__(output_uri)
        self.spec = spec
        self.schema: pa.Schema | None = None
        self.file: _StreamingFile | None = None

    def settings(self) -> dict[str, Any]:
        return {"compression": self.spec.compression,
                "rows_per_row_group": self.spec.rows_per_row_group}

    def on_write_start(self, partition_id: str, attempt_id: str, schema: pa.Schema) -> None:
        """Begin an attempt: the file's key-value metadata is ``schema.metadata`` (the
        pipeline's ``mmpipe.version``/``fingerprint``/``spec``) plus ``mmpipe.partition_id``
        and ``mmpipe.attempt_id``; pyarrow adds its own ``ARROW:schema`` beside them."""
        super().on_write_start(partition_id, attempt_id, schema)
        self.schema = self._schema(schema).with_metadata({
            **(schema.metadata or {}), b"mmpipe.partition_id": partition_id.encode(),
            b"mmpipe.attempt_id": attempt_id.encode()})
        self.rel = OutputLayout.rel_parquet(self.name, partition_id, attempt_id)
        self.file = _StreamingFile(lambda: self.open_file(self.rel), self.schema, self.spec,
                                   self._buffer_bytes())

    def _buffer_bytes(self) -> int:
        """Bytes buffered before a row group is written (``sink.max_buffer_bytes``)."""
        return self.spec.max_buffer_bytes

    def _schema(self, data_schema: pa.Schema) -> pa.Schema:
        return data_schema

    def _rows(self, batch: Batch) -> list[int]:
        return list(range(len(batch[STATUS])))

    def write(self, batch: Batch) -> None:
        self.write_rows(batch, self._rows(batch))

    def write_rows(self, batch: Batch, rows: list[int]) -> None:
        """Rows ``rows`` of ``batch`` to the file, converted to Arrow in pieces of at most
        the buffer's bytes (``row_chunks``), each flushed once the buffer is full."""
        for chunk in row_chunks(batch, self.schema, rows, self.file.max_buffer_bytes):
            self.file.write(to_table(batch, self.schema, chunk))

    def _finish(self) -> None:
        if self.file.close():
            self.finish_file(self.rel, self.file.rows)


