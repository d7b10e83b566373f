"""Local file names that are not valid UTF-8: listed, read, staged and shown as text."""

from __future__ import annotations

import os

import pytest

from pipeline.storage import fs

# raw name bytes -> content
NAMES = {b"caf\xe9.jpg": b"cp1252 e-acute",          # not UTF-8 (cp1252 0xE9)
         "café.jpg".encode(): b"utf-8 e-acute",
         b"ok.jpg": b"plain ascii"}


def _create(directory: bytes, name: bytes, data: bytes) -> None:
    fd = os.open(os.path.join(directory, name), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.fixture
def odd_dir(tmp_path) -> str:
    root = os.fsencode(str(tmp_path / "in"))
    os.mkdir(root)
    for name, data in NAMES.items():
        _create(root, name, data)
    os.mkdir(os.path.join(root, b"sub\xff"))                      # an undecodable directory
    _create(os.path.join(root, b"sub\xff"), b"x\x80.txt", b"nested")
    return str(tmp_path / "in")


def test_list_files_lists_every_name_sorted(odd_dir):
    entries = list(fs.list_files(odd_dir))
    uris = [e.uri for e in entries]
    assert uris == sorted(uris)                        # str order, checkable with <
    names = [os.path.relpath(fs.uri_to_bytes(u), os.fsencode(odd_dir)) for u in uris]
    assert names == [b"caf\xc3\xa9.jpg", b"caf\xe9.jpg", b"ok.jpg", b"sub\xff/x\x80.txt"]
    assert all(os.path.isabs(u) for u in uris)
    assert [e.size_bytes for e in entries] == [len(NAMES[n]) for n in names[:3]] + [6]
    assert all(e.mtime_s and e.mtime_s > 0 for e in entries)
    # the undecodable byte is a lone surrogate, as os.fsdecode gives
    assert uris[1] == os.fsdecode(os.path.join(os.fsencode(odd_dir), b"caf\xe9.jpg"))
    assert uris[1].endswith("caf\udce9.jpg") and not fs.is_valid_name(uris[1])
    assert fs.is_valid_name(uris[0]) and fs.is_valid_name(uris[2])


def test_list_files_via_file_uri_and_missing_prefix(odd_dir, tmp_path):
    assert [e.uri for e in fs.list_files("file://" + odd_dir)] == \
        [e.uri for e in fs.list_files(odd_dir)]
    assert list(fs.list_files(str(tmp_path / "missing"))) == []


def test_read_stat_and_stage_each_name(odd_dir, tmp_path):
    entries = list(fs.list_files(odd_dir))[:3]
    by_name = {os.path.basename(fs.uri_to_bytes(e.uri)): e.uri for e in entries}
    staging = tmp_path / "staging"
    staging.mkdir()
    for name, data in NAMES.items():
        uri = by_name[name]
        assert fs.read_bytes(uri) == data
        assert fs.read_bytes("file://" + uri) == data
        assert fs.file_size(uri) == len(data)
        assert fs.exists(uri)
        with fs.staged(uri, str(staging)) as local:
            assert fs.is_valid_name(local)             # any library can open it
            assert local.endswith(".jpg")
            with open(local, "rb") as f:
                assert f.read() == data
        assert os.listdir(staging) == []               # the stand-in link is removed
    missing = by_name[b"caf\xe9.jpg"] + ".gone"
    assert fs.file_size(missing) is None and not fs.exists(missing)
    with pytest.raises(FileNotFoundError) as err:
        fs.read_bytes(missing)
    assert "caf\\xe9.jpg.gone" in str(err.value)       # named as valid text
    str(err.value).encode("utf-8")
    with pytest.raises(FileNotFoundError):
        with fs.staged(missing, str(staging)):
            pass
    assert fs.file_size(odd_dir) is None and fs.exists(odd_dir)   # a directory


def test_display_uri_and_byte_round_trip(odd_dir):
    uri = [e.uri for e in fs.list_files(odd_dir)][1]
    shown = fs.display_uri(uri)
    assert shown.endswith("caf\\xe9.jpg")            # four characters \ x e 9
    assert shown.encode("utf-8").decode("utf-8") == shown
    assert fs.display_uri("/d/café.jpg") == "/d/café.jpg"     # valid names unchanged
    assert fs.display_uri("s3://b/k.jpg") == "s3://b/k.jpg"
    assert fs.display_uri("x\ud800") == "x\\ud800"    # a surrogate no name decodes to

    raw = fs.uri_to_bytes(uri)
    assert raw.endswith(b"/caf\xe9.jpg") and fs.uri_from_bytes(raw) == uri
    for b in (b"caf\xe9.jpg", "café.jpg".encode(), b"\xff\xfe/\x80x", bytes(range(1, 256))):
        assert fs.uri_to_bytes(fs.uri_from_bytes(b)) == b
    assert fs.uri_to_bytes("café") == "café".encode()
    with pytest.raises(ValueError):
        fs.uri_to_bytes("x\ud800")
    assert fs.normalize(uri) == uri
