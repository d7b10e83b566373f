"""What a worker sends a model actor for one image when ``decode.device`` is ``cuda``.

Pure: no Ray, no torch, no I/O (``pipeline.models.media`` imports this module to read the
entries). With ``decode.device: cuda`` the model-input column of an image row holds one of:

* ``JpegInput``: the encoded JPEG, sent as is and decoded in the model actor (nvJPEG on a
  GPU; Pillow there, as a worker would, when nvJPEG is unavailable or refuses it). Chosen by
  ``device_input`` from the header alone: the bytes sniff as JPEG, the mode is "RGB" or
  "L", the ICC profile (if any) is one with which the worker's colour management moves
  no colour by more than 1 of 255 (sRGB; the device path does no colour management), no
  Adobe marker says the samples are plain RGB (nvJPEG would convert them as YCbCr), and
  ``width * height <= max_pixels``. The worker decodes such a row only as a JPEG draft of
  ``PHASH_DRAFT_PX`` (for ``phash``, the size filter and the decode checks); the actor
  also makes its output ``image`` (resized per ``resize``, re-encoded) and returns it in
  ``MEDIA_IMAGES``.
* ``HostDecoded``: anything else, decoded on the worker like a ``cpu`` job; ``reason``
  says why it was not sent encoded (``not_jpeg``, ``mode_cmyk``, ``icc_profile``, ...) and
  the actor counts it.

A model actor that cannot decode a row returns ``(error_reason, message)`` for it in the
``MEDIA_ERRORS`` output (None for every other row); the model step marks that row
``status="error"``.
"""

from __future__ import annotations

import dataclasses
import functools
import io

import numpy as np
from PIL import Image, JpegImagePlugin

from pipeline.spec import ResizeSpec
# decode.py's helpers: both paths read headers the same way
from pipeline.media.decode import DECODE_ERRORS, DEFAULT_MAX_PIXELS, exif_orientation, sniff_format
from pipeline.media.imageio_util import icc_to_srgb

__all__ = ["MEDIA_ERRORS", "MEDIA_IMAGES", "PHASH_DRAFT_PX", "HostDecoded", "JpegInput",
           "device_input"]

#: Output key of a model actor: per row None, or ``(error_reason, message)`` (ErrorReason
#: value, text) for an image it could not decode.
MEDIA_ERRORS = "media_errors"
#: Output key of a model actor: per row None, or ``(image, image_width, image_height)``
#: (encoded bytes, pixels) made from a ``JpegInput`` with a ``resize``.
MEDIA_IMAGES = "media_images"
#: Smallest shorter side (pixels) of the JPEG draft a worker decodes a ``JpegInput`` row
#: to: imagehash's pHash works on a 32 x 32 reduction.
PHASH_DRAFT_PX = 32

_DEVICE_MODES = ("RGB", "L")


@dataclasses.dataclass(frozen=True)
class JpegInput:
    """An encoded JPEG to decode in the model actor.

    ``data``: the file's bytes. ``orientation``: EXIF Orientation 1..8 from the header
    (1: upright). ``max_pixels``/``draft_min_side_px``: the job's ``decode.max_pixels``
    and the JPEG draft size a ``cpu`` job's worker uses, used when the actor decodes it
    with Pillow, so that the result equals a ``cpu`` job's. ``resize``: the job's
    ``resize`` section; the actor returns the output image made with it (None: no image).
    ``pixels``: width x height from the header (0: unknown); the actor bounds the pixels
    it decodes at once by it.
    """

    data: bytes
    orientation: int = 1
    max_pixels: int = DEFAULT_MAX_PIXELS
    draft_min_side_px: int | None = None
    resize: ResizeSpec | None = None
    pixels: int = 0


@dataclasses.dataclass(frozen=True)
class HostDecoded:
    """A model input decoded on the worker: ``pixels`` (h, w, 3) uint8 RGB at the model's
    geometry; ``reason``: why it was not sent encoded."""

    pixels: np.ndarray
    reason: str


def device_input(data: bytes, max_pixels: int, draft_min_side_px: int | None = None,
                 resize: ResizeSpec | None = None) -> JpegInput | str:
    """A ``JpegInput`` for ``data`` if the device path can decode it (module docstring),
    else the reason it cannot: ``not_jpeg``, ``header_error``, ``too_large``,
    ``mode_<mode>`` (lower case, e.g. ``mode_cmyk``), ``icc_profile`` or ``adobe_rgb``.
    Reads the header only; never raises."""
    if sniff_format(data) != "JPEG":
        return "not_jpeg"
    try:
        im = JpegImagePlugin.JpegImageFile(io.BytesIO(data))
    except DECODE_ERRORS:  # the worker's decoder reports the real error
        return "header_error"
    with im:
        width, height = im.size
        if width * height > max_pixels:
            return "too_large"
        if im.mode not in _DEVICE_MODES:
            return f"mode_{im.mode.lower()}"
        if not _icc_is_identity(im.info.get("icc_profile"), im.mode):
            return "icc_profile"
        if "adobe" in im.info and im.info.get("adobe_transform") == 0 and im.mode == "RGB":
            return "adobe_rgb"
        orientation = exif_orientation(im)
    return JpegInput(data, orientation, max_pixels, draft_min_side_px, resize, width * height)


@functools.lru_cache(maxsize=64)
def _icc_is_identity(icc: bytes | None, mode: str) -> bool:
    """True when the worker's colour management (``imageio_util.icc_to_srgb``, as
    ``decode_image`` applies it) moves no colour of a probe of ``mode`` ("RGB": a cube of
    35 levels per channel; "L": all 256 greys) by more than 1 of 255 (littleCMS rounding
    moves a few by 1 from sRGB to sRGB): no profile, an sRGB profile, or one the worker
    ignores (broken, wrong colour space)."""
    if not icc:
        return True
    levels = np.linspace(0, 255, 35 if mode == "RGB" else 256).round().astype(np.uint8)
    if mode == "RGB":
        probe = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1)
        probe = probe.reshape(len(levels), -1, 3)
    else:
        probe = levels.reshape(16, 16)
    converted = icc_to_srgb(Image.fromarray(probe, mode), icc)
    if converted is None:
        return True
    want = probe if mode == "RGB" else np.repeat(probe[..., None], 3, axis=2)
    return int(np.abs(np.asarray(converted, dtype=np.int16) - want).max()) <= 1
