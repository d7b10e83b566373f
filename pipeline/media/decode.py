"""Decode one encoded image (bytes) into upright sRGB pixels, or raise ``RecordError``.

Pure: no Ray, no file or network I/O. The policy, per kind of input:

* format: sniffed from magic bytes only (``sniff_format``); names are Pillow's.
* size guard: the header is parsed lazily and ``width * height > max_pixels`` is rejected
  as ``too_large`` before any pixel is decoded (Pillow's own bomb errors map there too).
* truncated or corrupt data: an error, never a grey-filled partial image
  (``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` must stay False, its default; this module
  never sets it). One exception: a JPEG missing only its final EOI marker whose coded
  data is complete decodes, flag ``missing_eoi`` (rule: ``decode_image``).
* EXIF orientation (JPEG, WebP, PNG eXIf, TIFF, AVIF) is applied; HEIF transforms are
  applied by libheif. ``width``/``height`` are the upright full-resolution size.
* every mode ends as (H, W, 3) uint8 RGB; an embedded ICC profile (of an "L", "RGB" or
  "CMYK" colour part) is converted to sRGB; alpha and palette/tRNS transparency are
  composited over white (255, 255, 255) and set ``has_alpha``. Per Pillow mode (names
  and layouts from Pillow's "Concepts: Modes" handbook page):

  ========================== ==========================================================
  mode                       conversion (``decode_flags`` set, if any)
  ========================== ==========================================================
  1                          0 -> 0, 1 -> 255, replicated to R = G = B
  L                          replicated to R = G = B (tRNS grey value -> white)
  LA, La                     L replicated, composited over white by A (Pillow
                             un-premultiplies La first)
  P, PA                      palette lookup; tRNS index, RGBA palette or A composited
  I;16, I;16B, I;16L, I;16N  16-bit unsigned: ``v >> 8`` (= floor(v / 256); 4660 -> 18),
                             never clipped or wrapped
  I                          32-bit signed (Pillow's container for 16-bit PNG/PPM and
                             integer TIFF). If the declared depth (TIFF BitsPerSample,
                             else 16) is <= 16 bits and holds every value: ``v >> (bits
                             - 8)``. Else (32-bit samples, negative values): linear
                             min..max stretch to 0..255 (``minmax_scaled``); uint32 TIFF
                             samples (SampleFormat 1) are read unsigned first
  F                          32-bit float. Finite samples all in [0, 1]: round(v * 255);
                             else min..max stretch (``float_scaled``, and
                             ``minmax_scaled``); NaN/-inf -> 0, +inf -> 255, left out of
                             min/max (``nonfinite_samples``); no finite sample at all ->
                             ``unsupported_format``. See ``imageio_util.float_to_uint8``
  RGB                        as is (tRNS colour -> white)
  RGBA, RGBa                 composited over white (RGBa un-premultiplied by Pillow)
  RGBX                       X (padding) dropped
  CMYK                       embedded ICC profile -> sRGB (littleCMS); else Pillow's
                             ``R = (255 - C) * (255 - K) / 255`` rounded (G from M, B
                             from Y). Adobe's inverted CMYK JPEGs are un-inverted by
                             Pillow's JPEG decoder
  YCbCr                      Pillow's convert: JFIF full-range ITU-R BT.601
                             (ITU-T T.871): R = Y + 1.402 (Cr - 128), ...
  LAB                        CIE L*a*b* (D50; L 0..255 = L* 0..100, a*/b* signed 8-bit
                             in two's complement, as in TIFF CIELab) to sRGB via
                             littleCMS (``ImageCms.createProfile("LAB")`` -> sRGB,
                             the transform Pillow 13's ``convert("RGB")`` also builds;
                             explicit so that no Pillow version copies the bands)
  HSV                        Pillow's convert (H, S, V 0..255; H = hue * 255 / 360)
  ========================== ==========================================================

  Rounding is half up (127.5 -> 128). ``decode_flags`` is empty for every other image.
* animations (GIF, APNG, WebP) and multi-page TIFF: frame/page 0 only; the count is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import struct
import threading
import zlib
from collections.abc import Iterator

import numpy as np
from PIL import Image, ImageFile, JpegImagePlugin

from pipeline.errors import RecordError
from pipeline.records import ErrorReason
from pipeline.media.imageio_util import (EXTENSION_FORMATS, FLAG_MISSING_EOI, MIME_TYPES, RASTER_FORMATS, UNSUPPORTED_IMAGE_FORMATS, composite_over_white, float_to_uint8, icc_to_srgb, int_to_uint8, jpeg_scans_complete, sniff_by_extension, sniff_format)


@functools.cache
def _register_heif() -> bool:
    """HEIC/HEIF through libheif: import pillow-heif and register its Pillow opener, once,
    the first time a HEIF or AVIF brand is sniffed (an image-only job of JPEGs never loads
    it). AVIF uses Pillow's own AVIF plugin (Pillow >= 11.2). False when pillow-heif is not
    installed (HEIF then decodes to ``unsupported_format``)."""
    try:
        import pillow_heif
    except ImportError:  # pragma: no cover - HEIF then decodes to unsupported_format
        return False
    pillow_heif.register_heif_opener()
    return True


__all__ = ["DECODE_ERRORS", "DEFAULT_MAX_PIXELS", "DecodedImage", "decode_image", "decoded_size",
           "exif_orientation", "sniff_format"]

#: Pillow's default ``Image.MAX_IMAGE_PIXELS`` (1024 * 1024 * 1024 // 4 // 3): about
#: 0.25 GiB of 24-bit pixels.
DEFAULT_MAX_PIXELS = 89_478_485

# Pillow plugin names to try for a sniffed format (HEIF files can carry AVIF brands).
_PLUGINS: dict[str, tuple[str, ...]] = {"HEIF": ("HEIF", "AVIF"), "AVIF": ("AVIF", "HEIF")}
# Formats whose extra frames are pages / previews, not an animation.
_NOT_ANIMATIONS = frozenset({"TIFF", "MPO", "ICO", "CUR", "ICNS", "PSD", "DDS", "DCX"})

# EXIF Orientation tag (0x0112) -> transpose that makes the image upright. Same table as
# PIL.ImageOps.exif_transpose.
_ORIENTATION_TAG = 0x0112
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

# The same transposes on an (H, W, 3) array (PIL's ROTATE_n turns counter-clockwise).
_ORIENT_ARRAY = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}

#: Bytes of one strip copied from a Pillow image into the output array (``_pixels``).
STRIP_BYTES = 8 * 2**20

# Exceptions Pillow and its plugins raise for bad input (UnidentifiedImageError is an
# OSError, DecompressionBombError an Exception; pillow-heif raises RuntimeError).
DECODE_ERRORS = (OSError, EOFError, SyntaxError, ValueError, struct.error, IndexError,
                 TypeError, KeyError, zlib.error, RuntimeError, MemoryError,
                 Image.DecompressionBombError)
_TRUNCATED_HINTS = ("truncat", "premature end", "unexpected end", "not enough data",
                    "end of file", "end of stream")
_TOO_LARGE_HINTS = ("too large", "too much memory", "exceeds limit", "decompression bomb")
_UNSUPPORTED_HINTS = ("unsupported", "not supported", "unknown pixel mode",
                      "unknown raw mode", "not available", "not installed")

_PIL_LIMIT_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class DecodedImage:
    """An image decoded to upright sRGB pixels plus what its header said.

    ``pixels``: (H, W, 3) uint8 RGB, upright (EXIF orientation applied), alpha composited
    over white; smaller than ``width`` x ``height`` only when a JPEG draft was requested.
    ``width``/``height``: upright full-resolution size in pixels, from the header.
    ``format``: Pillow format name sniffed from magic bytes ("JPEG", "PNG", "HEIF", ...).
    ``mime``: MIME type ("image/jpeg"; "image/apng" for animated PNG).
    ``n_frames``: animation frames or TIFF pages, 1 for a still image.
    ``is_animated``: True for multi-frame GIF/APNG/WebP/AVIF/HEIF sequences (not TIFF pages).
    ``has_alpha``: the source had an alpha channel or palette/tRNS transparency.
    ``flags``: how the samples were brought to 8 bits when that was not a fixed depth
    rule (``float_scaled``, ``minmax_scaled``, ``nonfinite_samples``; module docstring);
    empty for ordinary images.
    """

    pixels: np.ndarray
    width: int
    height: int
    format: str
    mime: str
    n_frames: int
    is_animated: bool
    has_alpha: bool
    flags: tuple[str, ...] = ()


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS,
                 draft_min_side_px: int | None = None, ext: str | None = None) -> DecodedImage:
    """Decode encoded image ``data`` to a :class:`DecodedImage` (frame/page 0).

    ``max_pixels``, ``draft_min_side_px``, ``ext`` and the errors raised:
    ``_decode_image``.

    A JPEG that ends without its final EOI marker (T.81 B.2.1; Pillow issue #4414) but
    whose coded data is complete decodes to the pixels of the whole file (EOI appended),
    with the flag ``missing_eoi``; one really cut short stays ``truncated``. The rule
    (``_jpeg_missing_eoi``): (1) the scans present cover the whole image
    (``imageio_util.jpeg_scans_complete``: every component; progressive: every
    coefficient to its last refinement), and (2) the pixels do not depend on any bit
    after the end of the file: the file decodes identically, strictly (no
    ``LOAD_TRUNCATED_IMAGES``), without error, with EOI appended directly (libjpeg pads
    a scan cut at a marker with zero bits) and after each of ``_EOI_PROBE_FILLS`` (4 KiB
    of fixed pseudo-random bytes, no 0xFF). A decoder that needs a missing MCU or
    refinement bit reads those bytes as entropy-coded data and the decodes differ (or one
    fails); one that has every MCU only reads them as look-ahead and then skips them
    looking for the EOI marker. (Constant fills are not enough: 0x55/0xAA read as
    invalid Huffman codes, which libjpeg decodes as zeros, like the marker's padding.)
    A file that ends in a lone 0xFF was cut inside a marker (or a stuffed byte) and stays
    ``truncated`` (C01).
    """
    try:
        return _decode_image(data, max_pixels=max_pixels, draft_min_side_px=draft_min_side_px,
                             ext=ext)
    except RecordError as err:
        if err.reason != ErrorReason.TRUNCATED or sniff_format(data) != "JPEG":
            raise
        repaired = _jpeg_missing_eoi(data)
        if repaired is None:
            raise
    decoded = _decode_image(repaired, max_pixels=max_pixels,
                            draft_min_side_px=draft_min_side_px)
    return dataclasses.replace(decoded, flags=decoded.flags + (FLAG_MISSING_EOI,))


# Fills appended before EOI to test that a JPEG's pixels do not depend on missing bits:
# none, and 4 KiB of bytes 0..254 (never 0xFF, a marker prefix) from two fixed seeds.
_EOI_PROBE_FILLS = (b"",) + tuple(
    np.random.default_rng(seed).integers(0, 255, 4096, dtype=np.uint8).tobytes()
    for seed in (4414, 7))


def _jpeg_missing_eoi(data: bytes) -> bytes | None:
    """``data`` with EOI appended if its coded data is complete (rule: ``decode_image``),
    else None. A file whose last byte is 0xFF is None: in entropy-coded data a 0xFF is
    always followed by a stuffed 0x00 or a marker code (ITU-T T.81 B.1.1.5), so that byte
    was cut from what followed it (C01: a progressive JPEG cut inside its EOI, ``…7b ff``);
    a file that lacks the whole EOI marker (T3-13) ends in entropy-coded data. Decodes the
    image three times at full size; only called for a JPEG whose header passed the
    ``max_pixels`` check and whose strict decode failed as truncated."""
    if data.endswith(b"\xff") or not jpeg_scans_complete(data):
        return None
    decodes = []
    for fill in _EOI_PROBE_FILLS:
        try:
            with _open_header(data + fill + b"\xff\xd9", "JPEG") as im:
                im.load()
                decodes.append(np.asarray(im))
        except DECODE_ERRORS:
            return None
    if not all(np.array_equal(decodes[0], other) for other in decodes[1:]):
        return None
    return data + b"\xff\xd9"


def _decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS,
                  draft_min_side_px: int | None = None, ext: str | None = None) -> DecodedImage:
    """Decode encoded image ``data`` to a :class:`DecodedImage` (frame/page 0), strictly.

    ``max_pixels``: largest accepted ``width * height`` (header dims, pixels); the default
    is Pillow's default ``MAX_IMAGE_PIXELS``. ``draft_min_side_px``: for JPEG only, let
    libjpeg decode at 1/2, 1/4 or 1/8 scale as long as the shorter side of ``pixels`` stays
    >= this many pixels (``width``/``height`` still report the full size). ``ext``: the
    source name's extension (".tga"); used only when the bytes carry no signature
    ``sniff_format`` knows, to open a format of ``imageio_util.EXTENSION_FORMATS`` (TGA,
    SGI, PCX, ...; ``sniff_by_extension``) with that format's plugin alone; a failure
    then names that format ("TGA: ...").

    Raises ``RecordError`` whose ``reason`` is an ``ErrorReason`` value: ``empty_file`` (no
    bytes), ``not_an_image`` (HTML, text, unknown bytes), ``unsupported_format`` (SVG,
    JPEG XL, a missing codec, a mode Pillow cannot open such as 3-channel float TIFF, a
    float image without one finite sample), ``too_large`` (over ``max_pixels``, or a
    metadata decompression bomb), ``truncated`` or ``corrupt`` (with the decoder's message).
    """
    if not data:
        raise RecordError(ErrorReason.EMPTY_FILE.value, "0 bytes")
    fmt = sniff_format(data) or sniff_by_extension(data, ext)
    if fmt in UNSUPPORTED_IMAGE_FORMATS:
        raise RecordError(ErrorReason.UNSUPPORTED_FORMAT.value,
                          f"{fmt.lower()}: {fmt} images are not rasterized")
    if fmt not in RASTER_FORMATS and fmt not in EXTENSION_FORMATS:
        what = f"looks like {fmt}" if fmt else "no known image signature"
        # The message never quotes the input's bytes (they may be a secret read by mistake).
        raise RecordError(ErrorReason.NOT_AN_IMAGE.value, f"{what} ({len(data)} bytes)")

    try:
        try:
            im = _open_header(data, fmt)
        except Image.DecompressionBombError:
            # Pillow refused the header itself (e.g. a GIF frame far larger than its
            # screen); read it again without Pillow's limit so our own check names WxH.
            with _pillow_limit_lifted():
                im = _open_header(data, fmt)
    except DECODE_ERRORS as exc:
        raise _record_error(exc, fmt, data) from exc

    with im:
        width, height = im.size
        if width * height > max_pixels:
            raise RecordError(ErrorReason.TOO_LARGE.value,
                              f"{width}x{height} ({width * height} pixels) exceeds "
                              f"max_pixels={max_pixels}")
        try:
            n_frames = _frame_count(im)
            if draft_min_side_px and isinstance(im, JpegImagePlugin.JpegImageFile):
                if min(width, height) >= 2 * draft_min_side_px:
                    # Pillow picks the largest scale s in {1,2,4,8} with s <= short // req,
                    # so ceil(short / s) >= draft_min_side_px.
                    im.draft(im.mode, (draft_min_side_px, draft_min_side_px))
            im.load()
            orientation = exif_orientation(im)
            pixels, has_alpha, flags = _to_rgb(im)
        except DECODE_ERRORS as exc:
            raise _record_error(exc, fmt, data) from exc
    # the Pillow image is closed (its pixels freed) before the orientation copy is made
    if orientation in _ORIENT_ARRAY:
        pixels = np.ascontiguousarray(_ORIENT_ARRAY[orientation](pixels))
        if orientation >= 5:
            width, height = height, width
    mime = MIME_TYPES.get(fmt) or Image.MIME.get(fmt, "application/octet-stream")
    is_animated = n_frames > 1 and fmt not in _NOT_ANIMATIONS and im.format not in _NOT_ANIMATIONS
    if fmt == "PNG" and is_animated:
        mime = "image/apng"
    return DecodedImage(pixels=pixels, width=width, height=height, format=fmt, mime=mime,
                        n_frames=n_frames, is_animated=is_animated, has_alpha=has_alpha,
                        flags=flags)


def decoded_size(data: bytes, draft_min_side_px: int | None = None,
                 ext: str | None = None) -> int:
    """Bytes of the (H, W, 3) uint8 array ``decode_image`` would make from ``data``,
    estimated from the header alone (no pixel is decoded): width * height * 3, with a
    JPEG's draft scale applied as ``decode_image`` applies it. 0 when the header cannot be
    read (decoding then fails with the real reason). ``ext``: as for ``decode_image``.
    Never raises."""
    fmt = (sniff_format(data) or sniff_by_extension(data, ext)) if data else None
    if fmt not in RASTER_FORMATS and fmt not in EXTENSION_FORMATS:
        return 0
    try:
        im = _open_header(data, fmt)
        with im:
            width, height = im.size
            is_jpeg = isinstance(im, JpegImagePlugin.JpegImageFile)
    except Exception:  # noqa: BLE001 - an estimate: decode_image reports the real error
        return 0
    scale = 1
    if draft_min_side_px and is_jpeg:
        while scale < 8 and min(width, height) // (2 * scale) >= draft_min_side_px:
            scale *= 2
    return -(-width // scale) * -(-height // scale) * 3


def _open_header(data: bytes, fmt: str) -> ImageFile.ImageFile:
    """Parse only the header with the plugin(s) for the sniffed ``fmt``; no pixels load.

    Calls the plugin factory directly (as ``Image.open`` does) but without
    ``Image.open``'s bomb check, so that our own ``max_pixels`` check runs first.
    """
    last_exc: Exception | None = None
    refusal = ""
    if fmt in _PLUGINS:  # HEIF or AVIF brand: pillow-heif's opener, registered on first use
        _register_heif()
    for name in _PLUGINS.get(fmt, (fmt,)):
        if name not in Image.OPEN:
            Image.init()
        entry = Image.OPEN.get(name)
        if entry is None:
            continue
        factory, accept = entry
        verdict = accept(data[:16]) if accept else True
        if isinstance(verdict, str):  # the plugin exists but its codec is missing
            refusal = verdict
            continue
        if not verdict:
            continue
        try:
            return factory(io.BytesIO(data), "")
        except (SyntaxError, IndexError, TypeError, struct.error) as exc:
            last_exc = exc  # Pillow's "not this format after all"; try the next plugin
    if last_exc is None:
        raise RecordError(ErrorReason.UNSUPPORTED_FORMAT.value,
                          f"{fmt}: no decoder available{': ' + refusal if refusal else ''}")
    raise last_exc


@contextlib.contextmanager
def _pillow_limit_lifted() -> Iterator[None]:
    """Disable ``Image.MAX_IMAGE_PIXELS`` while a header is re-read, then restore it.

    Only used after Pillow already refused a header; the lock keeps concurrent decodes in
    this process from restoring a wrong value. No pixels are decoded inside.
    """
    with _PIL_LIMIT_LOCK:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _frame_count(im: Image.Image) -> int:
    """Frames or pages in ``im``; leaves ``im`` on frame 0. Unreadable tails count as 1."""
    try:
        n = int(getattr(im, "n_frames", 1) or 1)
    except (EOFError, OSError, SyntaxError, ValueError, struct.error):
        n = 1
    if im.tell() != 0:
        try:
            im.seek(0)
        except EOFError:  # a PSD without layers: frame 1 is its only (composite) image
            pass
    return max(n, 1)


def exif_orientation(im: Image.Image) -> int:
    """EXIF Orientation 1..8 of a loaded image (PNG eXIf may follow IDAT); 1 if absent/bad."""
    try:
        value = int(im.getexif().get(_ORIENTATION_TAG, 1))
    except (SyntaxError, ValueError, OSError, struct.error, TypeError, IndexError, KeyError):
        return 1
    return value if value in _TRANSPOSE else 1


def _tiff_bits(im: Image.Image, default: int = 16) -> int:
    """BitsPerSample (TIFF tag 258) of a mode "I" TIFF; ``default`` for other sources."""
    tags = getattr(im, "tag_v2", None)
    bits = tags.get(258) if tags is not None else None
    if isinstance(bits, tuple):
        bits = bits[0] if bits else None
    return int(bits) if isinstance(bits, int) and 8 < bits <= 32 else default


def _int_samples(im: Image.Image) -> tuple[np.ndarray, int]:
    """Samples of a mode "I"/"I;16*" image and their declared depth in bits.

    Pillow reads an unsigned 32-bit TIFF (SampleFormat tag 339 = 1, its default) into
    signed mode "I"; those samples are reinterpreted as uint32 so 3e9 stays 3e9.
    """
    raw = np.asarray(im)
    if im.mode != "I":
        return raw, 16
    bits = _tiff_bits(im)
    tags = getattr(im, "tag_v2", None)
    if bits == 32 and tags is not None and raw.dtype == np.int32:
        fmt = tags.get(339, 1)
        if (fmt[0] if isinstance(fmt, tuple) and fmt else fmt) == 1:
            raw = raw.view(np.uint32)
    return raw, bits


def _to_rgb(im: Image.Image) -> tuple[np.ndarray, bool, tuple[str, ...]]:
    """Convert a loaded image of any mode to (H, W, 3) uint8 sRGB composited over white.

    Returns ``(pixels, has_alpha, flags)`` (per-mode rules and flags: module docstring).
    The colour part is first reduced to "L", "RGB" or "CMYK" (RGBA: its colour bands, read
    in place) so the embedded ICC profile can be applied to the channels it describes
    (LAB is already sRGB after littleCMS). An "RGB" colour part is not copied. Raises
    ``RecordError`` (``unsupported_format``) for a float image with no finite sample.
    """
    color, alpha, flags = _color_and_alpha(im)
    icc = im.info.get("icc_profile")
    if im.mode == "LAB" or color.mode == "RGB" and not icc:
        rgb = color
    elif color.mode == "RGBA":
        rgb = (icc_to_srgb(color.convert("RGB"), icc) if icc else None) or color
    else:
        rgb = icc_to_srgb(color, icc) or color.convert("RGB")
    return _pixels(rgb, alpha), alpha is not None, flags


def _pixels(rgb: Image.Image, alpha: np.ndarray | None) -> np.ndarray:
    """A new writable (H, W, 3) uint8 array of an "RGB" or "RGBA" image's colour bands,
    composited over white by ``alpha`` ((H, W) uint8) if given.

    Copied strip by strip (``STRIP_BYTES`` of the image each): Pillow's
    ``__array_interface__`` goes through ``tobytes`` (a second whole copy) and whole-image
    compositing makes (H, W, 3) temporaries, so a large image cost several times its
    array (finding 14 of round 3: a 9000x9000 RGB PNG of 258 KB peaked at 1.1 GB). Here
    the peak is Pillow's image (4 bytes per pixel) + the array (3) + one strip.
    """
    width, height = rgb.size
    out = np.empty((height, width, 3), np.uint8)
    step = max(1, STRIP_BYTES // max(1, 4 * width))
    for top in range(0, height, step):
        bottom = min(height, top + step)
        strip = np.asarray(rgb.crop((0, top, width, bottom)))[..., :3]
        if alpha is not None:
            strip = composite_over_white(strip, alpha[top:bottom])
        out[top:bottom] = strip
    return out


def _color_and_alpha(im: Image.Image) -> tuple[Image.Image, np.ndarray | None, tuple[str, ...]]:
    """Split ``im`` into a colour part ("L", "RGB" or "CMYK"), an (H, W) uint8 alpha or
    None (from an A band or ``info["transparency"]``), and the ``decode_flags``."""
    mode = im.mode
    trns = im.info.get("transparency")
    if mode == "I" or mode.startswith("I;16"):
        raw, bits = _int_samples(im)
        scaled, flags = int_to_uint8(raw, bits)
        alpha = np.where(raw == trns, 0, 255).astype(np.uint8) if isinstance(trns, int) else None
        return Image.fromarray(scaled), alpha, flags
    if mode == "F":
        try:
            scaled, flags = float_to_uint8(np.asarray(im))
        except ValueError as exc:
            raise RecordError(ErrorReason.UNSUPPORTED_FORMAT.value,
                              f"mode F (float) image: {exc}") from exc
        return Image.fromarray(scaled), None, flags
    if mode in ("1", "L"):
        color = im.convert("L")
        if isinstance(trns, int):
            key = (255 if trns else 0) if mode == "1" else trns
            return color, np.where(np.asarray(color) == key, 0, 255).astype(np.uint8), ()
        return color, None, ()
    if mode in ("LA", "La"):
        la = im.convert("LA")
        return la.getchannel("L"), np.asarray(la.getchannel("A")), ()
    if mode == "RGB":
        if isinstance(trns, tuple) and len(trns) >= 3:
            diff = np.asarray(im) != np.asarray(trns[:3], dtype=np.uint8)
            return im, np.where(diff.any(axis=2), 255, 0).astype(np.uint8), ()
        return im, None, ()
    if mode in ("P", "PA", "RGBA", "RGBa"):
        palette_alpha = mode == "P" and im.palette is not None and im.palette.mode == "RGBA"
        if mode == "P" and trns is None and not palette_alpha:
            return im.convert("RGB"), None, ()
        rgba = im if mode == "RGBA" else im.convert("RGBA")
        return rgba, np.asarray(rgba.getchannel("A")), ()   # colour bands read by _pixels
    if mode == "CMYK":  # Pillow already undid Adobe's inverted CMYK in the JPEG decoder
        return im, None, ()
    if mode == "LAB":
        return _lab_to_srgb(im), None, ()
    return im.convert("RGB"), None, ()  # RGBX (X dropped), YCbCr (BT.601), HSV


def _lab_to_srgb(im: Image.Image) -> Image.Image:
    """Pillow "LAB" (CIE L*a*b*, D50) to sRGB "RGB" with littleCMS, perceptual intent."""
    from PIL import ImageCms

    return ImageCms.profileToProfile(im, ImageCms.createProfile("LAB"),
                                     ImageCms.createProfile("sRGB"), outputMode="RGB")


def _png_header_dims(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG IHDR chunk (bytes 16..24), or None."""
    if len(data) >= 24 and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return None


def _record_error(exc: BaseException, fmt: str, data: bytes) -> RecordError:
    """Map a decoder exception to a ``RecordError`` keeping the decoder's own message."""
    text = str(exc) or type(exc).__name__
    message = f"{fmt}: {type(exc).__name__}: {text}"
    low = text.lower()
    if isinstance(exc, (Image.DecompressionBombError, MemoryError)) or any(
        hint in low for hint in _TOO_LARGE_HINTS
    ):
        dims = _png_header_dims(data) if fmt == "PNG" else None
        if dims is not None:
            message = (f"{dims[0]}x{dims[1]} in header, but data expands past Pillow's "
                       f"safety limit (decompression bomb): {message}")
        return RecordError(ErrorReason.TOO_LARGE.value, message)
    if isinstance(exc, EOFError) or any(hint in low for hint in _TRUNCATED_HINTS):
        return RecordError(ErrorReason.TRUNCATED.value, message)
    if any(hint in low for hint in _UNSUPPORTED_HINTS):
        return RecordError(ErrorReason.UNSUPPORTED_FORMAT.value, message)
    return RecordError(ErrorReason.CORRUPT.value, message)
