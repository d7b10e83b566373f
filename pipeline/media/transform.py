"""Image transforms over arrays: pHash and its low-detail test, the output size and resize
of ``resize``, and the output encoding.

Pure codecs: (H, W, 3) uint8 RGB arrays and bytes in, ints/images/bytes out; no batches,
no I/O. ``steps.image`` applies them per row, ``models.media_output`` on the device path.
"""

from __future__ import annotations
import io
import math

import numpy as np
from PIL import Image
from pipeline.spec import ResizeSpec

#: ``imagehash.phash``'s defaults: ``hash_size`` 8 bits a side, ``highfreq_factor`` 4, so
#: the DCT runs over a 32 x 32 grey image and the hash is its top-left 8 x 8 block.
PHASH_BITS_SIDE, PHASH_HIGHFREQ_FACTOR = 8, 4
PHASH_GREY_SIDE = PHASH_BITS_SIDE * PHASH_HIGHFREQ_FACTOR

#: Standard deviation of one low-frequency coefficient of the pHash DCT that comes from
#: nothing but rounding the 32 x 32 grey image to 8 bits (an error uniform over one grey
#: level: variance 1/12). scipy's unnormalised DCT-II, ``y_k = 2 sum_n x_n cos(pi k (2n+1)
#: / 2N)``, turns independent errors of variance s^2 into variance ``4 s^2 N/2 = 2N s^2``
#: per axis (k >= 1), so ``(2N)^2 s^2`` over both axes: ``2N / sqrt(12)`` = 18.5 for N = 32.
DCT_ROUNDING_STD = 2 * PHASH_GREY_SIDE / math.sqrt(12)
#: A coefficient *decides* its hash bit when it is more than 3 ``DCT_ROUNDING_STD`` from
#: the median it is compared with: rounding alone moves it that far with probability
#: below 0.3 %; closer, its bit is a tie or rounding noise, not image content.
DECIDED_MARGIN = 3 * DCT_ROUNDING_STD
#: ``low_detail``: fewer than this many of the 64 bits decided. A hash with k decided bits
#: carries at most k bits about the image, the rest are ties (0) or noise. Measured
#: (``tests/media/test_low_detail.py``): every solid colour decides 0 or 1 (the DC term:
#: hashes ``0x0`` / ``0x8000000000000000``), a 1x1 image 1, linear gradients between
#: colours 4 to 21; the 57 photos of ``data/photos`` 61 to 64, 48 and more at a tenth of
#: their contrast, a page of black text on white 52. 32, half the hash, sits between the
#: two: a hash with fewer decided bits is mostly ties, and two such hashes agree on most
#: bits whatever the images.
LOW_DETAIL_MIN_BITS = 32


def phash_dct(pixels: np.ndarray) -> np.ndarray:
    """The 8 x 8 low-frequency DCT block (float64) that ``imagehash.phash`` thresholds,
    computed its way (Zauner 2010; imagehash 4.3 ``phash``): (H, W, 3) or (H, W) uint8
    pixels -> Pillow ``L`` grey -> 32 x 32 Lanczos resize -> ``scipy.fftpack.dct`` along
    axis 0 then axis 1 -> the top-left 8 x 8. Colour is gone at the first step: images
    that differ only in hue at equal luma hash alike."""
    import scipy.fftpack  # here: 0.1 s to import, and a job without hashes never needs it

    grey = Image.fromarray(pixels).convert("L").resize(
        (PHASH_GREY_SIDE, PHASH_GREY_SIDE), Image.Resampling.LANCZOS)
    a = np.asarray(grey)
    dct = scipy.fftpack.dct(scipy.fftpack.dct(a, axis=0), axis=1)
    return dct[:PHASH_BITS_SIDE, :PHASH_BITS_SIDE]


def phash_bits(dct: np.ndarray) -> int:
    """The pHash of an 8 x 8 ``phash_dct`` block as a signed int64 value (``phash64``):
    bit = coefficient > median, most significant first (imagehash's hex order)."""
    bits = (dct > np.median(dct)).flatten()
    return int(np.packbits(bits).view(">i8")[0])


