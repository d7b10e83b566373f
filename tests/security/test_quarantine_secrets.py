"""Issue 12 items 2 and 7 (captions): quarantine keeps media that failed to decode (capped
per row), never bytes of rows refused before decoding; the buffer is bounded in bytes;
the ``error`` text never quotes input bytes; a huge caption is cut and flagged."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.columns import ERROR, ERROR_REASON, KEY, READ_ERROR, SOURCE_BYTES, STATUS
from pipeline.errors import RecordError
from pipeline.output.sinks.quarantine import QuarantineDatasink
from pipeline.records import ErrorReason, RowError
from pipeline.spec import CaptionSpec, SinkSpec
from pipeline.steps.caption import normalize_captions
from pipeline.media.decode import decode_image

SECRET = b"AWS_SECRET_ACCESS_KEY=do-not-leak-4f1c9e\n"
SCHEMA = pa.schema([(KEY, pa.string()), (STATUS, pa.string()), (ERROR_REASON, pa.string()),
                    (ERROR, pa.string())])


def _batch(rows: list[tuple[str, str, bytes | None, RowError | None]]) -> dict:
    return {KEY: [r[0] for r in rows], STATUS: [r[1] for r in rows],
            SOURCE_BYTES: [r[2] for r in rows], READ_ERROR: [r[3] for r in rows],
            ERROR_REASON: [None if r[1] != "error" else "x" for r in rows],
            ERROR: [None if r[1] != "error" else "x: y" for r in rows]}


def _write(tmp_path, spec: SinkSpec, batches: list[dict]) -> tuple[pa.Table, pq.ParquetFile]:
    sink = QuarantineDatasink(str(tmp_path / "out"), spec)
    sink.on_write_start("p-000000", "a1", SCHEMA)
    for b in batches:
        sink.write(b)
    result = sink.on_write_complete()
    path = tmp_path / "out" / result.files[0]
    return pq.read_table(path), pq.ParquetFile(path)


def test_quarantine_keeps_media_not_refused_rows(tmp_path):
    refused = RowError(ErrorReason.OUTSIDE_INPUT_ROOT, "/etc/passwd: outside")
    batch = _batch([("ok", "ok", b"fine", None),
                    ("bad_media", "error", b"\x89PNG broken", None),
                    ("outside", "error", SECRET, refused),
                    ("too_big_for_quarantine", "error", b"m" * 2000, None)])
    spec = SinkSpec(uri=str(tmp_path / "out"), quarantine_max_row_bytes=1000)
    table, _ = _write(tmp_path, spec, [batch])
    got = dict(zip(table[KEY].to_pylist(), table["source_bytes"].to_pylist()))
    assert got == {"bad_media": b"\x89PNG broken", "outside": None,
                   "too_big_for_quarantine": None}


def test_quarantine_buffer_is_bounded_in_bytes(tmp_path):
    """rows_per_row_group 256 would buffer 256 MiB of 1 MiB rows; the byte bound writes a
    row group every 4 MiB instead."""
    spec = SinkSpec(uri=str(tmp_path / "out"), rows_per_row_group=256,
                    quarantine_buffer_bytes=4 * 2**20, compression="none")
    batches = [_batch([(f"k{i}", "error", bytes([i]) * 2**20, None)]) for i in range(12)]
    table, pf = _write(tmp_path, spec, batches)
    assert table.num_rows == 12
    assert pf.metadata.num_row_groups == 3


def test_error_text_never_quotes_input_bytes():
    with pytest.raises(RecordError) as e:
        decode_image(SECRET)
    assert SECRET[:16].decode() not in str(e.value) and "AWS" not in str(e.value)
    assert "no known image signature" in str(e.value)


def test_forty_megabyte_caption_is_cut_and_flagged():
    spec = CaptionSpec()
    t0 = time.monotonic()
    caption, captions, flags = normalize_captions(b"word " * (8 * 2**20), spec)  # 40 MiB
    assert time.monotonic() - t0 < 2.0
    assert len(caption) <= spec.max_caption_chars and caption.startswith("word word")
    assert "caption_truncated" in flags and "long_caption" in flags
    caption, _, flags = normalize_captions("x" * 100, CaptionSpec(max_caption_chars=10))
    assert caption == "x" * 10 and flags == ["caption_truncated"]
    caption, _, flags = normalize_captions(["y" * 50], CaptionSpec(max_caption_chars=10))
    assert caption == "y" * 10 and flags[:2] == ["from_list", "caption_truncated"]
    assert normalize_captions("short", spec)[2] == []
