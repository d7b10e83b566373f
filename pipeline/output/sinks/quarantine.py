"""The quarantine datasink: the ``status="error"`` rows with their original bytes.

Streams the error rows of an attempt, plus ``source_bytes``, to
``quarantine/<pid>/a-<attempt>/part-00000.parquet`` (``ParquetDatasink``'s file, schema
and buffering; buffered up to ``sink.quarantine_buffer_bytes`` as well as rows).
Quarantine holds media, not secrets: it keeps the bytes of a row that failed at or after
decoding, up to ``sink.quarantine_max_row_bytes``, and never those of a row the datasource
refused before decoding (``_read_error`` set: outside the input roots, too large, not a
file, download failed or refused).
"""

from __future__ import annotations
from typing import Any
import pyarrow as pa
from pipeline.columns import READ_ERROR, SOURCE_BYTES, SOURCE_BYTES_OUT, STATUS, Batch, lookup
from pipeline.output.sinks.parquet import ParquetDatasink, to_table
from pipeline.records import Status


class QuarantineDatasink(ParquetDatasink):
    """The ``status="error"`` rows with ``source_bytes`` (their original bytes; None for
    videos, which are never read into memory: ``source_uri`` names the file)."""

    name = "quarantine"
    directory = "quarantine"

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
