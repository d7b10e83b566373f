"""The one contract every model backend follows (no Ray, no torch at import time).

A backend is a callable class. ``__init__`` loads the weights once (in a ``ModelActor``,
or in-process for tests and plain loops); ``info`` says what it needs and what it gives;
``prepare(inputs)`` does the host-side work of a batch (copy to pinned memory, start the
non-blocking copy to the device, tokenise) and ``run(prepared)`` the device work, returning
host columns. ``__call__(inputs) == run(prepare(inputs))``. The split lets a model actor
prepare batch i+1 while batch i computes (``pipeline.models.serving``).

Batch inputs (one entry per row, n rows):

* ``pixels``: ``np.ndarray`` (n, H, W, 3) uint8 RGB, already resized/cropped on the CPU side
  to ``info.image`` (``ImageGeometry``); rescaling and normalisation happen on the device.
  With ``decode.device: cuda`` (image embeddings only) a list of n entries instead, some
  still encoded (``steps/device_media.py``, ``models/media.py``); the outputs then also
  hold ``media_errors`` (per row None or ``(error_reason, message)``) and
  ``media_images`` (per row None or the output ``(image, width, height)``).
* ``text``: list of n ``str`` (``None`` where a row has no caption, if ``info.text`` is
  ``"optional"``).

Outputs: a dict of column name -> ``np.ndarray`` with n rows (vectors (n, D), scalars (n,),
NaN where undefined) or a list of n values (strings), as declared by ``info.outputs``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

Inputs = dict[str, Any]
Outputs = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ImageGeometry:
    """How the CPU side turns decoded pixels into a model's uint8 input, once per record.

    ``mode``: ``center_crop`` (shorter side to ``crop`` edge, then centre crop; CLIP) or
    ``squash`` (resize to height x width, aspect not kept; SigLIP, BLIP).
    ``height_px``/``width_px``: the array's size. ``shortest_edge_px``: the resize target
    before the crop (``center_crop`` only). ``resample``: a ``PIL.Image.Resampling`` value.
    """

    mode: Literal["center_crop", "squash"]
    height_px: int
    width_px: int
    shortest_edge_px: int = 0
    resample: int = 3  # bicubic

    @property
    def column(self) -> str:
        """The internal batch column holding pixels of this geometry."""
        from pipeline.columns import MODEL_PIXELS

        edge = f"-{self.shortest_edge_px}" if self.mode == "center_crop" else ""
        return f"{MODEL_PIXELS}{self.mode}{edge}_{self.height_px}x{self.width_px}_r{self.resample}"

    @property
    def min_side_px(self) -> int:
        """Smallest decoded shorter side that makes this input without upscaling."""
        if self.mode == "center_crop":
            return max(self.shortest_edge_px, self.height_px, self.width_px)
        return max(self.height_px, self.width_px)


@dataclasses.dataclass(frozen=True)
class OutputField:
    """An output column: ``kind`` ``vector`` (fixed_size_list<dtype>[dim], L2-normalised),
    ``vectors`` (list<fixed_size_list<dtype>[dim]>: one vector per video frame), ``float``
    (float32 scalar) or ``text`` (large_string)."""

    name: str
    kind: Literal["vector", "vectors", "float", "text"]
    dim: int = 0
    dtype: Literal["float32", "float16"] = "float32"

    def arrow(self):
        import pyarrow as pa

        if self.kind in ("vector", "vectors"):
            value = pa.float16() if self.dtype == "float16" else pa.float32()
            vector = pa.list_(value, self.dim)
            return pa.field(self.name, vector if self.kind == "vector" else pa.list_(vector))
        if self.kind == "float":
            return pa.field(self.name, pa.float32())
        return pa.field(self.name, pa.large_string())


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a loaded backend needs and produces (picklable; sent to partition workers).

    ``image``: geometry of the ``pixels`` input, or None if the model takes no image.
    ``text``: ``"required"`` (only rows with a caption are sent), ``"optional"`` (rows
    without one are sent with ``None``) or None. ``outputs``: the columns it returns.
    ``description``: backend, model location, device and dtype, for logs and reports.
    """

    backend: str
    outputs: tuple[OutputField, ...]
    image: ImageGeometry | None = None
    text: Literal["required", "optional"] | None = None
    description: str = ""


class ModelBackend:
    """Base class of backends: subclasses set ``info`` in ``__init__`` and implement ``run``.

    ``prepare``'s result must be a dict whose values all have the batch's rows as their
    first dimension (tensors, arrays or lists), so that a batch can be split in halves
    (``serving.run_splitting_on_oom``); keys starting with ``_`` (e.g. a CUDA event) are
    not row data and are passed through unchanged.
    """

    info: ModelInfo
    device: str = "cpu"

    def prepare(self, inputs: Inputs) -> dict[str, Any]:
        return dict(inputs)

    def run(self, prepared: dict[str, Any]) -> Outputs:
        raise NotImplementedError

    def __call__(self, inputs: Inputs) -> Outputs:
        return self.run(self.prepare(inputs))

    def media_stats(self) -> dict[str, Any]:
        """Counters of images decoded by this backend (``models.media``); default none."""
        return {}


def rows_of(value: Any) -> int:
    """Number of rows of a batch column (array, tensor or list)."""
    return int(value.shape[0]) if hasattr(value, "shape") else len(value)


def slice_rows(batch: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows [start, stop) of every column of ``batch`` (``_`` keys passed through)."""
    return {k: (v if k.startswith("_") else v[start:stop]) for k, v in batch.items()}


def concat_rows(parts: list[Outputs]) -> Outputs:
    """Concatenate output dicts row-wise (arrays with ``np.concatenate``, lists by extend)."""
    if len(parts) == 1:
        return parts[0]
    out: Outputs = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if isinstance(values[0], np.ndarray):
            out[key] = np.concatenate(values)
        else:
            out[key] = [v for part in values for v in part]
    return out
