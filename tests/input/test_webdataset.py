"""WebDataset shards: robust reading (real case tars, truncations, non-tars) and writing
(read back by both ``read_shard`` and the real ``webdataset`` library), local and S3."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import zlib
from pathlib import Path

import pytest

from pipeline.storage import fs
from pipeline.records import ErrorReason, RowError
from pipeline.input.shards import (ShardSample, is_shard_name, read_shard, shard_error_key, split_member_name)
from pipeline.output.sinks.webdataset import WebDatasetWriter
from pipeline.spec import WebDatasetSinkSpec
from tests.conftest import CASES, PHOTOS, coco_captions

T07 = CASES / "T07_dupkey" / "wds_noncontiguous_keys.tar"
T09 = CASES / "T09_shard" / "wds_bad_members.tar"


def _photo_rows(n: int) -> list[dict]:
    return coco_captions()[:n]


def _make_tar(path, samples: list[tuple[str, dict[str, bytes]]]) -> list[tarfile.TarInfo]:
    """Write a plain tar with tarfile; return the member infos (with their offsets)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tf:
        return tf.getmembers()


def _three_photo_samples() -> list[tuple[str, dict[str, bytes]]]:
    return [(row["key"], {"jpg": (PHOTOS / row["file"]).read_bytes(),
                          "txt": row["captions"][0].encode()})
            for row in _photo_rows(3)]


def _text(error) -> str | None:
    """A ``RowError`` as the ``error`` column's text (None stays None)."""
    return None if error is None else str(error)


def test_split_member_name_follows_webdataset():
    assert split_member_name("a/b/x.seg.PNG") == ("a/b/x", "seg.png")
    assert split_member_name("000001.jpg") == ("000001", "jpg")
    assert split_member_name("README") is None
    assert split_member_name("dir/.hidden.jpg") is None


def test_t07_noncontiguous_keys_are_two_bad_sample_rows():
    rows = list(read_shard(str(T07)))
    assert [r.key for r in rows] == ["000000062554", "000000099053"]
    assert [_text(r.error) for r in rows] == [
        f"bad_sample: key '000000062554' in shard {T07}: members not contiguous (positions 0, 2)",
        f"bad_sample: key '000000099053' in shard {T07}: members not contiguous (positions 1, 3)",
    ]
    assert all(r.members == {} and r.shard_uri == str(T07) for r in rows)


def test_t09_bad_members_are_normal_members():
    rows = list(read_shard(str(T09)))
    assert [r.key for r in rows] == ["000000062554", "000000099053", "000000126107",
                                     "000000160012"]
    assert all(r.error is None for r in rows)
    assert [sorted(r.members) for r in rows] == [["jpg", "txt"]] * 4
    assert [len(r.members["jpg"]) for r in rows] == [140456, 6698, 0, 157339]
    assert rows[0].members["jpg"] == (PHOTOS / "000000062554.jpg").read_bytes()
    with tarfile.open(T09) as tf:               # captions as the tar holds them
        expected = {m.name[:-4]: tf.extractfile(m).read().decode()
                    for m in tf.getmembers() if m.name.endswith(".txt")}
    captions = [r.members["txt"].decode() for r in rows]
    assert captions == [expected[r.key] for r in rows]
    assert all(len(c) > 20 for c in captions)


def test_truncated_inside_third_image_keeps_two_samples(tmp_path):
    samples = _three_photo_samples()
    full = tmp_path / "full.tar"
    infos = _make_tar(full, samples)
    third_jpg = next(i for i in infos if i.name == f"{samples[2][0]}.jpg")
    cut = third_jpg.offset_data + third_jpg.size // 2
    shard = tmp_path / "cut-000003.tar"
    shard.write_bytes(full.read_bytes()[:cut])

    rows = list(read_shard(str(shard)))
    assert [r.key for r in rows] == [samples[0][0], samples[1][0], "cut-000003#shard"]
    for row, (key, members) in zip(rows[:2], samples[:2]):
        assert row.error is None and row.members == members
    assert rows[2].members == {}
    assert str(rows[2].error) == (
        f"truncated_shard: {shard}: tar ends at byte {cut} inside member "
        f"'{samples[2][0]}.jpg'; 2 complete samples kept; incomplete sample "
        f"'{samples[2][0]}' dropped")


