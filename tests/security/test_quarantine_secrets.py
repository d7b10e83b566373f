"""Issue 12 items 2 and 7 (captions): quarantine keeps media that failed to decode (capped
per row), never bytes of rows refused before decoding; the buffer is bounded in bytes;
the ``error`` text never quotes input bytes; a huge caption is cut and flagged."""

from __future__ import annotations

import hashlib
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


BROKEN_PNG = b"\x89PNG\r\n\x1a\n broken"


def test_quarantine_keeps_media_not_refused_rows(tmp_path):
    refused = RowError(ErrorReason.OUTSIDE_INPUT_ROOT, "/etc/passwd: outside")
    batch = _batch([("ok", "ok", b"fine", None),
                    ("bad_media", "error", BROKEN_PNG, None),
                    ("outside", "error", SECRET, refused),
                    ("too_big_for_quarantine", "error", b"\xff\xd8\xff" + b"m" * 2000, None)])
    spec = SinkSpec(uri=str(tmp_path / "out"), quarantine_max_row_bytes=1000)
    table, _ = _write(tmp_path, spec, [batch])
    got = dict(zip(table[KEY].to_pylist(), table["source_bytes"].to_pylist()))
    assert got == {"bad_media": BROKEN_PNG, "outside": None,
                   "too_big_for_quarantine": None}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digests(table: pa.Table) -> dict:
    return {r[KEY]: (r["source_bytes"], r["source_sha256"], r["source_size"])
            for r in table.to_pylist()}


def test_quarantine_of_a_non_media_file_keeps_its_digest_and_size_only(tmp_path):
    """Round 3: a key, a token, an HTML page that failed to decode are not media: before,
    their bytes were copied into quarantine; now a sha256 and a size, by default."""
    key = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n"
    page = b"<html>not an image</html>"
    webm = b"\x1a\x45\xdf\xa3" + b"\x00" * 40
    batch = _batch([("key", "error", key, None), ("page", "error", page, None),
                    ("png", "error", BROKEN_PNG, None), ("webm", "error", webm, None)])
    table, _ = _write(tmp_path / "media", SinkSpec(uri=str(tmp_path / "media" / "out")),
                      [batch])
    assert _digests(table) == {"key": (None, _sha(key), len(key)),
                               "page": (None, _sha(page), len(page)),
                               "png": (BROKEN_PNG, _sha(BROKEN_PNG), len(BROKEN_PNG)),
                               "webm": (webm, _sha(webm), len(webm))}
    spec = SinkSpec(uri=str(tmp_path / "digest" / "out"), quarantine_bytes="digest")
    table, _ = _write(tmp_path / "digest", spec, [batch])
    assert {k: v[0] for k, v in _digests(table).items()} == dict.fromkeys(
        ("key", "page", "png", "webm"))
    spec = SinkSpec(uri=str(tmp_path / "all" / "out"), quarantine_bytes="all")
    table, _ = _write(tmp_path / "all", spec, [batch])
    assert {k: v[0] for k, v in _digests(table).items()} == {
        "key": key, "page": page, "png": BROKEN_PNG, "webm": webm}


def test_quarantine_buffer_is_bounded_in_bytes(tmp_path):
    """rows_per_row_group 256 would buffer 256 MiB of 1 MiB rows; the byte bound writes a
    row group every 4 MiB instead."""
    spec = SinkSpec(uri=str(tmp_path / "out"), rows_per_row_group=256,
                    quarantine_buffer_bytes=4 * 2**20, compression="none",
                    quarantine_bytes="all")   # the rows are no media: keep them anyway
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
