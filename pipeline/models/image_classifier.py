"""``image-classifier``: a transformers image classifier's score for its positive labels.

``AutoModelForImageClassification`` with ``AutoImageProcessor`` (real architectures:
ConvNeXt, EfficientNet, ViT, Swin, ...), e.g. a watermark detector. The processor gives
the CPU-side geometry (resize/crop once per record, ``torch_util.geometry_from_processor``)
and the device-side rescale and normalisation; ``prepare`` starts the copy to the device,
``run`` computes the logits of the batch.

Output: ``spec.column`` (default ``watermark_score``), (n,) float32 in 0..1: the softmax
probability mass of ``spec.positive_labels``, label names of ``config.json``'s
``id2label`` (``positive_label_ids``; a name the model lacks is a ``ModelLoadError`` at job
start, listing the model's labels). Single-label classifiers only: a checkpoint whose
``problem_type`` is ``multi_label_classification`` (independent sigmoids) is refused.
Video rows: the model gets the middle sampled frame (``steps.model.ModelStep`` sends a
model without vector outputs one frame per video), so the score is that frame's.

timm checkpoints are not served: timm needs torchvision, whose PyPI wheel does not load
with the CPU torch this project is tested with (``operator torchvision::nms does not
exist``), so a timm backend could not be tested here. transformers hosts ConvNeXt and
EfficientNet themselves; the LAION watermark detector (a timm ``efficientnet_b3a``) would
need such a backend or a conversion of its weights (left to do).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline.contracts import ModelInfo, OutputField
from pipeline.errors import ModelLoadError
from pipeline.models.base import ModelBackend
from pipeline.models.torch_util import (
    copies_done,
    geometry_from_processor,
    normalizer_for,
    pick_dtype,
    to_device_uint8,
    wait_for,
)
from pipeline.spec import ImageClassificationSpec


def positive_label_ids(config: dict[str, Any], spec: ImageClassificationSpec) -> list[int]:
    """Class indices of ``spec.positive_labels`` in ``config`` (a parsed ``config.json``).

    Raises ``ModelLoadError`` naming ``image_classification.positive_labels``, the unknown
    names and the model's labels, if a name is not in ``id2label``; or naming the model if
    it has no ``id2label`` or is a multi-label classifier. No torch, no weights read.
    """
    where = f"image_classification.model {spec.model!r}"
    if config.get("problem_type") == "multi_label_classification":
        raise ModelLoadError(f"{where} is a multi-label classifier (independent sigmoids); "
                             "image-classifier sums softmax probabilities of single-label "
                             "classifiers only")
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        raise ModelLoadError(f"{where}: config.json has no id2label (not a classifier?)")
    by_name = {str(name): int(index) for index, name in id2label.items()}
    unknown = [label for label in spec.positive_labels if label not in by_name]
    if unknown:
        raise ModelLoadError(f"image_classification.positive_labels: {unknown} not among the "
                             f"labels of {spec.model!r}: {sorted(by_name, key=by_name.get)}")
    return [by_name[label] for label in spec.positive_labels]


class ImageClassifier(ModelBackend):
    """``image-classifier`` backend: (n, H, W, 3) uint8 pixels -> ``{spec.column}`` (n,)
    float32 in 0..1 (see the module docstring). Raises ``ModelLoadError`` for unknown
    positive labels or a multi-label checkpoint."""

    def __init__(self, model_dir: str, spec: ImageClassificationSpec, device: str,
                 backend: str = "image-classifier"):
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        self.device, self.spec = device, spec
        self.dtype = pick_dtype(spec.dtype, device)
        processor = AutoImageProcessor.from_pretrained(model_dir)
        self.model = AutoModelForImageClassification.from_pretrained(
            model_dir, dtype=self.dtype).to(device).eval()
        self.label_ids = positive_label_ids(self.model.config.to_dict(), spec)
        self.index = torch.tensor(self.label_ids, device=device)
        self.geometry = geometry_from_processor(processor)
        self.normalize = normalizer_for(processor, (self.geometry.height_px,
                                                    self.geometry.width_px), device, self.dtype)
        labels = "+".join(spec.positive_labels)
        self.info = ModelInfo(backend, (OutputField(spec.column, "float"),), image=self.geometry,
                              description=f"{backend} {type(self.model).__name__} "
                              f"P({labels}) of {self.model.config.num_labels} labels on "
                              f"{device} {str(self.dtype).removeprefix('torch.')}")
        probe = np.zeros((1, self.geometry.height_px, self.geometry.width_px, 3), np.uint8)
        with torch.inference_mode():  # warms the model up
            self.run(self.prepare({"pixels": probe}))

    def prepare(self, inputs):
        """``inputs["pixels"]``: (n, H, W, 3) uint8 at ``info.image``'s size; starts the
        copy to the device (pinned, non-blocking on CUDA)."""
        pixels = np.asarray(inputs["pixels"], dtype=np.uint8)
        return {"pixels": to_device_uint8(pixels, self.device), "_ready": copies_done(self.device)}

    def run(self, prepared):
        """Logits -> float32 softmax -> sum over the positive labels, (n,) float32."""
        wait_for(prepared.get("_ready"))
        logits = self.model(pixel_values=self.normalize(prepared["pixels"])).logits
        probs = torch.softmax(logits.float(), dim=-1)
        score = probs.index_select(1, self.index).sum(dim=1).clamp_(0.0, 1.0)
        return {self.spec.column: score.detach().cpu().numpy().astype(np.float32)}
