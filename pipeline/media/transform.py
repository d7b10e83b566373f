"""Image transforms over arrays: pHash, the output size and resize of ``resize``, and the
output encoding.

Pure codecs: (H, W, 3) uint8 RGB arrays and bytes in, ints/images/bytes out; no batches,
no I/O. ``steps.image`` applies them per row, ``models.media_output`` on the device path.
"""

from __future__ import annotations
import io
import imagehash
import numpy as np
from PIL import Image
from pipeline.spec import ResizeSpec


def phash64(pixels: np.ndarray) -> int:
    """64-bit perceptual hash of an (H, W, 3) uint8 image as a signed int64 value: the 64
    bits of ``imagehash.phash`` (most significant first, as its hex string) read as two's
    complement, i.e. ``np.uint64(u).view(np.int64)`` of the unsigned value ``u`` (Parquet
    readers such as Spark and BigQuery have no uint64). The unsigned value is
    ``np.int64(h).view(np.uint64)`` (or ``h & (2**64 - 1)``); Hamming distances are those
    of the unsigned values (``((a ^ b) & (2**64 - 1)).bit_count()``)."""
    bits = imagehash.phash(Image.fromarray(pixels)).hash.flatten()
    return int(np.packbits(bits).view(">i8")[0])


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
