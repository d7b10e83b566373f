"""Model-input geometry: an (H, W, 3) uint8 image resized (and centre-cropped) the way a
model's own image processor does, as ``ImageGeometry`` (``pipeline.contracts``) says.

Pure: arrays in, arrays out (Pillow resampling); used by ``steps.model_input`` on the
workers and by ``models.media`` in the actor.
"""

from __future__ import annotations
import numpy as np
from PIL import Image
from pipeline.contracts import ImageGeometry


def model_input(pixels: np.ndarray, geometry: "ImageGeometry") -> np.ndarray:
    """(H, W, 3) uint8 -> the model's (height_px, width_px, 3) uint8 input.

    ``center_crop``: shorter side to ``shortest_edge_px`` (aspect kept), then a centre crop;
    ``squash``: straight to height x width. Resampling filter: ``geometry.resample``.
    """
    img = Image.fromarray(pixels)
    if geometry.mode == "center_crop":
        size = resized_size(img.width, img.height, geometry)
        if size != img.size:
            img = img.resize(size, geometry.resample)
        left = (img.width - geometry.width_px) // 2
        top = (img.height - geometry.height_px) // 2
        img = img.crop((left, top, left + geometry.width_px, top + geometry.height_px))
    elif img.size != (geometry.width_px, geometry.height_px):
        img = img.resize((geometry.width_px, geometry.height_px), geometry.resample)
    return np.asarray(img, dtype=np.uint8)


def resized_size(w: int, h: int, geometry: "ImageGeometry") -> tuple[int, int]:
    """(width, height) in pixels a w x h image is resized to before the centre crop of a
    ``center_crop`` geometry: the shorter side to ``shortest_edge_px``, the longer one
    truncated, as Hugging Face image processors (and torchvision) do."""
    edge = geometry.shortest_edge_px
    return (edge, max(1, int(edge * h / w))) if w <= h else (max(1, int(edge * w / h)), edge)
