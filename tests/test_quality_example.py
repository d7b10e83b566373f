"""examples/quality.yaml end to end on Ray (issue 26's "done when"): every signal column
present and typed, filters with their reasons, score-only mode, and ``mmpipe calibrate`` on
the example's by-eye labels (examples/quality_labels.csv) giving its table and plot.

The full run is on all 57 bundled photos (the labels name every one of them); the
score-only run is on the photos the full run rejected (every reason it gave) and the first
few it kept: the claims on it are per row (kept, flagged with the reason the full run
rejected it for, or not flagged) and the counts by flag, which that subset holds in full,
at a fraction of the cost of the 57 photos' OCR and model stages again."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from pipeline import cli
from pipeline.read import read_committed
from pipeline.runtime.driver import run_job
from pipeline.spec import load_spec
from tests.conftest import PHOTOS, REPO
from tests.e2e.jobs import check_accounting

EXAMPLE = REPO / "examples" / "quality.yaml"
LABELS = REPO / "examples" / "quality_labels.csv"
TYPES = {  # every signal column the example turns on, and its Arrow type
    "sharpness": pa.float32(), "brightness": pa.float32(), "contrast": pa.float32(),
    "clipped_fraction": pa.float32(), "text_area_fraction": pa.float32(),
    "text_box_count": pa.int32(), "ocr_text": pa.large_string(),
    "aesthetic_score": pa.float32(), "nsfw_score": pa.float32(),
    "score_watermark": pa.float32(), "watermark_score": pa.float32(),
    "caption_language": pa.string(), "caption_language_confidence": pa.float32(),
    "caption_words": pa.int32(), "caption_chars": pa.int32(),
    "caption_repetition": pa.float32(), "caption_flagged_words": pa.int32(),
    "signal_flags": pa.list_(pa.string()), "clip_score": pa.float32(),
}


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example's text with its models built under a temporary folder."""
    from pipeline.testing.tiny_models import build_tiny_models

    root = tmp_path_factory.mktemp("quality")
    build_tiny_models(root / "tiny-models", ("tiny-clip-768", "tiny-heads", "tiny-convnext"))
    spec = root / "quality.yaml"
    spec.write_text(EXAMPLE.read_text().replace("output/tiny-models", str(root / "tiny-models")))
    return spec


#: ok rows of the full run that the score-only run also gets (it must not flag them)
KEPT_IN_SCORE_ONLY = 3


def _subset(photos, dest, keys):
    """``dest`` holding the bundled photos of ``keys`` with their sidecar captions."""
    dest.mkdir()
    for key in keys:
        for path in photos.glob(f"{key}.*"):
            shutil.copyfile(path, dest / path.name)
    return dest


def _run(example, out, *overrides, source=PHOTOS):
    spec = load_spec(example, [f"source.uri={source}", *overrides], output_uri=str(out))
    report = run_job(spec)
    assert report.complete, report.format()
    check_accounting(str(out))
    return report, {r["key"]: r for r in read_committed(str(out)).to_pylist()}


def test_the_quality_example_writes_every_signal_filters_and_calibrates(ray_local, example,
                                                                       tmp_path, capsys):
    out = tmp_path / "out"
    report, rows = _run(example, out)
    schema = read_committed(str(out)).schema
    assert {name: schema.field(name).type for name in TYPES} == TYPES
    assert len(rows) == 57
    # the three filters, each with its reason, and nothing kept that one of them rejects
    rejected = {k: r["reject_reason"] for k, r in rows.items() if r["status"] == "rejected"}
    assert set(rejected.values()) <= {"blurry", "text_heavy", "language"} and rejected
    for key, row in rows.items():
        blurry = row["sharpness"] < 300.0
        heavy = row["text_area_fraction"] > 0.2
        foreign = row["caption_language"] != "en"
        assert (key in rejected) == (blurry or heavy or foreign), (key, row["sharpness"])
        assert row["status"] in ("ok", "rejected"), row["error"]
        if row["status"] == "ok":    # the models ran on every kept row
            assert 0 <= row["nsfw_score"] <= 1 and 0 <= row["watermark_score"] <= 1
            assert 0 <= row["score_watermark"] <= 1 and np.isfinite(row["aesthetic_score"])
    by_reason = {k.removeprefix("rejected:"): v for k, v in report.rows_by_reason.items()}
    assert by_reason == {r: list(rejected.values()).count(r) for r in set(rejected.values())}

    # score-only, on every rejected photo and a few kept ones: every row kept, the would-be
    # reasons flagged and counted, the kept photos not flagged
    kept = sorted(k for k in rows if k not in rejected)[:KEPT_IN_SCORE_ONLY]
    subset = _subset(PHOTOS, tmp_path / "subset", [*rejected, *kept])
    report2, rows2 = _run(example, tmp_path / "scored", "filters.score_only=true",
                          source=subset)
    assert sorted(rows2) == sorted([*rejected, *kept])
    assert {r["status"] for r in rows2.values()} == {"ok"}
    flagged = {k: r["signal_flags"] for k, r in rows2.items() if r["signal_flags"]}
    assert {k: f[0] for k, f in flagged.items()} == rejected
    assert dict(report2.rows_by_flag) == by_reason

    # calibration on the by-eye labels: the printed best F1 is the one computed here
    capsys.readouterr()
    assert cli.main(["calibrate", str(out), "--labels", str(LABELS)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "_calibration" / "quality_labels" / "calibration.json").read_text())
    labels = {r["key"]: r["label"] == "true" for r in csv.DictReader(LABELS.open())}
    scores = np.array([rows[k]["text_area_fraction"] for k in labels])
    truth = np.array(list(labels.values()))
    best = max(_f1(truth, scores >= t) for t in np.unique(scores))
    assert f"{best:.3f}" in printed and "text_area_fraction" in printed
    assert json.dumps(doc).count("text_area_fraction") >= 1
    with Image.open(out / "_calibration" / "quality_labels" / "calibration.png") as im:
        assert im.size[0] > 100 and im.size[1] > 100


def _f1(truth: np.ndarray, predicted: np.ndarray) -> float:
    tp = int((truth & predicted).sum())
    return 2 * tp / (int(truth.sum()) + int(predicted.sum())) if tp else 0.0
