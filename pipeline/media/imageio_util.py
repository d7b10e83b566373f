"""Pure helpers for image decoding: magic-byte sniffing, bit-depth and float scaling,
ICC to sRGB, alpha compositing.

Nothing here does I/O or touches Ray; every function takes bytes, Pillow images or numpy
arrays and returns new values. ``pipeline.media.decode`` builds on these.
"""

from __future__ import annotations

import functools
import io

import numpy as np
from PIL import Image, ImageCms

# ISO-BMFF ``ftyp`` brands (ISO/IEC 23008-12 HEIF and AV1 Image File Format specs).
_AVIF_BRANDS = frozenset({b"avif", b"avis"})
_HEIF_BRANDS = frozenset(
    {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1",
     b"mif2", b"mif3"}
)

# BMP info-header sizes (BITMAPCOREHEADER .. BITMAPV5HEADER), used to tell a real BMP from
# text that merely starts with "BM".
_BMP_HEADER_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})

#: MIME type of each format name returned by :func:`sniff_format`.
MIME_TYPES: dict[str, str] = {
    "JPEG": "image/jpeg",
    "PNG": "image/png",
    "GIF": "image/gif",
    "WEBP": "image/webp",
    "TIFF": "image/tiff",
    "BMP": "image/bmp",
    "ICO": "image/x-icon",
    "HEIF": "image/heif",
    "AVIF": "image/avif",
    "JPEG2000": "image/jp2",
    "PSD": "image/vnd.adobe.photoshop",
    "QOI": "image/qoi",
    "DDS": "image/vnd-ms.dds",
    "ICNS": "image/icns",
    "PPM": "image/x-portable-anymap",
    "JXL": "image/jxl",
    "SVG": "image/svg+xml",
    "HTML": "text/html",
    "PDF": "application/pdf",
}

#: Sniffed formats that are raster images Pillow (plus pillow-heif) can be asked to open.
RASTER_FORMATS = frozenset(
    {"JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP", "ICO", "HEIF", "AVIF", "JPEG2000", "PSD",
     "QOI", "DDS", "ICNS", "PPM"}
)

#: Sniffed formats that are images but that this pipeline cannot rasterize.
UNSUPPORTED_IMAGE_FORMATS = frozenset({"SVG", "JXL"})


def sniff_format(data: bytes) -> str | None:
    """Return the format of ``data`` from its magic bytes, never from a file name.

    Raster formats use Pillow's format names ("JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP",
    "ICO", "HEIF", "AVIF", "JPEG2000", "PSD", "QOI", "DDS", "ICNS", "PPM"); "JXL" is JPEG XL.
    Non-raster documents are reported as "SVG", "HTML" or "PDF" so callers can give a
    precise error. Returns ``None`` for anything else (plain text, random bytes, empty).
    Only the first 4 KiB are inspected.
    """
    head = data[:4096]
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if head[4:8] == b"ftyp":
        return _sniff_ftyp(head)
    if head[:2] == b"BM" and len(head) >= 18:
        if int.from_bytes(head[14:18], "little") in _BMP_HEADER_SIZES:
            return "BMP"
    if head[:4] in (b"\x00\x00\x01\x00", b"\x00\x00\x02\x00") and len(head) >= 6:
        if 0 < int.from_bytes(head[4:6], "little") <= 256:
            return "ICO"
    if head.startswith(b"\x00\x00\x00\x0cjP  \r\n\x87\n") or head.startswith(b"\xff\x4f\xff\x51"):
        return "JPEG2000"
    if head.startswith(b"\x00\x00\x00\x0cJXL \r\n\x87\n") or head.startswith(b"\xff\x0a"):
        return "JXL"
    if head[:4] == b"8BPS":
        return "PSD"
    if head[:4] == b"qoif":
        return "QOI"
    if head[:4] == b"DDS ":
        return "DDS"
    if head[:4] == b"icns":
        return "ICNS"
    if len(head) >= 3 and head[:1] == b"P" and head[1:2] in b"123456" and head[2:3].isspace():
        return "PPM"
    if head.startswith(b"%PDF-"):
        return "PDF"
    return _sniff_markup(head)


