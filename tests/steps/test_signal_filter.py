"""Filters on any signal column (``filters.signals``): semantics on built batches, presets
and reasons, score-only flags and their counts, spec errors before anything runs, where
the assembler puts each filter, calibrated thresholds, and real jobs over the photos."""

from __future__ import annotations

import json
import typing

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image, ImageOps

from pipeline import calibration
from pipeline.assembly import assemble
from pipeline.cli import main
from pipeline.columns import REJECT_REASON, SIGNAL_FLAGS, STATUS
from pipeline.errors import SpecError
from pipeline.output.checkpoint import CheckpointStore, CommitMarker
from pipeline.read import read_committed
from pipeline.records import RejectReason
from pipeline.runtime.driver import run_job
from pipeline.runtime.report import JobReport
from pipeline.runtime.status import format_status, output_status
from pipeline.spec import SIGNAL_PRESETS, JobSpec, SignalFilterSpec, SignalReason
from pipeline.stats import AttemptStats
from pipeline.steps.signal_filter import SignalFilterStep, SignalRule
from tests.conftest import PHOTOS


def _step(*filters: dict, score_only: bool = False) -> SignalFilterStep:
    rules = [SignalRule.from_spec(i, SignalFilterSpec(**f)) for i, f in enumerate(filters)]
    return SignalFilterStep(rules, score_only, "cpu")


def _batch(**columns: list) -> dict[str, list]:
    n = len(next(iter(columns.values())))
    return {STATUS: ["ok"] * n, REJECT_REASON: [None] * n, **columns}


def _spec(tmp_path, *signals: dict, **sections) -> JobSpec:
    return JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(PHOTOS)}, "sink": {"uri": str(tmp_path / "out")},
        "text_embedding": {"enabled": False},
        "filters": {"signals": list(signals), **sections.pop("filters", {})}, **sections})


# --- semantics on built batches -------------------------------------------------------------

def test_min_and_max_are_inclusive_bounds_and_null_or_nan_is_kept_unscored():
    step = _step({"column": "width", "min": 400, "max": 600})
    batch = step(_batch(width=[399, 400, 600, 601, None, float("nan"), np.float32("nan"), 500]))
    assert batch[STATUS] == ["rejected", "ok", "ok", "rejected", "ok", "ok", "ok", "ok"]
    assert batch[REJECT_REASON] == ["signal", None, None, "signal", None, None, None, None]
    assert batch[SIGNAL_FLAGS] == [[], [], [], [], ["unscored:width"], ["unscored:width"],
                                   ["unscored:width"], []]
    assert dict(step.rejected) == {"signal": 2}


def test_missing_reject_rejects_an_unscored_row_with_the_filters_reason():
    step = _step({"column": "clip_score", "min": 0.2, "missing": "reject",
                  "reason": "low_caption_quality"})
    batch = step(_batch(clip_score=[None, 0.3, float("nan")]))
    assert batch[STATUS] == ["rejected", "ok", "rejected"]
    assert batch[REJECT_REASON] == ["low_caption_quality", None, "low_caption_quality"]
    assert batch[SIGNAL_FLAGS][0] == ["unscored:clip_score"]


def test_allow_keeps_only_the_listed_strings_and_rows_not_ok_are_left_alone():
    step = _step({"column": "format", "allow": ["JPEG", "PNG"]})
    batch = _batch(format=["JPEG", "GIF", "PNG", None, "WEBP"])
    batch[STATUS][4] = "error"
    batch = step(batch)
    assert batch[STATUS] == ["ok", "rejected", "ok", "ok", "error"]
    assert batch[SIGNAL_FLAGS] == [[], [], [], ["unscored:format"], None]


def test_the_first_filter_that_rejects_names_the_reason():
    step = _step({"column": "width", "min": 500, "reason": "blurry"},
                 {"column": "height", "max": 400, "reason": "text_heavy"})
    batch = step(_batch(width=[100, 100, 640, 640], height=[500, 300, 500, 300]))
    assert batch[REJECT_REASON] == ["blurry", "blurry", "text_heavy", None]
    assert dict(step.rejected) == {"blurry": 2, "text_heavy": 1}


