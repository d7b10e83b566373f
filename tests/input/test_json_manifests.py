"""T3-08: ``.json`` manifests as tools write them (a JSON array, pretty or on one line,
concatenated objects) and JSON Lines with blank lines: one row per record, end to end."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.input import manifest_rows
from tests.conftest import CASES
from tests.input.local_job import run_job

CASE = CASES / "T3-08_json_array_manifests"


@pytest.mark.parametrize("folder", ["manifest", "manifest_b", "manifest_c", "manifest_d"])
def test_t3_08_each_manifest_gives_its_three_records_ok(tmp_path, folder):
    rows, plan = run_job({"kind": "manifest", "uri": str(CASE / folder),
                          "key_column": "key"}, tmp_path / "out")
    assert plan.rows_total == 3
    assert [(r["key"], r["status"], r["caption"]) for r in rows] == [
        ("r0", "ok", "photo 0"), ("r1", "ok", "photo 1"), ("r2", "ok", "photo 2")]
    assert [r["width"] > 0 for r in rows] == [True] * 3


def _rows(path, used=("path", "caption")):
    found = manifest_rows.profile(str(path), "auto", used)
    batches = list(manifest_rows.read_rows(str(path), "auto", 0, found.rows, used,
                                           found.columns))
    return found, [(v, e) for b in batches
                   for v, e in zip(zip(*(b.values[c] for c in used)), b.errors)]


def test_empty_array_is_one_error_row_saying_so(tmp_path):
    (tmp_path / "m.json").write_text("[\n]\n")
    found, rows = _rows(tmp_path / "m.json")
    assert found.rows == 1
    assert rows == [((None, None),
                     "row 0 (line 1): an empty JSON array: the file holds no records")]


def test_array_of_non_objects_gives_an_error_row_per_element_naming_it(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps([1, "x.png", None, [1], {"path": "a.png"}]))
    _, rows = _rows(tmp_path / "m.json")
    assert [e for _, e in rows] == [
        "row 0 (line 1): element 0 of the JSON array: not a JSON object but a number",
        "row 1 (line 1): element 1 of the JSON array: not a JSON object but a string",
        "row 2 (line 1): element 2 of the JSON array: not a JSON object but a null",
        "row 3 (line 1): element 3 of the JSON array: not a JSON object but an array",
        None]
    assert rows[4][0] == ("a.png", None)


def test_json_lines_in_a_json_file_loses_only_the_bad_line(tmp_path):
    (tmp_path / "m.json").write_text('{"path": "a.png"}\n{"path": bad\n\n{"path": "b.png",\n'
                                     ' "caption": "two\\nlines"}\n')
    found, rows = _rows(tmp_path / "m.json")
    assert found.rows == 3
    assert [v for v, _ in rows] == [("a.png", None), (None, None), ("b.png", "two\nlines")]
    assert rows[1][1].startswith("row 1 (line 2): invalid JSON")


def test_partitions_of_a_json_array_read_each_record_once(tmp_path):
    src = tmp_path / "in"
    shutil.copytree(CASE / "manifest_b", src)
    records = [{"key": f"k{i}", "path": f"img{i % 3}.png", "caption": f"c{i}"}
               for i in range(7)]
    (src / "b_array_pretty.json").write_text(json.dumps(records, indent=2))
    rows, plan = run_job({"kind": "manifest", "uri": str(src), "key_column": "key",
                          "partition_size": 2}, tmp_path / "out")
    assert len(plan.partition_ids) == 4
    assert [(r["key"], r["caption"], r["status"]) for r in rows] == [
        (f"k{i}", f"c{i}", "ok") for i in range(7)]


def test_a_json_array_over_the_document_limit_is_one_error_row(tmp_path, monkeypatch):
    monkeypatch.setattr(manifest_rows, "DOCUMENT_LIMIT", 64)
    (tmp_path / "m.json").write_text(json.dumps([{"path": f"{i}.png"} for i in range(10)]))
    found, rows = _rows(tmp_path / "m.json")
    assert found.rows == 1 and rows[0][1].startswith("row 0 (line 1): a JSON array of more "
                                                     "than 64 bytes (not read)")
    # JSON Lines that large still stream, one row per line
    (tmp_path / "m.json").write_text("".join(json.dumps({"path": f"{i}.png"}) + "\n"
                                             for i in range(10)))
    found, rows = _rows(tmp_path / "m.json")
    assert found.rows == 10 and all(e is None for _, e in rows)
