"""Caption normalisation on the real T* case files."""

from __future__ import annotations

import pyarrow.parquet as pq

from pipeline.spec import CaptionSpec
from pipeline.steps.caption import normalize_caption
from tests.conftest import CASES

SPEC = CaptionSpec()


def test_t01_cp1252_bytes_are_decoded_with_fallback_and_flagged():
    raw = (CASES / "T01_utf8" / "cp1252_caption.txt").read_bytes()
    text, flags = normalize_caption(raw, SPEC)
    assert flags == ["encoding_fixed"]
    assert text.startswith("Then he said, \u201cThe names Bod")
    assert "spam \u2013 served" in text and "\u2014 served" in text


def test_undecodable_bytes_become_replacement_chars():
    text, flags = normalize_caption(b"caf\x81 \xff", SPEC)
    assert flags == ["invalid_utf8"]
    assert text == "caf\ufffd \ufffd"


def test_t03_null_blank_and_missing_captions():
    rows = pq.read_table(CASES / "T03_capnull" / "coco_captions_with_nulls.parquet").to_pylist()
    results = [normalize_caption(r["caption"], SPEC) for r in rows]
    assert results[0] == ("Several plates of food are set on a table.", [])
    assert [r for r in results[1:]] == [(None, ["missing_caption"])] * 3


def test_non_string_and_list_captions():
    assert normalize_caption(42, SPEC) == ("42", ["non_string_caption"])
    assert normalize_caption(["", "  ", "second"], SPEC) == ("second", ["from_list"])
    assert normalize_caption([], SPEC) == (None, ["from_list", "missing_caption"])
    assert normalize_caption({"en": "x"}, SPEC)[1] == ["non_string_caption"]


def test_t05_long_captions_are_kept_in_full_and_flagged():
    texts = pq.read_table(CASES / "T05_caplong" / "laion_sample_1000.parquet").column("TEXT").to_pylist()
    out = [normalize_caption(t, SPEC) for t in texts]
    long = [(t, c, f) for t, (c, f) in zip(texts, out) if t and len(t.strip()) > 1000]
    assert long, "the LAION sample holds captions over 1000 characters"
    for t, c, f in long:
        assert c == t.strip() and "long_caption" in f
    assert sum("long_caption" in f for _, f in out) == len(long)
    assert normalize_caption("x\ufffdy", SPEC) == ("x\ufffdy", ["replacement_char"])
