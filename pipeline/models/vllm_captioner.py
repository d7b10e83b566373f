"""``vllm``: VLM captioning served by vLLM, for scale on GPUs (optional; not installed here).

The same checkpoints as the ``vlm`` backend, run by ``vllm.LLM`` with continuous batching
and paged attention. Greedy decoding only (``num_beams`` must be 1). The prompt goes through
the model's chat template (``LLM.chat``) with the image as a PIL image. ``check_available``
runs at job start so a missing vllm fails before anything runs.

Untested in this repository's CI (vLLM needs a CUDA GPU); written against vLLM's public
``LLM.chat`` / ``SamplingParams`` API.
"""

from __future__ import annotations

import importlib.util

import numpy as np

from pipeline.errors import ModelLoadError
from pipeline.contracts import ImageGeometry, ModelInfo, OutputField
from pipeline.models.base import ModelBackend
from pipeline.models.captioner import DEFAULT_VLM_PROMPT, DEFAULT_VLM_SIZE_PX
from pipeline.columns import GENERATED_CAPTION
from pipeline.spec import CaptionModelSpec


def check_available(spec: CaptionModelSpec) -> None:
    """Raise ``ModelLoadError`` unless vllm is importable and the spec is greedy."""
    if importlib.util.find_spec("vllm") is None:
        raise ModelLoadError("captioning.backend 'vllm' needs the vllm package "
                             "(pip install vllm) on the GPU nodes")
    if spec.num_beams != 1:
        raise ModelLoadError("captioning.backend 'vllm' supports greedy decoding only "
                             "(num_beams: 1)")
    if spec.num_gpus <= 0:
        raise ModelLoadError("captioning.backend 'vllm' needs num_gpus > 0")


class VllmCaptioner(ModelBackend):
    """``vllm.LLM`` over a local checkpoint directory; one ``chat`` call per batch."""

    def __init__(self, model_dir: str, spec: CaptionModelSpec, device: str, backend: str = "vllm"):
        from vllm import LLM, SamplingParams

        check_available(spec)
        dtype = "auto" if spec.dtype == "auto" else spec.dtype
        self.llm = LLM(model=model_dir, dtype=dtype, limit_mm_per_prompt={"image": 1},
                       gpu_memory_utilization=0.85 * min(1.0, spec.num_gpus),
                       max_num_seqs=max(spec.batch_size, 1))
        self.params = SamplingParams(max_tokens=spec.max_new_tokens,
                                     min_tokens=spec.min_new_tokens, temperature=0.0)
        self.prompt = spec.prompt or DEFAULT_VLM_PROMPT
        side = spec.image_size_px or DEFAULT_VLM_SIZE_PX
        self.device = device
        self.info = ModelInfo("vllm", (OutputField(GENERATED_CAPTION, "text"),),
                              image=ImageGeometry("squash", side, side),
                              description=f"vllm {model_dir} on {device} {dtype}")

    def run(self, prepared):
        from PIL import Image

        conversations = [[{"role": "user", "content": [
            {"type": "image_pil", "image_pil": Image.fromarray(np.asarray(px))},
            {"type": "text", "text": self.prompt}]}] for px in prepared["pixels"]]
        outs = self.llm.chat(conversations, self.params, use_tqdm=False)
        return {GENERATED_CAPTION: [o.outputs[0].text.strip() for o in outs]}
