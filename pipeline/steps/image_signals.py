"""Measured image signals (no model): sharpness, brightness, contrast, clipped fraction.

All four are measured on one greyscale at a fixed analysis scale, so that images of
different resolutions, and JPEGs that ``DecodeStep`` decoded as a reduced draft, compare:

1. luma: ``cv2.cvtColor(RGB2GRAY)``, ITU-R BT.601 weights ``Y = 0.299 R + 0.587 G +
   0.114 B`` (OpenCV's, rounded to uint8);
2. the luma's shorter side is shrunk to ``signals.image.analysis_px`` with Pillow's
   antialiased Lanczos filter (never enlarged: an image whose shorter side is already
   smaller is measured as it is). The Laplacian's variance is dominated by the highest
   frequencies, which every resampling filter attenuates near its cut-off: measured on
   the bundled photos (analysis at 256 px), a full decode and a JPEG draft whose shorter
   side is >= 2x the analysis scale agree within 10% (mean 4%) with Lanczos, 20% (mean
   9%) with ``cv2.INTER_AREA``; a draft only 1-2x the scale reads ~25% (Lanczos) to ~45%
   (INTER_AREA) less sharp. So the assembler keeps JPEG drafts at least
   ``2 * analysis_px`` (``assembly._cpu_steps``);
3. ``sharpness``: variance of the Laplacian (``cv2.Laplacian``, 3x3 aperture, CV_64F) -
   the variance-of-Laplacian focus measure of Pech-Pacheco, Cristobal,
   Chamorro-Martinez and Fernandez-Valdivia, "Diatom autofocusing in brightfield
   microscopy: a comparative study", ICPR 2000; higher is sharper, 0 on a flat image;
   ``brightness``: mean luma (0..255); ``contrast``: standard deviation of the luma
   (RMS contrast, 0..127.5); ``clipped_fraction``: fraction of pixels with luma <= 5 or
   >= 250 (crushed shadows or blown highlights, 0..1).

Videos (rows with ``_frames``, a list of (H, W, 3) uint8 frames): each signal is the mean
over the sampled frames. Flat images are flagged by ``low_detail`` (``HashStep``), not here.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
from PIL import Image

from pipeline.columns import (
    BRIGHTNESS,
    CLIPPED_FRACTION,
    CONTRAST,
    FRAMES,
    PIXELS,
    SHARPNESS,
)
from pipeline.spec import ImageSignalsSpec, JobSpec
from pipeline.steps.base import RowStep

#: Luma at or below this, or at or above ``CLIP_HIGH``, counts as clipped (0..255).
CLIP_LOW, CLIP_HIGH = 5, 250


def analysis_luma(pixels: np.ndarray, analysis_px: int) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (h, w) uint8 BT.601 luma whose shorter side is
    ``min(analysis_px, min(H, W))`` (Pillow Lanczos, aspect ratio kept).
    Raises ``ValueError`` for anything but a non-empty (H, W, 3) uint8 array."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8 or not pixels.size:
        raise ValueError(f"expected (H, W, 3) uint8 pixels, got {pixels.shape} {pixels.dtype}")
    luma = cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
    h, w = luma.shape
    short = min(h, w)
    if short > analysis_px:
        scale = analysis_px / short
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        luma = np.asarray(Image.fromarray(luma).resize(size, Image.Resampling.LANCZOS))
    return luma


def image_signals(pixels: np.ndarray, analysis_px: int) -> dict[str, float]:
    """The four signals of one (H, W, 3) uint8 RGB image (module docstring), as floats:
    ``sharpness`` (luma units squared), ``brightness``, ``contrast`` (luma units 0..255),
    ``clipped_fraction`` (0..1). Raises ``ValueError`` on a malformed array."""
    luma = analysis_luma(pixels, analysis_px)
    mean, std = cv2.meanStdDev(luma)
    clipped = np.count_nonzero((luma <= CLIP_LOW) | (luma >= CLIP_HIGH))
    return {SHARPNESS: float(cv2.Laplacian(luma, cv2.CV_64F).var()),
            BRIGHTNESS: float(mean[0, 0]), CONTRAST: float(std[0, 0]),
            CLIPPED_FRACTION: clipped / luma.size}


class ImageSignalsStep(RowStep):
    """``_pixels`` (images) or ``_frames`` (videos: mean over the frames) -> ``sharpness``,
    ``brightness``, ``contrast``, ``clipped_fraction`` (float32 in the output). A row
    without pixels, or with malformed ones, becomes that row's error (``step_failed``)."""

    writes = (SHARPNESS, BRIGHTNESS, CONTRAST, CLIPPED_FRACTION)

    def __init__(self, spec: ImageSignalsSpec, video: bool = False):
        self.spec = spec
        self.video = video
        self.reads = (FRAMES,) if video else (PIXELS,)

    def settings(self) -> dict[str, Any]:
        return {"analysis_px": self.spec.analysis_px, "resample": "lanczos",
                "clip": [CLIP_LOW, CLIP_HIGH]}

    def process_row(self, batch, i):
        if not self.video:
            return image_signals(batch[PIXELS][i], self.spec.analysis_px)
        frames = batch[FRAMES][i]
        if not frames:
            raise ValueError("no sampled frames")
        per_frame = [image_signals(f, self.spec.analysis_px) for f in frames]
        return {col: float(np.mean([s[col] for s in per_frame])) for col in self.writes}


def image_signals_step(spec: JobSpec) -> ImageSignalsStep | None:
    """``assembly.STEP_FACTORIES`` entry: the step when ``signals.image.enabled``."""
    if not spec.signals.image.enabled:
        return None
    return ImageSignalsStep(spec.signals.image, video=spec.source.media == "video")