def test_score_only_keeps_every_row_flags_each_would_be_rejection_and_counts_them():
    step = _step({"column": "width", "min": 500, "reason": "blurry"},
                 {"column": "height", "max": 400, "reason": "text_heavy"},
                 {"column": "height", "max": 450},            # reason by column: signal
                 score_only=True)
    batch = step(_batch(width=[100, 100, 640, 640, None], height=[500, 300, 500, 300, 420]))
    assert batch[STATUS] == ["ok"] * 5 and batch[REJECT_REASON] == [None] * 5
    assert batch[SIGNAL_FLAGS] == [["blurry", "text_heavy", "signal"], ["blurry"],
                                   ["text_heavy", "signal"], [], ["unscored:width", "text_heavy"]]
    assert not step.rejected
    stats = AttemptStats()
    batch.update({"error_reason": [None] * 5})
    stats.count_rows(batch)
    assert stats.rows_by_flag == {"blurry": 2, "signal": 2, "text_heavy": 3,
                                  "unscored:width": 1}
    assert stats.rows_by_reason == {} and stats.rows_by_status == {"ok": 5}


# --- presets and reasons ------------------------------------------------------------------

@pytest.mark.parametrize("preset, threshold, column, reason, bound", [
    ("aesthetic", 5.0, "aesthetic_score", "low_aesthetic", "min"),
    ("nsfw", 0.5, "nsfw_score", "nsfw", "max"),
    ("watermark", 0.8, "watermark_score", "watermark", "max"),
    ("text_heavy", 0.2, "text_area_fraction", "text_heavy", "max"),
    ("blurry", 100.0, "sharpness", "blurry", "min"),
    ("language", ("en", "de"), "caption_language", "language", "allow"),
])
def test_a_preset_fills_column_reason_and_the_bound_of_its_threshold(
        preset, threshold, column, reason, bound):
    spec = SignalFilterSpec(preset=preset, threshold=threshold)
    assert (spec.column, spec.reason, getattr(spec, bound), spec.threshold) == (
        column, reason, threshold, None)
    assert SIGNAL_PRESETS[preset] == (column, reason, bound)
    assert SignalFilterSpec.model_validate(spec.model_dump()) == spec   # round trip


def test_every_signal_reason_is_a_reject_reason_and_default_reasons_go_by_column():
    assert {RejectReason(r) for r in typing.get_args(SignalReason)} >= {
        RejectReason.LOW_AESTHETIC, RejectReason.NSFW, RejectReason.WATERMARK,
        RejectReason.TEXT_HEAVY, RejectReason.BLURRY, RejectReason.LANGUAGE,
        RejectReason.FLAGGED_WORDS, RejectReason.LOW_CAPTION_QUALITY, RejectReason.SIGNAL}
    assert SignalFilterSpec(column="text_box_count", max=3).reason == "text_heavy"
    assert SignalFilterSpec(column="caption_repetition", max=0.5).reason == "low_caption_quality"
    assert SignalFilterSpec(column="width", min=3).reason == "signal"
    assert SignalFilterSpec(preset="nsfw", threshold=0.5, reason="signal").reason == "signal"
    # a preset's column may be overridden (e.g. a zero-shot score): the reason stays
    assert (SignalFilterSpec(preset="nsfw", column="score_nsfw", threshold=0.5).column
            == "score_nsfw")


@pytest.mark.parametrize("bad, field, words", [
    ({"column": "width"}, "filters.signals.0.min", "needs min, max or allow"),
    ({"threshold": 3}, "filters.signals.0.column", "required"),
    ({"column": "width", "threshold": 3}, "filters.signals.0.threshold", "needs a preset"),
    ({"column": "format", "min": 1, "allow": ["JPEG"]}, "filters.signals.0.allow", "not both"),
    ({"column": "format", "allow": []}, "filters.signals.0.allow", "empty"),
    ({"column": "width", "min": 5, "max": 3}, "filters.signals.0.min", "above max"),
    ({"preset": "nsfw", "threshold": 0.5, "max": 0.3}, "filters.signals.0.threshold", "twice"),
    ({"preset": "nsfw", "threshold": 0.5, "reason": "too_small"}, "filters.signals.0.reason",
     "Input should be"),
])
def test_a_contradictory_filter_is_a_spec_error_naming_the_field(tmp_path, bad, field, words):
    from pipeline.spec import parse_spec
    with pytest.raises(SpecError) as e:
        parse_spec({"source": {"kind": "files", "uri": str(PHOTOS)},
                    "sink": {"uri": str(tmp_path)}, "filters": {"signals": [bad]}})
    assert e.value.field == field and words in str(e.value), str(e.value)


