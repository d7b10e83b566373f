"""Model inputs made once per record on the CPU side, and the filter on model scores.

``ModelInputStep`` turns the decoded ``_pixels`` (before ``ResizeStep`` drops them) into
each served model's input: an (H, W, 3) uint8 RGB array per geometry, resized (and
centre-cropped) like the model's own image processor does, in an internal column named
by ``ImageGeometry.column``. The worker stacks these into (n, H, W, 3) uint8 batches; the
model actor rescales and normalises them on its device. Nothing is decoded twice.

``ScoreFilterStep`` is the LAION filter: rows whose ``clip_score`` is below
``min_clip_score`` get ``status="rejected"``, ``reject_reason="low_clip_score"``; their
re-encoded ``image`` is dropped like that of every other rejected row. Rows without a
score (no caption) pass.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from pipeline.records import (CLIP_SCORE, FRAMES, IMAGE, PIXELS, REJECT_REASON, STATUS, Batch,
                              RejectReason, Status)
from pipeline.steps.base import RowStep, Step

if TYPE_CHECKING:  # steps do not import models at run time (import direction)
    from pipeline.models.base import ImageGeometry


def model_input(pixels: np.ndarray, geometry: "ImageGeometry") -> np.ndarray:
    """(H, W, 3) uint8 -> the model's (height_px, width_px, 3) uint8 input.

    ``center_crop``: shorter side to ``shortest_edge_px`` (aspect kept), then a centre crop;
    ``squash``: straight to height x width. Resampling filter: ``geometry.resample``.
    """
    img = Image.fromarray(pixels)
    w, h = img.size
    if geometry.mode == "center_crop":
        edge = geometry.shortest_edge_px
        # the long side truncates, as Hugging Face image processors (and torchvision) do
        size = (edge, max(1, int(edge * h / w))) if w <= h else (max(1, int(edge * w / h)), edge)
        if size != img.size:
            img = img.resize(size, geometry.resample)
        left = (img.width - geometry.width_px) // 2
        top = (img.height - geometry.height_px) // 2
        img = img.crop((left, top, left + geometry.width_px, top + geometry.height_px))
    elif img.size != (geometry.width_px, geometry.height_px):
        img = img.resize((geometry.width_px, geometry.height_px), geometry.resample)
    return np.asarray(img, dtype=np.uint8)


class ModelInputStep(RowStep):
    """``_pixels`` -> one model-input column per distinct geometry, for ``ok`` rows: an
    (h, w, 3) uint8 array per image; for a video (``_frames``) an (F, h, w, 3) uint8 stack
    of its F sampled frames."""

    def __init__(self, geometries: "list[ImageGeometry]"):
        self.geometries = sorted(set(geometries), key=lambda g: g.column)
        self.outputs = tuple(g.column for g in self.geometries)

    def process_row(self, batch, i):
        pixels = batch.get(PIXELS)
        if pixels is not None and pixels[i] is not None:
            return {g.column: model_input(pixels[i], g) for g in self.geometries}
        frames = batch[FRAMES][i]
        return {g.column: np.stack([model_input(f, g) for f in frames]) for g in self.geometries}


class ScoreFilterStep(Step):
    """Rejects ``ok`` rows with ``clip_score < min_clip_score`` (``low_clip_score``)."""

    dropped = (IMAGE, "image_width", "image_height")

    def __init__(self, min_clip_score: float):
        self.min_clip_score = min_clip_score

    def __call__(self, batch: Batch) -> Batch:
        n = len(batch[STATUS])
        scores = batch.get(CLIP_SCORE, [None] * n)
        for i in range(n):
            score = scores[i]
            if batch[STATUS][i] != Status.OK.value or score is None or math.isnan(score):
                continue
            if score < self.min_clip_score:
                batch[STATUS][i] = Status.REJECTED.value
                batch[REJECT_REASON][i] = RejectReason.LOW_CLIP_SCORE.value
                for col in self.dropped:
                    if col in batch:
                        batch[col][i] = None
        return batch
