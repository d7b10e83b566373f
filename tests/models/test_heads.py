"""Heads on the image embedding (LAION aesthetic and NSFW presets, generic heads) and
zero-shot classifiers: tiny random-initialised checkpoints of the real architectures,
saved with ``save_pretrained`` / ``torch.save`` / safetensors and loaded through the
normal loading path, checked against plain torch arithmetic, through a whole job, and
refused at job start when the head does not fit the embedding model."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.torch import save_file

from pipeline.errors import ModelLoadError, SpecError
from pipeline.media.geometry import model_input
from pipeline.models import heads
from pipeline.models.registry import check_models, load_backend
from pipeline.spec import HeadSpec, parse_spec
from pipeline.steps.model import section_writes
from tests.conftest import REPO, coco_captions
from tests.e2e.jobs import check_accounting
from tests.models.conftest import photo_pixels, section_spec

#: the published layouts, key -> shape (improved-aesthetic-predictor simple_inference.py;
#: NeMo Curator nemo_curator/image/classifiers/nsfw.py)
AESTHETIC = {"layers.0.weight": (1024, 768), "layers.0.bias": (1024,),
             "layers.2.weight": (128, 1024), "layers.2.bias": (128,),
             "layers.4.weight": (64, 128), "layers.4.bias": (64,),
             "layers.6.weight": (16, 64), "layers.6.bias": (16,),
             "layers.7.weight": (1, 16), "layers.7.bias": (1,)}
NSFW = {"norm.mean": (768,), "norm.variance": (768,),
        "linear_1.weight": (64, 768), "linear_1.bias": (64,),
        "linear_2.weight": (512, 64), "linear_2.bias": (512,),
        "linear_3.weight": (256, 512), "linear_3.bias": (256,),
        "linear_4.weight": (1, 256), "linear_4.bias": (1,)}
PROMPTS = ["a photo of a dog", "a photo of a cat", "a photo of food"]


def _random_state(layout: dict, seed: int, gain: float = 4.0) -> dict[str, torch.Tensor]:
    """Tensors with the layout's names and shapes; wide enough that scores vary by image."""
    g = torch.Generator().manual_seed(seed)
    out = {k: torch.randn(s, generator=g) * (gain / s[-1] ** 0.5 if len(s) == 2 else 0.1)
           for k, s in layout.items()}
    if "norm.variance" in out:
        out["norm.mean"] = torch.randn(768, generator=g) * 0.01
        out["norm.variance"] = torch.rand(768, generator=g) * 0.002 + 0.0005
    return out


@pytest.fixture(scope="module")
def clip768(tmp_path_factory):
    from pipeline.testing.tiny_models import build_tiny_models

    return str(build_tiny_models(tmp_path_factory.mktemp("clip768"), ("tiny-clip-768",))
               ["tiny-clip-768"])


@pytest.fixture(scope="module")
def head_files(tmp_path_factory):
    """Weight files: aesthetic as a torch.save pickle, NSFW and a generic MLP as safetensors."""
    root = tmp_path_factory.mktemp("heads")
    aesthetic, nsfw = _random_state(AESTHETIC, 1), _random_state(NSFW, 2, gain=0.7)
    torch.save(aesthetic, root / "sac+logos+ava1-l14-linearMSE.pth")
    save_file(nsfw, str(root / "nsfw.safetensors"))
    mlp = _random_state({"layers.0.weight": (32, 768), "layers.0.bias": (32,),
                         "layers.2.weight": (2, 32), "layers.2.bias": (2,)}, 3)
    (root / "mlp").mkdir()
    save_file(mlp, str(root / "mlp" / "model.safetensors"))
    small = _random_state({"layers.0.weight": (1, 512), "layers.0.bias": (1,)}, 4)
    save_file(small, str(root / "linear512.safetensors"))
    return {"aesthetic": str(root / "sac+logos+ava1-l14-linearMSE.pth"),
            "nsfw": str(root / "nsfw.safetensors"), "mlp": str(root / "mlp"),
            "linear512": str(root / "linear512.safetensors"), "root": root,
            "state": {"aesthetic": aesthetic, "nsfw": nsfw, "mlp": mlp}}


