"""Zero-shot classifiers from prompts on the image embedding (CLIP, SigLIP).

``image_embedding.zero_shot`` (``spec.ZeroShotSpec``) names prompts (``labels``) and which
of them count as ``positive``. At load, ``ZeroShot`` embeds every prompt once with the
same model's text tower (``encode_text``: the backend's tokenizer and padding) and keeps
the L2-normalised prompt embeddings (L, D) float32 on the device. Per batch, with the
L2-normalised image embeddings x (n, D) float32 already on the device:

    logits = logit_scale.exp() * x @ prompts.T (+ logit_bias, SigLIP)     (n, L)
    score  = sum over the positive labels of softmax(logits)               (n,) 0..1

This is CLIP's zero-shot classification (Radford et al. 2021, ``CLIPModel.forward``'s
``logits_per_image``). SigLIP's logits are ``logit_scale.exp() * cosine + logit_bias``
(``SiglipModel.forward``); it was trained with a per-pair sigmoid, but a softmax over the
labels is used here for both so that the scores of a classifier sum to one over its
labels; SigLIP's ``logit_bias`` is one constant added to every logit, which the softmax
cancels, so only its ``logit_scale`` matters.

Videos: every sampled frame is scored; the row gets the mean of its frames' scores
(``steps.model._pool``), as for the heads (``models.heads``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipeline.spec import ZeroShotSpec


class ZeroShot:
    """One zero-shot classifier: ``zs(embeddings)`` with (n, D) float32 L2-normalised image
    embeddings on the device -> (n,) float32 probabilities there (module docstring).

    ``encode_text(prompts) -> (L, D)`` tensor of text features (not yet normalised);
    ``logit_scale``: the model's ``logit_scale.exp()``, a float."""

    def __init__(self, spec: ZeroShotSpec, encode_text: Callable[[list[str]], torch.Tensor],
                 logit_scale: float):
        self.spec, self.column, self.scale = spec, spec.column, float(logit_scale)
        with torch.inference_mode():
            prompts = encode_text(list(spec.labels)).float()
        self.prompts = torch.nn.functional.normalize(prompts, dim=-1)  # (L, D)
        self.positive = torch.tensor([label in spec.positive_labels for label in spec.labels],
                                     device=self.prompts.device)

    @torch.inference_mode()
    def __call__(self, embeddings: torch.Tensor) -> torch.Tensor:
        logits = self.scale * embeddings.float() @ self.prompts.T
        return logits.softmax(dim=-1)[:, self.positive].sum(dim=-1)

