"""Model sections of the job spec: validation, fingerprint, the example spec."""

from __future__ import annotations

import pytest

from pipeline.errors import SpecError
from pipeline.assembly import fingerprint
from pipeline.spec import load_spec, parse_spec
from tests.conftest import REPO

BASE = {"source": {"kind": "files", "uri": "in"}, "sink": {"uri": "out"}}


def spec_with(**sections):
    return parse_spec({**BASE, **sections})


@pytest.mark.parametrize("section, fields, message", [
    ("image_embedding", {"enabled": True}, "image_embedding.model is required"),
    ("captioning", {"enabled": True}, "captioning.model is required"),
    ("image_embedding", {"enabled": True, "model": "m", "score": False, "min_clip_score": 0.2},
     "min_clip_score needs score"),
    ("image_embedding", {"min_clip_score": 1.5}, "image_embedding.min_clip_score"),
    ("captioning", {"num_beams": 0}, "captioning.num_beams"),
    ("captioning", {"backend": "gpt"}, "captioning.backend"),
    ("image_embedding", {"num_gpus": -1}, "image_embedding.num_gpus"),
    ("image_embedding", {"embedding_dtype": "int8"}, "image_embedding.embedding_dtype"),
])
def test_bad_model_sections_name_the_field(section, fields, message):
    with pytest.raises(SpecError, match=message):
        spec_with(**{section: fields})


def test_fingerprint_ignores_serving_fields_but_not_model_fields():
    img = {"enabled": True, "model": "m"}
    base = fingerprint(spec_with(image_embedding=img))
    assert fingerprint(spec_with(image_embedding={**img, "replicas": 8, "num_gpus": 0.5,
                                                  "batch_size": 512, "max_in_flight": 4,
                                                  "actor_concurrency": 2})) == base
    for change in ({"model": "other"}, {"min_clip_score": 0.28}, {"embedding_dtype": "float16"},
                   {"dtype": "bfloat16"}):
        assert fingerprint(spec_with(image_embedding={**img, **change})) != base, change
    assert fingerprint(spec_with(captioning={"enabled": False, "max_new_tokens": 5})) == \
        fingerprint(spec_with())                       # a disabled section counts as disabled
    assert fingerprint(spec_with(text_embedding={"replicas": 3})) == fingerprint(spec_with())


def test_example_spec_validates_and_enables_the_three_steps():
    spec = load_spec(REPO / "examples" / "clip_blip.yaml")
    assert spec.image_embedding.enabled and spec.captioning.enabled
    assert spec.image_embedding.min_clip_score is not None
    assert not spec.text_embedding.enabled
