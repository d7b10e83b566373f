"""Whole jobs on a real local Ray: output, statuses, quarantine, retries, modes, resume."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import pipeline
from pipeline import cli
from pipeline.errors import PlanError
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import committed_files, read_committed
from pipeline.output.generations import read_root
from pipeline.input import make_datasource
from pipeline.runtime import local_ray
from pipeline.runtime.driver import run_job
from pipeline.runtime.preflight import preflight
from pipeline.spec import JobSpec
from tests.conftest import CASES, PHOTOS, TRUNCATED_JPEG, coco_captions
from tests.e2e.jobs import check_accounting


def make_spec(src: Path, out: Path, **over) -> JobSpec:
    data = {"name": "e2e", "source": {"kind": "files", "uri": str(src), "partition_size": 5},
            "sink": {"uri": str(out), "rows_per_row_group": 4},
            "filters": {"min_width_px": 64, "min_height_px": 64},
            "runtime": {"batch_size": 3, "num_workers": 1, "max_attempts": 2},
            "text_embedding": {"replicas": 1, "num_cpus": 0.5}}
    for section, values in over.items():
        data.setdefault(section, {}).update(values)
    return JobSpec.model_validate(data)


def read_output(out: Path):
    return read_committed(str(out)) if committed_files(str(out)) else None


def test_mixed_real_input_end_to_end(ray_local, mixed_input, tmp_path):
    out = tmp_path / "out"
    report = run_job(make_spec(mixed_input, out))
    assert report.complete and report.partitions_total == 4
    markers = check_accounting(str(out))
    assert sorted(markers) == ["p-000000", "p-000001", "p-000002", "p-000003"]
    table = read_output(out)
    rows = {r["key"]: r for r in table.to_pylist()}
    assert len(rows) == 19 and all(r["status"] in ("ok", "rejected", "error") for r in rows.values())
    first = coco_captions()[0]["key"]
    dup = rows[f"{first}_copy"]
    assert (dup["status"], dup["reject_reason"], dup["duplicate_of"]) == ("rejected", "duplicate", first)
    expect_errors = {"truncated_jpeg": ("truncated", "corrupt"), "empty": ("empty_file",),
                     "html_redirect_page": ("not_an_image",), "decompression_bomb": ("too_large",)}
    for key, reasons in expect_errors.items():
        assert rows[key]["status"] == "error" and rows[key]["error"].split(":")[0] in reasons, rows[key]
    # the same Grace Hopper portrait as a PNG named .jpg and as an EXIF-rotated JPEG:
    # sniffed as PNG, and caught as a near duplicate of the upright JPEG
    png = rows["hopper_png_bytes"]
    assert (png["format"], png["status"], png["reject_reason"]) == ("PNG", "rejected", "duplicate")
    assert png["duplicate_of"] == "hopper_orientation_6" and png["duplicate_hamming"] <= 4
    assert png["sha256"] != rows["hopper_orientation_6"]["sha256"]   # not a byte copy
    for r in rows.values():
        if r["status"] == "rejected":
            assert r["reject_reason"]
        if r["status"] == "error":
            assert r["error"] and r["image"] is None
    ok = [r for r in rows.values() if r["status"] == "ok"]
    assert len(ok) == 13 and all(r["image"][:3] == b"\xff\xd8\xff" for r in ok)
    for row in coco_captions()[:12]:
        r = rows[row["key"]]
        assert r["caption"] == row["captions"][0]
        assert (r["width"], r["height"]) == (row["width"], row["height"])
        assert min(r["image_width"], r["image_height"]) == 256
        vec = np.asarray(r["text_embedding"], dtype=np.float32)
        assert vec.shape == (384,) and abs(np.linalg.norm(vec) - 1) < 1e-4
    assert rows["hopper_orientation_6"]["caption_flags"] == ["missing_caption"]
    assert rows["hopper_orientation_6"]["captions"] == []
    assert rows["hopper_orientation_6"]["text_embedding"] is None
    # an absolute input root: source_uri is a file:// URI (pathlib's encoding)
    for key, r in rows.items():
        media = [p for p in mixed_input.glob(f"{key}.*") if p.suffix not in (".txt", ".json")]
        assert r["source_uri"] == media[0].as_uri()
    assert all(r["captions"] == [r["caption"]] for r in rows.values() if r["caption"])
    assert table.schema.field("phash").type == pa.int64()
    emb_type = table.schema.field("text_embedding").type
    assert pa.types.is_fixed_size_list(emb_type) and emb_type.list_size == 384
    assert emb_type.value_type == pa.float32()
    # quarantine: exactly the error rows, with their original bytes
    q_files = [out / f for m in markers.values() for f in m.files if f.startswith("quarantine/")]
    quarantined = {r["key"]: r for f in q_files for r in pq.read_table(f).to_pylist()}
    assert set(quarantined) == {k for k, r in rows.items() if r["status"] == "error"}
    assert quarantined["truncated_jpeg"]["source_bytes"] == (CASES / TRUNCATED_JPEG).read_bytes()
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["rows_by_status"] == {"ok": 13, "rejected": 2, "error": 4}
    assert success["complete"] is True
    # every data and quarantine file carries the job's key-value metadata (from a worker)
    for pid, m in markers.items():
        for rel in [f for f in m.files if f.endswith(".parquet")]:
            kv = {k.decode(): v.decode() for k, v in pq.read_metadata(out / rel).metadata.items()}
            assert kv["mmpipe.fingerprint"] == m.fingerprint and kv["mmpipe.partition_id"] == pid
            assert kv["mmpipe.attempt_id"] == m.attempt_id and "ARROW:schema" in kv
            assert kv["mmpipe.version"] == importlib.metadata.version("mmpipe")
            assert json.loads(kv["mmpipe.spec"])["source"]["uri"] == str(mixed_input)
    # pipeline.read_output: the committed files alone (Ray Data's read_parquet of
    # dataset.files is the README's recipe; it costs ~15 s here, so it is not run)
    assert pipeline.read_output(str(out)).to_table().to_pandas().shape[0] == 19
    assert pipeline.read_output(str(out), kind="quarantine").count_rows() == 4


def test_rerun_skips_committed_partitions_and_modes(ray_local, mixed_input, tmp_path,
                                                   monkeypatch, capsys):
    out = tmp_path / "out"
    spec = make_spec(mixed_input, out, text_embedding={"enabled": False})
    assert not preflight(spec).nothing_to_run
    first = run_job(spec)
    assert preflight(spec).nothing_to_run
    # `mmpipe run` of a finished job reports from the markers without starting Ray
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json")))

    def no_ray(*args, **kwargs):
        raise AssertionError("started Ray for a job with nothing to run")

    monkeypatch.setattr(local_ray, "start", no_ray)
    assert cli.main(["run", str(spec_file)]) == 0
    assert "0 committed now, 4 skipped (already committed)" in capsys.readouterr().out
    attempts = {p: m.attempt_id for p, m in CheckpointStore(str(out)).markers().items()}
    again = run_job(spec)
    assert again.partitions_committed == [] and len(again.partitions_skipped) == 4
    assert {p: m.attempt_id for p, m in CheckpointStore(str(out)).markers().items()} == attempts
    assert again.rows_by_status == first.rows_by_status
    with pytest.raises(PlanError, match="another spec fingerprint"):
        run_job(make_spec(mixed_input, out, text_embedding={"enabled": False},
                          resize={"size_px": 128}))
    with pytest.raises(PlanError, match="not empty"):
        run_job(make_spec(mixed_input, out, runtime={"mode": "error-if-exists"},
                          text_embedding={"enabled": False}))
    over = run_job(make_spec(mixed_input, out, runtime={"mode": "overwrite"},
                             text_embedding={"enabled": False}))
    assert len(over.partitions_committed) == 4
    # overwrite wrote generation 2 beside generation 1, then deleted generation 1
    root = read_root(str(out))
    assert root == str(out / "_generations" / "g-000002")
    new = {p: m.attempt_id for p, m in CheckpointStore(root).markers().items()}
    assert set(new) == set(attempts) and not set(new.values()) & set(attempts.values())
    assert CheckpointStore(str(out)).markers() == {} and not (out / "data").exists()


def test_poison_partition_is_retried_then_reported_and_others_complete(ray_local, tmp_path):
    src = tmp_path / "manifests"
    src.mkdir()
    rows = coco_captions()
    for name, chunk in (("a.jsonl", rows[:4]), ("b.jsonl", rows[4:8]), ("c.jsonl", rows[8:12])):
        (src / name).write_text("\n".join(json.dumps({"path": str(PHOTOS / r["file"]),
                                                      "caption": r["captions"][0]}) for r in chunk))
    out = tmp_path / "out"
    spec = make_spec(src, out, source={"kind": "manifest", "partition_size": 4,
                                       "allowed_roots": [str(PHOTOS)]},
                     text_embedding={"enabled": False})
    planning.load_or_create(str(out), spec.source,
                            make_datasource(spec.source, spec.decode).list_inputs)
    (src / "b.jsonl").write_text('{"path": "broken')           # corrupted after planning
    report = run_job(spec)
    assert not report.complete
    assert list(report.partitions_failed) == ["p-000001"]
    assert "b.jsonl" in report.partitions_failed["p-000001"]
    assert len(report.attempts["p-000001"]) == 2                 # max_attempts
    assert sorted(report.partitions_committed) == ["p-000000", "p-000002"]
    assert not (out / "_SUCCESS").exists()
    assert not list((out / "data").glob("p-000001/*"))           # failed attempts cleaned up
    assert "FAILED p-000001" in report.format()
