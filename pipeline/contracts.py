"""Contract types used across floors: what a model needs and gives.

``ImageGeometry`` (how the CPU side makes a model's uint8 input), ``OutputField`` and
``ModelInfo`` (a backend's declared inputs and outputs) are read by the model backends
(``pipeline.models``), the steps that feed them (``pipeline.steps.model``,
``pipeline.steps.model_input``) and the media codecs (``pipeline.media.geometry``), so they
live on the ground floor and none of those imports another's room for them. Pure
dataclasses: no torch, no ray, no I/O.
"""

from __future__ import annotations
import dataclasses
from typing import Literal


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
    ``frames``: frames per video row the model takes as one input: 1 (an image; a video
    row's frames go one by one to an embedding model, its middle frame to the others) or
    F > 1 (a window of F frames spread evenly over the row's sampled frames, ``pixels``
    (n, F, H, W, 3); image rows still send (n, H, W, 3)).
    """

    backend: str
    outputs: tuple[OutputField, ...]
    image: ImageGeometry | None = None
    text: Literal["required", "optional"] | None = None
    description: str = ""
    frames: int = 1