def head_fields(files) -> dict:
    return {"heads": [{"preset": "laion-aesthetic", "weights": files["aesthetic"]},
                      {"preset": "laion-nsfw", "weights": files["nsfw"]},
                      {"name": "mlp", "weights": files["mlp"], "architecture": "mlp",
                       "hidden": [32], "activation": "gelu", "outputs": 2,
                       "output": "softmax", "positive_index": 1, "input_dim": 768}],
            "zero_shot": [{"name": "dog", "labels": PROMPTS},
                          {"name": "pet", "labels": PROMPTS, "positive": PROMPTS[:2]}]}


def _reference(state: dict, emb: np.ndarray) -> dict[str, np.ndarray]:
    """The heads' scores by plain torch arithmetic on the state dicts (no nn.Module)."""
    x = torch.from_numpy(emb).double()
    a = {k: v.double() for k, v in state["aesthetic"].items()}
    x_a = x
    for i in (0, 2, 4, 6, 7):
        x_a = x_a @ a[f"layers.{i}.weight"].T + a[f"layers.{i}.bias"]
    n = {k: v.double() for k, v in state["nsfw"].items()}
    h = (x - n["norm.mean"]) / n["norm.variance"].sqrt()
    for i in (1, 2, 3):
        h = torch.relu(h @ n[f"linear_{i}.weight"].T + n[f"linear_{i}.bias"])
    nsfw = torch.sigmoid(h @ n["linear_4.weight"].T + n["linear_4.bias"])
    m = {k: v.double() for k, v in state["mlp"].items()}
    hid = torch.nn.functional.gelu(x @ m["layers.0.weight"].T + m["layers.0.bias"])
    mlp = torch.softmax(hid @ m["layers.2.weight"].T + m["layers.2.bias"], dim=-1)[:, 1]
    return {"aesthetic_score": x_a[:, 0].numpy(), "nsfw_score": nsfw[:, 0].numpy(),
            "score_mlp": mlp.numpy()}


def _pixels(backend, n: int) -> np.ndarray:
    return np.stack([model_input(p, backend.info.image) for p in photo_pixels(n)])


def test_presets_have_the_published_key_names_and_shapes():
    for preset, layout in (("laion-aesthetic", AESTHETIC), ("laion-nsfw", NSFW)):
        module = heads.build_module(HeadSpec(preset=preset, weights="w"))
        assert {k: tuple(v.shape) for k, v in module.state_dict().items()} == layout
    mlp = heads.build_module(HeadSpec(name="x", weights="w", architecture="mlp",
                                      hidden=[8, 4], input_dim=16, outputs=3, output="softmax"))
    assert [k for k in mlp.state_dict() if k.endswith("weight")] == [
        "layers.0.weight", "layers.2.weight", "layers.4.weight"]


def test_heads_and_zero_shot_scores_equal_reference_arithmetic(clip768, head_files):
    backend = load_backend("image_embedding", section_spec(
        "image_embedding", clip768, **head_fields(head_files)), "cpu")
    columns = ["aesthetic_score", "nsfw_score", "score_mlp", "score_dog", "score_pet"]
    assert [f.name for f in backend.info.outputs][2:] == columns
    assert all(f.kind == "float" for f in backend.info.outputs[2:])
    out = backend({"pixels": _pixels(backend, 8), "text": [None] * 8})
    for c in columns:
        assert out[c].dtype == np.float32 and out[c].shape == (8,)
    emb = out["image_embedding"]
    want = _reference(head_files["state"], emb)
    for c in ("aesthetic_score", "nsfw_score", "score_mlp"):
        np.testing.assert_allclose(out[c], want[c], rtol=1e-4, atol=1e-5)
        assert np.ptp(out[c]) > 1e-3, c                                  # varies by image
    assert ((out["nsfw_score"] > 0) & (out["nsfw_score"] < 1)).all()
    # zero-shot: softmax of logit_scale.exp() * cosine over the prompts (CLIP)
    with torch.inference_mode():
        tok = backend.processor.tokenizer(PROMPTS, padding="longest", return_tensors="pt")
        text = backend.model.get_text_features(**tok)
        text = getattr(text, "pooler_output", text)
        text = torch.nn.functional.normalize(text.float(), dim=-1).double().numpy()
        scale = float(backend.model.logit_scale.exp())
    logits = scale * emb.astype(np.float64) @ text.T
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    np.testing.assert_allclose(out["score_dog"], probs[:, 0], atol=1e-5)
    np.testing.assert_allclose(out["score_pet"], probs[:, :2].sum(1), atol=1e-5)
    assert ((out["score_dog"] > 0) & (out["score_dog"] < out["score_pet"])).all()
    assert (out["score_pet"] < 1).all()


