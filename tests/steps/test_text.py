"""pipeline.text: decoding bytes of every kind and cleaning strings, on the real case files."""

from __future__ import annotations

import codecs
import csv
import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.text import clean_text, decode_text, sniff_encoding, sniff_unicode
from tests.conftest import CASES


T01_TEXT = ("Then he said, \u201cThe names Bod, James Bond.\u201d\nto be \u201cme\u201d\n"
            "Spam, beans, spam \u2013 served every day\n"
            "beans, spam, beans, \u2014 served every other day\n")


def case(rel: str) -> Path:
    """A case file under data/cases."""
    return CASES / rel


def test_utf8_with_and_without_bom():
    assert decode_text("Caf\u00e9 \U0001F305".encode("utf-8")) == ("Caf\u00e9 \U0001F305", [])
    assert decode_text(codecs.BOM_UTF8 + "Caf\u00e9".encode()) == ("Caf\u00e9", [])


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_with_bom(encoding):
    bom = {"utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}.get(encoding, b"")
    raw = bom + "Caf\u00e9 \U0001F305 ok\n".encode(encoding)
    assert raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
    assert decode_text(raw) == ("Caf\u00e9 \U0001F305 ok\n", ["utf16"])


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_bom_is_recognised(encoding):
    raw = "A photo, second line\nCaf\u00e9".encode(encoding)
    assert sniff_unicode(raw) == encoding
    assert decode_text(raw) == ("A photo, second line\nCaf\u00e9", ["utf16"])


@pytest.mark.parametrize("encoding", ["utf-32", "utf-32-le", "utf-32-be"])
def test_utf32_with_and_without_bom(encoding):
    raw = "Caf\u00e9 \U0001F305".encode(encoding)
    assert decode_text(raw) == ("Caf\u00e9 \U0001F305", ["utf32"])


def test_t01_cp1252_sidecar_is_decoded_with_the_fallback():
    raw = case("T01_utf8/cp1252_caption.txt").read_bytes()
    assert decode_text(raw) == (T01_TEXT, ["encoding_fixed"])
    assert decode_text(raw, "latin-1")[1] == ["encoding_fixed", "control_chars_removed"]


def test_n04_cp1252_spreadsheet_captions():
    path = case("N04_csv_cp1252/manifest/excel_export.csv")
    with open(path, newline="", encoding="latin-1") as f:  # latin-1: bytes 1:1
        rows = list(csv.DictReader(f))
    got = [decode_text(r["caption"].encode("latin-1")) for r in rows]
    assert got == [("\u201cCaf\u00e9 terrace\u201d at night \u2013 Arles", ["encoding_fixed"]),
                   ("plain ascii caption", []),
                   ("Stra\u00dfe in M\u00fcnchen\u2019s old town", ["encoding_fixed"])]


def test_binary_junk_is_not_taken_for_8bit_text():
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff"
    assert decode_text(png) == ("\ufffdPNG\r\n\n\rIHDR\ufffd",
                                ["invalid_utf8", "control_chars_removed"])
    # 8-bit looking text, but a byte cp1252 leaves undefined (0x81): replaced, not fixed.
    assert decode_text(b"caf\x81 \xff") == ("caf\ufffd \ufffd", ["invalid_utf8"])
    assert decode_text(b"caf\xe9\x01") == ("caf\ufffd", ["invalid_utf8", "control_chars_removed"])
    assert decode_text(b"caf\xe9", "no-such-codec") == ("caf\ufffd", ["invalid_utf8"])


def test_n05_lone_surrogate_becomes_replacement_char():
    value = json.loads(case("N05_json_lone_surrogate/files/a.json").read_text())["caption"]
    assert value == "sunset at the beach \ud83c"
    with pytest.raises(UnicodeEncodeError):
        value.encode("utf-8")
    text, flags = clean_text(value)
    assert (text, flags) == ("sunset at the beach \ufffd", ["lone_surrogate"])
    assert text.encode("utf-8") == b"sunset at the beach \xef\xbf\xbd"
    assert pa.array([text], pa.large_string()).to_pylist() == [text]


def test_surrogate_pair_is_joined_and_existing_fffd_is_not_a_lone_surrogate():
    assert clean_text("\ud83c\udf05 sunset") == ("\U0001F305 sunset", [])
    assert clean_text("x\ufffdy") == ("x\ufffdy", [])
    assert clean_text("x\ufffd\udc80") == ("x\ufffd\ufffd", ["lone_surrogate"])


def test_nul_and_control_characters_are_removed():
    assert clean_text("a\x00b\x01c\x1bd\x7fe\x85f\x9fg\th\ni\rj") == (
        "abcdefg\th\ni\rj", ["control_chars_removed"])
    assert decode_text(b"nul\x00inside") == ("nulinside", ["control_chars_removed"])
    assert clean_text("plain\ttext\n") == ("plain\ttext\n", [])


def test_sniff_encoding_of_stream_heads():
    assert sniff_encoding(codecs.BOM_UTF8 + b"key,path") == ("utf-8-sig", None)
    assert sniff_encoding("key,path".encode("utf-16")) == ("utf-16", "utf16")
    assert sniff_encoding("key,path".encode("utf-32")) == ("utf-32", "utf32")
    head = "key,path,caption\n0,a.png,x".encode("utf-16-be")[:9]  # cut inside a unit
    assert sniff_encoding(head) == ("utf-16-be", "utf16")
    assert sniff_encoding(b"key,path,caption\n") == ("utf-8", None)
    assert sniff_encoding(b"caf\xe9") == ("utf-8", None)


_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)


@settings(max_examples=60, deadline=None)
@given(_TEXT, st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32"]))
def test_unicode_round_trips(text, encoding):
    out, flags = decode_text(text.encode(encoding))
    assert out == text
    assert set(flags) <= {"utf16", "utf32"}


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_give_clean_utf8_text(raw):
    text, flags = decode_text(raw)
    text.encode("utf-8")
    assert clean_text(text) == (text, [])
    assert len(set(flags) & {"encoding_fixed", "invalid_utf8", "utf16", "utf32"}) <= 1


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=40))
def test_any_str_gives_clean_utf8_text(s):
    text, flags = clean_text(s)
    text.encode("utf-8")
    assert "\x00" not in text
    assert clean_text(text) == (text, [])