def phash64(pixels: np.ndarray) -> int:
    """64-bit perceptual hash of an (H, W, 3) uint8 image as a signed int64 value: the 64
    bits of ``imagehash.phash`` (most significant first, as its hex string; computed its
    way by ``phash_dct``) read as two's complement, i.e. ``np.uint64(u).view(np.int64)``
    of the unsigned value ``u`` (Parquet readers such as Spark and BigQuery have no
    uint64). The unsigned value is ``np.int64(h).view(np.uint64)`` (or ``h & (2**64 -
    1)``); Hamming distances are those of the unsigned values (``((a ^ b) & (2**64 -
    1)).bit_count()``). Check ``low_detail`` before comparing two hashes."""
    return phash_bits(phash_dct(pixels))


def decided_bits(pixels_or_dct: np.ndarray) -> int:
    """How many of the 64 pHash bits image content decides: coefficients of the
    ``phash_dct`` block more than ``DECIDED_MARGIN`` from their median. Takes the 8 x 8
    float block itself, or pixels ((H, W, 3) or (H, W) uint8) to compute it from."""
    dct = _as_dct(pixels_or_dct)
    return int(np.count_nonzero(np.abs(dct - np.median(dct)) > DECIDED_MARGIN))


def low_detail(pixels_or_dct: np.ndarray) -> bool:
    """True if the image is too flat for its pHash to mean anything: fewer than
    ``LOW_DETAIL_MIN_BITS`` of its 64 bits are decided (``decided_bits``). Solid colours,
    1 x 1 images and plain gradients are low detail: their hashes (``0x0``,
    ``0x8000000000000000``, a few bits more) are near duplicates of one another whatever
    their colours, so near dedup must not use them (exact dedup of equal bytes still
    applies). Takes pixels ((H, W, 3) or (H, W) uint8) or their 8 x 8 ``phash_dct`` block
    (float); a video may call it on each frame it hashes."""
    return decided_bits(pixels_or_dct) < LOW_DETAIL_MIN_BITS


def phash_and_low_detail(pixels: np.ndarray) -> tuple[int, bool]:
    """``(phash64(pixels), low_detail(pixels))`` from one DCT."""
    dct = phash_dct(pixels)
    return phash_bits(dct), low_detail(dct)


def _as_dct(pixels_or_dct: np.ndarray) -> np.ndarray:
    a = np.asarray(pixels_or_dct)
    if a.shape == (PHASH_BITS_SIDE, PHASH_BITS_SIDE) and np.issubdtype(a.dtype, np.floating):
        return a
    return phash_dct(a)


def target_size(w: int, h: int, spec: ResizeSpec) -> tuple[int, int]:
    """Output size (before any centre crop) for a w x h image under ``spec``, in pixels."""
    if spec.mode == "none":
        return w, h
    ref = max(w, h) if spec.mode == "longest_side" else min(w, h)
    scale = spec.size_px / ref
    if scale >= 1 and not spec.upscale:
        return w, h
    return max(1, round(w * scale)), max(1, round(h * scale))


def resize_pixels(pixels: np.ndarray, spec: ResizeSpec) -> Image.Image:
    """Resize (H, W, 3) uint8 pixels per ``spec`` (bicubic, Pillow's reducing_gap=2.0)."""
    img = Image.fromarray(pixels)
    size = target_size(img.width, img.height, spec)
    if size != img.size:
        img = img.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    if spec.mode == "center_crop":
        side = min(img.width, img.height, spec.size_px)
        left, top = (img.width - side) // 2, (img.height - side) // 2
        img = img.crop((left, top, left + side, top + side))
    return img


def encode(img: Image.Image, spec: ResizeSpec) -> bytes:
    """``img`` encoded as ``spec.encode_format`` (JPEG or WebP) at ``spec.quality``."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG" if spec.encode_format == "jpeg" else "WEBP",
             quality=spec.quality)
    return buf.getvalue()
