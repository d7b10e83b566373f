"""Issue 12 item 1 (and the read-side bounds of item 7), at the datasource level: a job
reads only under its input roots, only regular files, never more than ``max_bytes + 1``
bytes. Each refused row is one error row without bytes; the secret's bytes are nowhere
in what the datasource yields."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pyarrow as pa
import pytest

from pipeline.output import plan as planning
from pipeline.input.confine import InputRoots, read_bounded
from pipeline.input import make_datasource
from pipeline.spec import DecodeSpec, SourceSpec
from tests.conftest import PHOTOS

SECRET = b"AWS_SECRET_ACCESS_KEY=do-not-leak-4f1c9e\nroot:x:0:0:root:/root:/bin/bash\n"
PHOTO = sorted(PHOTOS.glob("*.jpg"))[0]


def read_all(spec: SourceSpec, decode: DecodeSpec | None = None) -> dict[str, list]:
    """Every row the datasource yields, as columns (no Ray)."""
    src = make_datasource(spec, decode or DecodeSpec())
    cols: dict[str, list] = {}
    with ThreadPoolExecutor(2) as pool:
        for part in planning.pack(src.list_inputs(), 100):
            for batch in src.read_partition(part, 100, pool):
                for k, v in batch.items():
                    cols.setdefault(k, []).extend(v)
    return cols


def assert_no_secret(cols: dict[str, list]) -> None:
    for name, values in cols.items():
        for v in values:
            text = v if isinstance(v, (bytes, bytearray)) else str(v).encode()
            assert SECRET[:20] not in text, (name, v)


def reasons(cols) -> list:
    return [None if e is None else e.reason.value for e in cols["_read_error"]]


@pytest.fixture
def layout(tmp_path) -> Path:
    """``tmp/secret.txt`` (outside), ``tmp/in/`` (the input: a photo, links out of it)."""
    (tmp_path / "secret.txt").write_bytes(SECRET)
    (tmp_path / "secret.jpg").write_bytes(SECRET)
    root = tmp_path / "in"
    root.mkdir()
    shutil.copy(PHOTO, root / "good.jpg")
    return root


def test_manifest_rows_outside_the_root_are_refused(layout):
    tmp = layout.parent
    secret = tmp / "secret.txt"
    os.symlink(secret, layout / "link.jpg")
    os.symlink(tmp, layout / "updir")
    rows = [{"path": "good.jpg"}, {"path": str(secret)}, {"path": "../secret.txt"},
            {"path": "file://" + str(secret)}, {"path": "FILE://" + str(secret)},
            {"path": "link.jpg"}, {"path": "updir/secret.txt"},
            {"path": str(layout / "sub" / ".." / ".." / "secret.txt")}]
    pq.write_table(pa.Table.from_pylist(rows), layout / "m.parquet")
    cols = read_all(SourceSpec(kind="manifest", uri=str(layout / "m.parquet")))
    assert reasons(cols) == [None] + ["outside_input_root"] * 7
    assert cols["_source_bytes"][0] == PHOTO.read_bytes()
    assert all(b is None for b in cols["_source_bytes"][1:])
    assert "file:// URIs are not read" in str(cols["_read_error"][3])
    assert "resolves to" in str(cols["_read_error"][5])  # the symlink's target is named
    assert "source.allowed_roots" in str(cols["_read_error"][1])
    assert_no_secret(cols)


def test_allowed_roots_widen_the_input(layout):
    other = layout.parent / "photos"
    other.mkdir()
    shutil.copy(PHOTO, other / "p.jpg")
    rows = [{"path": str(other / "p.jpg")}, {"path": "../photos/p.jpg"},
            {"path": "../secret.txt"}]
    (layout / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = SourceSpec(kind="manifest", uri=str(layout / "m.jsonl"),
                      allowed_roots=(str(other),))
    cols = read_all(spec)
    assert reasons(cols) == [None, None, "outside_input_root"]


def test_manifest_directory_is_a_root_but_not_its_parent(layout):
    (layout / "manifests").mkdir()
    shutil.copy(PHOTO, layout / "manifests" / "near.jpg")
    rows = [{"path": "near.jpg"}, {"path": "../good.jpg"}]
    (layout / "manifests" / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    by_file = read_all(SourceSpec(kind="manifest", uri=str(layout / "manifests" / "m.jsonl")))
    assert reasons(by_file) == [None, "outside_input_root"]
    by_dir = read_all(SourceSpec(kind="manifest", uri=str(layout)))  # the whole input
    assert reasons(by_dir) == [None, None]


def test_fifo_and_devices_are_error_rows_quickly(layout):
    os.mkfifo(layout / "pipe.jpg")  # nobody ever writes: a blocking open would hang
    (layout / "adir.jpg").mkdir()
    rows = [{"path": "pipe.jpg"}, {"path": "adir.jpg"}, {"path": "/dev/zero"},
            {"path": "/dev/null"}, {"path": "good.jpg"}]
    (layout / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result: list = []
    spec = SourceSpec(kind="manifest", uri=str(layout / "m.jsonl"), allowed_roots=("/dev",))
    t = threading.Thread(target=lambda: result.append(read_all(spec)), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "reading a FIFO or /dev/zero blocked"
    cols = result[0]
    assert reasons(cols) == ["not_a_file", "not_a_file", "not_a_file", "not_a_file", None]
    assert "a FIFO; only regular files are read" in str(cols["_read_error"][0])
    assert "a character device" in str(cols["_read_error"][2])
    # without /dev among the roots, /dev/zero is simply outside
    spec = SourceSpec(kind="manifest", uri=str(layout / "m.jsonl"))
    assert reasons(read_all(spec))[2] == "outside_input_root"


def test_files_source_symlinks_out_of_the_input(layout):
    tmp = layout.parent
    os.symlink(tmp / "secret.jpg", layout / "evil.jpg")
    shutil.copy(PHOTO, layout / "cap.jpg")
    os.symlink(tmp / "secret.txt", layout / "cap.txt")   # a caption sidecar leaving the root
    os.symlink(PHOTO, layout / "inside_link.jpg")          # also outside (data/photos)
    cols = read_all(SourceSpec(kind="files", uri=str(layout)))
    by_key = dict(zip(cols["key"], reasons(cols)))
    assert by_key == {"cap": "outside_input_root", "evil": "outside_input_root",
                      "good": None, "inside_link": "outside_input_root"}
    assert_no_secret(cols)
    cols = read_all(SourceSpec(kind="files", uri=str(layout), allowed_roots=(str(PHOTOS),)))
    assert dict(zip(cols["key"], reasons(cols)))["inside_link"] is None


def test_max_bytes_enforced_while_reading(tmp_path):
    big = tmp_path / "big.jpg"
    big.write_bytes(b"\xff" * 5000)
    roots = InputRoots([str(tmp_path)])
    data, err = read_bounded(str(big), 4999, roots)
    assert data is None and str(err) == "too_large: 5000 bytes > max_bytes 4999"
    assert read_bounded(str(big), 5000, roots) == (b"\xff" * 5000, None)
    # A file whose size cannot be known up front (/dev/zero, allowed on purpose) stops at
    # max_bytes + 1 bytes read: the device check refuses it before any read at all.
    data, err = read_bounded("/dev/zero", 10, InputRoots(["/dev"]))
    assert err.reason.value == "not_a_file"


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_webdataset_json_depth_size_and_member_limits(tmp_path):
    photo = PHOTO.read_bytes()
    deep = b"[" * 100_000 + b"]" * 100_000          # RecursionError in json.loads
    _tar(tmp_path / "a.tar", [("s0.jpg", photo), ("s0.json", b'{"caption": "ok"}'),
                              ("s1.jpg", photo), ("s1.json", deep),
                              ("s2.jpg", photo), ("s2.json", b'{"k": "' + b"y" * 2**20 + b'"}'),
                              ("s3.jpg", b"\x00" * (len(photo) + 10)),
                              ("s4.jpg", photo)])
    spec = SourceSpec(kind="webdataset", uri=str(tmp_path))
    cols = read_all(spec, DecodeSpec(max_bytes=len(photo) + 5))
    by_key = dict(zip(cols["key"], cols["_read_error"]))
    assert by_key["s0"] is None and by_key["s4"] is None
    assert str(by_key["s1"]).startswith("bad_sample: key 's1' in shard ")
    assert "nested deeper than 64" in str(by_key["s1"])
    assert str(by_key["s2"]).startswith("too_large: key 's2' in shard ")  # never read
    assert "member 'json' of 1048585 bytes > max_bytes" in str(by_key["s2"])
    assert str(by_key["s3"]).startswith("too_large: key 's3' in shard ")
    assert len(cols["key"]) == 5


def test_webdataset_shard_symlink_out_of_the_input(tmp_path):
    (tmp_path / "in").mkdir()
    _tar(tmp_path / "secret.tar", [("x.jpg", SECRET)])
    _tar(tmp_path / "in" / "a.tar", [("s0.jpg", PHOTO.read_bytes())])
    os.symlink(tmp_path / "secret.tar", tmp_path / "in" / "b.tar")
    cols = read_all(SourceSpec(kind="webdataset", uri=str(tmp_path / "in")))
    assert reasons(cols) == [None, "outside_input_root"]
    assert cols["key"][1] == "b#shard"
    assert_no_secret(cols)


def test_json_sidecar_size_limit_is_one_row_error():
    from pipeline.input.base import MAX_JSON_BYTES, split_json_caption

    with pytest.raises(ValueError, match="JSON limit"):
        split_json_caption(b'{"caption": "' + b"y" * MAX_JSON_BYTES + b'"}', "caption")
    assert split_json_caption(b'{"caption": "c", "d": [[[1]]]}', "caption") == (
        "c", '{"d": [[[1]]]}')


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "utf16-jsonl"])
def test_manifest_line_over_the_limit_is_one_error_row(layout, monkeypatch, fmt):
    """A manifest cell is never read whole past the line limit (a 10 GB line without a
    newline must not fill memory): the line is skipped in pieces, one error row."""
    from pipeline.input import manifest_rows as manifest

    monkeypatch.setattr(manifest, "LINE_LIMIT", 1000)
    huge = "c" * 5000
    if fmt == "csv":
        text = f"path,caption\ngood.jpg,a\ngood.jpg,{huge}\ngood.jpg,b\n"
    else:
        text = "".join(json.dumps(r) + "\n" for r in (
            {"path": "good.jpg"}, {"path": "good.jpg", "caption": huge}, {"path": "good.jpg"}))
    name = "m.csv" if fmt == "csv" else "m.jsonl"
    data = text.encode("utf-16") if fmt.startswith("utf16") else text.encode()
    (layout / name).write_bytes(data)
    cols = read_all(SourceSpec(kind="manifest", uri=str(layout / name)))
    assert reasons(cols) == [None, "read_failed", None]
    assert "longer than 1000 bytes" in str(cols["_read_error"][1])


def test_video_media_staged_in_place_must_be_regular_files(layout):
    """Video is decoded from a local file in place: a FIFO named like a video would block
    FFmpeg, so it is refused before staging."""
    from pipeline.input.fetch import Fetcher
    from pipeline.spec import DownloadSpec

    os.mkfifo(layout / "clip.mp4")
    roots = InputRoots([str(layout)])
    fetcher = Fetcher(2**20, DownloadSpec(), None, True, roots)
    data, err = fetcher.fetch(str(layout / "clip.mp4"), None)
    assert data is None and err.reason.value == "not_a_file"
    data, err = fetcher.fetch(str(layout.parent / "secret.txt"), None)
    assert err.reason.value == "outside_input_root"
    fetcher.close()


def test_parquet_manifest_cells_and_row_groups_are_bounded(layout, monkeypatch):
    """Parquet has no line to skip: a cell over the line limit is one error row, and a row
    group whose read columns exceed ``ROW_GROUP_LIMIT`` (footer metadata) is not read at
    all - its rows are error rows - so one hostile row group cannot fill memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.input import manifest_rows as manifest

    monkeypatch.setattr(manifest, "LINE_LIMIT", 1000)
    monkeypatch.setattr(manifest, "ROW_GROUP_LIMIT", 20_000)
    rows = {"path": ["good.jpg"] * 4, "caption": ["a", "c" * 5000, "b", "d"]}
    pq.write_table(pa.table(rows), layout / "m.parquet", row_group_size=4)
    cols = read_all(SourceSpec(kind="manifest", uri=str(layout / "m.parquet")))
    assert reasons(cols) == [None, "read_failed", None, None]
    assert "a value of 5000 bytes, over 1000" in str(cols["_read_error"][1])
    assert "c" * 1001 not in json.dumps([str(v) for v in cols.get("caption", [])])

    big = {"path": ["good.jpg"] * 4, "caption": ["x" * 900] * 4}
    pq.write_table(pa.table(big), layout / "big.parquet", row_group_size=2)  # 2 x ~1.8 kB
    monkeypatch.setattr(manifest, "ROW_GROUP_LIMIT", 1000)
    cols = read_all(SourceSpec(kind="manifest", uri=str(layout / "big.parquet")))
    assert reasons(cols) == ["read_failed"] * 4
    assert "Parquet row group 0 holds" in str(cols["_read_error"][0])
