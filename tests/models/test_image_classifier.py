"""The ``image-classifier`` backend (``image_classification``): a tiny random ConvNeXt
checkpoint through the normal loading path, against transformers' own pipeline, and in
a real job on the bundled photos."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import yaml
from PIL import Image

from pipeline.errors import ModelLoadError, SpecError
from pipeline.media.decode import decode_image
from pipeline.media.geometry import model_input
from pipeline.models.registry import check_models, load_backend
from pipeline.spec import JobSpec, load_spec, parse_spec
from tests.conftest import PHOTOS, REPO, coco_captions
from tests.models.conftest import photo_pixels, section_spec

SECTION = "image_classification"


def classifier(tiny_models, **fields):
    return load_backend(SECTION, section_spec(SECTION, str(tiny_models["tiny-convnext"]),
                                              **fields), "cpu")


def model_pixels(backend, n: int) -> np.ndarray:
    return np.stack([model_input(p, backend.info.image) for p in photo_pixels(n)])


def test_loads_through_the_registry_with_the_processors_geometry(tiny_models):
    spec = section_spec(SECTION, str(tiny_models["tiny-convnext"]))
    assert check_models(spec) == {SECTION: "image-classifier"}
    backend = load_backend(SECTION, spec, "cpu")
    info = backend.info
    assert info.backend == "image-classifier" and info.text is None
    assert [(f.name, f.kind) for f in info.outputs] == [("watermark_score", "float")]
    # ConvNeXt at 224 px: shorter side to int(224 / 0.875) = 256, centre crop 224 x 224
    geometry = info.image
    assert (geometry.mode, geometry.height_px, geometry.width_px,
            geometry.shortest_edge_px, geometry.resample) == ("center_crop", 224, 224, 256, 3)
    assert "ConvNextForImageClassification" in info.description
    assert "P(watermark) of 2 labels" in info.description


def test_scores_match_transformers_own_preprocessing_and_softmax(tiny_models):
    """CPU-side crop + device-side normalisation == ``AutoImageProcessor`` on the decoded
    photos, then ``softmax(logits)[:, watermark]``."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    path = tiny_models["tiny-convnext"]
    backend = classifier(tiny_models)
    pixels = photo_pixels(8)
    got = backend({"pixels": np.stack([model_input(p, backend.info.image) for p in pixels])})
    processor = AutoImageProcessor.from_pretrained(path)
    model = AutoModelForImageClassification.from_pretrained(path).eval()
    with torch.inference_mode():
        inputs = processor(images=[Image.fromarray(p) for p in pixels], return_tensors="pt")
        want = torch.softmax(model(**inputs).logits, dim=-1)[:, 1].numpy()
    np.testing.assert_allclose(got["watermark_score"], want, atol=1e-5)


def test_outputs_shape_dtype_range_and_determinism(tiny_models):
    backend = classifier(tiny_models)
    pixels = model_pixels(backend, 10)
    first = backend({"pixels": pixels})
    assert set(first) == {"watermark_score"}
    score = first["watermark_score"]
    assert score.shape == (10,) and score.dtype == np.float32
    assert np.all((score >= 0) & (score <= 1))
    assert score.std() > 0.01                        # the random model still sees the image
    again = classifier(tiny_models)({"pixels": pixels})   # a second load: same weights
    np.testing.assert_array_equal(again["watermark_score"], score)


def test_a_batch_equals_its_rows_one_by_one(tiny_models):
    backend = classifier(tiny_models)
    pixels = model_pixels(backend, 7)
    batch = backend({"pixels": pixels})["watermark_score"]
    alone = np.concatenate([backend({"pixels": pixels[i:i + 1]})["watermark_score"]
                            for i in range(len(pixels))])
    np.testing.assert_allclose(batch, alone, atol=1e-6)
    prepared = backend.prepare({"pixels": pixels})          # the actor's prepare/run split
    np.testing.assert_allclose(backend.run(prepared)["watermark_score"], batch, atol=1e-6)


