"""Captioning: BLIP, and a generic image-text-to-text VLM path (Florence-2, Qwen2-VL, LLaVA...).

Both produce ``generated_caption`` (one string per row) with ``max_new_tokens`` and greedy
(``num_beams=1``) or beam search, never sampling, so captions are deterministic.

* ``blip``: ``BlipForConditionalGeneration`` + ``BlipProcessor``. Pixels arrive resized on
  the CPU side (``squash`` to the processor's size) and are normalised on the device. A
  ``prompt`` is a caption prefix (``a picture of``) and stays in the caption, as in BLIP.
* ``vlm``: ``AutoModelForImageTextToText`` + ``AutoProcessor``. VLM processors differ
  (dynamic resolution, patch flattening), so the model's own processor runs on the
  already-resized uint8 pixels in the actor; the prompt is wrapped in the processor's
  chat template when it has one, and only the newly generated tokens are decoded.
  With ``captioning.frames`` F > 1 a video (or clip) row arrives as a window of F frames,
  (n, F, H, W, 3), and goes to the model as F images in one chat turn (Qwen2-VL,
  Qwen2.5-VL, LLaVA take several); ``media_stats`` counts the windows and their frames.
  Dynamic-resolution processors (Qwen2-VL's ``merge_size``) get ``image_size_px`` (default
  448) square images, never their ``min_pixels`` read as a side.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.contracts import ImageGeometry, ModelInfo, OutputField
from pipeline.errors import ModelLoadError
from pipeline.models.base import ModelBackend
from pipeline.models.processors import FrameWindows, load_processor
from pipeline.models.torch_util import (copies_done, geometry_from_processor, normalizer_for,
                                        pick_dtype, to_device_uint8, wait_for)
from pipeline.columns import GENERATED_CAPTION
from pipeline.spec import CaptionModelSpec

DEFAULT_VLM_PROMPT = "Describe the image in one sentence."
FLORENCE_PROMPT = "<CAPTION>"
DEFAULT_VLM_SIZE_PX = 448


def _generate_kwargs(spec: CaptionModelSpec) -> dict:
    kwargs = {"max_new_tokens": spec.max_new_tokens, "num_beams": spec.num_beams,
              "do_sample": False}
    if spec.min_new_tokens:
        kwargs["min_new_tokens"] = spec.min_new_tokens
    return kwargs


def _describe(name: str, model, device: str, dtype) -> str:
    return f"{name} {type(model).__name__} on {device} {str(dtype).removeprefix('torch.')}"


class BlipCaptioner(ModelBackend):
    """``blip``: pixels normalised on the device, ``model.generate``, batch-decoded."""

    def __init__(self, model_dir: str, spec: CaptionModelSpec, device: str, backend: str = "blip"):
        from transformers import AutoProcessor, BlipForConditionalGeneration

        self.device, self.spec = device, spec
        self.dtype = pick_dtype(spec.dtype, device)
        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.model = BlipForConditionalGeneration.from_pretrained(
            model_dir, dtype=self.dtype).to(device).eval()
        geometry = geometry_from_processor(self.processor.image_processor, 384)
        self.normalize = normalizer_for(self.processor.image_processor,
                                        (geometry.height_px, geometry.width_px), device, self.dtype)
        self.prompt_ids = None
        if spec.prompt:
            self.prompt_ids = self.processor.tokenizer(
                spec.prompt, return_tensors="pt")["input_ids"].to(device)
        self.info = ModelInfo("blip", (OutputField(GENERATED_CAPTION, "text"),), image=geometry,
                              description=_describe("blip", self.model, device, self.dtype))

    def prepare(self, inputs):
        return {"pixels": to_device_uint8(inputs["pixels"], self.device),
                "_ready": copies_done(self.device)}

    def run(self, prepared):
        wait_for(prepared.get("_ready"))
        pixels = self.normalize(prepared["pixels"])
        kwargs = _generate_kwargs(self.spec)
        if self.prompt_ids is not None:  # generate() overwrites column 0: give it a copy
            kwargs["input_ids"] = self.prompt_ids.repeat(pixels.shape[0], 1)
        ids = self.model.generate(pixel_values=pixels, **kwargs)
        texts = self.processor.batch_decode(ids, skip_special_tokens=True)
        return {GENERATED_CAPTION: [t.strip() for t in texts]}


class VlmCaptioner(ModelBackend):
    """``vlm``: any ``AutoModelForImageTextToText`` with its ``AutoProcessor``."""

    def __init__(self, model_dir: str, spec: CaptionModelSpec, device: str, backend: str = "vlm"):
        from transformers import AutoModelForImageTextToText

        self.device, self.spec = device, spec
        self.dtype = pick_dtype(spec.dtype, device)
        self.processor = load_processor(model_dir)
        self.frames, self.windows = spec.frames or 1, FrameWindows()
        if self.frames > 1 and not getattr(self.processor, "chat_template", None):
            raise ModelLoadError(f"captioning.frames {self.frames}: the processor of "
                                 f"{model_dir} has no chat template to place several images in")
        self.model = AutoModelForImageTextToText.from_pretrained(
            model_dir, dtype=self.dtype).to(device).eval()
        tokenizer = getattr(self.processor, "tokenizer", None)
        if tokenizer is not None and not self.model.config.is_encoder_decoder:
            tokenizer.padding_side = "left"  # batched decoder-only generation
        if tokenizer is not None and tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        florence = self.model.config.model_type.startswith("florence")
        prompt = spec.prompt or (FLORENCE_PROMPT if florence else DEFAULT_VLM_PROMPT)
        self.prompt, self.window_prompt = self._wrap(prompt, 1), self._wrap(prompt, self.frames)
        self.info = ModelInfo("vlm", (OutputField(GENERATED_CAPTION, "text"),),
                              image=self._geometry(spec), frames=self.frames,
                              description=_describe("vlm", self.model, device, self.dtype))

    def _geometry(self, spec: CaptionModelSpec) -> ImageGeometry:
        if spec.image_size_px:
            return ImageGeometry("squash", spec.image_size_px, spec.image_size_px)
        image_processor = getattr(self.processor, "image_processor", None)
        if image_processor is None or getattr(image_processor, "merge_size", None):
            return ImageGeometry("squash", DEFAULT_VLM_SIZE_PX, DEFAULT_VLM_SIZE_PX)
        return geometry_from_processor(image_processor, DEFAULT_VLM_SIZE_PX)

    def _wrap(self, prompt: str, images: int) -> str:
        """``prompt`` after ``images`` image placeholders in the chat template, if any."""
        if not getattr(self.processor, "chat_template", None):
            return prompt
        content = [{"type": "image"}] * images + [{"type": "text", "text": prompt}]
        messages = [{"role": "user", "content": content}]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True)

    def run(self, prepared):
        """``pixels`` (n, H, W, 3) or windows (n, F, H, W, 3) uint8 -> n captions."""
        pixels = np.asarray(prepared["pixels"])
        self.windows.add(pixels)
        images = [list(w) if pixels.ndim == 5 else w for w in pixels]
        prompt = self.window_prompt if pixels.ndim == 5 else self.prompt
        inputs = self.processor(images=images, text=[prompt] * len(images),
                                return_tensors="pt", padding=True)
        inputs = {k: (v.to(self.device, dtype=self.dtype) if torch.is_floating_point(v)
                      else v.to(self.device)) for k, v in inputs.items()}
        ids = self.model.generate(**inputs, **_generate_kwargs(self.spec))
        new = ids[:, inputs["input_ids"].shape[1]:] if not self.model.config.is_encoder_decoder else ids
        texts = self.processor.batch_decode(new, skip_special_tokens=True)
        return {GENERATED_CAPTION: [t.strip() for t in texts]}

    def media_stats(self):
        return self.windows.stats()