def test_truncated_inside_header_block(tmp_path):
    samples = _three_photo_samples()
    full = tmp_path / "full.tar"
    infos = _make_tar(full, samples)
    data = full.read_bytes()
    # (a) cut 300 bytes into the header of the 3rd sample's first member (name readable)
    third_jpg = next(i for i in infos if i.name == f"{samples[2][0]}.jpg")
    shard = tmp_path / "hdr.tar"
    shard.write_bytes(data[:third_jpg.offset + 300])
    rows = list(read_shard(str(shard)))
    assert [r.error is None for r in rows] == [True, True, False]
    assert [r.members for r in rows[:2]] == [samples[0][1], samples[1][1]]
    assert rows[2].key == "hdr#shard"
    assert str(rows[2].error) == (
        f"truncated_shard: {shard}: tar ends at byte {third_jpg.offset + 300} inside the "
        f"header of member '{samples[2][0]}.jpg' after member '{samples[1][0]}.txt'; "
        f"2 complete samples kept; incomplete sample '{samples[2][0]}' dropped")
    # (b) cut 10 bytes into the header of the 2nd sample's .txt: name unreadable, so the
    # last key seen (maybe missing members) is dropped - never a half-sample
    second_txt = next(i for i in infos if i.name == f"{samples[1][0]}.txt")
    shard.write_bytes(data[:second_txt.offset + 10])
    rows = list(read_shard(str(shard)))
    assert [r.key for r in rows] == [samples[0][0], "hdr#shard"]
    assert rows[0].members == samples[0][1]
    assert str(rows[1].error).startswith(f"truncated_shard: {shard}: tar ends at byte "
                                    f"{second_txt.offset + 10} inside a member header")
    assert str(rows[1].error).endswith(
        f"1 complete samples kept; incomplete sample '{samples[1][0]}' dropped")
    # (c) cut exactly at a member boundary (no end-of-archive marker): last key dropped
    shard.write_bytes(data[:second_txt.offset])
    rows = list(read_shard(str(shard)))
    assert [r.key for r in rows] == [samples[0][0], "hdr#shard"]
    assert "without the end-of-archive marker" in str(rows[1].error)
    assert str(rows[1].error).endswith(f"incomplete sample '{samples[1][0]}' dropped")


def test_not_a_tar_and_missing_shard_are_read_failed_rows(tmp_path):
    shard = tmp_path / "url_list_named.tar"
    shutil.copy(CASES / "T12_shard" / "url_list_named.parquet", shard)
    rows = list(read_shard(str(shard)))
    assert len(rows) == 1
    assert rows[0].key == "url_list_named#shard" and rows[0].members == {}
    assert str(rows[0].error).startswith(f"read_failed: {shard}: not a readable uncompressed tar")
    missing = tmp_path / "nope.tar"
    assert list(read_shard(str(missing))) == [ShardSample(
        "nope#shard", str(missing), {}, RowError(ErrorReason.INPUT_MISSING,
                                                 f"{missing}: shard not found (planned, no longer there)"))]


def test_duplicate_member_is_one_bad_sample_row(tmp_path):
    jpg = (PHOTOS / "000000062554.jpg").read_bytes()
    shard = tmp_path / "dup.tar"
    _make_tar(shard, [("a", {"jpg": jpg}), ("b", {"jpg": jpg, "txt": b"first"})])
    with tarfile.open(shard, "a") as tf:          # append b.txt again, right after b's
        info = tarfile.TarInfo("b.txt")
        info.size = 6
        tf.addfile(info, io.BytesIO(b"second"))
    rows = list(read_shard(str(shard)))
    assert [(r.key, r.error is None) for r in rows] == [("a", True), ("b", False)]
    assert rows[0].members == {"jpg": jpg}
    assert str(rows[1].error) == f"bad_sample: key 'b' in shard {shard}: duplicate extension 'txt'"
    assert rows[1].members == {}


