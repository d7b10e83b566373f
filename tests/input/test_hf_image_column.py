"""T3-09: a Hugging Face ``Image()`` column (``struct<bytes, path>``) in a Parquet manifest:
embedded bytes are the media, else the path; every row ok with its caption."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import CASES
from tests.input.local_job import run_job

CASE = CASES / "T3-09_hf_struct_image" / "manifest"
SOURCE = {"kind": "manifest", "path_column": "image", "caption_column": "text"}


def _only(tmp_path, name: str):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(CASE / name, src / name)
    return src


def test_t3_09_embedded_bytes_are_used_without_the_files(tmp_path):
    src = _only(tmp_path, "a_hf_embedded.parquet")  # no PNG beside it: bytes must be used
    rows, _ = run_job({**SOURCE, "uri": str(src)}, tmp_path / "out")
    assert [(r["status"], r["caption"]) for r in rows] == [
        ("ok", "photo 0"), ("ok", "photo 1"), ("ok", "photo 2")]
    assert all(r["width"] > 0 and r["height"] > 0 for r in rows)


def test_t3_09_paths_only_read_the_files(tmp_path):
    rows, _ = run_job({**SOURCE, "uri": str(CASE / "b_hf_paths.parquet")}, tmp_path / "out")
    assert [(r["status"], r["caption"]) for r in rows] == [
        ("ok", "photo 0"), ("ok", "photo 1"), ("ok", "photo 2")]
    assert sorted(r["source_uri"].rsplit("/", 1)[-1] for r in rows) == [
        "img0.png", "img1.png", "img2.png"]


def test_struct_cells_mixed_embedded_path_missing_and_too_large(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(CASE / "img1.png", src / "img1.png")
    png = (CASE / "img0.png").read_bytes()
    image = pa.array([{"bytes": png, "path": None}, {"bytes": None, "path": "img1.png"},
                      {"bytes": None, "path": None}, None,
                      {"bytes": b"\x89PNG" + b"\0" * 5000, "path": "big.png"}],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"image": image, "text": ["a", "b", "c", "d", "e"]}),
                   src / "m.parquet")
    rows, _ = run_job({**SOURCE, "uri": str(src)}, tmp_path / "out",
                      decode={"max_bytes": 4096})
    got = {r["caption"]: (r["status"], r["error_reason"]) for r in rows}
    assert got["a"] == ("ok", None) and got["b"] == ("ok", None)
    assert got["c"][0] == got["d"][0] == "error"
    assert got["e"] == ("error", "too_large")