def test_batched_equals_one_by_one_and_reruns_are_identical(clip768, head_files):
    backend = load_backend("image_embedding", section_spec(
        "image_embedding", clip768, score=False, **head_fields(head_files)), "cpu")
    pixels = _pixels(backend, 5)
    batch = backend({"pixels": pixels})
    again = backend({"pixels": pixels})
    for c in ("aesthetic_score", "nsfw_score", "score_mlp", "score_dog", "score_pet"):
        np.testing.assert_array_equal(batch[c], again[c])
        single = np.concatenate([backend({"pixels": pixels[i:i + 1]})[c] for i in range(5)])
        np.testing.assert_allclose(batch[c], single, rtol=1e-5, atol=1e-6)


def test_siglip_zero_shot_scores_are_probabilities(tiny_models):
    backend = load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models["tiny-siglip"]), score=False,
        zero_shot=[{"name": "dog", "labels": PROMPTS}]), "cpu")
    out = backend({"pixels": _pixels(backend, 3)})
    assert out["score_dog"].dtype == np.float32
    assert ((out["score_dog"] > 0) & (out["score_dog"] < 1)).all()


def test_a_head_that_does_not_fit_the_model_fails_before_ray_starts(tiny_models, clip768,
                                                                     head_files, tmp_path):
    from pipeline.runtime.preflight import preflight

    clip64 = str(tiny_models["tiny-clip"])
    aesthetic = {"preset": "laion-aesthetic", "weights": head_files["aesthetic"]}
    with pytest.raises(ModelLoadError, match=r"heads\[0\] \(laion-aesthetic, aesthetic_score\)"
                       r" expects input_dim 768; image_embedding.model .*tiny-clip.* "
                       r"embeds into 64 dimensions"):
        check_models(section_spec("image_embedding", clip64, heads=[aesthetic]))
    siglip = str(tiny_models["tiny-siglip"])
    with pytest.raises(ModelLoadError, match=r"expects embedding_model 'clip'; "
                       r"image_embedding.model .*tiny-siglip.* is model_type 'siglip'"):
        check_models(section_spec("image_embedding", siglip, heads=[aesthetic]))
    wrong = {"name": "x", "weights": head_files["linear512"], "input_dim": 768}
    with pytest.raises(ModelLoadError, match=r"input_dim is 768 but the weights .*"
                       r"linear512.safetensors' take 512 inputs"):
        check_models(section_spec("image_embedding", clip768, heads=[wrong]))
    swapped = {"preset": "laion-nsfw", "weights": head_files["aesthetic"]}
    with pytest.raises(ModelLoadError, match=r"do not fit the laion-nsfw architecture: "
                       r"missing keys \['linear_1.bias'"):
        check_models(section_spec("image_embedding", clip768, heads=[swapped]))
    # `mmpipe run`'s checks before Ray starts: the same error, nothing written
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jpg").write_bytes((REPO / "data" / "photos" / coco_captions()[0]["file"])
                                .read_bytes())
    spec = parse_spec({"source": {"kind": "files", "uri": str(src)},
                       "sink": {"uri": str(tmp_path / "out")},
                       "text_embedding": {"enabled": False},
                       "image_embedding": {"enabled": True, "model": clip64,
                                           "heads": [aesthetic]}})
    with pytest.raises(ModelLoadError, match="expects input_dim 768.*64 dimensions"):
        preflight(spec)
    assert not (tmp_path / "out").exists()


