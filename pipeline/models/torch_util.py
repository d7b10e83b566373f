"""Torch helpers shared by the backends: device and dtype choice, uint8 images to the device.

Imported only by backends (torch is heavy: nothing imports this at module load of the
package). Layout conventions: host pixels are (n, H, W, 3) uint8 RGB; device pixels are
(n, 3, H, W) in the model's dtype, rescaled and normalised on the device.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import torch

_local = threading.local()


def pick_device(num_gpus: float) -> str:
    """``cuda`` when the actor was given a GPU share and CUDA is available, else ``cpu``."""
    return "cuda" if num_gpus > 0 and torch.cuda.is_available() else "cpu"


def pick_dtype(name: str, device: str) -> torch.dtype:
    """``auto``: bfloat16 on a GPU that supports it, else float16 on GPU; float32 on CPU."""
    if name == "auto":
        if not device.startswith("cuda"):
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[name]


def copy_stream(device: str):
    """A per-thread side CUDA stream for host-to-device copies (None on CPU)."""
    if not device.startswith("cuda"):
        return None
    stream = getattr(_local, "stream", None)
    if stream is None:
        stream = _local.stream = torch.cuda.Stream(device=device)
    return stream


def to_device(host: torch.Tensor, device: str) -> torch.Tensor:
    """A host tensor on ``device``: on CUDA copied once into pinned memory and sent with a
    non-blocking copy on this thread's side stream; call ``copies_done`` after the copies
    and ``wait_for`` on the compute thread before using the result."""
    if not device.startswith("cuda"):
        return host
    pinned = host.pin_memory()
    with torch.cuda.stream(copy_stream(device)):
        out = pinned.to(device, non_blocking=True)
    out.record_stream(torch.cuda.default_stream(device))  # the compute thread's stream
    return out


def to_device_uint8(pixels: np.ndarray, device: str) -> torch.Tensor:
    """(n, H, W, 3) uint8 host array -> uint8 tensor on ``device`` (see ``to_device``)."""
    with warnings.catch_warnings():  # arrays from Ray's object store are read-only; never written
        warnings.simplefilter("ignore", UserWarning)
        host = torch.from_numpy(np.ascontiguousarray(pixels))
    return to_device(host, device)


def copies_done(device: str):
    """A CUDA event marking the end of this thread's pending copies (None on CPU)."""
    if not device.startswith("cuda"):
        return None
    event = torch.cuda.Event()
    event.record(copy_stream(device))
    return event


def wait_for(event) -> None:
    """Make the current stream wait for ``event`` (from ``copies_done``) without blocking."""
    if event is not None:
        torch.cuda.current_stream().wait_event(event)


class ImageNormalizer:
    """uint8 (n, H, W, 3) on the device -> (n, 3, H', W') float in ``dtype``:
    ``(x * rescale - mean) / std``, resized on the device (bicubic, antialiased) only if the
    shipped size differs from the model's ``size_hw``."""

    def __init__(self, mean, std, rescale: float, size_hw: tuple[int, int], device: str,
                 dtype: torch.dtype, normalize: bool = True):
        self.mean = torch.tensor(mean if normalize else (0.0, 0.0, 0.0),
                                 dtype=torch.float32, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std if normalize else (1.0, 1.0, 1.0),
                                dtype=torch.float32, device=device).view(1, 3, 1, 1)
        self.rescale, self.size_hw, self.dtype = rescale, tuple(size_hw), dtype

    def __call__(self, pixels_u8: torch.Tensor) -> torch.Tensor:
        x = pixels_u8.permute(0, 3, 1, 2).to(torch.float32)
        if tuple(x.shape[-2:]) != self.size_hw:
            x = torch.nn.functional.interpolate(x, size=self.size_hw, mode="bicubic",
                                                antialias=True, align_corners=False)
        x = (x * self.rescale - self.mean) / self.std
        return x.to(self.dtype)


def normalizer_for(image_processor, size_hw: tuple[int, int], device: str,
                   dtype: torch.dtype) -> ImageNormalizer:
    """An ``ImageNormalizer`` with a Hugging Face image processor's mean, std and rescale."""
    return ImageNormalizer(image_processor.image_mean, image_processor.image_std,
                           float(getattr(image_processor, "rescale_factor", 1 / 255) or 1 / 255),
                           size_hw, device, dtype,
                           normalize=bool(getattr(image_processor, "do_normalize", True)))


def geometry_from_processor(image_processor, fallback_px: int = 224):
    """The CPU-side ``ImageGeometry`` that reproduces a HF image processor's resize/crop."""
    from pipeline.contracts import ImageGeometry

    size = _as_dict(getattr(image_processor, "size", None))
    crop = _as_dict(getattr(image_processor, "crop_size", None))
    resample = int(getattr(image_processor, "resample", 3) or 3)
    if getattr(image_processor, "do_center_crop", False) and crop.get("height"):
        edge = size.get("shortest_edge") or min(crop["height"], crop["width"])
        return ImageGeometry("center_crop", crop["height"], crop["width"], edge, resample)
    crop_pct, edge = getattr(image_processor, "crop_pct", None), size.get("shortest_edge")
    if crop_pct and edge and edge < 384 and type(image_processor).__name__.startswith("ConvNext"):
        # ConvNeXt: shorter side to int(edge / crop_pct), centre crop edge x edge; from 384
        # px up it warps to edge x edge (transformers ConvNextImageProcessor.resize)
        return ImageGeometry("center_crop", edge, edge, int(edge / crop_pct), resample)
    if size.get("height") and size.get("width"):
        return ImageGeometry("squash", size["height"], size["width"], 0, resample)
    edge = size.get("shortest_edge") or fallback_px
    return ImageGeometry("squash", edge, edge, 0, resample)


def _as_dict(size) -> dict:
    if size is None:
        return {}
    if isinstance(size, dict):
        return {k: v for k, v in size.items() if v is not None}
    return {k: v for k, v in vars(size).items() if v is not None} if hasattr(size, "__dict__") \
        else {k: getattr(size, k) for k in ("height", "width", "shortest_edge")
              if getattr(size, k, None) is not None}


def l2_normalize(x: torch.Tensor) -> np.ndarray:
    """Rows of ``x`` in float32, L2-normalised, as a host array."""
    x = x.float()
    return torch.nn.functional.normalize(x, dim=-1).detach().cpu().numpy()