def _sniff_ftyp(head: bytes) -> str | None:
    """Classify an ISO-BMFF file by its major and compatible brands (AVIF wins ties)."""
    size = int.from_bytes(head[0:4], "big")
    end = min(len(head), size if size >= 16 else 16)
    brands = {head[8:12]} | {head[i:i + 4] for i in range(16, end - 3, 4)}
    if brands & _AVIF_BRANDS:
        return "AVIF"
    if brands & _HEIF_BRANDS:
        return "HEIF"
    return None  # mp4 / mov / 3gp and other non-image ISO-BMFF files


def _sniff_markup(head: bytes) -> str | None:
    """Recognise SVG and HTML text (UTF-8/UTF-16 BOMs and leading whitespace allowed)."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = head.decode("utf-16", errors="ignore")
        except UnicodeError:  # pragma: no cover - errors="ignore" never raises
            return None
    else:
        text = head.decode("utf-8", errors="ignore")
    text = text.lstrip("\ufeff \t\r\n").lower()
    if not text.startswith("<"):
        return None
    if "<svg" in text and (text.startswith(("<svg", "<?xml", "<!doctype svg", "<!--"))):
        return "SVG"
    if text.startswith(("<!doctype html", "<html", "<head", "<body", "<meta", "<title",
                        "<script", "<!--")) or "<html" in text:
        return "HTML"
    return None


def scale_to_uint8(raw: np.ndarray, bits: int = 16) -> np.ndarray:
    """Scale unsigned integer samples of ``bits`` depth to uint8 by ``v >> (bits - 8)``.

    ``raw`` is any integer array (e.g. uint16 from mode "I;16", int32 from mode "I");
    negative values are clamped to 0 and values above ``2**bits - 1`` to that maximum
    before the shift, so nothing wraps. 16-bit 0..65535 maps to 0..255 (4660 -> 18).
    Returns an array of the same shape, dtype uint8.
    """
    if bits <= 8:
        return np.clip(raw, 0, 255).astype(np.uint8)
    top = (1 << bits) - 1
    values = np.clip(raw.astype(np.int64, copy=False), 0, top)
    return (values >> (bits - 8)).astype(np.uint8)


#: ``decode_flags`` values set when samples were not plain 8-bit (see ``pipeline.media.decode``).
FLAG_FLOAT_SCALED = "float_scaled"       # mode "F" float samples mapped to 8 bits
FLAG_MINMAX_SCALED = "minmax_scaled"     # scaled by the image's own min..max, not a depth
FLAG_NONFINITE = "nonfinite_samples"     # NaN / +-inf samples replaced (see float_to_uint8)


def _round_half_up(values: np.ndarray) -> np.ndarray:
    """float64 array in [0, 255] -> uint8, rounding halves up (127.5 -> 128)."""
    return np.clip(np.floor(values + 0.5), 0, 255).astype(np.uint8)


def int_to_uint8(raw: np.ndarray, bits: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """Integer samples of declared depth ``bits`` (e.g. mode "I", "I;16*") to uint8.

    If ``bits <= 16`` and every value lies in ``0 .. 2**bits - 1`` the declared depth is
    used: ``v >> (bits - 8)`` (:func:`scale_to_uint8`; 16-bit 4660 -> 18), no flag. Else
    (32-bit samples, whose values say nothing about a display range, or negative signed
    samples) the image's own range is stretched linearly: ``out = round_half_up((v - min)
    * 255 / (max - min))``, flag ``minmax_scaled``; a constant image gives all 0 (its min).
    Returns ``(uint8 array of raw's shape, flags)``.
    """
    if raw.size == 0:
        return np.zeros(raw.shape, np.uint8), ()
    values = raw.astype(np.int64, copy=False)
    lo, hi = int(values.min()), int(values.max())
    if bits <= 16 and lo >= 0 and hi <= (1 << bits) - 1:
        return scale_to_uint8(values, bits), ()
    return _minmax(values.astype(np.float64), lo, hi), (FLAG_MINMAX_SCALED,)


def _minmax(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``round_half_up((v - lo) * 255 / (hi - lo))`` as uint8; all 0 when ``hi == lo``."""
    if hi <= lo:
        return np.zeros(values.shape, np.uint8)
    return _round_half_up((values - lo) * 255.0 / (hi - lo))


def float_to_uint8(raw: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """Float samples (mode "F", e.g. a 32-bit float TIFF) to uint8, never black or clipped.

    Rule, on the finite samples: if all lie in [0, 1] (the usual normalised range),
    ``out = round_half_up(v * 255)`` (0.5 -> 128, 1.0 -> 255); otherwise the image's own
    range is stretched, ``out = round_half_up((v - min) * 255 / (max - min))`` (0..1000:
    500 -> 128) and ``minmax_scaled`` is added; a constant image outside [0, 1] gives all 0.
    Non-finite samples are left out of min/max and then set to NaN -> 0, -inf -> 0,
    +inf -> 255 (flag ``nonfinite_samples``). Flags always start with ``float_scaled``.
    Raises ``ValueError`` if no sample is finite (the caller refuses the image).
    Returns ``(uint8 array of raw's shape, flags)``.
    """
    if raw.size == 0:
        return np.zeros(raw.shape, np.uint8), (FLAG_FLOAT_SCALED,)
    values = raw.astype(np.float64, copy=False)
    finite = np.isfinite(values)
    all_finite = bool(finite.all())
    if not all_finite and not finite.any():
        raise ValueError("no finite sample (all NaN or infinite)")
    usable = values if all_finite else values[finite]
    lo, hi = float(usable.min()), float(usable.max())
    clean = values if all_finite else np.where(finite, values, lo)
    flags = [FLAG_FLOAT_SCALED]
    if lo >= 0.0 and hi <= 1.0:
        out = _round_half_up(clean * 255.0)
    else:
        out = _minmax(clean, lo, hi)
        flags.append(FLAG_MINMAX_SCALED)
    if not all_finite:
        out[np.isnan(values) | (values == -np.inf)] = 0
        out[values == np.inf] = 255
        flags.append(FLAG_NONFINITE)
    return out, tuple(flags)


_ICC_COLOR_SPACE_TO_MODE = {"RGB": "RGB", "GRAY": "L", "CMYK": "CMYK"}


@functools.lru_cache(maxsize=1)
def _srgb_profile() -> ImageCms.ImageCmsProfile:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


@functools.lru_cache(maxsize=32)
def _icc_transform(icc: bytes, mode: str) -> ImageCms.ImageCmsTransform | None:
    """Build (and cache) a transform from the embedded profile to sRGB, or None if unusable."""
    try:
        src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        space = src.profile.xcolor_space.strip()
        if _ICC_COLOR_SPACE_TO_MODE.get(space) != mode:
            return None  # profile does not describe these channels: ignore it
        return ImageCms.buildTransform(
            src, _srgb_profile(), mode, "RGB",
            renderingIntent=ImageCms.Intent.PERCEPTUAL,
        )
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError, AttributeError):
        return None


def icc_to_srgb(color: Image.Image, icc: bytes | None) -> Image.Image | None:
    """Convert an "L", "RGB" or "CMYK" image from its embedded ICC profile to sRGB "RGB".

    Uses littleCMS through ``PIL.ImageCms`` with perceptual intent (the intent
    ``ImageCms.profileToProfile`` uses by default). Returns ``None`` when there is no
    profile, the profile is broken, or its colour space does not match the image mode; the
    caller then falls back to a plain ``convert("RGB")`` and the record does not fail.
    """
    if not icc or color.mode not in ("L", "RGB", "CMYK"):
        return None
    transform = _icc_transform(bytes(icc), color.mode)
    if transform is None:
        return None
    try:
        return ImageCms.applyTransform(color, transform)
    except (ImageCms.PyCMSError, OSError, ValueError):
        return None


def composite_over_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Alpha-composite (H, W, 3) uint8 ``rgb`` with (H, W) uint8 ``alpha`` over white.

    ``out = (c * a + 255 * (255 - a)) / 255`` rounded half up, so alpha 0 gives exactly
    (255, 255, 255) and alpha 255 leaves the colour unchanged. Returns (H, W, 3) uint8.
    """
    a = alpha.astype(np.uint32)[..., None]
    out = (rgb.astype(np.uint32) * a + 255 * (255 - a) + 127) // 255
    return out.astype(np.uint8)
