"""Caption normalisation on the real T* case files."""

from __future__ import annotations

import pyarrow.parquet as pq

from pipeline.spec import CaptionSpec
from pipeline.steps.caption import CaptionStep, normalize_caption, normalize_captions
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


def test_every_caption_of_a_list_is_kept_normalised_in_order():
    assert normalize_captions(["", " A dog. ", 7, b"caf\xe9", "\x00", ["x"], "b"], SPEC) == (
        "A dog.", ["A dog.", "caf\u00e9", "b"], ["from_list"])
    assert normalize_captions(" one ", SPEC) == ("one", ["one"], [])
    assert normalize_captions(42, SPEC) == ("42", ["42"], ["non_string_caption"])
    assert normalize_captions(None, SPEC) == (None, [], ["missing_caption"])
    assert normalize_captions(["", "  "], SPEC) == (None, [], ["from_list", "missing_caption"])
    assert normalize_captions(["\x00", "later"], SPEC) == ("later", ["later"], ["from_list"])
    batch = CaptionStep(SPEC)({"_raw_caption": [["a", "b"], "c", None]})
    assert (batch["caption"], batch["captions"]) == (["a", "c", None], [["a", "b"], ["c"], []])


def test_t05_long_captions_are_kept_in_full_and_flagged():
    texts = pq.read_table(CASES / "T05_caplong" / "laion_sample_1000.parquet").column("TEXT").to_pylist()
    out = [normalize_caption(t, SPEC) for t in texts]
    long = [(t, c, f) for t, (c, f) in zip(texts, out) if t and len(t.strip()) > 1000]
    assert long, "the LAION sample holds captions over 1000 characters"
    for t, c, f in long:
        assert c == t.strip() and "long_caption" in f
    assert sum("long_caption" in f for _, f in out) == len(long)
    assert normalize_caption("x\ufffdy", SPEC) == ("x\ufffdy", ["replacement_char"])


def _case(rel: str):
    """A case file under data/cases."""
    return CASES / rel


def test_no_caption_ever_holds_nul_or_control_characters():
    assert normalize_caption("a\x00b\x07c", SPEC) == ("abc", ["control_chars_removed"])
    assert normalize_caption("\x00\x00", SPEC) == (None, ["control_chars_removed",
                                                           "missing_caption"])
    assert normalize_caption(b"nul\x00byte", SPEC) == ("nulbyte", ["control_chars_removed"])
    # JSON text escapes control characters itself: nothing to remove.
    assert normalize_caption({"t": "x\x00"}, SPEC) == ('{"t": "x\\u0000"}',
                                                        ["non_string_caption"])


def test_n05_lone_surrogate_caption_is_replaced_and_flagged():
    import json

    import pyarrow as pa

    raw = json.loads(_case("N05_json_lone_surrogate/files/a.json").read_text())["caption"]
    text, flags = normalize_caption(raw, SPEC)
    assert (text, flags) == ("sunset at the beach \ufffd", ["lone_surrogate"])
    assert pa.array([text]).to_pylist() == [text]


def test_n04_cp1252_manifest_cell_bytes_are_fixed():
    import csv

    with open(_case("N04_csv_cp1252/manifest/excel_export.csv"), newline="",
              encoding="latin-1") as f:
        cells = [r["caption"].encode("latin-1") for r in csv.DictReader(f)]
    assert normalize_caption(cells[0], SPEC) == (
        "\u201cCaf\u00e9 terrace\u201d at night \u2013 Arles", ["encoding_fixed"])
    assert normalize_caption(cells[1], SPEC) == ("plain ascii caption", [])


def test_unicode_bytes_bools_floats_and_lists_of_bytes():
    assert normalize_caption("  two dogs \n".encode("utf-16"), SPEC) == ("two dogs", ["utf16"])
    assert normalize_caption(True, SPEC) == ("true", ["non_string_caption"])
    assert normalize_caption(1.5, SPEC) == ("1.5", ["non_string_caption"])
    assert normalize_caption({"en": "x"}, SPEC) == ('{"en": "x"}', ["non_string_caption"])
    assert normalize_caption([None, b" ", b"caf\xe9"], SPEC) == (
        "caf\u00e9", ["from_list", "encoding_fixed"])
    assert normalize_caption(bytearray(b"ok"), SPEC) == ("ok", [])
    assert normalize_caption("   ", SPEC) == (None, ["missing_caption"])


def test_any_json_value_gives_a_clean_caption_or_none():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
        lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)

    @settings(max_examples=80, deadline=None)
    @given(values)
    def check(raw):
        text, flags = normalize_caption(raw, SPEC)
        assert text is None or (text == text.strip() and text
                                and "\x00" not in text and text.encode("utf-8"))
        assert (text is None) == ("missing_caption" in flags)

    check()
