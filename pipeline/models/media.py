"""Images decoded in the model actor (``decode.device: cuda``): entries -> a uint8 batch.

A request's ``pixels`` is then a list of n entries (``pipeline.media.device``):
``JpegInput`` (encoded JPEG), ``HostDecoded`` or a plain (h, w, 3) uint8 array (decoded
on the worker). ``MediaDecoder`` turns them into one (n, h, w, 3) uint8 tensor on the
actor's device:

* the ``JpegInput`` entries of the request go to batched nvJPEG calls
  (``torchvision.io.decode_jpeg(list, device="cuda")``, imported lazily; used only on a
  CUDA device when torchvision imports), one per run of at most ``DECODE_CHUNK_PIXELS``
  header pixels (usually the whole request); if a call raises, each of its images is
  retried alone to find the bad ones. Then the EXIF orientation is applied on the tensor (flips and
  ``rot90``, the transposes of ``PIL.ImageOps.exif_transpose``) and the image is resized
  and cropped as ``ImageGeometry`` says (``torch.nn.functional.interpolate``, bicubic or
  bilinear with antialiasing, rounded to uint8);
* a JPEG nvJPEG refused, or every JPEG when nvJPEG is unavailable (CPU device, no
  torchvision, a resampling filter other than bicubic/bilinear), is decoded with Pillow
  exactly as a ``cpu`` job's worker does (``decode_image`` with the worker's draft size,
  then ``model_input``), so that its pixels equal the ``cpu`` path's;
* a JPEG Pillow cannot decode either gets zero pixels and ``(error_reason, message)`` in
  the returned errors (the model step turns the row into an error row; the batch goes on);
* a ``JpegInput`` with a ``resize`` also gets its output image, made from the same
  decoded pixels (``media_output``: on the device; Pillow's ``ResizeStep`` code on the
  Pillow branch).

``stats()`` counts per image: ``media_device_decoded`` (nvJPEG), ``media_actor_cpu_decoded``
(Pillow in the actor, by reason: ``no_gpu``, ``no_torchvision``, ``resample_<n>``,
``nvjpeg_error``), ``media_worker_decoded`` (by the worker's reason, ``device_media``;
``host`` for a plain array), ``media_decode_errors`` (by error reason) and
``media_images_encoded`` (output images, by encoder: ``nvjpeg`` or ``pillow``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipeline.errors import RecordError
from pipeline.contracts import ImageGeometry
from pipeline.models.media_output import EncodeBatch, ImageEncoder, resize_chw, resize_output
from pipeline.models.torch_util import copy_stream, to_device_uint8
from pipeline.media.decode import decode_image
from pipeline.media.device import HostDecoded, JpegInput
from pipeline.media.transform import encode, resize_pixels
from pipeline.media.geometry import model_input, resized_size

log = logging.getLogger(__name__)

#: decode_batch(list of 1-D uint8 CPU tensors) -> list of (3 or 1, H, W) uint8 tensors
DecodeBatch = Callable[[list[torch.Tensor]], list[torch.Tensor]]

_INTERPOLATION = {3: "bicubic", 2: "bilinear"}  # PIL.Image.Resampling -> interpolate mode


#: Most pixels (width x height, from the headers) one nvJPEG call decodes: 128 MP, i.e.
#: 384 MiB of RGB uint8 output plus nvJPEG's own buffers, so that a coalesced batch of
#: large photos does not take the GPU memory the model needs. Each chunk is resized to
#: the model input (and the output image) before the next is decoded.
DECODE_CHUNK_PIXELS = 128 * 2**20


def chunks(jpegs: "dict[int, JpegInput]", max_pixels: int) -> list[list[int]]:
    """The rows of ``jpegs`` in order, cut into runs whose ``pixels`` sum to at most
    ``max_pixels`` (a run holds at least one row; unknown sizes count as 0)."""
    out: list[list[int]] = []
    total = max_pixels + 1
    for i, entry in jpegs.items():
        if total + entry.pixels > max_pixels and (not out or out[-1]):
            out.append([])
            total = 0
        out[-1].append(i)
        total += entry.pixels
    return out


def nvjpeg_decoder(device: str, geometry: ImageGeometry) -> tuple[DecodeBatch | None, str]:
    """``(decode_batch, "")`` with torchvision's nvJPEG on ``device``, or ``(None, why)``:
    ``no_gpu``, ``no_torchvision`` or ``resample_<n>`` (no matching torch filter)."""
    if not device.startswith("cuda"):
        return None, "no_gpu"
    if geometry.resample not in _INTERPOLATION:
        return None, f"resample_{geometry.resample}"
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except (ImportError, RuntimeError, OSError):  # absent, or built for another torch
        return None, "no_torchvision"

    def decode_batch(data: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))

    return decode_batch, ""


def orient(chw: torch.Tensor, orientation: int) -> torch.Tensor:
    """Apply EXIF ``orientation`` (1..8) to a (C, H, W) tensor, as Pillow's
    ``exif_transpose`` does (5..8 swap H and W); any other value leaves it as is."""
    hw = (-2, -1)
    if orientation == 2:
        return chw.flip(-1)
    if orientation == 3:
        return chw.flip(hw)
    if orientation == 4:
        return chw.flip(-2)
    if orientation == 5:
        return chw.transpose(-2, -1)
    if orientation == 6:
        return torch.rot90(chw, -1, hw)
    if orientation == 7:
        return chw.transpose(-2, -1).flip(hw)
    if orientation == 8:
        return torch.rot90(chw, 1, hw)
    return chw


def fit(chw: torch.Tensor, geometry: ImageGeometry) -> torch.Tensor:
    """A (3, H, W) uint8 image -> the model's (height_px, width_px, 3) uint8 input on the
    same device: resized (antialiased, filter from ``geometry.resample``) and centre-cropped
    like ``steps.model_input.model_input``."""
    _, h, w = chw.shape
    gh, gw = geometry.height_px, geometry.width_px
    nw, nh = resized_size(w, h, geometry) if geometry.mode == "center_crop" else (gw, gh)
    if (nh, nw) != (h, w):
        chw = resize_chw(chw, nh, nw, _INTERPOLATION.get(geometry.resample, "bicubic"))
    top, left = (nh - gh) // 2, (nw - gw) // 2
    return chw[:, top:top + gh, left:left + gw].permute(1, 2, 0)


@dataclasses.dataclass
class MediaBatch:
    """What ``MediaDecoder`` makes of n entries. ``pixels``: (n, height_px, width_px, 3)
    uint8 on the device; ``errors``: n values, None or ``(error_reason, message)``;
    ``images``: n values, None or ``(image bytes, width, height)`` for a ``JpegInput``
    with a ``resize``."""

    pixels: torch.Tensor
    errors: list
    images: list


class MediaDecoder:
    """``decoder(entries) -> MediaBatch``: see the module docstring. ``decode_batch`` and
    ``encode_batch`` replace nvJPEG (tests); defaults: ``nvjpeg_decoder`` and
    ``media_output.nvjpeg_encoder``. Raises ``TypeError`` for an entry of another type."""

    def __init__(self, geometry: ImageGeometry, device: str,
                 decode_batch: DecodeBatch | None = None,
                 encode_batch: EncodeBatch | None = None):
        self.geometry, self.device = geometry, device
        self.chunk_pixels = DECODE_CHUNK_PIXELS
        self.decode_batch, self.unavailable = ((decode_batch, "") if decode_batch is not None
                                               else nvjpeg_decoder(device, geometry))
        self.encoder = ImageEncoder(device, encode_batch)
        self._lock = threading.Lock()
        self._device_decoded, self._warned = 0, False
        self._counts = {k: collections.Counter() for k in (
            "media_actor_cpu_decoded", "media_worker_decoded", "media_decode_errors",
            "media_images_encoded")}

    def __call__(self, entries: list[Any]) -> MediaBatch:
        host: dict[int, np.ndarray] = {}
        for i, entry in enumerate(entries):
            if isinstance(entry, HostDecoded):
                host[i] = entry.pixels
                self._count("media_worker_decoded", entry.reason)
            elif isinstance(entry, np.ndarray):
                host[i] = entry
                self._count("media_worker_decoded", "host")
            elif not isinstance(entry, JpegInput):
                raise TypeError(f"pixels entry {i}: {type(entry).__name__} is not an array, "
                                "HostDecoded or JpegInput")
        jpeg = [i for i, e in enumerate(entries) if isinstance(e, JpegInput)]
        if jpeg and self.decode_batch is None and self.device.startswith("cuda"):
            self._warn_once()
        out = MediaBatch(None, [None] * len(entries), [None] * len(entries))
        with self._side_stream():
            on_device = self._on_device({i: entries[i] for i in jpeg}, out.images)
            for i in jpeg:
                if i not in on_device:
                    host[i] = self._on_host(entries[i], i, out)
            out.pixels = self._assemble(len(entries), host, on_device)
        return out

    def stats(self) -> dict[str, Any]:
        """The counters of the module docstring (a snapshot)."""
        with self._lock:
            return {"media_device_decoded": self._device_decoded,
                    **{k: dict(v) for k, v in self._counts.items()}}

    def _warn_once(self) -> None:
        """Log once that JPEGs sent for nvJPEG are decoded by Pillow in this actor."""
        if not self._warned:
            self._warned = True
            log.warning("decode.device is cuda but nvJPEG is unavailable here (%s): JPEGs "
                        "are decoded with Pillow in this model actor", self.unavailable)

    def _count(self, key: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key][reason] += n

    def _side_stream(self):
        """On CUDA, this thread's copy stream (the compute thread waits for it through
        ``torch_util.copies_done``); else nothing."""
        stream = copy_stream(self.device)
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def _on_device(self, jpegs: dict[int, JpegInput], images: list) -> dict[int, torch.Tensor]:
        """Row -> its (h, w, 3) uint8 input decoded by ``decode_batch`` (and ``images[row]``
        made from the same pixels); rows it refused (and all of them when it is
        unavailable) are left out."""
        if not jpegs or self.decode_batch is None:
            return {}
        out, resized = {}, collections.defaultdict(dict)
        for rows in chunks(jpegs, self.chunk_pixels):
            with warnings.catch_warnings():  # read-only bytes; decode_jpeg never writes them
                warnings.simplefilter("ignore", UserWarning)
                data = [torch.frombuffer(jpegs[i].data, dtype=torch.uint8) for i in rows]
            for i, chw in zip(rows, self._decode_all(data)):
                if chw is None:
                    continue
                chw = orient(chw.expand(3, -1, -1) if chw.shape[0] == 1 else chw,
                             jpegs[i].orientation)
                out[i] = fit(chw, self.geometry)
                if jpegs[i].resize is not None:
                    resized[jpegs[i].resize][i] = resize_output(chw, jpegs[i].resize)
            del data  # the chunk's full-size images go with the loop variables
        for spec, by_row in resized.items():
            encoded, how = self.encoder(list(by_row.values()), spec)
            self._count("media_images_encoded", how, len(encoded))
            for (i, chw), data_i in zip(by_row.items(), encoded):
                images[i] = (data_i, int(chw.shape[2]), int(chw.shape[1]))
        with self._lock:
            self._device_decoded += len(out)
        return out

    def _decode_all(self, data: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """One batched call; if it raises, one call per image (None where that raises)."""
        try:
            return self.decode_batch(data)
        except (RuntimeError, ValueError):
            pass
        out: list[torch.Tensor | None] = []
        for one in data:
            try:
                out.append(self.decode_batch([one])[0])
            except (RuntimeError, ValueError):
                out.append(None)
        return out

    def _on_host(self, entry: JpegInput, i: int, out: MediaBatch) -> np.ndarray:
        """Row ``i``'s input (and ``out.images[i]``) made with Pillow exactly as a ``cpu``
        job's worker does; zeros and ``out.errors[i]`` if the image does not decode."""
        self._count("media_actor_cpu_decoded", self.unavailable or "nvjpeg_error")
        try:
            pixels = decode_image(entry.data, max_pixels=entry.max_pixels,
                                  draft_min_side_px=entry.draft_min_side_px).pixels
        except RecordError as exc:
            out.errors[i] = (exc.reason.value, exc.message)
            self._count("media_decode_errors", exc.reason.value)
            return np.zeros((self.geometry.height_px, self.geometry.width_px, 3), np.uint8)
        if entry.resize is not None:
            img = resize_pixels(pixels, entry.resize)
            out.images[i] = (encode(img, entry.resize), img.width, img.height)
            self._count("media_images_encoded", "pillow")
        return model_input(pixels, self.geometry)

    def _assemble(self, n: int, host: dict[int, np.ndarray],
                  on_device: dict[int, torch.Tensor]) -> torch.Tensor:
        """Host arrays (one pinned, non-blocking copy) and device tensors, in row order."""
        if not on_device:
            return to_device_uint8(np.stack([host[i] for i in range(n)]), self.device)
        out = torch.empty((n, self.geometry.height_px, self.geometry.width_px, 3),
                          dtype=torch.uint8, device=self.device)
        if host:
            rows = sorted(host)
            out[rows] = to_device_uint8(np.stack([host[i] for i in rows]), self.device)
        rows = sorted(on_device)
        out[rows] = torch.stack([on_device[i] for i in rows])
        if self.device.startswith("cuda"):  # made on the copy stream, used on the default one
            out.record_stream(torch.cuda.default_stream(self.device))
        return out