def test_positive_labels_sum_their_probabilities_into_the_named_column(tiny_models):
    backend = classifier(tiny_models)
    pixels = model_pixels(backend, 5)
    watermark = backend({"pixels": pixels})["watermark_score"]
    clear = classifier(tiny_models, positive_labels=["clear"], column="score_clear")
    assert [f.name for f in clear.info.outputs] == ["score_clear"]
    clear_score = clear({"pixels": pixels})["score_clear"]
    np.testing.assert_allclose(clear_score, 1 - watermark, atol=1e-6)
    both = classifier(tiny_models, positive_labels=["clear", "watermark"])
    np.testing.assert_allclose(both({"pixels": pixels})["watermark_score"], 1.0, atol=1e-6)


def test_an_unknown_positive_label_is_refused_naming_it_and_the_models_labels(tiny_models):
    spec = section_spec(SECTION, str(tiny_models["tiny-convnext"]), positive_labels=["logo"])
    with pytest.raises(ModelLoadError, match=r"image_classification\.positive_labels: "
                       r"\['logo'\] not among .*\['clear', 'watermark'\]"):
        check_models(spec)
    with pytest.raises(ModelLoadError, match="logo"):                # in the actor too
        load_backend(SECTION, spec, "cpu")


def test_an_unknown_positive_label_fails_mmpipe_run_before_ray_starts(tiny_models, tmp_path):
    spec = {"source": {"kind": "files", "uri": str(PHOTOS)}, "sink": {"uri": str(tmp_path / "out")},
            "text_embedding": {"enabled": False},
            SECTION: {"enabled": True, "model": str(tiny_models["tiny-convnext"]),
                      "positive_labels": ["watermark", "logo"]}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "image_classification.positive_labels: ['logo']" in done.stderr
    assert "['clear', 'watermark']" in done.stderr and "Traceback" not in done.stderr
    assert "started a local Ray" not in done.stderr and not (tmp_path / "out").exists()


def test_a_multi_label_checkpoint_is_refused(tiny_models):
    from pipeline.models.image_classifier import positive_label_ids

    spec = section_spec(SECTION, "m").image_classification
    config = {"id2label": {"0": "clear", "1": "watermark"}}
    assert positive_label_ids(config, spec) == [1]
    with pytest.raises(ModelLoadError, match="multi-label"):
        positive_label_ids(dict(config, problem_type="multi_label_classification"), spec)
    with pytest.raises(ModelLoadError, match="no id2label"):
        positive_label_ids({}, spec)


def test_spec_round_trip_defaults_and_errors(tmp_path):
    spec = section_spec(SECTION, "some/model", positive_labels=["watermark", "logo"],
                        column="score_marks", batch_size=16)
    section = spec.image_classification
    assert (section.backend, section.positive_labels, section.column) == (
        "auto", ("watermark", "logo"), "score_marks")
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(json.loads(spec.model_dump_json())))
    assert load_spec(path) == spec
    default = JobSpec.model_validate({"source": {"kind": "files", "uri": "a"},
                                      "sink": {"uri": "b"}}).image_classification
    assert (default.enabled, default.positive_labels, default.column) == (
        False, ("watermark",), "watermark_score")
    base = {"source": {"kind": "files", "uri": "a"}, "sink": {"uri": "b"}}
    for fields, field in [({"enabled": True}, "model is required"),
                          ({"column": "Watermark"}, "image_classification.column"),
                          ({"column": "width"}, "image_classification.column"),
                          ({"positive_labels": []}, "image_classification.positive_labels"),
                          ({"positive_labels": ["a", "a"]}, "repeated"),
                          ({"backend": "timm"}, "image_classification.backend")]:
        with pytest.raises(SpecError, match=field):
            parse_spec(dict(base, image_classification=fields))
    with pytest.raises(SpecError, match="image_classification is enabled"):
        parse_spec(dict(base, decode={"device": "cuda"},
                        image_embedding={"enabled": True, "model": "m"},
                        image_classification={"enabled": True, "model": "m"}))


