"""Generations of an output, where a job may write, and resume from marker names alone
(no Ray)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.assembly import assemble
from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.output import generations
from pipeline.output import plan as planning
from pipeline.read import committed_files
from pipeline.runtime.partition import run_partition
from pipeline.runtime.preflight import check_output, committed_markers
from pipeline.spec import JobSpec


def _spec(src: str, out: str, **sink) -> JobSpec:
    return JobSpec.model_validate({"source": {"kind": "files", "uri": src},
                                   "sink": {"uri": out, **sink},
                                   "text_embedding": {"enabled": False},
                                   "runtime": {"mode": "overwrite"}})


def test_overlap_is_judged_on_resolved_paths(tmp_path):
    data = tmp_path / "data"
    (data / "in").mkdir(parents=True)
    (data / "in" / "a.jpg").write_bytes(b"x")
    link = tmp_path / "elsewhere"
    link.symlink_to(data)
    for src, out in [(f"{data}/./in", str(data)),            # the reproduction
                     (str(data / "in"), f"{data}/in/../in/out"),
                     (str(link / "in"), str(data)),           # a symlink to the same place
                     (str(data), str(data / "in" / "out"))]:
        with pytest.raises(PlanError, match="overlap"):
            check_output(_spec(src, out), None)
    check_output(_spec(str(data / "in"), str(tmp_path / "out")), None)   # siblings: fine


def test_s3_uris_are_compared_canonically_and_a_bucket_root_needs_consent():
    assert generations.overlaps("s3://b/in/", "s3://b/./in/x")
    assert generations.overlaps("s3://b//in", "s3://b/in")
    assert not generations.overlaps("s3://b/in", "s3://b/input")
    assert not generations.overlaps("s3://b/in", "s3://c/in")
    for out in ("s3://bucket", "s3://bucket/"):
        assert generations.is_bucket_root(out)
        with pytest.raises(PlanError, match="bucket root"):
            generations.check_locations(_spec("s3://other/in", out))
        generations.check_locations(_spec("s3://other/in", out, allow_bucket_root=True))
        with pytest.raises(PlanError, match="overlap"):   # consent covers the root, not overlap
            generations.check_locations(_spec("s3://bucket/in", out, allow_bucket_root=True))
    assert not generations.is_bucket_root("s3://bucket/out")


def _commit_all(spec: JobSpec, root: str, attempt: str) -> list[str]:
    pool = ThreadPoolExecutor(2)
    spec = spec.model_copy(update={"sink": spec.sink.model_copy(update={"uri": root})})
    pipeline = assemble(spec, executor=pool, setup=True)
    plan, _ = planning.load_or_create(root, spec.source, pipeline.datasource.list_inputs)
    for pid in plan.partition_ids:
        assert run_partition(pipeline, planning.read_partition(root, pid), attempt, pool).committed
    return list(plan.partition_ids)


def test_readers_see_the_newest_complete_generation(mixed_input, tmp_path):
    out = tmp_path / "out"
    spec = _spec(str(mixed_input), str(out))
    pids = _commit_all(spec, str(out), "g1")       # an output from before generations
    (out / "_SUCCESS").write_text("{}")
    assert [g.number for g in generations.list_generations(str(out))] == [1]
    assert generations.read_root(str(out)) == str(out)
    g2 = generations.generation_root(str(out), 2)
    assert generations.create(str(out), generations.GenerationRecord(generation=2,
                                                                     fingerprint="x"))
    _commit_all(spec, g2, "g2")
    # generation 2 has every marker but no _SUCCESS: readers still see generation 1
    assert generations.read_root(str(out)) == str(out)
    assert generations.newest_root(str(out)) == g2
    assert all("/a-g1/" in f for f in committed_files(str(out)))
    fs.write_bytes(fs.join(g2, "_SUCCESS"), b"{}")
    assert generations.read_root(str(out)) == g2
    assert all("/a-g2/" in f and "/_generations/g-000002/" in f
               for f in committed_files(str(out)))
    assert generations.read_root(g2) == g2                 # a generation root reads as itself
    (out / "notes.txt").write_text("not mmpipe's")
    assert generations.delete_older(str(out), 2) == [1]
    assert (out / "notes.txt").exists() and not (out / "data").exists()
    assert [g.number for g in generations.list_generations(str(out))] == [2]
    assert len(committed_files(str(out))) == len(pids)


def test_resume_decides_from_marker_names_and_reads_no_marker(mixed_input, tmp_path,
                                                             monkeypatch):
    """Issue 15: which partitions are committed comes from one listing of marker names;
    the generation record holds the fingerprint, so no marker is read to check it."""
    out = str(tmp_path / "out")
    spec = _spec(str(mixed_input), out)
    pipeline = assemble(spec)
    assert generations.create(out, generations.new_record(1, pipeline, "", "r", "resume"))
    pids = _commit_all(spec, out, "a1")
    reads = []
    real = fs.read_bytes
    monkeypatch.setattr(fs, "read_bytes", lambda uri: reads.append(uri) or real(uri))
    done = committed_markers(out, pipeline)
    assert sorted(done) == pids and len(done) == len(pids)
    assert not [u for u in reads if "/_checkpoints/" in u]
    assert done[pids[0]].attempt_id == "a1"                  # read when asked for
    # another fingerprint is refused from the record, naming what changed
    other = assemble(_spec(str(mixed_input), out).model_copy(
        update={"resize": spec.resize.model_copy(update={"size_px": 77})}))
    with pytest.raises(PlanError, match="another spec fingerprint.*size_px"):
        committed_markers(out, other)
