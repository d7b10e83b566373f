"""pipeline.input.manifest_rows: profile once, read row ranges; rows out == rows in on real and
generated manifests (N01 quoted newlines, N03 mixed JSONL types, N04 cp1252, encodings)."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import PartitionError, PlanError
from pipeline.input import manifest_rows as manifest, manifest_types
from pipeline.spec import CaptionSpec
from pipeline.steps.caption import normalize_caption
from pipeline.text import clean_text
from tests.conftest import CASES

USED = ("url", "path", "caption", "key")


def case(rel: str) -> Path:
    """A case file under data/cases."""
    return CASES / rel


def read_all(uri, ranges, carried=None, used=USED, batch_size=1000, declared="auto"):
    """Concatenate read_rows over ``ranges``: (values by column, errors, first rows)."""
    values: dict[str, list] = {}
    errors: list = []
    firsts = []
    for start, stop in ranges:
        expect = start
        for b in manifest.read_rows(str(uri), declared, start, stop, used, carried or {},
                                    batch_size):
            assert b.first_row == expect and 0 < b.num_rows <= batch_size
            assert all(len(v) == b.num_rows for v in b.values.values())
            expect += b.num_rows
            firsts.append(b.first_row)
            errors += b.errors
            for k, v in b.values.items():
                values.setdefault(k, []).extend(v)
        assert expect == stop
    return values, errors, firsts


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


# ---------------------------------------------------------------------------------------
# Real case files


def test_n01_quoted_newlines_past_the_first_block_every_row_read():
    path = case("N01_csv_newline_captions/manifest/yfcc_like.csv")
    p = manifest.profile(str(path), "auto", USED)
    assert p.rows == 16264
    assert p.names == ["key", "path", "caption"] and p.columns == {}
    assert manifest.profile(str(path), "auto", ()).rows == 16264
    values, errors, _ = read_all(path, [(0, 5000), (5000, 5001), (5001, 12345),
                                        (12345, 16264)], batch_size=777)
    with open(path, newline="", encoding="utf-8") as f:
        expected = list(csv.DictReader(f))
    assert len(values["caption"]) == len(expected) == 16264
    assert errors == [None] * 16264
    assert values["caption"] == [r["caption"] for r in expected]
    assert values["key"] == [r["key"] for r in expected]  # "000123" kept as text
    assert values["caption"][16263] == "A photo number 16263\nsecond line of caption 16263"
    assert values["url"] == [None] * 16264
    # Read past the end: only the rows the file holds.
    tail = list(manifest.read_rows(str(path), "auto", 16260, 16300, USED, {}))
    assert sum(b.num_rows for b in tail) == 4


def test_n01_profile_is_fast_and_types_every_column_from_all_rows():
    path = case("N01_csv_newline_captions/manifest/yfcc_like.csv")
    p = manifest.profile(str(path), "auto", ("path",))
    assert p.rows == 16264
    assert p.columns == {"key": pa.large_string(), "caption": pa.large_string()}


def test_n03_jsonl_field_changing_type():
    spec = CaptionSpec()
    first = case("N03_jsonl_mixed_types/manifest/caption_number.jsonl")
    second = case("N03_jsonl_mixed_types/manifest2/meta_id.jsonl")
    p1 = manifest.profile(str(first), "auto", USED)
    p2 = manifest.profile(str(second), "auto", USED)
    assert (p1.rows, p1.columns) == (3, {})
    assert (p2.rows, p2.columns) == (3, {"source_id": pa.large_string()})
    carried, warnings = manifest_types.union_columns([p1.columns, p2.columns])
    assert carried == {"source_id": pa.large_string()} and warnings == []
    v1, e1, _ = read_all(first, [(0, 3)], carried)
    assert e1 == [None] * 3
    assert v1["caption"] == ["a red bus on a bridge", 1984, "two dogs in the snow"]
    assert normalize_caption(v1["caption"][1], spec) == ("1984", ["non_string_caption"])
    assert v1["source_id"] == [None] * 3
    v2, e2, _ = read_all(second, [(0, 1), (1, 3)], carried, batch_size=1)
    assert e2 == [None] * 3
    assert v2["source_id"] == ["a-17", "4711", "b-3"]
    assert v2["key"] == ["r0", "r1", "r2"]


def test_n04_cp1252_csv_captions_keep_their_bytes_for_the_caption_step():
    path = case("N04_csv_cp1252/manifest/excel_export.csv")
    p = manifest.profile(str(path), "auto", USED)
    assert p.rows == 3
    values, errors, _ = read_all(path, [(0, 3)])
    assert errors == [None] * 3
    assert values["caption"][1] == "plain ascii caption"
    assert isinstance(values["caption"][0], bytes)
    spec = CaptionSpec()
    assert [normalize_caption(c, spec) for c in values["caption"]] == [
        ("\u201cCaf\u00e9 terrace\u201d at night \u2013 Arles", ["encoding_fixed"]),
        ("plain ascii caption", []),
        ("Stra\u00dfe in M\u00fcnchen\u2019s old town", ["encoding_fixed"])]


def test_cp1252_carried_cells_and_header_are_decoded(tmp_path):
    path = write(tmp_path / "m.csv", "path,caption,L\u00e9gende,n\r\n"
                 "a.png,Caf\u00e9,\u201cquoted\u201d,1\r\nb.png,x,plain,2\r\n", "cp1252")
    p = manifest.profile(str(path), "auto", USED)
    assert p.columns == {"L\u00e9gende": pa.large_string(), "n": pa.int64()}
    values, errors, _ = read_all(path, [(0, 2)], p.columns)
    assert values["L\u00e9gende"] == ["\u201cquoted\u201d", "plain"]
    assert values["n"] == [1, 2]
    assert values["caption"] == [b"Caf\xe9", "x"]


# ---------------------------------------------------------------------------------------
# Encodings and broken rows


ROWS_TEXT = 'path,caption,n\n"a.png","Caf\u00e9 \U0001F305\nline 2",1\nb.png,"q""uote, comma",2\n'


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be",
                                      "utf-32"])
def test_csv_in_unicode_encodings(tmp_path, encoding):
    path = write(tmp_path / "m.csv", ROWS_TEXT, encoding)
    p = manifest.profile(str(path), "auto", USED)
    assert (p.rows, p.names, p.columns) == (2, ["path", "caption", "n"], {"n": pa.int64()})
    values, errors, _ = read_all(path, [(0, 1), (1, 2)], p.columns)
    assert errors == [None, None]
    assert values["path"] == ["a.png", "b.png"]
    assert values["caption"] == ["Caf\u00e9 \U0001F305\nline 2", 'q"uote, comma']
    assert values["n"] == [1, 2]


def test_csv_row_with_wrong_field_count_is_one_error_row(tmp_path):
    path = write(tmp_path / "m.csv", "path,caption,n\na.png,x,1\nb.png,y\n\nc.png,z,3,extra\n"
                 "d.png,w,4\n")
    p = manifest.profile(str(path), "auto", USED)
    assert p.rows == 4 and p.columns == {"n": pa.int64()}  # blank line skipped
    values, errors, _ = read_all(path, [(0, 2), (2, 4)], p.columns)
    assert errors[0] is None and errors[3] is None
    assert errors[1] == "row 1: expected 3 fields (the header's), got 2"
    assert errors[2] == "row 2: expected 3 fields (the header's), got 4"
    assert values["path"] == ["a.png", None, None, "d.png"]
    assert values["n"] == [1, None, None, 4]


def test_invalid_jsonl_lines_are_one_error_row_each(tmp_path):
    path = write(tmp_path / "m.jsonl", '{"path": "a.png", "caption": "x", "n": 1}\n'
                 '{"path": "b.png", "caption": \n'
                 '\n'
                 '[1, 2]\n'
                 '{"path": "c.png", "caption": "z\\u0000", "n": 2.5, "o": {"k": [1]}}\r\n')
    p = manifest.profile(str(path), "auto", USED)
    assert p.rows == 4
    assert p.columns == {"n": pa.float64(), "o": pa.large_string()}
    values, errors, _ = read_all(path, [(0, 4)], p.columns)
    assert errors[0] is None and errors[3] is None
    assert errors[1].startswith("row 1 (line 2): invalid JSON")
    assert errors[2] == "row 2 (line 4): not a JSON object but list"
    assert values["path"] == ["a.png", None, None, "c.png"]
    assert values["caption"][3] == "z\x00"  # used columns are raw
    assert values["n"] == [1.0, None, None, 2.5]
    assert values["o"] == [None, None, None, '{"k": [1]}']


def test_carried_types_from_all_rows_csv(tmp_path):
    lines = ["path,i,f,b,t,zeros,empty,late"]
    lines += [f"p{j}.png,{j},{j}.5,{'true' if j % 2 else 'False'},t{j},{j:04d},,"
              f"{'x' if j == 4999 else j}" for j in range(5000)]
    path = write(tmp_path / "m.csv", "\n".join(lines) + "\n")
    p = manifest.profile(str(path), "auto", ["path"])
    assert p.rows == 5000
    assert p.columns == {"i": pa.int64(), "f": pa.float64(), "b": pa.bool_(),
                         "t": pa.large_string(), "zeros": pa.large_string(),
                         "empty": pa.null(), "late": pa.large_string()}
    values, errors, _ = read_all(path, [(4998, 5000)], p.columns, used=["path"])
    assert errors == [None, None]
    assert values["i"] == [4998, 4999] and values["f"] == [4998.5, 4999.5]
    assert values["b"] == [False, True] and values["zeros"] == ["4998", "4999"]
    assert values["empty"] == [None, None] and values["late"] == ["4998", "x"]


def test_carried_json_text_is_cleaned_and_lone_surrogates_replaced(tmp_path):
    path = write(tmp_path / "m.jsonl", '{"path": "a", "caption": "sun \\ud83c", '
                 '"s": "cut \\ud83c", "big": 123456789012345678901234}\n')
    p = manifest.profile(str(path), "auto", USED)
    assert p.columns == {"s": pa.large_string(), "big": pa.large_string()}
    values, errors, _ = read_all(path, [(0, 1)], p.columns)
    assert values["s"] == ["cut \ufffd"] and values["big"] == ["123456789012345678901234"]
    assert values["caption"] == ["sun \ud83c"]  # raw; the caption step flags it
    assert normalize_caption(values["caption"][0], CaptionSpec()) == (
        "sun \ufffd", ["lone_surrogate"])


def test_jsonl_line_that_is_not_utf8_keeps_the_bytes_of_its_strings(tmp_path):
    (tmp_path / "m.jsonl").write_bytes(
        b'{"path": "a.png", "caption": "Caf\xe9", "t": "\x93q\x94", "L\xe9": 1}\n')
    p = manifest.profile(str(tmp_path / "m.jsonl"), "auto", USED)
    values, errors, _ = read_all(tmp_path / "m.jsonl", [(0, 1)], p.columns)
    assert errors == [None]
    assert values["caption"] == [b"Caf\xe9"]
    assert values["t"] == ["\u201cq\u201d"]
    assert p.columns == {"t": pa.large_string(), "L\u00e9": pa.int64()}


# ---------------------------------------------------------------------------------------
# Parquet


@pytest.mark.parametrize("kind", ["string", "large_string", "binary", "large_binary",
                                  "dictionary"])
def test_parquet_used_columns_of_every_string_kind(tmp_path, kind):
    captions = ["a red bus", None, "Caf\u00e9 \U0001F305", "a red bus"] * 5
    if kind == "dictionary":
        arr = pa.array(captions).dictionary_encode()
    elif kind.endswith("binary"):
        arr = pa.array([c and c.encode() for c in captions], getattr(pa, kind)())
    else:
        arr = pa.array(captions, getattr(pa, kind)())
    table = pa.table({"path": pa.array([f"{i}.png" for i in range(20)]).dictionary_encode(),
                      "caption": arr, "n": pa.array(range(20), pa.int32()),
                      "tag": pa.array(["x", "y"] * 10).dictionary_encode()})
    pq.write_table(table, tmp_path / "m.parquet", row_group_size=6)
    p = manifest.profile(str(tmp_path / "m.parquet"), "auto", USED)
    assert p.rows == 20 and p.columns == {"n": pa.int32(), "tag": pa.string()}
    values, errors, firsts = read_all(tmp_path / "m.parquet", [(0, 5), (5, 13), (13, 20)],
                                      p.columns, batch_size=4)
    assert errors == [None] * 20
    assert values["path"] == [f"{i}.png" for i in range(20)]
    expect = [c.encode() if c and kind.endswith("binary") else c for c in captions]
    assert values["caption"] == expect
    assert values["n"] == list(range(20)) and values["tag"] == ["x", "y"] * 10
    assert [normalize_caption(c, CaptionSpec())[0] for c in values["caption"]] == captions


def test_parquet_invalid_utf8_in_string_column_comes_out_as_bytes(tmp_path):
    arr = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(
        pa.array([0, 2, 6], pa.int32()).buffers()[1]), pa.py_buffer(b"okcaf\xe9")])
    pq.write_table(pa.table({"path": ["a", "b"], "caption": arr, "note": arr}),
                   tmp_path / "m.parquet")
    p = manifest.profile(str(tmp_path / "m.parquet"), "auto", USED)
    values, errors, _ = read_all(tmp_path / "m.parquet", [(0, 2)], p.columns)
    assert values["caption"] == ["ok", b"caf\xe9"]
    assert values["note"] == ["ok", "caf\u00e9"]


# ---------------------------------------------------------------------------------------
# Union across files, errors, helpers


def test_union_of_conflicting_types_becomes_text_with_a_warning(tmp_path):
    write(tmp_path / "a.jsonl", '{"path": "a", "id": 4711, "score": 1, "x": null}\n')
    write(tmp_path / "b.csv", "path,id,score,x\nb,a-17,0.5,\n")
    pq.write_table(pa.table({"path": ["c"], "id": pa.array([True]),
                             "score": pa.array([2], pa.int16())}), tmp_path / "c.parquet")
    profiles = [manifest.profile(str(tmp_path / f), "auto", USED)
                for f in ("a.jsonl", "b.csv", "c.parquet")]
    assert profiles[0].columns == {"id": pa.int64(), "score": pa.int64(), "x": pa.null()}
    carried, warnings = manifest_types.union_columns(p.columns for p in profiles)
    assert carried == {"id": pa.large_string(), "score": pa.float64(), "x": pa.large_string()}
    assert warnings == ["manifest column 'id' has conflicting types across files "
                        "(int64, large_string, bool); converted to text (large_string)"]
    got = [read_all(tmp_path / f, [(0, 1)], carried)[0]
           for f in ("a.jsonl", "b.csv", "c.parquet")]
    assert [g["id"] for g in got] == [["4711"], ["a-17"], ["true"]]
    assert [g["score"] for g in got] == [[1.0], [0.5], [2.0]]
    assert [g["x"] for g in got] == [[None], [None], [None]]
    assert manifest_types.columns_from_text(manifest_types.columns_to_text(carried)) == carried


def test_unreadable_files_raise_errors_naming_them(tmp_path):
    missing = str(tmp_path / "missing.csv")
    with pytest.raises(PlanError, match="missing.csv"):
        manifest.profile(missing, "auto", USED)
    with pytest.raises(PartitionError, match="missing.csv"):
        list(manifest.read_rows(missing, "auto", 0, 5, USED, {}))
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(PlanError, match="bad.parquet"):
        manifest.profile(str(tmp_path / "bad.parquet"), "auto", USED)
    with pytest.raises(PlanError, match="format"):
        manifest.profile(str(tmp_path / "m.txt"), "auto", USED)


def test_empty_and_header_only_files(tmp_path):
    write(tmp_path / "empty.csv", "")
    write(tmp_path / "header.csv", "path,caption\n")
    write(tmp_path / "blank.jsonl", "\n\n")
    for name in ("empty.csv", "header.csv", "blank.jsonl"):
        assert manifest.profile(str(tmp_path / name), "auto", USED).rows == 0
        assert list(manifest.read_rows(str(tmp_path / name), "auto", 0, 10, USED, {})) == []


# ---------------------------------------------------------------------------------------
# Property: rows out == rows in, captions recoverable, whatever the file holds

_SPECIAL = ["", "a,b", 'q"uote', "line1\nline2", "cr\r\nlf", "nul\x00x", "emoji \U0001F305",
            "Caf\u00e9 \u2013 \u201cquoted\u201d", " spaced ", "\u00fc"]
_CAPTION_TEXT = st.one_of(st.sampled_from(_SPECIAL),
                          st.text(st.characters(blacklist_categories=("Cs",)), max_size=20))
_CAPTION = st.one_of(st.none(), _CAPTION_TEXT, st.integers(-10**6, 10**6),
                     st.floats(allow_nan=False, allow_infinity=False))
_EXTRA_NAMES = ["n", "score", "flag", "tag", "L\u00e9gende", "mixed"]


@st.composite
def _manifests(draw, fmt):
    n = draw(st.integers(0, 30))
    extra = draw(st.lists(st.sampled_from(_EXTRA_NAMES), unique=True, max_size=4))
    kinds = {name: draw(st.sampled_from(["int", "float", "bool", "text", "mixed"]))
             for name in extra}
    values = {"int": st.integers(-2**63, 2**63 - 1),
              "float": st.floats(allow_nan=False, allow_infinity=False),
              "bool": st.booleans(),
              "text": st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
              .map(lambda s: "t" + s),
              "mixed": st.one_of(st.integers(), st.text(max_size=4).map(lambda s: "m" + s))}
    rows = []
    for i in range(n):
        row = {"path": f"img{i}.png",
               "caption": draw(_CAPTION_TEXT if fmt == "parquet" else _CAPTION)}
        if fmt == "parquet" and row["caption"] is not None and draw(st.booleans()):
            row["caption"] = None
        for name, kind in kinds.items():
            row[name] = draw(st.none() | values[kind])
        rows.append(row)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    bounds = [0, *cuts, n]
    return rows, kinds, list(zip(bounds, bounds[1:])), draw(st.integers(1, 7))


def _csv_cell(v) -> str:
    if v is None:
        return ""
    return str(v) if not isinstance(v, bool) else ("true" if v else "false")


def _same(got, want, encoding: str) -> bool:
    """``got`` is ``want`` as written; in a cp1252 file, bytes that also happen to be valid
    UTF-8 are read as UTF-8 (the usual mojibake ambiguity; decode_text prefers UTF-8)."""
    if isinstance(got, bytes):
        got = got.decode(encoding)
    if got == want:
        return True
    return (encoding == "cp1252" and isinstance(want, str) and isinstance(got, str)
            and want.encode("cp1252").decode("utf-8", "replace") == got)


def _check(path: Path, rows, kinds, ranges, batch_size, exact_text: bool, encoding: str):
    p = manifest.profile(str(path), "auto", USED)
    assert p.rows == len(rows)
    values, errors, _ = read_all(path, ranges, p.columns, batch_size=batch_size)
    assert len(errors) == len(rows) and errors == [None] * len(rows)
    assert values.get("path", []) == [r["path"] for r in rows]
    for got, row in zip(values.get("caption", []), rows):
        want = row["caption"]
        if path.suffix == ".csv":
            want = _csv_cell(want)
        assert _same(got, want, encoding)
        text, _ = normalize_caption(got, CaptionSpec())
        assert text is None or ("\x00" not in text and text.encode("utf-8"))
    for name, kind in kinds.items():
        col = values.get(name, [])
        want = [r[name] for r in rows]
        if kind == "mixed" or (kind == "text" and not exact_text):
            assert all(v is None or isinstance(v, (str, int, float, bool)) for v in col)
        elif kind == "text":
            assert col == [None if w is None else clean_text(w)[0] for w in want]
        elif kind == "float" and p.columns.get(name) == pa.float64():
            assert col == [None if w is None else float(w) for w in want]
        else:
            assert col == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["csv", "jsonl"]), st.data())
def test_property_csv_jsonl_rows_out_equal_rows_in(fmt, data):
    rows, kinds, ranges, batch_size = data.draw(_manifests(fmt))
    encoding = data.draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "cp1252"]))
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["path", "caption", *kinds])
        for r in rows:
            writer.writerow([_csv_cell(r[k]) for k in ("path", "caption", *kinds)])
        text = out.getvalue()
    else:
        ascii_only = data.draw(st.booleans())
        text = "".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in rows)
    try:
        raw = text.encode(encoding)
    except UnicodeEncodeError:
        encoding, raw = "utf-8", text.encode("utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"m.{fmt}"
        path.write_bytes(raw)
        _check(path, rows, kinds, ranges, batch_size, exact_text=encoding != "cp1252",
               encoding=encoding)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_property_parquet_rows_out_equal_rows_in(data):
    rows, kinds, ranges, batch_size = data.draw(_manifests("parquet"))
    mixed = [k for k, v in kinds.items() if v == "mixed"]  # Parquet columns have one type
    kinds = {k: v for k, v in kinds.items() if v != "mixed"}
    for r in rows:
        for k in mixed:
            del r[k]
    caption_type = data.draw(st.sampled_from(["string", "large_string", "large_binary",
                                              "dictionary"]))
    caps = [r["caption"] for r in rows]
    if caption_type == "dictionary":
        cap_arr = pa.array(caps, pa.string()).dictionary_encode()
    elif caption_type == "large_binary":
        cap_arr = pa.array([c and c.encode() for c in caps], pa.large_binary())
    else:
        cap_arr = pa.array(caps, getattr(pa, caption_type)())
    types = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
             "text": pa.string()}
    columns = {"path": pa.array([r["path"] for r in rows], pa.string()), "caption": cap_arr}
    for name, kind in kinds.items():
        columns[name] = pa.array([r[name] for r in rows], types[kind])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.parquet"
        pq.write_table(pa.table(columns), path,
                       row_group_size=data.draw(st.integers(1, 10)))
        _check(path, rows, kinds, ranges, batch_size, exact_text=True, encoding="utf-8")


def test_a_storage_error_mid_stream_resumes_at_the_same_row(tmp_path, monkeypatch):
    """A transient error while streaming reopens the file at the byte after the last row
    taken: no row lost or repeated."""
    lines = ["path,caption"] + [f'p{i}.png,"cap {i}\nline 2 of {i}"' for i in range(3000)]
    path = write(tmp_path / "m.csv", "\n".join(lines) + "\n")
    real, opened = manifest._utf8_lines, []

    def flaky_lines(buf, at):
        opened.append(at.byte)
        for k, line in enumerate(real(buf, at)):
            if len(opened) == 2 and k == 4000:  # the first data stream (1: the header's)
                raise ConnectionError("Connection was closed")
            yield line

    monkeypatch.setattr(manifest, "_utf8_lines", flaky_lines)
    values, errors, _ = read_all(path, [(1000, 3000)], batch_size=100)
    assert len(opened) == 3 and opened[2] > opened[1] > 0   # reopened further on, no header
    assert errors == [None] * 2000
    assert values["caption"] == [f"cap {i}\nline 2 of {i}" for i in range(1000, 3000)]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_profile_offsets_let_a_range_seek_instead_of_streaming_from_the_start(tmp_path, fmt,
                                                                              monkeypatch):
    """profile(every=n) records where rows n, 2n, ... start (byte and line); read_rows from
    such an offset gives exactly the rows of a read from the start, reading only from there."""
    rows = [{"path": f"p{i}.png", "caption": f"caf\u00e9 {i}\nline 2", "n": i}
            for i in range(1000)]
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out).writerows([["path", "caption", "n"]] +
                                  [[r["path"], r["caption"], r["n"]] for r in rows])
        text = out.getvalue()
    else:
        text = "".join(json.dumps(r) + "\n\n" for r in rows)  # blank lines between rows
    path = write(tmp_path / f"m.{fmt}", text, "utf-8-sig")
    p = manifest.profile(str(path), "auto", USED, every=300)
    assert p.rows == 1000 and [o.row for o in p.offsets] == [300, 600, 900]
    raw = path.read_bytes()
    for o in p.offsets:
        assert raw[o.byte:].lstrip(b"\n").startswith(  # (blank lines may precede a row)
            b'p%d.png' % o.row if fmt == "csv" else b'{"path": "p%d.png"' % o.row)
    starts = []
    real = manifest._utf8_lines

    def spy(buf, at):
        starts.append(at.byte)
        return real(buf, at)

    monkeypatch.setattr(manifest, "_utf8_lines", spy)
    for o in p.offsets:
        got = list(manifest.read_rows(str(path), "auto", o.row, o.row + 50, USED, p.columns,
                                      seek=o))
        assert [c for b in got for c in b.values["caption"]] == [
            r["caption"] for r in rows[o.row:o.row + 50]]
        assert got[0].first_row == o.row and starts[-1] == o.byte
    bad = list(manifest.read_rows(str(path), "auto", 950, 960, USED, p.columns,
                                  seek=p.offsets[-1]))
    assert [b.values["n"] for b in bad] == [list(range(950, 960))]


def test_a_json_sidecar_beside_its_media_is_not_a_manifest(tmp_path):
    """``x.jpg`` + ``x.json`` is a sample with its sidecar; ``rows.json`` alone is a manifest."""
    for name in ("x.jpg", "x.json", "clip.MP4", "clip.json", "rows.json", "more.csv"):
        (tmp_path / name).write_bytes(b"{}\n")
    found = [Path(u).name for u, _ in manifest.list_manifests(str(tmp_path), "auto")]
    assert found == ["more.csv", "rows.json"]
    assert [Path(u).name for u, _ in manifest.list_manifests("data/photos", "auto")] == [
        "captions.jsonl"]