def test_samples_without_media_and_directories(tmp_path):
    shard = tmp_path / "misc.tar"
    with tarfile.open(shard, "w") as tf:
        d = tarfile.TarInfo("sub")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        for name, data in [("sub/x.TXT", b"only text"), ("sub/x.Seg.PNG", b"png"),
                           ("NOEXT", b"skipped")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    rows = list(read_shard(str(shard)))
    assert rows == [ShardSample("sub/x", str(shard), {"txt": b"only text", "seg.png": b"png"},
                                None)]


def _photo_samples(n: int) -> list[tuple[str, dict[str, bytes]]]:
    out = []
    for row in _photo_rows(n):
        out.append((row["key"] + ".v1", {   # a "." in the key: written as "_"
            "jpg": (PHOTOS / row["file"]).read_bytes(),
            "json": json.dumps({"key": row["key"] + ".v1"}).encode(),
            "txt": row["captions"][0].encode()}))
    return out


def test_writer_rolls_shards_and_real_webdataset_reads_them(tmp_path):
    import webdataset as wds

    samples = _photo_samples(10)
    spec = WebDatasetSinkSpec(enabled=True, shard_max_bytes=450_000, shard_max_samples=3)
    out = tmp_path / "out"
    writer = WebDatasetWriter(str(out), "p-000004", "att1", spec)
    for key, members in samples:
        writer.write(key, members)
    files, shas, total = writer.close()

    assert len(files) >= 4                      # at most 3 per shard: 10 samples
    assert files == [f"wds/p-000004/a-att1/p-000004-{n:06d}.tar" for n in range(len(files))]
    paths = [out / f for f in files]
    sizes = [p.stat().st_size for p in paths]
    assert total == sum(sizes) and all(s % tarfile.RECORDSIZE == 0 for s in sizes)
    assert shas == {f: hashlib.sha256(p.read_bytes()).hexdigest() for f, p in zip(files, paths)}

    ours = [r for p in paths for r in read_shard(str(p))]
    assert [r.error for r in ours] == [None] * 10
    assert [r.key for r in ours] == [k.replace(".", "_") for k, _ in samples]
    assert [r.members for r in ours] == [m for _, m in samples]
    assert [list(r.members) for r in ours] == [["jpg", "json", "txt"]] * 10  # order kept
    per_shard = [len(list(read_shard(str(p)))) for p in paths]
    assert sum(per_shard) == 10 and max(per_shard) <= 3
    # the byte limit bites (or the shard holds one sample only)
    for p, n in zip(paths, per_shard):
        assert p.stat().st_size <= spec.shard_max_bytes or n == 1
    with tarfile.open(paths[0]) as tf:          # deterministic headers
        assert {(m.mtime, m.mode, m.uid, m.gid, m.uname, m.gname) for m in tf} == \
            {(0, 0o444, 0, 0, "", "")}

    theirs = list(wds.WebDataset([str(p) for p in paths], shardshuffle=False,
                                 empty_check=False))
    assert [s["__key__"] for s in theirs] == [r.key for r in ours]
    for s, (key, members) in zip(theirs, samples):
        assert {k: v for k, v in s.items() if not k.startswith("__")} == members
        assert json.loads(s["json"])["key"] == key

    # the same input writes byte-identical shards
    again = WebDatasetWriter(str(tmp_path / "again"), "p-000004", "att1", spec)
    for key, members in samples:
        again.write(key, members)
    assert again.close()[1] == shas

    writer.abort()
    assert not (out / "wds" / "p-000004" / "a-att1").exists()


def test_writer_single_big_sample_alone_and_no_empty_shards(tmp_path):
    samples = _photo_samples(3)
    spec = WebDatasetSinkSpec(enabled=True, shard_max_bytes=1024, shard_max_samples=100)
    writer = WebDatasetWriter(str(tmp_path), "p-1", "a", spec)
    for key, members in samples:
        writer.write(key, members)
    files, _, _ = writer.close()
    assert len(files) == 3 and all(len(list(read_shard(str(tmp_path / f)))) == 1
                                   for f in files)
    empty = WebDatasetWriter(str(tmp_path), "p-2", "a", spec)
    assert empty.close() == ([], {}, 0)
    assert not (tmp_path / "wds" / "p-2").exists()
    dup = WebDatasetWriter(str(tmp_path), "p-3", "a", WebDatasetSinkSpec(enabled=True))
    dup.write("a.b", {"txt": b"1"})
    with pytest.raises(ValueError, match="repeats key 'a.b'"):
        dup.write("a_b", {"txt": b"2"})
    dup.abort()
    assert not (tmp_path / "wds" / "p-3" / "a").exists()


def test_s3_write_then_read_shards(s3_server, s3_env, tmp_path):
    samples = _photo_samples(4)
    spec = WebDatasetSinkSpec(enabled=True, shard_max_bytes=400_000)
    root = f"s3://{s3_env}/out"
    writer = WebDatasetWriter(root, "p-000000", "s3att", spec)
    for key, members in samples:
        writer.write(key, members)
    files, shas, total = writer.close()
    assert len(files) >= 2
    blobs = [fs.read_bytes(fs.join(root, f)) for f in files]
    assert shas == {f: hashlib.sha256(b).hexdigest() for f, b in zip(files, blobs)}
    assert total == sum(map(len, blobs))

    staging = tmp_path / "staging"
    staging.mkdir()
    rows = [r for f in files for r in read_shard(fs.join(root, f), temp_dir=str(staging))]
    assert [(r.key, r.error) for r in rows] == [(k.replace(".", "_"), None) for k, _ in samples]
    assert [r.members for r in rows] == [m for _, m in samples]
    assert rows[0].shard_uri == fs.join(root, files[0])
    assert os.listdir(staging) == []            # staged copies deleted

    # a truncated shard on S3, and a missing one
    bad = fs.join(root, "cut.tar")
    fs.write_bytes(bad, blobs[0][:len(blobs[0]) // 2])
    rows = list(read_shard(bad, temp_dir=str(staging)))
    assert rows[-1].key == "cut#shard" and str(rows[-1].error).startswith(f"truncated_shard: {bad}")
    missing = fs.join(root, "missing.tar")
    assert [_text(r.error) for r in read_shard(missing)] == [
        f"input_missing: {missing}: shard not found (planned, no longer there)"]

    writer.abort()
    assert list(fs.list_files(fs.join(root, "wds/p-000000/a-s3att"))) == []


# ---- gzip-compressed shards (N09) -----------------------------------------------------

def _case(name: str) -> Path:
    """A case folder under data/cases."""
    return CASES / name


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _without_uri(rows: list[ShardSample], *uris: str) -> list[tuple]:
    """Rows comparable across shard files: the shard's name blanked in messages."""
    def text(error):
        if error is None:
            return None
        out = str(error)
        for u in uris:
            out = out.replace(u, "<shard>")
        return out
    return [("<shard>#shard" if r.key.endswith("#shard") else r.key, r.members, text(r.error))
            for r in rows]


def test_is_shard_name_and_error_key():
    assert [is_shard_name(n) for n in ("a.tar", "s3://b/x/a.TAR.GZ", "a.tgz", "A.TGZ",
                                       "a.tar.bz2", "a.gz", "tar", "a.txt")] == \
        [True, True, True, True, False, False, False, False]
    assert shard_error_key("s3://b/x/Shard-1.TAR.GZ") == "Shard-1#shard"
    assert shard_error_key("/d/shard-2.tgz") == "shard-2#shard"


def test_n09_gzip_shards_read_like_their_tars():
    shards = sorted((_case("N09_wds_gzip_shards") / "shards").iterdir())
    assert [p.name for p in shards] == ["shard-000000.tar", "shard-000001.tar.gz",
                                        "shard-000002.tgz"]
    rows = [r for p in shards for r in read_shard(str(p))]
    assert [(r.key, r.error) for r in rows] == [(f"{i:06d}", None) for i in range(5)]
    assert [r.shard_uri for r in rows] == [str(shards[i]) for i in (0, 0, 1, 1, 2)]
    # the members, by sha256, are exactly those of the (decompressed) tars
    expected = {}
    for p in shards:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            for m in tf.getmembers():
                key, ext = split_member_name(m.name)
                expected.setdefault(key, {})[ext] = _sha(tf.extractfile(m).read())
    got = {r.key: {ext: _sha(data) for ext, data in r.members.items()} for r in rows}
    assert got == expected
    assert all(list(r.members) == ["jpg", "txt"] for r in rows)
    assert all(r.members["jpg"][:3] == b"\xff\xd8\xff" for r in rows)   # real JPEGs


def test_gzip_shard_cut_in_half_keeps_complete_samples(tmp_path):
    samples = _three_photo_samples()
    full = tmp_path / "full.tar"
    infos = _make_tar(full, samples)
    gz = _gz(full.read_bytes())
    shard = tmp_path / "half-000001.tar.gz"
    shard.write_bytes(gz[:len(gz) // 2])
    # where the decompressed tar stops, and the member it stops in
    available = len(zlib.decompressobj(31).decompress(gz[:len(gz) // 2]))
    cut_member = next(i for i in infos if i.offset_data <= available < i.offset_data + i.size)
    cut_key = split_member_name(cut_member.name)[0]
    complete = [(k, m) for k, m in samples if k != cut_key
                and all(i.offset_data + i.size <= available for i in infos
                        if i.name.startswith(k + "."))]
    assert complete                              # the test cuts after a whole sample

    rows = list(read_shard(str(shard)))
    assert [(r.key, r.members, r.error) for r in rows[:-1]] == \
        [(k, m, None) for k, m in complete]
    assert rows[-1].key == "half-000001#shard" and rows[-1].members == {}
    assert rows[-1].error.reason == ErrorReason.TRUNCATED_SHARD
    assert str(rows[-1].error) == (
        f"truncated_shard: {shard}: gzip stream cut at byte {len(gz) // 2} of "
        f"{len(gz) // 2} (Compressed file ended before the end-of-stream marker was "
        f"reached); tar ends at byte {available} inside member '{cut_member.name}'; "
        f"{len(complete)} complete samples kept; incomplete sample '{cut_key}' dropped")


def test_gzip_of_truncated_tars_gives_the_same_rows(tmp_path):
    """A complete gzip stream of a cut tar: the same rows as the cut tar itself."""
    samples = _three_photo_samples()
    full = tmp_path / "full.tar"
    infos = _make_tar(full, samples)
    data = full.read_bytes()
    third = next(i for i in infos if i.name == f"{samples[2][0]}.jpg")
    second_txt = next(i for i in infos if i.name == f"{samples[1][0]}.txt")
    bad_header = bytearray(data)
    bad_header[third.offset + 148:third.offset + 156] = b"0000000\0"   # wrong checksum
    for cut in (data[:third.offset_data + 1000], data[:third.offset + 300],
                data[:second_txt.offset + 10], data[:second_txt.offset], bytes(bad_header),
                data):
        plain, packed = tmp_path / "s.tar", tmp_path / "s.tgz"
        plain.write_bytes(cut)
        packed.write_bytes(_gz(cut))
        want = _without_uri(list(read_shard(str(plain))), str(plain))
        assert _without_uri(list(read_shard(str(packed))), str(packed)) == want
    assert [k for k, _, e in want] == [k for k, _ in samples] and want[0][2] is None


def test_gzip_shard_with_duplicate_and_noncontiguous_keys(tmp_path):
    jpg = (PHOTOS / "000000062554.jpg").read_bytes()
    plain = tmp_path / "dup.tar"
    _make_tar(plain, [("a", {"jpg": jpg}), ("b", {"jpg": jpg, "txt": b"first"}),
                      ("b", {"txt": b"second"}), ("c", {"jpg": jpg}), ("d", {"txt": b"d"}),
                      ("c", {"txt": b"late"}), ("e", {"jpg": jpg, "txt": b"e"})])
    shard = tmp_path / "dup.tgz"
    shard.write_bytes(_gz(plain.read_bytes()))
    rows = list(read_shard(str(shard)))
    assert [(r.key, _text(r.error)) for r in rows] == [
        ("a", None),
        ("b", f"bad_sample: key 'b' in shard {shard}: duplicate extension 'txt'"),
        ("c", f"bad_sample: key 'c' in shard {shard}: members not contiguous (positions 4, 6)"),
        ("d", None),
        ("e", None)]
    assert [r.members for r in rows] == [{"jpg": jpg}, {}, {}, {"txt": b"d"},
                                         {"jpg": jpg, "txt": b"e"}]
    assert all(r.error.reason == ErrorReason.BAD_SAMPLE for r in rows if r.error)
    assert _without_uri(rows, str(shard)) == _without_uri(list(read_shard(str(plain))),
                                                          str(plain))
    # the real T07 case, gzip-compressed: the same two bad_sample rows as the tar
    t07 = tmp_path / "wds_noncontiguous_keys.tar.gz"
    t07.write_bytes(_gz(T07.read_bytes()))
    assert _without_uri(list(read_shard(str(t07))), str(t07)) == \
        _without_uri(list(read_shard(str(T07))), str(T07))


def test_gzip_garbage_and_corruption_are_one_error_row(tmp_path):
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(bytes(range(256)) * 20)
    rows = list(read_shard(str(garbage)))
    assert [(r.key, r.members, r.error.reason) for r in rows] == \
        [("garbage#shard", {}, ErrorReason.READ_FAILED)]
    assert str(rows[0].error).startswith(
        f"read_failed: {garbage}: not gzip-compressed (no 1f 8b magic bytes)")

    gz = _gz(T09.read_bytes())
    header = tmp_path / "header.tgz"               # magic fine, compression method not
    header.write_bytes(gz[:2] + b"\x07" + gz[3:])
    rows = list(read_shard(str(header)))
    assert len(rows) == 1 and rows[0].key == "header#shard"
    assert str(rows[0].error).startswith(
        f"read_failed: {header}: not a readable gzip-compressed tar archive (gzip data "
        "corrupt near byte")
    assert "Unknown compression method" in str(rows[0].error)

    crc = tmp_path / "crc.tar.gz"                  # data intact, CRC in the trailer wrong
    crc.write_bytes(gz[:-8] + bytes([gz[-8] ^ 0xFF]) + gz[-7:])
    rows = list(read_shard(str(crc)))
    assert len(rows) == 1 and rows[0].key == "crc#shard"
    assert "CRC check failed" in str(rows[0].error) and rows[0].members == {}
    assert rows[0].error.reason == ErrorReason.READ_FAILED

    tiny = tmp_path / "tiny.tar.gz"                # cut inside the first tar header
    tiny.write_bytes(gz[:12])
    assert [r.key for r in read_shard(str(tiny))] == ["tiny#shard"]

    # gzip magic decides, not the name: an uncompressed tar named .tar.gz, a gzip .tar
    misnamed = tmp_path / "plain.tar.gz"
    shutil.copy(T09, misnamed)
    packed = tmp_path / "packed.tar"
    packed.write_bytes(gz)
    assert [r.members for r in read_shard(str(misnamed))] == \
        [r.members for r in read_shard(str(packed))] == [r.members for r in read_shard(str(T09))]