def test_assembly_puts_the_classifier_in_stage_0_behind_model_inputs(tiny_models):
    from pipeline.assembly import assemble
    from pipeline.steps.model_input import ModelInputStep

    spec = section_spec(SECTION, str(tiny_models["tiny-convnext"]))
    unbound = assemble(spec)
    assert [[t.section for t in s] for s in unbound.models.stages] == [[SECTION]]
    assert any(isinstance(s, ModelInputStep) for s in unbound.steps)
    assert "watermark_score: model-typed" in unbound.explain()
    backend = load_backend(SECTION, spec, "cpu")
    bound = assemble(spec, {SECTION: (None, backend.info)})
    fields = {f.name: f.type for f in bound.fields()}
    assert fields["watermark_score"] == pa.float32()
    named = section_spec(SECTION, str(tiny_models["tiny-convnext"]), column="score_marks")
    renamed = load_backend(SECTION, named, "cpu")
    fields = {f.name: f.type for f in assemble(named, {SECTION: (None, renamed.info)}).fields()}
    assert fields["score_marks"] == pa.float32() and "watermark_score" not in fields
    other = section_spec(SECTION, str(tiny_models["tiny-convnext"]), positive_labels=["clear"])
    assert assemble(other).fingerprint != unbound.fingerprint     # labels change the output
    served = section_spec(SECTION, str(tiny_models["tiny-convnext"]), replicas=3)
    assert assemble(served).fingerprint == unbound.fingerprint    # serving fields do not


def test_video_rows_send_the_middle_frame(tiny_models):
    """A model without vector outputs gets one frame per video: the middle sampled one."""
    from pipeline.steps.model import ModelStep

    backend = classifier(tiny_models)
    spec = section_spec(SECTION, str(tiny_models["tiny-convnext"]))
    step = ModelStep(SECTION, spec.image_classification, video=True).bind(None, backend.info)
    assert not step.per_frame
    frames = np.stack([np.full((224, 224, 3), v, np.uint8) for v in (0, 100, 200)])
    inputs = step.inputs({backend.info.image.column: [frames]}, [0])
    np.testing.assert_array_equal(inputs["pixels"], frames[1:2])


@pytest.mark.parametrize("column", ["watermark_score", "score_marks"])
def test_a_job_writes_a_typed_watermark_score(ray_local, tiny_models, tmp_path, column):
    from pipeline.read import read_committed
    from pipeline.runtime.driver import run_job
    from tests.e2e.jobs import check_accounting

    rows = coco_captions()
    backend = classifier(tiny_models)
    # what a worker sends: decoded once (JPEG draft to the largest consumer: 256 px)
    pixels = np.stack([model_input(decode_image((PHOTOS / r["file"]).read_bytes(),
                                                draft_min_side_px=256).pixels,
                                   backend.info.image) for r in rows])
    expected = dict(zip([r["key"] for r in rows], backend({"pixels": pixels})["watermark_score"]))
    out = tmp_path / "out"
    spec = JobSpec.model_validate({
        "name": "classifier-e2e",
        "source": {"kind": "manifest", "uri": str(REPO / "data/photos/captions.jsonl"),
                   "path_column": "file", "caption_column": "captions", "key_column": "key",
                   "partition_size": 20},
        "sink": {"uri": str(out), "rows_per_row_group": 8},
        "runtime": {"batch_size": 8, "num_workers": 1, "max_attempts": 1},
        "text_embedding": {"enabled": False},
        SECTION: {"enabled": True, "model": str(tiny_models["tiny-convnext"]),
                  "column": column, "replicas": 1, "num_cpus": 0.25, "batch_size": 16}})
    report = run_job(spec)
    assert report.complete and report.partitions_total == 3
    check_accounting(str(out))
    table = read_committed(str(out))
    assert table.schema.field(column).type == pa.float32()
    assert [n for n in table.schema.names if "score" in n] == [column]
    got = {r["key"]: r for r in table.to_pylist()}
    assert set(got) == set(expected)
    for key, want in expected.items():
        assert got[key]["status"] == "ok"
        assert 0.0 <= got[key][column] <= 1.0
        assert abs(got[key][column] - want) < 1e-5, key
    (stats,) = report.model_actors
    assert stats["model"] == SECTION and stats["records"] == len(rows)
    assert stats["backend"] == "image-classifier"
