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
  still encoded (``media/device.py``, ``models/media.py``); the outputs then also
  hold ``media_errors`` (per row None or ``(error_reason, message)``) and
  ``media_images`` (per row None or the output ``(image, width, height)``).
* ``text``: list of n ``str`` (``None`` where a row has no caption, if ``info.text`` is
  ``"optional"``).

Outputs: a dict of column name -> ``np.ndarray`` with n rows (vectors (n, D), scalars (n,),
NaN where undefined) or a list of n values (strings), as declared by ``info.outputs``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pipeline.contracts import ModelInfo

Inputs = dict[str, Any]
Outputs = dict[str, Any]


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
        """Counters this backend keeps for the job report: images it decoded
        (``models.media``), frame windows it was sent (``processors.FrameWindows``);
        default none."""
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
