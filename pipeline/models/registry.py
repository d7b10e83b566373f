"""The model registry: which backend serves which model step, and loading it once.

Model steps are the spec sections in ``pipeline.spec.MODEL_SECTIONS``
(``text_embedding``, ``image_embedding``, ``image_classification``, ``captioning``). Each
names a model location and a backend (or ``auto``, read from ``config.json``'s
``model_type``). Backends are registered by name as ``"module:Class"`` and imported only
when loaded, so importing this module pulls in neither torch nor transformers.

    check_models(spec)            # driver, job start: weights present and complete,
                                  #   backend known, libraries there, heads fit the
                                  #   model (models.heads); else ModelLoadError
    load_backend(section, spec, device)   # model actor: fetch weights, build the backend
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from pipeline.errors import ModelLoadError
from pipeline.models import weights
from pipeline.spec import MODEL_SECTIONS, JobSpec

# backend name -> ("module:Class", the sections it can serve)
BACKENDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sentence-transformers": ("pipeline.models.text:SentenceTransformerBackend",
                              ("text_embedding",)),
    "clip": ("pipeline.models.dual_encoder:DualEncoder", ("image_embedding",)),
    "siglip": ("pipeline.models.dual_encoder:DualEncoder", ("image_embedding",)),
    "xclip": ("pipeline.models.video_embedding:XClipEmbedder", ("image_embedding",)),
    "blip": ("pipeline.models.captioner:BlipCaptioner", ("captioning",)),
    "vlm": ("pipeline.models.captioner:VlmCaptioner", ("captioning",)),
    "vllm": ("pipeline.models.vllm_captioner:VllmCaptioner", ("captioning",)),
    "image-classifier": ("pipeline.models.image_classifier:ImageClassifier",
                         ("image_classification",)),
}


def register(name: str, target: str, sections: tuple[str, ...]) -> None:
    """Add a backend: ``target`` is ``"module:Class"`` whose ``__init__(model_dir, spec,
    device, backend)`` loads the model and whose instances follow ``ModelBackend``."""
    BACKENDS[name] = (target, tuple(sections))


def backend_class(name: str) -> type:
    if name not in BACKENDS:
        raise ModelLoadError(f"unknown model backend {name!r} (known: {', '.join(BACKENDS)})")
    module, _, cls = BACKENDS[name][0].partition(":")
    return getattr(importlib.import_module(module), cls)


def enabled_sections(spec: JobSpec) -> list[str]:
    """The model steps this job runs, in pipeline order."""
    return [s for s in MODEL_SECTIONS if getattr(spec, s).enabled]


def section_spec(spec: JobSpec, section: str):
    return getattr(spec, section)


def resolve_backend(section: str, section_spec: Any, config: dict[str, Any]) -> str:
    """The backend name for a section, from its ``backend`` field or ``config.json``."""
    if section == "text_embedding":
        return "sentence-transformers"
    name = section_spec.backend
    if name == "auto":
        model_type = str(config.get("model_type", ""))
        if section == "image_embedding":
            name = {"clip": "clip", "siglip": "siglip"}.get(model_type, "")
            if not name:
                raise ModelLoadError(f"image_embedding.model {section_spec.model!r}: model_type "
                                     f"{model_type!r} is not CLIP or SigLIP; set "
                                     "image_embedding.backend (xclip for X-CLIP)")
        elif section == "image_classification":
            name = "image-classifier"
        else:
            name = "blip" if model_type == "blip" else "vlm"
    if section not in BACKENDS.get(name, ("", ()))[1]:
        raise ModelLoadError(f"{section}.backend {name!r} cannot serve {section}")
    if name == "xclip" and config.get("model_type") != "xclip":
        raise ModelLoadError(f"image_embedding.model {section_spec.model!r}: backend xclip "
                             f"needs an X-CLIP checkpoint, model_type is "
                             f"{config.get('model_type')!r}")
    if section == "captioning" and (section_spec.frames or 1) > 1 and name != "vlm":
        raise ModelLoadError(f"captioning.frames {section_spec.frames}: backend {name!r} takes "
                             "one image per row; multi-frame windows need backend vlm")
    return name


def check_models(spec: JobSpec) -> dict[str, str]:
    """Job start: every enabled model is present and complete and its backend usable.

    Returns section -> backend name. Raises ``ModelLoadError`` naming the field and the
    model location (no weights are downloaded here; see ``weights.check_weights``).
    """
    out = {}
    for section in enabled_sections(spec):
        sspec = section_spec(spec, section)
        config = weights.check_weights(sspec.model, f"{section}.model")
        out[section] = resolve_backend(section, sspec, config)
        if out[section] == "vllm":
            from pipeline.models.vllm_captioner import check_available

            check_available(sspec)
        if out[section] == "image-classifier":
            from pipeline.models.image_classifier import positive_label_ids

            positive_label_ids(config, sspec)  # labels named by the spec are the model's
        if section == "image_embedding" and sspec.heads:
            from pipeline.models.heads import check_heads

            check_heads(sspec, config)  # embedding model, size and weights fit each head
    return out


def load_backend(section: str, spec: JobSpec, device: str):
    """Fetch the section's weights to a local directory and build its backend (once per
    ModelActor, or in-process for tests and plain loops)."""
    sspec = section_spec(spec, section)
    _quiet_libraries()
    model_dir = weights.fetch_weights(sspec.model)
    config_path = os.path.join(model_dir, "config.json")  # weights.check_weights required it
    with open(config_path) as f:
        config = json.load(f)
    name = resolve_backend(section, sspec, config)
    return backend_class(name)(model_dir, sspec, device, name)


def _quiet_libraries() -> None:
    """No per-load progress bars in actor logs (transformers' "Loading weights")."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
