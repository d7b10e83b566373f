"""T3-11 and issue 15: WebDataset members that are links, devices or FIFOs; per-shard caps
on members and bytes (plain and gzip shards), and the staging cap for S3 shards."""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile
import time

import pytest

from pipeline.input.shards import ShardCaps, read_shard
from pipeline.records import ErrorReason
from tests.conftest import CASES, PHOTOS, coco_captions
from tests.input.local_job import run_job

T3_11 = CASES / "T3-11_tar_links" / "links" / "shard-000000.tar"


def _photo(i: int) -> bytes:
    return (PHOTOS / coco_captions()[i]["file"]).read_bytes()


def _tar(path, entries, gz: bool = False):
    """Write a tar of ``entries``: ``(name, bytes)`` regular members or ``(name, TarInfo
    kwargs)`` for other kinds."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, what in entries:
            info = tarfile.TarInfo(name)
            if isinstance(what, bytes):
                info.size = len(what)
                tf.addfile(info, io.BytesIO(what))
            else:
                for k, v in what.items():
                    setattr(info, k, v)
                tf.addfile(info)
    data = raw.getvalue()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _rows(path, **kw):
    return [(s.key, sorted(s.members), s.error) for s in read_shard(str(path), **kw)]


def test_t3_11_linked_members_are_read_end_to_end(tmp_path):
    rows, _ = run_job({"kind": "webdataset", "uri": str(T3_11.parent)}, tmp_path / "out")
    # 0002 is a hard link and 0003 a symbolic link to 0001.jpg: the same bytes, so the
    # in-partition dedup rejects them as exact duplicates of 0001 (never "no media member")
    assert [(r["key"], r["status"], r["error"], r["reject_reason"]) for r in rows] == [
        ("0001", "ok", None, None), ("0002", "rejected", None, "duplicate"),
        ("0003", "rejected", None, "duplicate"), ("0004", "ok", None, None)]
    by_key = {r["key"]: r for r in rows}
    assert by_key["0002"]["phash"] == by_key["0003"]["phash"] == by_key["0001"]["phash"]
    assert by_key["0002"]["width"] == by_key["0001"]["width"]
    assert all(r["caption"] for r in rows)


@pytest.mark.parametrize("gz", [False, True])
def test_links_devices_fifos_and_escapes(tmp_path, gz):
    jpg = _photo(0)
    shard = _tar(tmp_path / ("s.tar.gz" if gz else "s.tar"), [
        ("a.jpg", jpg), ("a.txt", b"first"),
        ("b.jpg", {"type": tarfile.SYMTYPE, "linkname": "a.jpg"}), ("b.txt", b"sym"),
        ("sub/c.jpg", {"type": tarfile.SYMTYPE, "linkname": "../a.jpg"}),
        ("d.jpg", {"type": tarfile.LNKTYPE, "linkname": "missing.jpg"}),
        ("e.jpg", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}),
        ("f.jpg", {"type": tarfile.FIFOTYPE}),
        ("g.jpg", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}),
        ("h.jpg", {"type": tarfile.SYMTYPE, "linkname": "../../outside.jpg"}),
        ("i.jpg", {"type": tarfile.SYMTYPE, "linkname": "i.jpg"}),
        ("j.jpg", {"type": tarfile.LNKTYPE, "linkname": "a.jpg"}), ("j.txt", b"hard"),
        ("k.jpg", {"type": tarfile.BLKTYPE}),
    ], gz=gz)
    got = {s.key: s for s in read_shard(str(shard))}
    for key in ("a", "b", "sub/c", "j"):
        assert got[key].error is None and got[key].members["jpg"] == jpg, key
    assert got["b"].members["txt"] == b"sym" and got["j"].members["txt"] == b"hard"
    why = {k: (s.error.reason, s.error.message.split(": ", 1)[1]) for k, s in got.items()
           if s.error is not None}
    nf = ErrorReason.NOT_A_FILE
    assert why == {
        "d": (nf, ("member 'd.jpg' is a hard link to 'missing.jpg', which is not a member "
                   "of the shard (not read)")),
        "e": (nf, "member 'e.jpg' is a character device (not read)"),
        "f": (nf, "member 'f.jpg' is a FIFO (not read)"),
        "g": (nf, ("member 'g.jpg' is a symbolic link to '/etc/passwd', outside the shard "
                   "(not read)")),
        "h": (nf, ("member 'h.jpg' is a symbolic link to '../../outside.jpg', outside the "
                   "shard (not read)")),
        "i": (nf, ("member 'i.jpg' is a symbolic link to 'i.jpg', which is not a member of "
                   "the shard (not read)")),
        "k": (nf, "member 'k.jpg' is a block device (not read)")}


def test_gzip_symlink_to_a_later_member_is_an_error_row_not_a_loss(tmp_path):
    jpg = _photo(1)
    shard = _tar(tmp_path / "s.tgz", [("a.jpg", {"type": tarfile.SYMTYPE,
                                                 "linkname": "b.jpg"}),
                                      ("b.jpg", jpg)], gz=True)
    got = {s.key: s for s in read_shard(str(shard))}
    assert got["b"].members == {"jpg": jpg}
    assert got["a"].error.reason == ErrorReason.NOT_A_FILE
    assert "a later member" in got["a"].error.message
    # the same in a plain tar resolves
    plain = _tar(tmp_path / "s.tar", [("a.jpg", {"type": tarfile.SYMTYPE,
                                                 "linkname": "b.jpg"}), ("b.jpg", jpg)])
    assert {s.key: s.members for s in read_shard(str(plain))}["a"] == {"jpg": jpg}


@pytest.mark.parametrize("gz", [False, True])
def test_member_cap_keeps_samples_before_it_and_reports_the_cap(tmp_path, gz):
    # 30,000 one-byte members: the attack of issue 15, scaled down
    entries = [(f"{i:06d}.bin", b"x") for i in range(30_000)]
    shard = _tar(tmp_path / ("m.tar.gz" if gz else "m.tar"), entries, gz=gz)
    started = time.monotonic()
    rows = list(read_shard(str(shard), caps=ShardCaps(max_members=100)))
    assert time.monotonic() - started < 5
    assert len(rows) == 101
    assert [r.key for r in rows[:100]] == [f"{i:06d}" for i in range(100)]
    last = rows[-1]
    assert last.key == "m#shard" and last.error.reason == ErrorReason.TOO_LARGE
    assert ("more than source.webdataset.max_members=100 members (stopped at member "
            "'000100.bin'") in last.error.message
    assert "100 complete samples kept" in last.error.message


@pytest.mark.parametrize("gz", [False, True])
def test_byte_cap_drops_the_sample_it_cuts(tmp_path, gz):
    entries = []
    for i in range(4):
        entries += [(f"{i}.jpg", _photo(i)), (f"{i}.txt", b"caption")]
    limit = sum(len(d) for _, d in entries[:5]) - 1  # passed at member 2.jpg
    shard = _tar(tmp_path / ("b.tar.gz" if gz else "b.tar"), entries, gz=gz)
    rows = list(read_shard(str(shard), caps=ShardCaps(max_bytes=limit)))
    assert [r.key for r in rows] == ["0", "1", "b#shard"]
    assert rows[-1].error.reason == ErrorReason.TOO_LARGE
    assert f"max_bytes={limit} bytes" in rows[-1].error.message
    assert "(stopped at member '2.jpg'" in rows[-1].error.message
    assert "2 complete samples kept; incomplete sample '2' dropped" in rows[-1].error.message
    assert rows[0].members["jpg"] == _photo(0) and rows[1].members["txt"] == b"caption"


def test_caps_from_the_spec_end_to_end(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(T3_11, src / "shard-000000.tar")
    rows, _ = run_job({"kind": "webdataset", "uri": str(src),
                       "webdataset": {"max_members": 5}}, tmp_path / "out")
    assert [(r["key"], r["status"], r["error_reason"]) for r in rows] == [
        ("0001", "ok", None), ("0002", "rejected", None),  # 0002: a duplicate of 0001
        ("shard-000000#shard", "error", "too_large")]


def test_s3_shard_over_the_cap_is_not_staged(s3_env, s3_server, tmp_path):
    client = s3_server.client()
    client.upload_file(str(T3_11), s3_env, "wds/shard-000000.tar")
    uri = f"s3://{s3_env}/wds/shard-000000.tar"
    staged_dir = tmp_path / "stage"
    staged_dir.mkdir()
    rows = list(read_shard(uri, str(staged_dir), caps=ShardCaps(max_bytes=10_000)))
    assert [(r.key, r.error.reason) for r in rows] == [("shard-000000#shard",
                                                        ErrorReason.TOO_LARGE)]
    assert "20480 bytes > source.webdataset.max_bytes=10000 (not staged)" in \
        rows[0].error.message
    assert list(staged_dir.iterdir()) == []
    ok = list(read_shard(uri, str(staged_dir), caps=ShardCaps()))
    assert [r.key for r in ok] == ["0001", "0002", "0003", "0004"]


@pytest.mark.parametrize("source, message", [
    ({"kind": "webdataset", "webdataset": {"max_members": 0}}, "max_members"),
    ({"kind": "webdataset", "webdataset": {"max_bytes": -1}}, "max_bytes"),
    ({"kind": "files", "webdataset": {"max_members": 5}},
     "does not apply to source.kind 'files'"),
])
def test_bad_caps_fail_the_spec_naming_the_field(source, message):
    from pydantic import ValidationError

    from pipeline.spec import JobSpec

    with pytest.raises(ValidationError) as e:
        JobSpec.model_validate({"source": {"uri": "in", **source}, "sink": {"uri": "out"}})
    assert "webdataset" in str(e.value) and message in str(e.value)