def test_weight_locations(head_files, tmp_path):
    spec = HeadSpec(name="mlp", weights=head_files["mlp"], architecture="mlp", hidden=[32],
                    outputs=2, output="softmax", input_dim=768)
    assert heads.head_file(head_files["mlp"]).endswith("mlp/model.safetensors")  # directory
    assert heads.load_head(spec, "cpu").column == "score_mlp"
    with pytest.raises(ModelLoadError, match="holds 3 weight files"):
        heads.head_file(str(head_files["root"]), "heads[0].weights")
    with pytest.raises(ModelLoadError, match="heads\\[0\\].weights .*missing.pth.*no such"):
        heads.head_file(str(tmp_path / "missing.pth"), "heads[0].weights")
    (tmp_path / "junk.pth").write_bytes(b"not a pickle")
    with pytest.raises(ModelLoadError, match="junk.pth is not a readable state dict"):
        heads.load_head(spec.model_copy(update={"weights": str(tmp_path / "junk.pth")}), "cpu")


def test_spec_rules_and_declared_columns():
    base = {"source": {"kind": "files", "uri": "in"}, "sink": {"uri": "out"}}

    def image_embedding(**fields):
        return parse_spec({**base, "image_embedding": {"enabled": True, "model": "m",
                                                       **fields}}).image_embedding

    with pytest.raises(SpecError, match=r"heads.0.hidden: preset 'laion-nsfw' fixes"):
        image_embedding(heads=[{"preset": "laion-nsfw", "weights": "w", "hidden": [4]}])
    with pytest.raises(SpecError, match=r"heads.0.name: required without a preset"):
        image_embedding(heads=[{"weights": "w", "input_dim": 4}])
    with pytest.raises(SpecError, match=r"heads.0.positive_index: softmax needs outputs >= 2"):
        image_embedding(heads=[{"name": "a", "weights": "w", "input_dim": 4,
                                "output": "softmax", "outputs": 2, "positive_index": 2}])
    with pytest.raises(SpecError, match=r"zero_shot.0.positive: must be some, not all"):
        image_embedding(zero_shot=[{"name": "a", "labels": ["x", "y"], "positive": ["z"]}])
    with pytest.raises(SpecError, match=r"\['score_a'\] written twice"):
        image_embedding(heads=[{"name": "a", "weights": "w", "input_dim": 4}],
                        zero_shot=[{"name": "a", "labels": ["x", "y"]}])
    sec = image_embedding(heads=[{"preset": "laion-aesthetic", "weights": "w"},
                                 {"preset": "laion-nsfw", "weights": "w", "name": "nsfw2"}],
                          zero_shot=[{"name": "dog", "labels": ["x", "y"]}])
    assert sec.heads[0].input_dim == 768 and sec.heads[0].embedding_model == "clip"
    assert type(sec).model_validate_json(sec.model_dump_json()) == sec  # as actors get it
    assert section_writes("image_embedding", sec, video=False) == (
        "image_embedding", "clip_score", "aesthetic_score", "score_nsfw2", "score_dog")


def test_empty_heads_leave_the_fingerprint_of_an_existing_image_embedding_job_alone():
    """A job written before heads existed resumes: with no heads and no zero-shot
    classifiers, the image-embedding step's settings (and so the fingerprint) are what they
    were (examples/clip_blip.yaml's fingerprint before issue 26: 5f7c46904af3d7ec; the
    example read the photos' manifest then, without the dataset-wide dedup pass)."""
    from pipeline.assembly import assemble
    from pipeline.spec import load_spec
    from pipeline.steps.model import ModelStep

    as_before = ["source.kind=manifest", "source.uri=data/photos/captions.jsonl",
                 "source.path_column=file", "source.caption_column=captions",
                 "source.key_column=key", "dedup.dataset.enabled=false"]
    spec = load_spec(REPO / "examples" / "clip_blip.yaml", as_before)
    step = ModelStep("image_embedding", spec.image_embedding)
    assert not {"heads", "zero_shot"} & set(step.settings())
    assert assemble(spec).fingerprint == "5f7c46904af3d7ec"
    with_zero_shot = type(spec.image_embedding).model_validate(
        {**spec.image_embedding.model_dump(), "zero_shot": [{"name": "dog", "labels": ["x", "y"]}]})
    assert "zero_shot" in ModelStep("image_embedding", with_zero_shot).settings()


