"""The Parquet datasinks: data rows, and error rows with their bytes (quarantine).

``ParquetDatasink`` streams every row of an attempt to
``data/<pid>/a-<attempt>/part-00000.parquet``; ``QuarantineDatasink`` streams the
``status="error"`` rows, plus ``source_bytes`` (the original bytes), to the same path under
``quarantine/``. Quarantine holds media, not secrets: it keeps the bytes of a row that
failed at or after decoding, up to ``sink.quarantine_max_row_bytes``, and never those of
a row the datasource refused before decoding (``_read_error`` set: outside the input
roots, too large, not a file, download failed or refused). Both carry the job's key-value
metadata (``on_write_start``). Rows are buffered up to ``rows_per_row_group`` (quarantine:
also up to ``sink.quarantine_buffer_bytes``) and written as a row group, so a partition is
never held in memory whole; the file's sha256 and size come from the stream
(``fs.HashingOutput``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.columns import READ_ERROR, SOURCE_BYTES, SOURCE_BYTES_OUT, STATUS, Batch, lookup
from pipeline.io import fs
from pipeline.io.datasink import Datasink, WriteResult
from pipeline.io.layout import OutputLayout
from pipeline.records import Status
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

    def __init__(self, uri: str, schema: pa.Schema, spec: SinkSpec,
                 max_buffer_bytes: int | None = None):
        self.uri, self.schema, self.spec = uri, schema, spec
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
            self.out = fs.HashingOutput(self.uri)
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
        self.out.close()
        return True

    def discard(self) -> None:
        if self.out is not None:
            self.out.discard()
            self.out.close()


class ParquetDatasink(Datasink):
    """Every row of an attempt, in input order, to one Parquet file of the data schema."""

    name = "parquet"

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
        self.file = _StreamingFile(self.layout.uri(self.rel), self.schema, self.spec,
                                   self._buffer_bytes())

    def _buffer_bytes(self) -> int | None:
        return None

    def _schema(self, data_schema: pa.Schema) -> pa.Schema:
        return data_schema

    def _rows(self, batch: Batch) -> list[int]:
        return list(range(len(batch[STATUS])))

    def write(self, batch: Batch) -> None:
        rows = self._rows(batch)
        if rows:
            self.file.write(to_table(batch, self.schema, rows))

    def _close(self) -> WriteResult:
        if not self.file.close():
            return WriteResult()
        return WriteResult((self.rel,), self.file.rows, self.file.out.size,
                           {self.rel: self.file.out.sha256})

    def _discard(self) -> None:
        if self.file is not None:
            self.file.discard()


class QuarantineDatasink(ParquetDatasink):
    """The ``status="error"`` rows with ``source_bytes`` (their original bytes; None for
    videos, which are never read into memory: ``source_uri`` names the file)."""

    name = "quarantine"

    def _schema(self, data_schema: pa.Schema) -> pa.Schema:
        return data_schema.append(lookup(SOURCE_BYTES_OUT).field())

    def settings(self) -> dict[str, Any]:
        return {"quarantine_max_row_bytes": self.spec.quarantine_max_row_bytes}

    def _buffer_bytes(self) -> int | None:
        return self.spec.quarantine_buffer_bytes

    def _rows(self, batch: Batch) -> list[int]:
        return [i for i, s in enumerate(batch[STATUS]) if s == Status.ERROR.value]

    def kept_bytes(self, batch: Batch, i: int) -> bytes | None:
        """The ``source_bytes`` quarantine keeps for row ``i``: its bytes if the
        datasource read it without error and they are at most
        ``quarantine_max_row_bytes``, else None (see the module docstring)."""
        data = (batch.get(SOURCE_BYTES) or [None] * (i + 1))[i]
        refused = (batch.get(READ_ERROR) or [None] * (i + 1))[i] is not None
        if data is None or refused or len(data) > self.spec.quarantine_max_row_bytes:
            return None
        return data

    def write(self, batch: Batch) -> None:
        rows = self._rows(batch)
        if rows:
            keep, view = set(rows), dict(batch)
            view[SOURCE_BYTES] = [self.kept_bytes(batch, i) if i in keep else None
                                  for i in range(len(batch[STATUS]))]
            self.file.write(to_table(view, self.schema, rows))
