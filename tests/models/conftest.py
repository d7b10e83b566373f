"""Small random checkpoints of the real architectures, built once per test session."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from tests.conftest import PHOTOS, coco_captions


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict:
    """name -> directory of ``tiny-clip``, ``tiny-siglip``, ``tiny-blip``, ``tiny-llava``."""
    from pipeline.testing.tiny_models import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"))


def photo_pixels(n: int) -> list[np.ndarray]:
    """Decoded (H, W, 3) uint8 pixels of the first ``n`` bundled COCO photos."""
    return [np.asarray(Image.open(PHOTOS / r["file"]).convert("RGB")) for r in coco_captions()[:n]]


def section_spec(section: str, model: str, **fields):
    """A JobSpec with one model section enabled (other sections off)."""
    from pipeline.spec import JobSpec

    data = {"source": {"kind": "files", "uri": "in"}, "sink": {"uri": "out"},
            "text_embedding": {"enabled": section == "text_embedding"},
            section: {"enabled": True, "model": model, **fields}}
    return JobSpec.model_validate(json.loads(json.dumps(data)))
