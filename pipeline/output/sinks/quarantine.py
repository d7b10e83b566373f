"""The quarantine datasink: the ``status="error"`` rows with their original bytes.

Streams the error rows of an attempt, plus ``source_bytes``, to
``quarantine/<pid>/a-<attempt>/part-00000.parquet`` (``ParquetDatasink``'s file, schema
and buffering; buffered up to ``sink.quarantine_buffer_bytes`` as well as rows).
Quarantine holds media, not secrets: it keeps the bytes of a row that failed at or after
decoding, up to ``sink.quarantine_max_row_bytes``, only if they sniff as media
(``is_media``; ``sink.quarantine_bytes``: ``media`` by default, ``digest`` keeps none,
``all`` any), and never those of a row the datasource refused before decoding
(``_read_error`` set: outside the input roots, hidden, too large, not a file, download
failed or refused). A row read without error keeps ``source_sha256`` and ``source_size``
whether its bytes are kept or not, so a failure can be traced to its input without a copy.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa

from pipeline.columns import (
    READ_ERROR,
    SOURCE_BYTES,
    SOURCE_BYTES_OUT,
    SOURCE_SHA256_OUT,
    SOURCE_SIZE_OUT,
    STATUS,
    Batch,
    lookup,
)
from pipeline.media.imageio_util import (
    RASTER_FORMATS,
    UNSUPPORTED_IMAGE_FORMATS,
    sniff_format,
)
from pipeline.output.sinks.parquet import ParquetDatasink
from pipeline.records import Status

#: The quarantine-only columns, in file order.
QUARANTINE_COLUMNS = (SOURCE_BYTES_OUT, SOURCE_SHA256_OUT, SOURCE_SIZE_OUT)

# Container signatures of video formats (magic bytes as FFmpeg's probes and file(1) know
# them): Matroska/WebM EBML, Ogg, FLV, ASF/WMV, MPEG program stream.
_VIDEO_MAGIC = (b"\x1a\x45\xdf\xa3", b"OggS", b"FLV\x01",
                b"\x30\x26\xb2\x75\x8e\x66\xcf\x11", b"\x00\x00\x01\xba")
# ISO-BMFF / QuickTime top-level box types at offset 4 (mp4, mov, 3gp, m4v, HEIF/AVIF).
_BMFF_BOXES = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip")


def is_media(data: bytes) -> bool:
    """True if ``data`` starts like an image (``imageio_util.sniff_format``: a raster
    format, SVG or JPEG XL) or a video container (ISO-BMFF/QuickTime, Matroska/WebM, AVI,
    Ogg, FLV, ASF, MPEG-PS/TS), by magic bytes only. Formats without a signature (TGA,
    raw) are not media here: quarantine keeps their digest, not their bytes."""
    if sniff_format(data) in RASTER_FORMATS | UNSUPPORTED_IMAGE_FORMATS:
        return True
    head = data[:16]
    if head.startswith(_VIDEO_MAGIC) or head[4:8] in _BMFF_BOXES:
        return True
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return True
    return len(data) > 188 and data[0] == 0x47 and data[188] == 0x47   # MPEG-TS sync bytes


class QuarantineDatasink(ParquetDatasink):
    """The ``status="error"`` rows with ``source_bytes`` (their original bytes; None for
    videos, which are never read into memory: ``source_uri`` names the file)."""

    name = "quarantine"
    directory = "quarantine"

    def _schema(self, data_schema: pa.Schema) -> pa.Schema:
        return quarantine_schema(data_schema)

    def settings(self) -> dict[str, Any]:
        return {"quarantine_max_row_bytes": self.spec.quarantine_max_row_bytes,
                "quarantine_bytes": self.spec.quarantine_bytes}

    def _buffer_bytes(self) -> int:
        """The smaller of ``sink.quarantine_buffer_bytes`` and ``sink.max_buffer_bytes``."""
        return min(self.spec.quarantine_buffer_bytes, self.spec.max_buffer_bytes)

    def _rows(self, batch: Batch) -> list[int]:
        return [i for i, s in enumerate(batch[STATUS]) if s == Status.ERROR.value]

    def _read_bytes(self, batch: Batch, i: int) -> bytes | None:
        """Row ``i``'s bytes as the datasource read them without error, else None."""
        data = (batch.get(SOURCE_BYTES) or [None] * (i + 1))[i]
        refused = (batch.get(READ_ERROR) or [None] * (i + 1))[i] is not None
        return None if refused or not isinstance(data, (bytes, bytearray, memoryview)) else data

    def kept_bytes(self, batch: Batch, i: int) -> bytes | None:
        """The ``source_bytes`` quarantine keeps for row ``i``: its bytes if the
        datasource read it without error, they are at most ``quarantine_max_row_bytes``
        and ``quarantine_bytes`` admits them (``media``: ``is_media``; ``digest``: never;
        ``all``: always), else None (see the module docstring)."""
        data = self._read_bytes(batch, i)
        mode = self.spec.quarantine_bytes
        if (data is None or len(data) > self.spec.quarantine_max_row_bytes or mode == "digest"
                or mode == "media" and not is_media(bytes(data[:4096]))):
            return None
        return data

    def write(self, batch: Batch) -> None:
        rows = self._rows(batch)
        if rows:
            n = len(batch[STATUS])
            view, read = dict(batch), {i: self._read_bytes(batch, i) for i in rows}
            view[SOURCE_BYTES] = [self.kept_bytes(batch, i) if i in read else None
                                  for i in range(n)]
            view[SOURCE_SHA256_OUT] = [hashlib.sha256(read[i]).hexdigest()
                                       if read.get(i) is not None else None for i in range(n)]
            view[SOURCE_SIZE_OUT] = [len(read[i]) if read.get(i) is not None else None
                                     for i in range(n)]
            self.write_rows(view, rows)


def quarantine_schema(data_schema: pa.Schema) -> pa.Schema:
    """The schema of quarantine files: ``data_schema`` plus ``QUARANTINE_COLUMNS``."""
    for name in QUARANTINE_COLUMNS:
        data_schema = data_schema.append(lookup(name).field())
    return data_schema
