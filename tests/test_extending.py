"""DESIGN.md's "Extending the pipeline" recipes, followed literally, and the three ways an
extension used to be accepted and then fail silently (issue 24):

1. a new datasink's live files were deleted by gc (its directory was copied into gc,
   generations and ``mmpipe ls`` by hand);
2. a manifest column named like a step module's column was not renamed ``meta_<name>``
   (the reserved names were computed once, before the step module declared its column);
3. a step that reads a column no earlier part writes was accepted and every row then
   failed (``error: step_failed``), committed.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from pipeline import assembly, cli
from pipeline.assembly import assemble
from pipeline.columns import IMAGE, PIXELS
from pipeline.errors import AssemblyError
from pipeline.output import gc, generations
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore, verify_files
from pipeline.output.layout import ATTEMPT_ROOTS, attempt_of, root_entries
from pipeline.read import committed_files, read_committed
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from pipeline.steps.base import RowStep
from tests.assembly.mean_brightness_step import MEAN_BRIGHTNESS, MeanBrightnessStep
from tests.conftest import PHOTOS, REPO
from tests.output.keys_datasink import KeysDatasink
from tests import inproc


def _files_spec(tmp_path, **extra) -> JobSpec:
    return JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(PHOTOS), "partition_size": 6},
        "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False},
        "runtime": {"batch_size": 2}, **extra})


def _plan(spec: JobSpec):
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    plan = planning.write_plan(spec.sink.uri, pipeline.datasource.list_inputs(), spec.source)
    return pipeline, plan, pool


# --- 1. a datasink in one module ------------------------------------------------------

def test_a_new_datasink_registers_its_directory_with_the_layout():
    assert ATTEMPT_ROOTS["keys"] == "keys"
    assert "keys" in root_entries()
    assert attempt_of("keys/p-000003/a-x1/keys.txt") == ("p-000003", "x1")
    assert attempt_of("notes/p-000003/a-x1/keys.txt") is None
    with pytest.raises(ValueError, match="belongs to 'parquet'"):
        type("Clash", (KeysDatasink,), {"name": "clash", "directory": "data"})
    with pytest.raises(ValueError, match="not a free top-level name"):
        type("Fixed", (KeysDatasink,), {"name": "fixed", "directory": "_checkpoints"})


def test_gc_every_second_during_a_job_keeps_a_new_datasinks_live_files(tmp_path):
    # named in the spec by import path (pipeline.plugins): no registration by hand
    spec = _files_spec(tmp_path, sink={"uri": str(tmp_path / "out"), "datasinks": [
        {"uses": "tests.output.keys_datasink:KeysDatasink", "with": {"delay_s": 1.0}}]})
    out = spec.sink.uri
    pipeline, plan, pool = _plan(spec)
    generations.create(out, generations.new_record(1, pipeline, "src", "run-1", "resume"))
    done = threading.Event()
    passes, deleted = [], []

    def collect_every_second():
        while not done.wait(1.0):
            found = gc.collect(out)
            deleted.extend(found.garbage)
            gc.delete(out, found)
            passes.append(len(found.live))

    collector = threading.Thread(target=collect_every_second)
    collector.start()
    try:
        outcomes = [run_partition(pipeline, planning.read_partition(out, pid), "a1", pool)
                    for pid in plan.partition_ids[:2]]
    finally:
        done.set()
        collector.join()
    assert all(o.committed for o in outcomes)
    assert len(passes) >= 3 and max(passes) >= 1   # gc saw the running attempts' files
    assert not deleted                              # ... and deleted none of them
    markers = CheckpointStore(out).markers()
    keys_files = [f for m in markers.values() for f in m.files if f.startswith("keys/")]
    assert keys_files == ["keys/p-000000/a-a1/keys.txt", "keys/p-000001/a-a1/keys.txt"]
    for m in markers.values():
        verify_files(out, m)                        # every file there, checksums equal
    rows = read_committed(out, ["key", "status"]).to_pylist()
    ok = sorted(r["key"] for r in rows if r["status"] == "ok")
    written = sorted(k for f in committed_files(out, "keys")
                     for k in open(f, encoding="utf-8").read().split())
    assert written == ok and len(ok) >= 10


def test_ls_kind_and_generation_deletion_know_a_new_datasinks_directory(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setattr(assembly, "DATASINK_FACTORIES", [lambda spec: KeysDatasink(spec.sink.uri)])
    spec = _files_spec(tmp_path)
    out = spec.sink.uri
    pipeline, plan, pool = _plan(spec)
    generations.create(out, generations.new_record(1, pipeline, "src", "run-1", "resume"))
    assert generations.record_of_root(out).attempt_roots == ["data", "keys", "quarantine"]
    assert run_partition(pipeline, planning.read_partition(out, plan.partition_ids[0]),
                         "a1", pool).committed
    assert cli.main(["ls", out, "--kind", "keys"]) == 0
    assert capsys.readouterr().out.split() == [f"{out}/keys/p-000000/a-a1/keys.txt"]
    # a process that never imported the datasink knows the directory from the record
    listed = subprocess.run([sys.executable, "-m", "pipeline", "ls", out, "--kind", "keys"],
                            capture_output=True, text=True, cwd=REPO, check=True)
    assert listed.stdout.split() == [f"{out}/keys/p-000000/a-a1/keys.txt"]
    refused = subprocess.run([sys.executable, "-m", "pipeline", "ls", out, "--kind", "notes"],
                             capture_output=True, text=True, cwd=REPO)
    assert refused.returncode == 2 and "'notes'" in refused.stderr and "keys" in refused.stderr
    # deleting generation 1 (what a completed --mode overwrite does) deletes keys/ too
    (tmp_path / "out" / "notes.txt").write_text("the user's")
    gen1 = generations.list_generations(out)[0]
    generations.delete_generation(out, gen1)
    assert not (tmp_path / "out" / "keys").exists()
    assert not (tmp_path / "out" / "data").exists()
    assert (tmp_path / "out" / "notes.txt").read_text() == "the user's"


# --- 2. reserved names are live -------------------------------------------------------

def test_a_manifest_column_named_like_a_step_column_is_carried_as_meta(tmp_path, monkeypatch):
    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: MeanBrightnessStep()])
    photos = sorted(PHOTOS.glob("*.jpg"))[:4]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"file": str(p), "captions": f"photo {i}",
                                            MEAN_BRIGHTNESS: i + 0.5}) + "\n"
                                for i, p in enumerate(photos)))
    spec = JobSpec.model_validate({
        "source": {"kind": "manifest", "uri": str(manifest), "path_column": "file",
                   "caption_column": "captions", "allowed_roots": [str(PHOTOS)]},
        "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False}})
    pipeline, plan, pool = _plan(spec)
    outcome = run_partition(pipeline, planning.read_partition(spec.sink.uri,
                                                              plan.partition_ids[0]), "a1", pool)
    assert outcome.committed
    table = read_committed(spec.sink.uri)
    assert table.schema.field(MEAN_BRIGHTNESS).type == pa.float32()   # the step's column
    assert table.schema.field(f"meta_{MEAN_BRIGHTNESS}").type == pa.float64()
    rows = table.to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert [r[f"meta_{MEAN_BRIGHTNESS}"] for r in rows] == [0.5, 1.5, 2.5, 3.5]
    assert all(0 < r[MEAN_BRIGHTNESS] < 255 for r in rows)


# --- 3. steps declare what they read --------------------------------------------------

def test_a_step_reading_a_column_no_earlier_part_writes_is_refused_at_assembly(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: MeanBrightnessStep()])
    video = JobSpec.model_validate({
        "source": {"kind": "files", "media": "video", "uri": str(REPO / "data/videos")},
        "sink": {"uri": str(tmp_path / "v")}, "text_embedding": {"enabled": False}})
    with pytest.raises(AssemblyError, match=r"MeanBrightnessStep reads '_pixels', which no "
                                            r"earlier part writes \(no part writes it"):
        assemble(video)

    class ReadsImage(RowStep):              # `image` is written by ResizeStep, later
        reads = (IMAGE,)

        def process_row(self, batch, i):
            return {}

    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: ReadsImage()])
    with pytest.raises(AssemblyError, match="ReadsImage reads 'image'.*only by a later part"):
        assemble(_files_spec(tmp_path))

    class ReadsUndeclared(RowStep):
        reads = ("no_such_column",)

    monkeypatch.setattr(assembly, "STEP_FACTORIES", [lambda spec: ReadsUndeclared()])
    with pytest.raises(AssemblyError, match="ReadsUndeclared reads 'no_such_column', which "
                                            "is not declared"):
        assemble(_files_spec(tmp_path))
    assert not (tmp_path / "out").exists()    # refused before anything was written


def test_every_built_in_step_declares_reads_written_before_it(tmp_path):
    for extra in ({}, {"source": {"kind": "files", "media": "video",
                                  "uri": str(REPO / "data/videos")}}):
        pipeline = assemble(_files_spec(tmp_path, **extra))
        assert all(step.reads for step in pipeline.steps), [s.name for s in pipeline.steps]
    image = assemble(_files_spec(tmp_path))
    resize = next(s for s in image.steps if s.name == "ResizeStep")
    assert resize.reads == (PIXELS,)


def test_validate_explain_prints_the_assembled_pipeline(capsys):
    done = inproc.command(capsys, "validate", "--explain", str(REPO / "examples/images.yaml"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    fp = assemble(JobSpec.model_validate(
        __import__("yaml").safe_load((REPO / "examples/images.yaml").read_text()))).fingerprint
    assert out.splitlines()[0].endswith(f"fingerprint {fp}")
    assert "datasource FilesDatasource (source.kind files, media image)" in out
    assert "  ResizeStep\n    reads _pixels\n    writes image, image_width, image_height" in out
    assert "  parquet -> data/" in out and "  quarantine -> quarantine/" in out
    assert "  phash: int64\n" in out and "  metadata_json: string\n" in out
    assert out.rstrip().endswith(f"examples/images.yaml: valid (fingerprint {fp})")


# --- the datasource recipe ------------------------------------------------------------

def test_a_datasource_in_one_module_plans_and_reads_every_line_as_one_row(tmp_path):
    from tests.input.lines_datasource import LinesDatasource

    photos = sorted(PHOTOS.glob("*.jpg"))[:5]
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(photos[0].read_bytes())
    listing = tmp_path / "list.txt"
    listing.write_text("# five photos, a missing one, one outside the roots\n"
                       + "".join(f"{p}\n" for p in photos)
                       + f"{PHOTOS}/no_such_photo.jpg\n\n{secret}\n")
    spec = JobSpec.model_validate({
        "source": {"kind": "plugin", "uses": "tests.input.lines_datasource:LinesDatasource",
                   "uri": str(listing), "partition_size": 4, "allowed_roots": [str(PHOTOS)]},
        "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False}})
    pipeline, plan, pool = _plan(spec)
    assert isinstance(pipeline.datasource, LinesDatasource)
    # a module from no installed distribution: fingerprinted by its file's sha256
    source_file = REPO / "tests/input/lines_datasource.py"
    assert pipeline.settings()["plugins"]["source"] == {
        "class": "tests.input.lines_datasource:LinesDatasource", "distribution": None,
        "version": None, "with": {},
        "file_sha256": hashlib.sha256(source_file.read_bytes()).hexdigest()}
    assert list(plan.partition_ids) == ["p-000000", "p-000001"]
    for pid in plan.partition_ids:
        assert run_partition(pipeline, planning.read_partition(spec.sink.uri, pid), "a1",
                             pool).committed
    rows = read_committed(spec.sink.uri, ["key", "status", "error_reason", "width"]).to_pylist()
    assert [r["key"] for r in rows] == [p.stem for p in photos] + ["no_such_photo", "secret"]
    assert [r["status"] for r in rows] == ["ok"] * 5 + ["error", "error"]
    assert rows[5]["error_reason"] == "input_missing"
    assert rows[6]["error_reason"] == "outside_input_root"
    assert all(r["width"] > 0 for r in rows[:5])
