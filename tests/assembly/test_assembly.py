"""The assembled pipeline: derived schema, declared columns, fingerprint, an added step."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from pipeline import assembly
from pipeline.assembly import assemble, fingerprint
from pipeline.errors import AssemblyError
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import read_committed
from pipeline.input.source_uri import local_path
from pipeline.runtime.preflight import foreign_output_message
from pipeline.records import Partition
from pipeline.runtime.partition import AttemptOutcome, run_partition
from pipeline.spec import JobSpec, load_spec
from pipeline.steps.base import RowStep
from pipeline.media.decode import decode_image
from tests.assembly.mean_brightness_step import MeanBrightnessStep
from tests.conftest import PHOTOS, REPO

QUICKSTART = REPO / "examples" / "quickstart.yaml"
URLS = REPO / "examples" / "url_manifest.yaml"


def _files_spec(tmp_path, **extra) -> JobSpec:
    return JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(PHOTOS), "partition_size": 6},
        "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False}, **extra})


def _run_first_partition(spec: JobSpec) -> tuple[assembly.Pipeline, Partition, AttemptOutcome]:
    """Assemble ``spec``'s pipeline (no models), write its plan and run attempt ``a1`` of
    the first partition in this process."""
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    plan = planning.write_plan(spec.sink.uri, pipeline.datasource.list_inputs(), spec.source)
    part = planning.read_partition(spec.sink.uri, plan.partition_ids[0])
    return pipeline, part, run_partition(pipeline, part, "a1", pool)


def test_schema_is_derived_from_what_the_pipeline_writes(tmp_path):
    image = assemble(_files_spec(tmp_path))
    names = [f.name for f in image.fields()]
    assert names[:7] == ["key", "partition_id", "source_uri", "status", "reject_reason",
                         "error_reason", "error"]
    assert {"phash", "duplicate_of", "image", "metadata_json"} <= set(names)
    assert not {"frames", "duration_s", "text_embedding"} & set(names)
    video = assemble(JobSpec.model_validate({
        "source": {"kind": "files", "media": "video", "uri": str(REPO / "data/videos")},
        "sink": {"uri": str(tmp_path / "v")}, "text_embedding": {"enabled": False}}))
    vnames = [f.name for f in video.fields()]
    assert {"frames", "duration_s", "frame_timestamps_s", "image"} <= set(vnames)
    assert not {"n_frames", "is_animated", "has_alpha"} & set(vnames)   # image-only columns
    assert video.fields()[vnames.index("frames")].type == pa.list_(pa.binary())


def test_a_step_writing_an_undeclared_column_fails_at_assembly(tmp_path, monkeypatch):
    class Sloppy(RowStep):
        writes = ("brightness_typo",)

    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: Sloppy()])
    with pytest.raises(AssemblyError, match="Sloppy writes 'brightness_typo', which is not "
                                            "declared in pipeline.columns"):
        assemble(_files_spec(tmp_path))


def test_a_step_that_writes_more_than_it_declares_fails_the_partition(tmp_path, monkeypatch):
    class Leaky(RowStep):
        def process_row(self, batch, i):
            return {}

        def __call__(self, batch):
            batch["undeclared"] = [1] * len(batch["key"])
            return batch

    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: Leaky()])
    with pytest.raises(AssemblyError, match=r"Leaky wrote undeclared columns \['undeclared'\]"):
        _run_first_partition(_files_spec(tmp_path))
    assert not (tmp_path / "out" / "data").exists()          # the attempt's files are gone


def test_an_added_step_in_one_file_and_one_line_reaches_the_output(tmp_path, monkeypatch):
    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: MeanBrightnessStep()])
    spec = _files_spec(tmp_path)
    pipeline, _, out = _run_first_partition(spec)
    assert pipeline.settings()["steps"]["MeanBrightnessStep"] == {"digits": 2}
    assert out.committed and out.marker.rows_in == 6
    table = read_committed(spec.sink.uri)
    assert table.schema.field("mean_brightness").type == pa.float32()
    for row in table.to_pylist():
        assert row["status"] == "ok"
        with open(local_path(row["source_uri"]), "rb") as f:   # the decode step's draft
            pixels = decode_image(f.read(), draft_min_side_px=256).pixels
        assert row["mean_brightness"] == pytest.approx(round(float(pixels.mean()), 2), abs=1e-3)
        assert 0 < row["mean_brightness"] < 255
    # its setting is part of the fingerprint
    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: MeanBrightnessStep(3)])
    assert assemble(spec).fingerprint != pipeline.fingerprint


def test_fingerprint_follows_output_affecting_settings_only():
    base = fingerprint(load_spec(URLS))
    for same in ("video.temp_dir=/tmp/elsewhere", "runtime.num_workers=7",
                 "runtime.batch_size=5", "download.threads=3", "download.max_per_host=1",
                 "text_embedding.replicas=4", "runtime.max_attempts=9"):
        assert fingerprint(load_spec(URLS, [same])) == base, same
    for changed in ("download.timeout_s=1", "download.max_time_s=5", "download.retries=0",
                    "download.backoff_s=2", "download.user_agent=other/1.0",
                    "download.disallowed_header_directives=[]", "decode.max_bytes=1000",
                    "decode.max_pixels=1000", "resize.size_px=128", "dedup.near=false",
                    "sink.quarantine=false", "sink.webdataset.enabled=true"):
        assert fingerprint(load_spec(URLS, [changed])) != base, changed


def test_an_output_of_another_fingerprint_is_refused_naming_the_changed_setting(tmp_path):
    spec = load_spec(QUICKSTART, ["text_embedding.enabled=false", "source.partition_size=20"],
                     output_uri=str(tmp_path / "out"))
    pipeline, _, _ = _run_first_partition(spec)
    changed = assemble(load_spec(QUICKSTART, ["text_embedding.enabled=false",
                                              "source.partition_size=20", "filters.min_width_px=500"],
                                 output_uri=str(tmp_path / "out")))
    done, foreign = CheckpointStore(spec.sink.uri).committed(changed.fingerprint)
    assert not done and list(foreign) == ["p-000000"]
    message = foreign_output_message(spec.sink.uri, foreign, changed.fingerprint,
                                     changed.settings())
    assert (f"1 partitions were committed under another spec fingerprint "
            f"({pipeline.fingerprint}; this spec has {changed.fingerprint})") in message
    assert "settings changed: steps.FilterStep.min_width_px: 64 -> 500" in message
    assert "use --mode overwrite or a new output location" in message


def test_reasons_are_typed_from_the_step_to_the_columns_and_the_marker(mixed_input, tmp_path):
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(mixed_input), "partition_size": 100},
        "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False},
        "filters": {"min_width_px": 400}})
    _, part, outcome = _run_first_partition(spec)
    marker = outcome.marker
    rows = read_committed(spec.sink.uri).to_pylist()
    counted: dict[str, int] = {}
    for r in rows:
        if r["status"] == "error":
            assert r["error"].startswith(f"{r['error_reason']}: ") and r["reject_reason"] is None
            key = f"error:{r['error_reason']}"
        elif r["status"] == "rejected":
            assert r["error_reason"] is None and r["error"] is None
            key = f"rejected:{r['reject_reason']}"
        else:
            assert r["error_reason"] is None and r["reject_reason"] is None
            continue
        counted[key] = counted.get(key, 0) + 1
    assert marker.rows_by_reason == counted
    assert {"rejected:duplicate", "rejected:too_small"} <= set(counted)
    assert sum(v for k, v in counted.items() if k.startswith("error:")) == 4  # as in e2e
    assert marker.rows_in == len(rows) == len(part.inputs)


def test_an_output_of_an_older_mmpipe_is_refused_saying_so(tmp_path):
    """A version-1 marker (no ``version``, no ``settings``) still parses; the refusal says
    which version wrote it instead of listing settings it cannot know."""
    out = tmp_path / "out"
    (out / "_checkpoints").mkdir(parents=True)
    (out / "_checkpoints" / "p-000000.json").write_text(json.dumps({
        "partition_id": "p-000000", "attempt_id": "old", "fingerprint": "0123456789abcdef",
        "files": ["data/p-000000/a-old/part-00000.parquet"], "rows_in": 3,
        "rows_by_status": {"ok": 3, "rejected": 0, "error": 0}, "rows_by_reason": {},
        "mmpipe_version": "0.1.0", "throttled_requests": 0, "retried_requests": 0}))
    marker = CheckpointStore(str(out)).marker("p-000000")
    assert (marker.version, marker.rows_in, marker.settings, marker.downloads) == (1, 3, {}, {})
    spec = load_spec(QUICKSTART, output_uri=str(out))
    pipeline = assemble(spec)
    _, foreign = CheckpointStore(str(out)).committed(pipeline.fingerprint)
    message = foreign_output_message(str(out), foreign, pipeline.fingerprint, pipeline.settings())
    assert ("they were written by mmpipe 0.1.0 (commit marker version 1), whose fingerprint "
            "covers other settings") in message
