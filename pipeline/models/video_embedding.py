"""``xclip``: one video embedding per row from X-CLIP (``XCLIPModel.get_video_features``).

Where the ``clip``/``siglip`` backends embed every sampled frame and the row gets their
L2-normalised mean, X-CLIP encodes a window of frames as a video: its vision tower runs per
frame, its multi-frame integration transformer mixes the frames' class tokens, and the
projection gives one (D,) vector. The window length is the checkpoint's
``vision_config.num_frames`` (``ModelInfo.frames``; X-CLIP's temporal position embedding
has exactly that many positions), taken by ``steps.model.frame_window`` from the row's
sampled frames (a clip row's frames lie inside its span).

Inputs: ``pixels`` (n, F, H, W, 3) uint8 windows, F = ``num_frames``, resized on the CPU
side like the checkpoint's image processor (VideoMAE: shorter side, centre crop) and
normalised here on the device; an image row, (n, H, W, 3), is a still clip of its image
repeated F times. Output: ``image_embedding`` (n, D) L2-normalised, D =
``projection_dim``, float32 or float16 storage (``image_embedding.embedding_dtype``).
No ``clip_score``: X-CLIP's text embedding is conditioned on the video (its prompt
generator), so the spec requires ``score: false`` (and no heads or zero-shot classifiers,
which are trained on CLIP image embeddings).
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.columns import IMAGE_EMBEDDING
from pipeline.contracts import ModelInfo, OutputField
from pipeline.models.base import ModelBackend
from pipeline.models.processors import FrameWindows
from pipeline.models.torch_util import (copies_done, geometry_from_processor, l2_normalize,
                                        normalizer_for, pick_dtype, to_device_uint8, wait_for)
from pipeline.spec import ImageEmbedSpec


class XClipEmbedder(ModelBackend):
    """``XCLIPModel`` with its processor's image settings; one vector per frame window."""

    def __init__(self, model_dir: str, spec: ImageEmbedSpec, device: str, backend: str = "xclip"):
        from transformers import AutoProcessor, XCLIPModel

        self.device, self.spec = device, spec
        self.dtype = pick_dtype(spec.dtype, device)
        image_processor = AutoProcessor.from_pretrained(model_dir).image_processor
        self.model = XCLIPModel.from_pretrained(model_dir, dtype=self.dtype).to(device).eval()
        self.frames = int(self.model.config.vision_config.num_frames)
        self.geometry = geometry_from_processor(image_processor)
        self.normalize = normalizer_for(image_processor,
                                        (self.geometry.height_px, self.geometry.width_px),
                                        device, self.dtype)
        self.windows = FrameWindows()
        dim = int(self.model.config.projection_dim)
        self.info = ModelInfo(
            backend, (OutputField(IMAGE_EMBEDDING, "vector", dim, spec.embedding_dtype),),
            image=self.geometry, frames=self.frames,
            description=f"{backend} {type(self.model).__name__} D={dim} frames={self.frames} "
            f"on {device} {str(self.dtype).removeprefix('torch.')}")

    def prepare(self, inputs):
        """``pixels`` (n, F, H, W, 3) windows or (n, H, W, 3) stills -> uint8 on the
        device, (n, F, H, W, 3). Raises ``ValueError`` for a window of another length."""
        pixels = np.asarray(inputs["pixels"])
        if pixels.ndim == 4:
            pixels = np.repeat(pixels[:, None], self.frames, axis=1)
        if pixels.shape[1] != self.frames:
            raise ValueError(f"xclip takes windows of {self.frames} frames, got "
                             f"{pixels.shape[1]}")
        self.windows.add(pixels)
        return {"pixels": to_device_uint8(pixels, self.device),
                "_ready": copies_done(self.device)}

    def run(self, prepared):
        wait_for(prepared.get("_ready"))
        windows = prepared["pixels"]
        n, frames = windows.shape[:2]
        pixels = self.normalize(windows.reshape(n * frames, *windows.shape[2:]))
        with torch.inference_mode():
            out = self.model.get_video_features(
                pixel_values=pixels.reshape(n, frames, *pixels.shape[1:]))
        features = out.pooler_output if hasattr(out, "pooler_output") else out
        emb = l2_normalize(features)
        dtype = np.float16 if self.spec.embedding_dtype == "float16" else np.float32
        return {IMAGE_EMBEDDING: emb.astype(dtype)}

    def media_stats(self):
        return self.windows.stats()
