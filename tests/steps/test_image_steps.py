"""Resize/encode, filters, hashes and in-partition dedup on real photos (no Ray)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipeline.columns import SOURCE_BYTES, STATUS
from pipeline.spec import DecodeSpec, DedupSpec, FilterSpec, ResizeSpec
from pipeline.steps.dedup import DedupStep
from pipeline.media.decode import decode_image
from pipeline.steps.image import DecodeStep, FilterStep, HashStep, ResizeStep
from pipeline.media.transform import phash64, resize_pixels, target_size
from tests.conftest import PHOTOS, coco_captions

ROWS = coco_captions()


def _photo(i: int) -> bytes:
    return (PHOTOS / ROWS[i]["file"]).read_bytes()


def _batch(blobs: list[bytes], keys: list[str] | None = None) -> dict:
    n = len(blobs)
    return {"key": keys or [f"k{i}" for i in range(n)], STATUS: ["ok"] * n, "error": [None] * n,
            "reject_reason": [None] * n, SOURCE_BYTES: blobs}


@pytest.mark.parametrize("mode,size,w,h,expect", [
    ("shorter_side", 256, 640, 427, (384, 256)),
    ("shorter_side", 256, 200, 100, (200, 100)),        # no upscaling by default
    ("longest_side", 256, 640, 427, (256, 171)),
    ("center_crop", 256, 640, 427, (256, 256)),
    ("none", 256, 640, 427, (640, 427)),
])
def test_resize_modes(mode, size, w, h, expect):
    spec = ResizeSpec(mode=mode, size_px=size)
    out = resize_pixels(np.zeros((h, w, 3), np.uint8), spec)
    assert out.size == expect


def test_upscale_option():
    assert target_size(200, 100, ResizeSpec(size_px=256, upscale=True)) == (512, 256)


@pytest.mark.parametrize("fmt,magic", [("jpeg", b"\xff\xd8\xff"), ("webp", b"RIFF")])
def test_resize_step_reencodes_real_photo(fmt, magic):
    batch = DecodeStep(DecodeSpec(), draft_min_side_px=128)(_batch([_photo(0)]))
    assert batch["width"] == [ROWS[0]["width"]] and batch["height"] == [ROWS[0]["height"]]
    assert min(batch["_pixels"][0].shape[:2]) >= 128
    batch = ResizeStep(ResizeSpec(mode="center_crop", size_px=128, encode_format=fmt))(batch)
    blob = batch["image"][0]
    assert blob.startswith(magic)
    img = Image.open(io.BytesIO(blob))
    assert img.size == (128, 128) and img.mode == "RGB"
    assert batch["_pixels"] == [None]


def test_jpeg_draft_matches_full_decode_closely():
    full = decode_image(_photo(1))
    draft = decode_image(_photo(1), draft_min_side_px=100)
    assert (draft.width, draft.height) == (full.width, full.height)
    assert draft.pixels.shape[0] < full.pixels.shape[0]
    small_full = np.asarray(Image.fromarray(full.pixels).resize(draft.pixels.shape[1::-1]))
    assert np.abs(small_full.astype(int) - draft.pixels.astype(int)).mean() < 8


def test_filters_reject_with_reason_and_keep_rows():
    batch = {"key": ["a", "b", "c"], STATUS: ["ok", "ok", "error"], "error": [None, None, "x"],
             "reject_reason": [None] * 3, "width": [640, 50, 10], "height": [100, 400, 10]}
    step = FilterStep(FilterSpec(min_width_px=64, max_aspect_ratio=3.0))
    out = step(batch)
    assert out[STATUS] == ["rejected", "rejected", "error"]
    assert out["reject_reason"] == ["aspect_ratio", "too_small", None]
    assert step.rejected == {"aspect_ratio": 1, "too_small": 1}     # the Filter's counters
    step.start_partition("p-000001")
    assert step.rejected == {}


def test_hashes_and_exact_and_near_dedup_inside_partition():
    original = _photo(2)
    img = Image.open(io.BytesIO(original))
    buf = io.BytesIO()
    img.resize((img.width // 2, img.height // 2)).save(buf, "JPEG", quality=70)
    blobs = [original, _photo(3), original, buf.getvalue(), _photo(4)]
    batch = DecodeStep(DecodeSpec())(_batch(blobs, ["orig", "other", "copy", "small", "third"]))
    batch = HashStep()(batch)
    assert batch["sha256"][0] == batch["sha256"][2] != batch["sha256"][3]
    assert all(isinstance(p, int) and -2**63 <= p < 2**63 for p in batch["phash"])   # int64
    step = DedupStep(DedupSpec(max_hamming_distance=6))
    step.start_partition("p-000000")
    out = step(batch)
    assert out[STATUS] == ["ok", "ok", "rejected", "rejected", "ok"]
    assert out["reject_reason"][2:4] == ["duplicate", "duplicate"]
    assert out["duplicate_of"][2:4] == ["orig", "orig"]
    assert out["duplicate_hamming"][2] == 0 and out["duplicate_hamming"][3] <= 6
    # state is per partition: a new partition forgets what it saw
    step.start_partition("p-000001")
    again = step(DecodeStep(DecodeSpec())(_batch([original])) | {"sha256": [batch["sha256"][0]],
                                                                 "phash": [batch["phash"][0]]})
    assert again[STATUS] == ["ok"]


def test_phash_is_imagehash_bits_as_int64_and_dedup_counts_the_sign_bit():
    """phash64 = imagehash's 64 bits (its hex string) read as two's complement; dedup
    compares all 64 bits, so hashes that differ in the sign bit are 1 bit apart."""
    import imagehash

    for i in range(8):
        pixels = decode_image(_photo(i)).pixels
        unsigned = int(str(imagehash.phash(Image.fromarray(pixels))), 16)
        got = phash64(pixels)
        assert got == np.array([unsigned], dtype=np.uint64).view(np.int64)[0]
        assert np.array([got], dtype=np.int64).view(np.uint64)[0] == unsigned
    a = -2**63 + 0b1011                       # sign bit set
    near = [a ^ 0b11, a ^ -2**63]             # 2 bits away; only the sign bit flipped
    far = 0x0F0F_0F0F_0F0F_0F0F
    n = 4
    batch = {"key": ["a", "near2", "sign", "far"], "status": ["ok"] * n,
             "reject_reason": [None] * n, "sha256": ["s0", "s1", "s2", "s3"],
             "phash": [a] + near + [far]}
    step = DedupStep(DedupSpec(exact=True, near=True, max_hamming_distance=2))
    step.start_partition("p-000000")
    out = step(batch)
    assert out["status"] == ["ok", "rejected", "rejected", "ok"]
    assert out["duplicate_of"][1:3] == ["a", "a"] and out["duplicate_hamming"][1:3] == [2, 1]


def test_distinct_coco_photos_are_not_near_duplicates():
    hashes = [phash64(decode_image(_photo(i)).pixels) for i in range(20)]
    dists = [bin(a ^ b).count("1") for i, a in enumerate(hashes) for b in hashes[i + 1:]]
    assert min(dists) > 4


def test_decode_step_turns_bad_bytes_into_error_rows():
    batch = DecodeStep(DecodeSpec())(_batch([b"", b"<html><body>moved</body></html>", _photo(0)]))
    assert batch[STATUS] == ["error", "error", "ok"]
    assert batch["error"][0].startswith("empty_file:")
    assert batch["error"][1].startswith("not_an_image:")


def test_dedup_table_grows_past_its_first_block_and_resets_per_partition():
    """300 kept hashes (the table starts at 64 and doubles); a row 2 bits from kept row 250
    is a near duplicate of exactly that row; the next partition starts empty."""
    rng = np.random.default_rng(7)
    hashes = [int(h) for h in rng.integers(0, 2**63, size=300, dtype=np.int64)]
    near = hashes[250] ^ 0b101
    n = 301
    batch = {"key": [f"k{i}" for i in range(n)], "status": ["ok"] * n,
             "reject_reason": [None] * n, "sha256": [f"s{i}" for i in range(n)],
             "phash": hashes + [near]}
    step = DedupStep(DedupSpec(exact=True, near=True, max_hamming_distance=2))
    step.start_partition("p-000000")
    out = step(batch)
    rejected = [i for i in range(n) if out["status"][i] == "rejected"]
    dists = [bin(hashes[i] ^ hashes[j]).count("1") for i in range(300) for j in range(i)]
    assert min(dists) > 2                                   # the random hashes are far apart
    assert rejected == [300]
    assert (out["duplicate_of"][300], out["duplicate_hamming"][300]) == ("k250", 2)
    step.start_partition("p-000001")
    again = step({k: (list(v) if k != "status" else ["ok"] * n) for k, v in batch.items()
                  if k in ("key", "status", "reject_reason", "sha256", "phash")})
    assert [i for i in range(n) if again["status"][i] == "rejected"] == [300]