# --- spec errors at assembly (driver), naming filters.signals[i].column -------------------

@pytest.mark.parametrize("signal, sections, words", [
    ({"column": "no_such_column", "min": 1}, {}, "'no_such_column' is not a declared column"),
    ({"column": "clip_score", "min": 0.2}, {}, "'clip_score' is not written by this pipeline"),
    ({"column": "image_width", "min": 100}, {}, "written only after the signal filters run"),
    ({"column": "_pixels", "min": 1}, {}, "internal column"),
    ({"column": "format", "min": 1}, {},
     "'format' is a column of type string; min/max need a numeric column; use allow"),
    ({"column": "width", "allow": ["640"]}, {},
     "'width' is a column of type int32; allow needs a string column"),
    ({"column": "decode_flags", "max": 1}, {}, "min/max need a numeric column"),
    ({"column": "clip_score", "allow": ["x"]},
     {"image_embedding": {"enabled": True, "model": "m"}},
     "'clip_score' is a column of type model-typed (numeric); allow needs a string column"),
    ({"column": "image_embedding", "min": 0},
     {"image_embedding": {"enabled": True, "model": "m"}}, "min/max need a numeric column"),
])
def test_a_filter_the_pipeline_cannot_apply_fails_at_assembly_naming_the_field(
        tmp_path, signal, sections, words):
    spec = _spec(tmp_path, {"column": "width", "min": 1}, signal, **sections)
    with pytest.raises(SpecError) as e:
        assemble(spec)
    assert e.value.field == "filters.signals[1].column", str(e.value)
    assert str(e.value).startswith("filters.signals[1].column: ") and words in str(e.value), \
        str(e.value)
    assert e.value.value == signal["column"]


