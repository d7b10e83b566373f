"""Output images made in the model actor from the JPEGs it decodes (``decode.device: cuda``).

A worker of a ``cpu`` job makes a row's ``image`` with ``steps.image.ResizeStep``; for a
``JpegInput`` the actor makes it from the pixels it decoded, the same way:
``resize_output`` resizes a (3, H, W) uint8 tensor on its device to
``steps.image.target_size`` (bicubic, antialiased) and centre-crops like
``resize_pixels``; ``ImageEncoder`` encodes a list of them as ``resize.encode_format``:
JPEG in one batched nvJPEG call (``torchvision.io.encode_jpeg``, imported lazily) on a CUDA
device when torchvision imports, else - and for WebP, or when nvJPEG raises - with Pillow
as ``ResizeStep`` does (``steps.image.encode``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from pipeline.spec import ResizeSpec
from pipeline.media.transform import encode, target_size

#: encode_batch(list of (3, H, W) uint8 device tensors, quality) -> list of 1-D uint8 tensors
EncodeBatch = Callable[[list[torch.Tensor], int], list[torch.Tensor]]


def nvjpeg_encoder(device: str) -> EncodeBatch | None:
    """torchvision's batched JPEG encoder on a CUDA ``device``, or None without one."""
    if not device.startswith("cuda"):
        return None
    try:
        from torchvision.io import encode_jpeg
    except (ImportError, RuntimeError, OSError):  # absent, or built for another torch
        return None
    return lambda images, quality: list(encode_jpeg(images, quality=quality))


def resize_chw(chw: torch.Tensor, height: int, width: int, mode: str = "bicubic") -> torch.Tensor:
    """A (C, H, W) uint8 tensor resized to (C, ``height``, ``width``) uint8 on its device:
    ``torch.nn.functional.interpolate`` (``mode``: ``bicubic`` or ``bilinear``) with
    antialiasing, as Pillow filters when reducing, rounded and clamped to 0..255."""
    return torch.nn.functional.interpolate(
        chw.unsqueeze(0).float(), size=(height, width), mode=mode, antialias=True,
        align_corners=False).round_().clamp_(0, 255).to(torch.uint8)[0]


def resize_output(chw: torch.Tensor, spec: ResizeSpec) -> torch.Tensor:
    """A (3, H, W) uint8 image -> (3, h, w) uint8 resized per ``spec`` on its device
    (size from ``target_size``; ``center_crop``: then a centred square of at most
    ``size_px``), as ``steps.image.resize_pixels`` does with Pillow."""
    _, h, w = chw.shape
    tw, th = target_size(w, h, spec)
    if (th, tw) != (h, w):
        chw = resize_chw(chw, th, tw)
    if spec.mode == "center_crop":
        side = min(tw, th, spec.size_px)
        top, left = (th - side) // 2, (tw - side) // 2
        chw = chw[:, top:top + side, left:left + side]
    return chw


class ImageEncoder:
    """``encoder(images, spec) -> (list of bytes, how)``: ``images`` (3, h, w) uint8
    tensors, encoded per ``spec`` (module docstring); ``how`` is ``nvjpeg`` or
    ``pillow``. ``encode_batch`` replaces nvJPEG (tests); default ``nvjpeg_encoder``."""

    def __init__(self, device: str, encode_batch: EncodeBatch | None = None):
        self.encode_batch = encode_batch if encode_batch is not None else nvjpeg_encoder(device)

    def __call__(self, images: list[torch.Tensor], spec: ResizeSpec) -> tuple[list[bytes], str]:
        if spec.encode_format == "jpeg" and self.encode_batch is not None:
            try:
                encoded = self.encode_batch([t.contiguous() for t in images], spec.quality)
                return [t.cpu().numpy().tobytes() for t in encoded], "nvjpeg"
            except (RuntimeError, ValueError):
                pass  # Pillow below
        hwc = [np.ascontiguousarray(t.permute(1, 2, 0).cpu().numpy()) for t in images]
        return [encode(Image.fromarray(a), spec) for a in hwc], "pillow"