def test_job_writes_typed_head_and_zero_shot_columns(ray_local, clip768, head_files, tmp_path):
    from pipeline.read import read_committed
    from pipeline.runtime.driver import run_job

    fields = head_fields(head_files)
    out = tmp_path / "out"
    spec = parse_spec({
        "name": "heads-e2e",
        "source": {"kind": "manifest", "uri": str(REPO / "data/photos/captions.jsonl"),
                   "path_column": "file", "caption_column": "captions", "key_column": "key",
                   "partition_size": 12},
        "sink": {"uri": str(out)},
        "runtime": {"batch_size": 6, "num_workers": 1, "max_attempts": 1},
        "text_embedding": {"enabled": False},
        "image_embedding": {"enabled": True, "model": clip768, "replicas": 1,
                            "num_cpus": 0.25, **fields}})
    report = run_job(spec)
    assert report.complete, report.format()
    check_accounting(str(out))
    table = read_committed(str(out))
    columns = ("aesthetic_score", "nsfw_score", "score_mlp", "score_dog", "score_pet")
    for c in columns:
        assert table.schema.field(c).type == pa.float32(), c
    rows = [r for r in table.to_pylist() if r["status"] == "ok"]
    assert len(rows) == len(coco_captions())
    emb = np.asarray([r["image_embedding"] for r in rows], dtype=np.float32)
    want = _reference(head_files["state"], emb)
    for c in ("aesthetic_score", "nsfw_score", "score_mlp"):
        np.testing.assert_allclose([r[c] for r in rows], want[c], rtol=1e-4, atol=1e-5)
    for c in ("nsfw_score", "score_mlp", "score_dog", "score_pet"):
        assert all(0 < r[c] < 1 for r in rows), c


def test_video_rows_get_the_mean_of_their_frames_scores(ray_local, clip768, head_files,
                                                        tmp_path):
    from pipeline.media.video import decode_video
    from pipeline.read import read_committed
    from pipeline.runtime.driver import run_job
    from pipeline.spec import VideoSpec
    from tests.conftest import DATA

    fields = {"heads": head_fields(head_files)["heads"][:2],
              "zero_shot": [{"name": "dog", "labels": PROMPTS}]}
    video = {"sampling": "uniform", "num_frames": 3}
    out = tmp_path / "out"
    report = run_job(parse_spec({
        "name": "heads-video", "source": {"kind": "files", "media": "video",
                                          "uri": str(DATA / "videos")},
        "sink": {"uri": str(out)}, "video": video,
        "runtime": {"batch_size": 2, "num_workers": 1, "max_attempts": 1},
        "text_embedding": {"enabled": False},
        "image_embedding": {"enabled": True, "model": clip768, "score": False,
                            "replicas": 1, "num_cpus": 0.25, **fields}}))
    assert report.complete, report.format()
    check_accounting(str(out))
    rows = read_committed(str(out)).to_pylist()
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)
    backend = load_backend("image_embedding", section_spec(
        "image_embedding", clip768, score=False, **fields), "cpu")
    for row in rows:
        info = decode_video(str(DATA / "videos" / row["source_uri"].rsplit("/", 1)[1]),
                            VideoSpec(**video))
        frames = np.stack([model_input(f, backend.info.image) for f in info.frames])
        want = backend({"pixels": frames})
        for c in ("aesthetic_score", "nsfw_score", "score_dog"):
            assert abs(row[c] - float(np.mean(want[c]))) < 1e-4 * max(1, abs(row[c])), c
