"""Finding 7 (case T3-01): flat images (solid colours, 1x1, plain gradients) all hash to
pHash ``0x0`` / ``0x8000000000000000`` (or a few bits from them), so near dedup grouped
distinct flat images. ``media.transform.low_detail`` flags them; near dedup skips them,
exact dedup (equal bytes) still applies; photos are unaffected."""

from __future__ import annotations

import io
import itertools

import imagehash
import numpy as np
import pytest
from PIL import Image

from pipeline.columns import LOW_DETAIL, PHASH, STATUS
from pipeline.media.decode import decode_image
from pipeline.media.transform import (
    LOW_DETAIL_MIN_BITS,
    decided_bits,
    low_detail,
    phash64,
    phash_dct,
)
from pipeline.spec import DecodeSpec, DedupSpec
from pipeline.steps.dedup import DedupStep
from pipeline.steps.image import DecodeStep, HashStep
from tests.conftest import CASES, PHOTOS

T3_01 = CASES / "T3-01_phash_flat_images" / "files"
FLAT = ["a_black", "b_white", "c_blue254", "d_white640", "e_red", "f_green_1x1"]
PHOTO_STEMS = ["g_photo", "h_photo"]


def _t3(stem: str) -> bytes:
    return next(T3_01.glob(f"{stem}.*[!t]")).read_bytes()   # the image, not the .txt


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def generated_flat() -> dict[str, np.ndarray]:
    """Distinct flat images: 12 solid colours at two sizes, 1x1 pixels, and horizontal,
    vertical and diagonal linear gradients between colour pairs (uint8 RGB)."""
    colours = [(0, 0, 0), (255, 255, 255), (255, 0, 0), (0, 255, 0), (0, 0, 254),
               (128, 128, 128), (30, 60, 90), (250, 200, 10), (10, 200, 250),
               (90, 0, 90), (200, 120, 60), (1, 1, 1)]
    out = {}
    for i, c in enumerate(colours):
        out[f"solid{i}-48"] = np.full((48, 48, 3), c, np.uint8)
        out[f"solid{i}-300x200"] = np.full((200, 300, 3), c, np.uint8)
        out[f"px{i}"] = np.full((1, 1, 3), c, np.uint8)
    t = np.linspace(0, 1, 256)
    for i, (a, b) in enumerate(itertools.combinations(colours[:6], 2)):
        a, b = np.array(a, float), np.array(b, float)
        ramp = (a + (b - a) * t[:, None]).round().astype(np.uint8)         # (256, 3)
        out[f"hgrad{i}"] = np.broadcast_to(ramp[None, :, :], (128, 256, 3)).copy()
        out[f"vgrad{i}"] = np.broadcast_to(ramp[:, None, :], (256, 128, 3)).copy()
        d = (np.add.outer(np.arange(160), np.arange(160)) / 318.0)[..., None]
        out[f"dgrad{i}"] = (a + (b - a) * d).round().astype(np.uint8)
    return out


def test_phash64_is_imagehash_phash_for_photos_and_flat_images():
    """phash_dct computes imagehash.phash's DCT its way: the same 64 bits."""
    pixels = [decode_image(p.read_bytes()).pixels for p in sorted(PHOTOS.glob("*.jpg"))[:10]]
    pixels += [decode_image(_t3(s)).pixels for s in FLAT + PHOTO_STEMS]
    for p in pixels:
        unsigned = int(str(imagehash.phash(Image.fromarray(p))), 16)
        assert phash64(p) == np.array([unsigned], np.uint64).view(np.int64)[0]


def test_t3_01_flat_images_are_low_detail_and_the_photos_are_not():
    got = {s: (phash64(decode_image(_t3(s)).pixels) & (2**64 - 1),
               low_detail(decode_image(_t3(s)).pixels)) for s in FLAT + PHOTO_STEMS}
    # the finding: every flat image hashes to 0x0 or 0x8000000000000000
    assert {got[s][0] for s in FLAT} <= {0, 0x8000000000000000}
    assert {s for s, (_, low) in got.items() if low} == set(FLAT)
    # low_detail takes the DCT block as well as pixels
    dct = phash_dct(decode_image(_t3("g_photo")).pixels)
    assert low_detail(dct) is False and decided_bits(dct) >= LOW_DETAIL_MIN_BITS


def test_generated_flat_images_are_low_detail_and_every_bundled_photo_is_not():
    flat = generated_flat()
    assert all(low_detail(p) for p in flat.values()), \
        {k: decided_bits(p) for k, p in flat.items() if not low_detail(p)}
    # without the flag these hashes are near duplicates of one another at distance 4
    hashes = [phash64(p) & (2**64 - 1) for p in flat.values()]
    close = sum((a ^ b).bit_count() <= 4 for a, b in itertools.combinations(hashes, 2))
    assert close > len(hashes)
    photos = sorted(PHOTOS.glob("*.jpg"))
    bits = [decided_bits(decode_image(p.read_bytes()).pixels) for p in photos]
    assert len(photos) == 57 and min(bits) >= LOW_DETAIL_MIN_BITS + 8, sorted(bits)[:5]


@pytest.mark.parametrize("distance", [4, 15])
def test_in_partition_dedup_keeps_every_distinct_flat_image_and_rejects_only_byte_copies(
        distance):
    """ATTACK: 12 + 3 distinct flat images in one partition; before the flag all but a few
    were rejected as near duplicates. A byte copy of one is still an exact duplicate; the
    photos are kept and flagged low_detail False."""
    flat = generated_flat()
    keys = list(flat) + FLAT + PHOTO_STEMS + ["b_white_copy", "hgrad3_copy"]
    blobs = [_png(p) for p in flat.values()] + [_t3(s) for s in FLAT + PHOTO_STEMS] + \
        [_t3("b_white"), _png(flat["hgrad3"])]
    n = len(keys)
    batch = {"key": keys, "status": ["ok"] * n, "reject_reason": [None] * n,
             "error": [None] * n, "error_reason": [None] * n, "_source_bytes": blobs}
    batch = HashStep()(DecodeStep(DecodeSpec())(batch))
    assert batch[STATUS] == ["ok"] * n
    assert batch[LOW_DETAIL] == [True] * len(flat) + [True] * len(FLAT) + [False, False] + \
        [True, True]
    assert all(isinstance(h, int) for h in batch[PHASH])          # the pHash is kept
    step = DedupStep(DedupSpec(max_hamming_distance=distance))
    step.start_partition("p-000000")
    out = step(batch)
    rejected = {k: (out["duplicate_of"][i], out["duplicate_hamming"][i])
                for i, k in enumerate(keys) if out[STATUS][i] == "rejected"}
    assert rejected == {"b_white_copy": ("b_white", 0), "hgrad3_copy": ("hgrad3", 0)}