def test_mmpipe_validate_shows_the_error_and_explain_the_filters(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({
        "source": {"kind": "files", "uri": str(PHOTOS)}, "sink": {"uri": str(tmp_path / "o")},
        "text_embedding": {"enabled": False},
        "filters": {"signals": [{"column": "width", "min": 500},
                                {"column": "clip_score", "min": 0.2}]}}))
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "error: filters.signals[1].column: 'clip_score' is not written by this pipeline" in err
    spec.write_text(spec.read_text().replace(', {"column": "clip_score", "min": 0.2}', ""))
    assert main(["validate", "--explain", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "  SignalFilterStep[cpu]\n    reads width\n    writes reject_reason, signal_flags\n" \
        in out
    assert '"0": {"allow": null, "calibrated": {}, "column": "width", "max": null, "min": 500.0' \
        in out
    assert "  signal_flags: list<item: string>" in out


# --- placement ----------------------------------------------------------------------------

def test_a_model_column_filter_runs_after_its_stage_and_before_captioning(tmp_path):
    spec = _spec(tmp_path, {"column": "width", "min": 500}, {"column": "clip_score", "min": 0.2},
                 image_embedding={"enabled": True, "model": "m"},
                 captioning={"enabled": True, "model": "c"})
    p = assemble(spec)                                 # unbound: no model is loaded
    names = [s.name for s in p.steps]
    assert names.index("SignalFilterStep[cpu]") == names.index("ModelInputStep") - 1
    assert names.index("SignalFilterStep[cpu]") > names.index("DedupStep")
    assert [[t.name for t in stage] for stage in p.models.stages] == [
        ["ModelStep[image_embedding]"], ["ModelStep[captioning]"]]
    assert [[f.name for f in fs] for fs in p.models.filters] == [
        ["SignalFilterStep[model stage 0]"], []]
    cpu, model = p.steps[names.index("SignalFilterStep[cpu]")], p.models.filters[0][0]
    assert (cpu.reads, model.reads) == (("width",), ("clip_score",))
    assert list(model.settings()["filters"]) == ["1"]       # spec index kept
    assert set(p.settings()["steps"]) >= {"SignalFilterStep[cpu]",
                                          "SignalFilterStep[model stage 0]"}


def test_with_only_cpu_filters_captioning_stays_in_stage_0_and_the_score_filter_comes_first(
        tmp_path):
    spec = _spec(tmp_path, {"column": "width", "min": 500},
                 image_embedding={"enabled": True, "model": "m"},
                 captioning={"enabled": True, "model": "c"})
    p = assemble(spec)
    assert [len(s) for s in p.models.stages] == [2] and p.models.filters == [[]]
    spec = _spec(tmp_path, {"column": "clip_score", "max": 0.9},
                 image_embedding={"enabled": True, "model": "m", "min_clip_score": 0.1},
                 captioning={"enabled": True, "model": "c"})
    p = assemble(spec)
    assert [[f.name for f in fs] for fs in p.models.filters] == [
        ["ScoreFilterStep", "SignalFilterStep[model stage 0]"], []]


def test_a_stage_without_rows_to_send_still_runs_its_filters():
    """A batch none of whose rows goes to a model (e.g. no caption for a text model) still
    passes the stage's filters: its rows are flagged unscored (or rejected: missing)."""
    from pipeline.steps.model import ModelStages

    class NoRows:
        writes, max_in_flight, client = ("clip_score",), 1, None

        def rows(self, batch):
            return []

    step = _step({"column": "clip_score", "min": 0.2, "missing": "reject"})
    stages = ModelStages([[NoRows()]], [[step]])
    batch = stages.finish(stages.start(_batch(width=[1, 2])))
    assert batch[STATUS] == ["rejected", "rejected"]
    assert batch[SIGNAL_FLAGS] == [["unscored:clip_score"]] * 2


def test_filter_settings_do_not_change_the_fingerprint_of_a_spec_without_them(tmp_path):
    base = _spec(tmp_path)
    assert "signals" not in assemble(base).settings()["steps"]["FilterStep"]
    assert assemble(base).fingerprint == assemble(_spec(tmp_path, filters={"score_only": True})
                                                  ).fingerprint
    one = assemble(_spec(tmp_path, {"column": "width", "min": 500})).fingerprint
    assert one != assemble(base).fingerprint
    assert one != assemble(_spec(tmp_path, {"column": "width", "min": 501})).fingerprint
    assert one != assemble(_spec(tmp_path, {"column": "width", "min": 500},
                                 filters={"score_only": True})).fingerprint


# --- calibrated thresholds --------------------------------------------------------------------

def _calibration_file(tmp_path) -> str:
    """A real calibration (``calibration.calibrate``) of ``width`` on 8 rows: label True
    (the row "is wide") for widths >= 600, one false positive at 620."""
    widths = [320, 400, 480, 560, 600, 620, 640, 700]
    labels = [False, False, False, False, True, False, True, True]
    table = pa.table({"key": [f"k{i}" for i in range(8)], "width": pa.array(widths, pa.int32())})
    rows = [calibration.Label(f"k{i}", "width", lab, i + 2) for i, lab in enumerate(labels)]
    doc = calibration.calibrate(table, calibration.Labels("labels.csv", "csv", "0" * 64, rows),
                                ["width"], 0.9, "widths", {"uri": "x"})
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_calibrated_threshold_is_resolved_at_assembly_into_the_settings(tmp_path):
    uri = _calibration_file(tmp_path)
    want = calibration.threshold_for(uri, "width", 1.0)
    assert want == 640.0                  # 640 and 700: both positives; 620 is not
    ref = {"calibration": uri, "precision": 1.0}
    p = assemble(_spec(tmp_path, {"column": "width", "min": ref}))
    settings = p.settings()["steps"]["SignalFilterStep[cpu]"]["filters"]["0"]
    assert (settings["min"], settings["calibrated"]) == (want, {"min": ref})
    assert f'"min": {want}' in p.explain()


@pytest.mark.parametrize("ref, words", [
    ({"calibration": "missing.json", "precision": 0.9}, "not found"),
    ({"calibration": "CAL", "precision": 0.5}, "no column 'height'"),
])
def test_a_bad_calibration_reference_fails_at_assembly_naming_the_bound(tmp_path, ref, words):
    ref = {**ref, "calibration": ref["calibration"].replace("CAL", _calibration_file(tmp_path))}
    column = "height" if "height" in words else "width"
    with pytest.raises(SpecError) as e:
        assemble(_spec(tmp_path, {"column": "width", "min": 1},
                       {"column": column, "max": ref}))
    assert e.value.field == "filters.signals[1].max" and words in str(e.value), str(e.value)


# --- old markers, real jobs -------------------------------------------------------------------

def test_a_marker_without_rows_by_flag_reads_as_empty():
    marker = CommitMarker.parse(json.dumps({
        "partition_id": "p-000000", "attempt_id": "a", "fingerprint": "f", "files": [],
        "rows_in": 1, "rows_by_status": {"ok": 1}}))
    assert marker.rows_by_flag == {}
    report = JobReport("j", "o", "f", "p")
    report.add_marker(marker, True)
    assert report.to_dict()["rows_by_flag"] == {} and "flagged" not in report.format()


def _narrow_keys() -> set[str]:
    """Keys of the bundled photos narrower than 500 px upright (EXIF orientation applied),
    measured with Pillow here, independently of the pipeline's decoder."""
    keys = set()
    for path in sorted(PHOTOS.glob("*.jpg")):
        with Image.open(path) as im:
            if ImageOps.exif_transpose(im).width < 500:
                keys.add(path.stem)
    return keys


def _job(tmp_path, name: str, score_only: bool):
    spec = _spec(tmp_path / name, {"column": "width", "min": 500},
                 filters={"score_only": score_only},
                 resize={"size_px": 32},
                 source={"kind": "files", "uri": str(PHOTOS), "partition_size": 1000},
                 runtime={"num_workers": 1, "batch_size": 16, "max_attempts": 1})
    report = run_job(spec)
    assert report.complete, report.format()
    out = str(tmp_path / name / "out")
    markers = CheckpointStore(out).markers()
    assert len(markers) == 1
    rows = {r["key"]: r for r in read_committed(out).to_pylist()}
    return report, next(iter(markers.values())), rows, out


def test_a_width_filter_rejects_exactly_the_narrow_photos_and_counts_match(ray_local, tmp_path):
    narrow = _narrow_keys()
    assert len(narrow) == 7, narrow               # 424, 480, 427, 480, 426, 383, 480 px wide
    report, marker, rows, _ = _job(tmp_path, "filter", score_only=False)
    assert len(rows) == 57
    assert {k for k, r in rows.items() if r["status"] == "rejected"} == narrow
    assert {r["reject_reason"] for k, r in rows.items() if k in narrow} == {"signal"}
    assert all(r["image"] is None for k, r in rows.items() if k in narrow)
    assert all(rows[k]["width"] >= 500 and rows[k]["signal_flags"] == [] for k in
               set(rows) - narrow)
    assert marker.rows_by_reason == {"rejected:signal": 7} and marker.rows_by_flag == {}
    assert marker.rows_by_status == {"ok": 50, "rejected": 7, "error": 0}
    d = report.to_dict()
    assert d["rows_by_reason"] == {"rejected:signal": 7} and d["rows_by_flag"] == {}
    assert "reasons: rejected:signal=7" in report.format()


def test_score_only_keeps_every_photo_and_flags_the_narrow_ones(ray_local, tmp_path):
    narrow = _narrow_keys()
    report, marker, rows, out = _job(tmp_path, "score", score_only=True)
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert {k for k, r in rows.items() if r["signal_flags"] == ["signal"]} == narrow
    assert all(r["signal_flags"] == [] for k, r in rows.items() if k not in narrow)
    assert all(r["image"] is not None for r in rows.values())
    assert marker.rows_by_reason == {} and marker.rows_by_flag == {"signal": 7}
    assert report.to_dict()["rows_by_flag"] == {"signal": 7}
    assert "flagged (signal filters): signal=7" in report.format()
    status = output_status(out)
    assert status["rows_by_flag"] == {"signal": 7}
    assert "flagged (signal filters): signal=7" in format_status(status)


def test_the_aesthetic_preset_on_a_head_column_runs_before_captioning(tmp_path):
    spec = _spec(tmp_path, {"preset": "aesthetic", "threshold": 5.0},
                 image_embedding={"enabled": True, "model": "m", "heads": [
                     {"preset": "laion-aesthetic", "weights": "w.pth"}]},
                 captioning={"enabled": True, "model": "c"})
    p = assemble(spec)
    assert [[t.section for t in stage] for stage in p.models.stages] == [
        ["image_embedding"], ["captioning"]]
    assert [f.reads for f in p.models.filters[0]] == [("aesthetic_score",)]


@pytest.fixture(scope="module")
def clip_and_blip(tmp_path_factory) -> dict:
    """Tiny random ``tiny-clip`` and ``tiny-blip`` checkpoints (``testing.tiny_models``)."""
    from pipeline.testing.tiny_models import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny"), ("tiny-clip", "tiny-blip"))


def test_a_clip_score_filter_with_bound_tiny_models_rejects_before_captioning(
        clip_and_blip, tmp_path):
    """Real (tiny, random) CLIP and BLIP checkpoints bound in process: score-only flags
    exactly the rows below the threshold and captions every row; the filter then rejects
    exactly those rows, and the captioner sees only the others."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.output import plan as planning
    from pipeline.runtime.partition import run_partition
    from pipeline.models.local import local_models

    pool = ThreadPoolExecutor(2)

    def run(name: str, threshold: float, score_only: bool):
        spec = _spec(tmp_path / name, {"column": "clip_score", "min": threshold},
                     filters={"score_only": score_only}, runtime={"batch_size": 4},
                     source={"kind": "files", "uri": str(PHOTOS), "partition_size": 12},
                     image_embedding={"enabled": True, "model": str(clip_and_blip["tiny-clip"])},
                     captioning={"enabled": True, "model": str(clip_and_blip["tiny-blip"]),
                                 "max_new_tokens": 3})
        models = local_models(spec)
        pipeline = assemble(spec, models, pool, setup=True)
        assert [[f.name for f in fs] for fs in pipeline.models.filters] == [
            ["SignalFilterStep[model stage 0]"], []]
        part = next(planning.pack(pipeline.datasource.list_inputs(), 12))
        marker = run_partition(pipeline, part, "a1", pool).marker
        return marker, read_committed(str(tmp_path / name / "out")).to_pylist()

    marker, rows = run("probe", -1.0, True)
    scores = sorted(r["clip_score"] for r in rows)
    threshold = (scores[5] + scores[6]) / 2              # half of the 12 rows below it
    marker, rows = run("score", threshold, True)
    low = {r["key"] for r in rows if r["clip_score"] < threshold}
    assert len(low) == 6
    assert {r["key"] for r in rows if r["signal_flags"] == ["signal"]} == low
    assert all(r["status"] == "ok" and r["generated_caption"] is not None for r in rows)
    assert marker.rows_by_flag == {"signal": 6} and marker.rows_by_reason == {}
    marker, rows = run("filter", threshold, False)
    assert {r["key"] for r in rows if r["status"] == "rejected"} == low
    # never captioned: the captioner's column is set only on the rows sent to it
    assert all((r["generated_caption"] is None) == (r["key"] in low) for r in rows)
    assert marker.rows_by_reason == {"rejected:signal": 6}


def test_the_worker_records_each_flag_it_committed_as_a_metric(monkeypatch):
    from pipeline.runtime import metrics
    from pipeline.runtime.partition import AttemptOutcome

    recorded = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def inc(self, n, tags):
            recorded.append((self.name, n, tags))

        observe = inc

    monkeypatch.setattr(metrics, "metric", Recorder)
    marker = CommitMarker(partition_id="p-000000", attempt_id="a", fingerprint="f", files=[],
                          rows_in=9, rows_by_status={"ok": 9},
                          rows_by_flag={"signal": 7, "unscored:width": 1})
    outcome = AttemptOutcome(marker, True, {("ok", "none"): 9})
    metrics.WorkerMetrics("job", 0).partition_done(outcome, 1.0)
    assert [(n, v, t) for n, v, t in recorded if n == "mmpipe_records_flagged"] == [
        ("mmpipe_records_flagged", 7, {"job_name": "job", "flag": "signal"}),
        ("mmpipe_records_flagged", 1, {"job_name": "job", "flag": "unscored:width"})]
    assert "mmpipe_records_flagged" in metrics.METRIC_NAMES


def test_filters_on_cpu_signal_columns_run_after_the_signal_steps(tmp_path):
    spec = _spec(tmp_path, {"preset": "blurry", "threshold": 50.0},
                 {"preset": "language", "threshold": ["en"]},
                 signals={"image": {"enabled": True}, "caption": {"enabled": True}})
    p = assemble(spec)
    names = [s.name for s in p.steps]
    assert names.index("SignalFilterStep[cpu]") > max(
        names.index("ImageSignalsStep"), names.index("CaptionSignalsStep"))
    assert names.index("SignalFilterStep[cpu]") == names.index("ResizeStep") - 1
    step = p.steps[names.index("SignalFilterStep[cpu]")]
    assert step.reads == ("sharpness", "caption_language")
    assert [(r.reason.value, r.low, r.allow) for r in step.rules] == [
        ("blurry", 50.0, None), ("language", None, ("en",))]
