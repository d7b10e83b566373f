"""CLIP and SigLIP: image embeddings, caption embeddings and their cosine (the LAION score).

``transformers`` ``AutoModel`` (``CLIPModel``/``SiglipModel``) with ``AutoProcessor``: the
processor's image settings give the CPU-side geometry (resize/crop, once per record) and
the device-side normalisation (mean, std, rescale); its tokenizer encodes captions
(SigLIP: padded to ``max_length`` 64 as it was trained; CLIP: to the longest, at most 77).

Outputs: ``image_embedding`` (n, D) L2-normalised, float32 or float16 storage, D from the
model; with ``score``: ``clip_score`` (n,) float32, the cosine of the image and caption
embeddings, NaN where the row has no caption. With ``decode.device: cuda`` images may come
encoded and are decoded here (``pipeline.models.media``); ``media_stats()`` counts how.

``heads`` (``models.heads``) and ``zero_shot`` classifiers (``models.zero_shot``) score the
normalised image embedding on the device, each into one (n,) float32 column
(``aesthetic_score``, ``nsfw_score``, ``score_<name>``); their scores come back with the
embedding in one device-to-host copy.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.errors import ModelLoadError
from pipeline.models.base import ModelBackend
from pipeline.contracts import ModelInfo, OutputField
from pipeline.models.heads import load_head
from pipeline.models.media import MediaDecoder
from pipeline.models.text import cap_chars
from pipeline.models.zero_shot import ZeroShot
from pipeline.models.torch_util import (copies_done, geometry_from_processor, l2_normalize,
                                        normalizer_for, pick_dtype, to_device, to_device_uint8,
                                        wait_for)
from pipeline.columns import CLIP_SCORE, IMAGE_EMBEDDING
from pipeline.spec import ImageEmbedSpec
from pipeline.media.device import MEDIA_ERRORS, MEDIA_IMAGES


def _features(out) -> torch.Tensor:
    """transformers 5 returns a ModelOutput (projected ``pooler_output``); 4.x a tensor."""
    return out.pooler_output if hasattr(out, "pooler_output") else out


class DualEncoder(ModelBackend):
    """``clip`` and ``siglip`` backends (same code; SigLIP pads text to max_length)."""

    def __init__(self, model_dir: str, spec: ImageEmbedSpec, device: str, backend: str = "clip"):
        from transformers import AutoModel, AutoProcessor

        self.device, self.spec, self.backend = device, spec, backend
        self.dtype = pick_dtype(spec.dtype, device)
        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir, dtype=self.dtype).to(device).eval()
        self.geometry = geometry_from_processor(self.processor.image_processor)
        self.media = MediaDecoder(self.geometry, device)
        self.normalize = normalizer_for(self.processor.image_processor,
                                        (self.geometry.height_px, self.geometry.width_px),
                                        device, self.dtype)
        text_config = self.model.config.text_config
        self.max_tokens = min(int(text_config.max_position_embeddings),
                              int(self.processor.tokenizer.model_max_length))
        self.pad = "max_length" if backend == "siglip" else "longest"
        self.scorers = [load_head(h, device, f"image_embedding.heads[{i}]")
                        for i, h in enumerate(spec.heads)]
        self.scorers += [ZeroShot(z, self._encode_prompts, self.model.logit_scale.exp().item())
                         for z in spec.zero_shot]
        probe = np.zeros((1, self.geometry.height_px, self.geometry.width_px, 3), np.uint8)
        with torch.inference_mode():  # also warms the model up
            dim = self.run(self.prepare({"pixels": probe, "text": ["a"]}))[IMAGE_EMBEDDING].shape[1]
        wrong = [h.column for h in self.scorers[:len(spec.heads)] if h.spec.input_dim != dim]
        if wrong:
            raise ModelLoadError(f"image_embedding.heads {wrong}: input_dim differs from the "
                                 f"model's embedding size {dim}")
        outputs = [OutputField(IMAGE_EMBEDDING, "vector", dim, spec.embedding_dtype)]
        if spec.score:
            outputs.append(OutputField(CLIP_SCORE, "float"))
        outputs += [OutputField(s.column, "float") for s in self.scorers]
        self.info = ModelInfo(backend, tuple(outputs), image=self.geometry,
                              text="optional" if spec.score else None,
                              description=f"{backend} {type(self.model).__name__} D={dim} "
                              f"on {device} {str(self.dtype).removeprefix('torch.')}")

    def prepare(self, inputs):
        """``inputs["pixels"]``: an (n, H, W, 3) uint8 array, or (``decode.device: cuda``)
        a list of n entries that ``media.MediaDecoder`` decodes; then the prepared batch
        (and the outputs) carry ``MEDIA_ERRORS`` and ``MEDIA_IMAGES``, one value per row."""
        pixels = inputs["pixels"]
        if isinstance(pixels, np.ndarray):
            prepared = {"pixels": to_device_uint8(pixels, self.device)}
        else:
            media = self.media(list(pixels))
            prepared = {"pixels": media.pixels, MEDIA_ERRORS: media.errors,
                        MEDIA_IMAGES: media.images}
        if self.spec.score:
            texts = list(inputs["text"])
            prepared["has_text"] = np.array([t is not None for t in texts])
            tokens = self.processor.tokenizer(cap_chars([t or "" for t in texts], self.max_tokens),
                                              padding=self.pad,
                                              truncation=True, max_length=self.max_tokens,
                                              return_tensors="pt")
            for key, value in tokens.items():
                prepared[f"text_{key}"] = to_device(value, self.device)
        prepared["_ready"] = copies_done(self.device)
        return prepared

    def run(self, prepared):
        wait_for(prepared.get("_ready"))
        pixels = self.normalize(prepared["pixels"])
        image = _features(self.model.get_image_features(pixel_values=pixels))
        image_np, scores = self._embed_and_score(image)
        out = {s.column: np.ascontiguousarray(scores[:, j]) for j, s in enumerate(self.scorers)}
        out[IMAGE_EMBEDDING] = image_np.astype(np.float16 if self.spec.embedding_dtype
                                               == "float16" else np.float32)
        for key in (MEDIA_ERRORS, MEDIA_IMAGES):
            if key in prepared:
                out[key] = list(prepared[key])
        if self.spec.score:
            text_inputs = {k.removeprefix("text_"): v for k, v in prepared.items()
                           if k.startswith("text_")}
            text_np = l2_normalize(_features(self.model.get_text_features(**text_inputs)))
            score = np.einsum("nd,nd->n", image_np, text_np).astype(np.float32)
            score[~np.asarray(prepared["has_text"], dtype=bool)] = np.nan
            out[CLIP_SCORE] = score
        return out

    def _embed_and_score(self, image: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Image features (n, D) on the device -> their L2-normalised float32 rows and the
        scorers' (n, k) float32 scores, as host arrays from one device-to-host copy."""
        emb = torch.nn.functional.normalize(image.detach().float(), dim=-1)
        if not self.scorers:
            return emb.cpu().numpy(), np.zeros((emb.shape[0], 0), np.float32)
        both = torch.cat([emb] + [s(emb)[:, None] for s in self.scorers], dim=1).cpu().numpy()
        return both[:, :emb.shape[1]], both[:, emb.shape[1]:]

    def _encode_prompts(self, prompts: list[str]) -> torch.Tensor:
        """Text features (L, D) of zero-shot prompts, tokenised like captions."""
        tokens = self.processor.tokenizer(cap_chars(prompts, self.max_tokens), padding=self.pad,
                                          truncation=True, max_length=self.max_tokens,
                                          return_tensors="pt")
        return _features(self.model.get_text_features(
            **{k: v.to(self.device) for k, v in tokens.items()}))

    def media_stats(self):
        return self.media.stats()
