"""Model inputs made once per record on the CPU side, and the filter on model scores.

``ModelInputStep`` turns the decoded ``_pixels`` (before ``ResizeStep`` drops them) into
each served model's input: an (H, W, 3) uint8 RGB array per geometry, resized (and
centre-cropped) like the model's own image processor does, in an internal column named
by ``ImageGeometry.column``. The worker stacks these into (n, H, W, 3) uint8 batches; the
model actor rescales and normalises them on its device. Nothing is decoded twice. With
``decode.device: cuda`` the image-embedding input of a JPEG the model actor can decode is
that JPEG instead (``media/device.py``), chosen by ``DecodeStep``.

``ScoreFilterStep`` is the LAION filter: rows whose ``clip_score`` is below
``min_clip_score`` get ``status="rejected"``, ``reject_reason="low_clip_score"``; their
re-encoded ``image`` is dropped like that of every other rejected row. Rows without a
score (no caption) pass.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pipeline.columns import (CLIP_SCORE, DEVICE_INPUT, FRAMES, IMAGE, IMAGE_HEIGHT,
                              IMAGE_WIDTH, PIXELS)
from pipeline.records import RejectReason
from pipeline.steps.base import Filter, RowStep
from pipeline.media.device import HostDecoded, JpegInput
from pipeline.media.geometry import model_input

if TYPE_CHECKING:  # steps do not import models at run time (import direction)
    from pipeline.contracts import ImageGeometry


class ModelInputStep(RowStep):
    """``_pixels`` -> one model-input column per distinct geometry, for ``ok`` rows: an
    (h, w, 3) uint8 array per image; for a video (``_frames``) an (F, h, w, 3) uint8 stack
    of its F sampled frames.

    With ``decode.device: cuda`` (a ``_device_input`` column) an image row's entry is its
    ``device_media.JpegInput`` (decoded in the model actor) or a ``HostDecoded`` (the
    array above and why it was decoded here).
    """

    def __init__(self, geometries: "list[ImageGeometry]"):
        self.geometries = sorted(set(geometries), key=lambda g: g.column)
        self.writes = tuple(g.column for g in self.geometries)

    def process_row(self, batch, i):
        pixels, device = batch.get(PIXELS), batch.get(DEVICE_INPUT)
        if device is not None and isinstance(device[i], JpegInput):
            return {g.column: device[i] for g in self.geometries}
        if device is not None and device[i] is not None:
            return {g.column: HostDecoded(model_input(pixels[i], g), device[i])
                    for g in self.geometries}
        if pixels is not None and pixels[i] is not None:
            return {g.column: model_input(pixels[i], g) for g in self.geometries}
        frames = batch[FRAMES][i]
        return {g.column: np.stack([model_input(f, g) for f in frames]) for g in self.geometries}


class ScoreFilterStep(Filter):
    """Rejects ``ok`` rows with ``clip_score < min_clip_score`` (``low_clip_score``)."""

    dropped = (IMAGE, IMAGE_WIDTH, IMAGE_HEIGHT)

    reads = (CLIP_SCORE,)

    def __init__(self, min_clip_score: float):
        super().__init__()
        self.min_clip_score = min_clip_score

    def settings(self):
        return {"min_clip_score": self.min_clip_score}

    def reject_reason(self, batch, i):
        score = batch[CLIP_SCORE][i]
        if score is None or math.isnan(score) or score >= self.min_clip_score:
            return None
        return RejectReason.LOW_CLIP_SCORE
