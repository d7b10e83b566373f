"""The real architectures (CLIP, SigLIP, BLIP, LLaVA) through the registry, in-process on CPU.

Checkpoints are random-initialised and tiny (``pipeline.testing.tiny_models``) but load through the
same ``from_pretrained(local_dir)`` code as downloaded weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.models.registry import load_backend
from pipeline.models.torch_util import to_device_uint8
from pipeline.columns import CLIP_SCORE, GENERATED_CAPTION, IMAGE_EMBEDDING
from pipeline.media.geometry import model_input
from tests.conftest import coco_captions
from tests.models.conftest import photo_pixels, section_spec


def model_pixels(backend, n: int = 8) -> np.ndarray:
    return np.stack([model_input(p, backend.info.image) for p in photo_pixels(n)])


@pytest.fixture(scope="module")
def encoders(tiny_models):
    return {name: load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models[f"tiny-{name}"])), "cpu") for name in ("clip", "siglip")}


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_image_embeddings_shape_norm_determinism_and_batching(encoders, name):
    backend = encoders[name]
    assert backend.info.backend == name
    dim = backend.info.outputs[0].dim
    pixels = model_pixels(backend)
    assert pixels.shape[1:] == (224, 224, 3) and pixels.dtype == np.uint8
    texts = [r["captions"][0] for r in coco_captions()[:8]]
    texts[3] = None                                                 # a row without caption
    out = backend({"pixels": pixels, "text": texts})
    emb, score = out[IMAGE_EMBEDDING], out[CLIP_SCORE]
    assert emb.shape == (8, dim) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert score.shape == (8,) and score.dtype == np.float32
    assert np.isnan(score[3]) and np.all(np.abs(np.delete(score, 3)) <= 1.0)
    assert len({round(float(s), 6) for s in np.delete(score, 3)}) > 1   # depends on the input
    again = backend({"pixels": pixels, "text": texts})
    np.testing.assert_array_equal(again[IMAGE_EMBEDDING], emb)      # deterministic
    singles = [backend({"pixels": pixels[i:i + 1], "text": texts[i:i + 1]}) for i in range(8)]
    np.testing.assert_allclose(np.concatenate([s[IMAGE_EMBEDDING] for s in singles]), emb,
                               atol=1e-5)
    np.testing.assert_allclose(np.concatenate([s[CLIP_SCORE] for s in singles]), score,
                               atol=1e-5)


def test_score_is_the_cosine_of_image_and_caption_embeddings(encoders):
    backend = encoders["clip"]
    pixels = model_pixels(backend, 4)
    texts = [r["captions"][0] for r in coco_captions()[:4]]
    out = backend({"pixels": pixels, "text": texts})
    with torch.inference_mode():
        tokens = backend.processor.tokenizer(texts, padding=True, return_tensors="pt")
        txt = backend.model.get_text_features(**tokens).pooler_output
    txt = torch.nn.functional.normalize(txt, dim=-1).numpy()
    np.testing.assert_allclose(out[CLIP_SCORE], np.sum(out[IMAGE_EMBEDDING] * txt, axis=1),
                               atol=1e-5)


def test_float16_storage(tiny_models):
    backend = load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models["tiny-clip"]), embedding_dtype="float16",
        score=False), "cpu")
    assert [f.name for f in backend.info.outputs] == [IMAGE_EMBEDDING]
    assert backend.info.outputs[0].arrow().type.value_type.bit_width == 16
    out = backend({"pixels": model_pixels(backend, 2)})
    assert out[IMAGE_EMBEDDING].dtype == np.float16 and set(out) == {IMAGE_EMBEDDING}
    np.testing.assert_allclose(np.linalg.norm(out[IMAGE_EMBEDDING].astype(np.float32), axis=1),
                               1.0, atol=2e-3)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_cpu_resize_and_device_normalisation_match_the_model_processor(encoders, name):
    """One decode; resize/crop on the CPU side, rescale/normalise on the device = the
    Hugging Face processor applied to the decoded image."""
    backend = encoders[name]
    photos = photo_pixels(4)
    ours = backend.normalize(to_device_uint8(
        np.stack([model_input(p, backend.info.image) for p in photos]), "cpu"))
    theirs = backend.processor.image_processor(images=photos, return_tensors="pt")["pixel_values"]
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs()
    assert float(diff.mean()) < 0.01 and float(diff.max()) < 0.1, (diff.mean(), diff.max())


@pytest.fixture(scope="module")
def blip(tiny_models):
    return load_backend("captioning", section_spec(
        "captioning", str(tiny_models["tiny-blip"]), max_new_tokens=12), "cpu")


def test_blip_captions_are_bounded_deterministic_strings_and_batching_is_exact(blip):
    assert blip.info.backend == "blip" and blip.info.image.height_px == 384
    pixels = model_pixels(blip)
    captions = blip({"pixels": pixels})[GENERATED_CAPTION]
    assert len(captions) == 8 and all(isinstance(c, str) and c for c in captions)
    # at most max_new_tokens tokens: WordPiece decoding gives at most one word per token
    assert all(len(c.split()) <= 12 and len(c) <= 12 * 20 for c in captions)
    assert len(set(captions)) > 1                                   # depends on the image
    assert blip({"pixels": pixels})[GENERATED_CAPTION] == captions
    singles = [blip({"pixels": pixels[i:i + 1]})[GENERATED_CAPTION][0] for i in range(8)]
    assert singles == captions


def test_blip_prompt_and_beam_search(tiny_models):
    backend = load_backend("captioning", section_spec(
        "captioning", str(tiny_models["tiny-blip"]), prompt="a picture of", num_beams=2,
        max_new_tokens=6), "cpu")
    captions = backend({"pixels": model_pixels(backend, 3)})[GENERATED_CAPTION]
    assert len(captions) == 3 and all(c.startswith("a picture of") for c in captions)


def test_generic_vlm_path_with_a_chat_template(tiny_models):
    backend = load_backend("captioning", section_spec(
        "captioning", str(tiny_models["tiny-llava"]), max_new_tokens=6), "cpu")
    assert backend.info.backend == "vlm" and "Describe the image" in backend.prompt
    pixels = model_pixels(backend, 3)
    captions = backend({"pixels": pixels})[GENERATED_CAPTION]
    assert len(captions) == 3 and all(isinstance(c, str) for c in captions)
    assert all(len(c) <= 6 * 20 for c in captions)
    assert backend({"pixels": pixels})[GENERATED_CAPTION] == captions
    assert [backend({"pixels": pixels[i:i + 1]})[GENERATED_CAPTION][0] for i in range(3)] == captions
