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
    "CUR": "image/x-win-bitmap",
    "TGA": "image/x-tga",
    "SGI": "image/sgi",
    "PCX": "image/x-pcx",
    "DCX": "image/x-dcx",
    "BLP": "image/x-blp",
    "MSP": "image/x-msp",
    "XBM": "image/x-xbitmap",
    "XPM": "image/x-xpixmap",
    "DIB": "image/bmp",
    "SUN": "image/x-sun-raster",
    "JXL": "image/jxl",
    "SVG": "image/svg+xml",
    "HTML": "text/html",
    "PDF": "application/pdf",
}

#: Sniffed formats that are raster images Pillow (plus pillow-heif) can be asked to open.
RASTER_FORMATS = frozenset(
    {"JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP", "ICO", "HEIF", "AVIF", "JPEG2000", "PSD",
     "QOI", "DDS", "ICNS", "PPM", "CUR"}
)

#: Pillow formats ``sniff_format`` does not name: formats without a signature (TGA)
#: and rare ones whose signature only Pillow's plugin checks. Such a file is opened only
#: when its extension names the format (``sniff_by_extension``), with that one plugin.
EXTENSION_FORMATS = frozenset(
    {"TGA", "SGI", "PCX", "DCX", "BLP", "MSP", "XBM", "XPM", "DIB", "SUN"}
)

#: Sniffed formats that are images but that this pipeline cannot rasterize.
UNSUPPORTED_IMAGE_FORMATS = frozenset({"SVG", "JXL"})


def sniff_format(data: bytes) -> str | None:
    """Return the format of ``data`` from its magic bytes, never from a file name.

    Raster formats use Pillow's format names ("JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP",
    "ICO", "CUR", "HEIF", "AVIF", "JPEG2000", "PSD", "QOI", "DDS", "ICNS", "PPM" - PFM
    included); "JXL" is JPEG XL.
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
            return "ICO" if head[2] == 1 else "CUR"   # ICONDIR type 1 icon, 2 cursor
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
    if len(head) >= 3 and head[:1] == b"P" and head[1:2] in b"123456fF" and head[2:3].isspace():
        return "PPM"
    if head.startswith(b"%PDF-"):
        return "PDF"
    return _sniff_markup(head)


def sniff_by_extension(data: bytes, ext: str | None) -> str | None:
    """The format a file's extension names, for a file ``sniff_format`` found no signature
    in: the Pillow format ``PIL.Image.registered_extensions()`` maps ``ext`` (".tga",
    any case) to, if it is one of ``EXTENSION_FORMATS`` and that plugin's own signature
    check (``accept`` of ``PIL.Image.OPEN``, when the format has one; TGA has none)
    takes the first 16 bytes. None otherwise (the file stays ``not_an_image``)."""
    if not ext:
        return None
    Image.init()
    fmt = Image.registered_extensions().get(ext.lower())
    entry = Image.OPEN.get(fmt) if fmt in EXTENSION_FORMATS else None
    if entry is None:
        return None
    accept = entry[1]
    verdict = accept(data[:16]) if accept is not None else True
    if not verdict or isinstance(verdict, str):   # a str: the plugin's codec is missing
        return None
    return fmt


def still_image_format(head: bytes, ext: str | None = None) -> str | None:
    """The Pillow format of a file whose first bytes are ``head`` when it is a raster
    image ``decode_image`` opens (``sniff_format`` in ``RASTER_FORMATS``, or a
    signature-less format its extension ``ext`` names: ``sniff_by_extension``); None for
    anything else (a video container, a document, text). A video job that also lists
    image extensions decodes such files as one-frame rows (``steps.video``)."""
    fmt = sniff_format(head)
    if fmt is None:
        return sniff_by_extension(head, ext)
    return fmt if fmt in RASTER_FORMATS else None


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
    lo, hi = int(raw.min()), int(raw.max())
    if bits <= 16 and lo >= 0 and hi <= (1 << bits) - 1:
        # in range: the shift in the samples' own dtype (no int64 copies of a large image)
        return (raw >> max(0, bits - 8)).astype(np.uint8), ()
    return _minmax(raw.astype(np.float64), lo, hi), (FLAG_MINMAX_SCALED,)


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
    Computed in uint16 (at most 255 * 255 + 127 = 65152), 2 bytes per sample.
    """
    a = alpha.astype(np.uint16)[..., None]
    out = rgb.astype(np.uint16) * a
    out += 255 * (255 - a) + 127
    out //= 255
    return out.astype(np.uint8)


#: ``decode_flags`` value of a JPEG decoded although its final EOI marker was missing.
FLAG_MISSING_EOI = "missing_eoi"

# Start-of-frame markers (ITU-T T.81 Table B.1: SOF0..SOF15 minus DHT C4, JPG C8, DAC CC)
# and the progressive ones among them (SOF2, SOF6, SOF10, SOF14).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})


def jpeg_scans_complete(data: bytes) -> bool:
    """True if the marker structure of the JPEG ``data`` (ITU-T T.81 Annex B) is whole up
    to its last scan and its scans cover the whole image; says nothing of the entropy-coded
    data of the last scan (``decode`` checks that by decoding).

    Walks the marker segments from SOI: every segment before the last SOS must be complete
    (a cut inside a header is False), an EOI ends the walk early (True only if the scans
    are complete). Coverage (T.81 G.1.1): sequential - every frame component appears in
    some scan; progressive - for every frame component and every coefficient 0..63 some
    scan covering it has successive-approximation low bit ``Al = 0`` (its last refinement).
    Never raises; False for anything it cannot read.
    """
    n, i = len(data), 2
    components: list[int] | None = None
    progressive = False
    scans: list[tuple[tuple[int, ...], int, int, int]] = []   # (ids, Ss, Se, Al)
    if not data.startswith(b"\xff\xd8"):
        return False
    while i < n:
        if data[i] != 0xFF:
            return False
        while i < n and data[i] == 0xFF:    # fill bytes before a marker
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker == 0xD9:
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:   # RSTn, TEM: no length
            continue
        if i + 2 > n or i + int.from_bytes(data[i:i + 2], "big") > n:
            return False                   # cut inside a marker segment
        length = int.from_bytes(data[i:i + 2], "big")
        seg = data[i + 2:i + length]
        i += length
        if marker in _SOF_MARKERS:
            if len(seg) < 6 or len(seg) < 6 + 3 * seg[5]:
                return False
            progressive = marker in _PROGRESSIVE_SOF
            components = [seg[6 + 3 * k] for k in range(seg[5])]
        elif marker == 0xDA:
            ns = seg[0] if seg else 0
            if ns == 0 or len(seg) < 4 + 2 * ns:
                return False
            ids = tuple(seg[1 + 2 * k] for k in range(ns))
            scans.append((ids, seg[1 + 2 * ns], seg[2 + 2 * ns], seg[3 + 2 * ns] & 0x0F))
            while i < n:                    # entropy-coded data: up to a non-RST marker
                if (data[i] == 0xFF and i + 1 < n and data[i + 1] != 0
                        and not 0xD0 <= data[i + 1] <= 0xD7):
                    break
                i += 1
    if not components or not scans:
        return False
    if not progressive:
        return set(components) <= {c for ids, *_ in scans for c in ids}
    final = {(c, k) for ids, ss, se, al in scans if al == 0
             for c in ids for k in range(ss, min(se, 63) + 1)}
    return all((c, k) in final for c in components for k in range(64))
