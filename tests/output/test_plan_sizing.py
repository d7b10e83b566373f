"""Every worker busy (issue 32, item 3): a small input left at the default
``source.partition_size`` is cut into ``runtime.partitions_per_worker`` partitions per
worker, by records and by bytes; an explicit size, a stored plan and the fingerprint stay
as they are. Real listings of the bundled photos and a real manifest read through the
worker processes."""

from __future__ import annotations

import csv
import shutil

from pipeline.assembly import assemble
from pipeline.input.source_uri import local_path
from pipeline.output import plan as planning
from pipeline.read import read_output
from pipeline.records import InputItem
from pipeline.runtime.driver import run_job, target_partitions
from pipeline.runtime.executors import ProcessWorkers, new_run_id
from pipeline.spec import JobSpec
from tests.conftest import PHOTOS
from tests.e2e.jobs import check_accounting

NO_MODEL = {"text_embedding": {"enabled": False}}


def _spec(src, out, **over) -> JobSpec:
    data = {"name": "sizing", "source": {"kind": "files", "uri": str(src)},
            "sink": {"uri": str(out)},
            **NO_MODEL}
    for section, values in over.items():
        data.setdefault(section, {}).update(values)
    return JobSpec.model_validate(data)


def _photos(tmp_path) -> list[InputItem]:
    spec = _spec(PHOTOS, tmp_path / "o")
    return list(assemble(spec).datasource.list_inputs())


def _covers(parts, items) -> None:
    """The partitions hold every item once, in order, under consecutive ids."""
    assert [i for p in parts for i in p.inputs] == items
    assert [p.partition_id for p in parts] == [f"p-{n:06d}" for n in range(len(parts))]


def test_a_small_input_gives_every_worker_partitions_by_records(tmp_path):
    items = _photos(tmp_path)
    assert len(items) == 57
    one = list(planning.pack(items, 1000))
    assert len(one) == 1                                        # as before: one worker busy
    # records only (all files the same size): 8 partitions of at most ceil(57 / 8) = 8
    same = [InputItem(i.uri, 0, i.caption_uri, key=i.key) for i in items]  # records only
    parts = list(planning.pack(same, 1000, target_partitions=8))
    _covers(parts, same)
    assert [len(p.inputs) for p in parts] == [8] * 7 + [1]
    # the real sizes (10 MB in all): under MIN_PARTITION_BYTES, the records decide
    assert [len(p.inputs) for p in planning.pack(items, 1000, 8)] == [8] * 7 + [1]


def test_large_files_spread_by_bytes_and_small_partitions_have_a_floor():
    big = [InputItem(f"/v/{n}.mp4", 500 * 2**20) for n in range(3)]
    small = [InputItem(f"/i/{n}.jpg", 2**10) for n in range(21)]
    parts = list(planning.pack(big + small, 1000, target_partitions=4))
    _covers(parts, big + small)
    assert [len(p.inputs) for p in parts[:3]] == [1, 1, 1]      # one video each
    assert [len(p.inputs) for p in parts[3:]] == [6, 6, 6, 3]   # ceil(24 / 4) records
    tiny = [InputItem(f"/i/{n}.jpg", 2**10) for n in range(10)]
    assert [len(p.inputs) for p in planning.pack(tiny, 1000, 8)] == [4, 4, 2]  # floor 4


def test_a_manifest_range_is_split_and_a_long_input_is_cut_at_the_lookahead(monkeypatch):
    rng = InputItem("/m/a.csv", 10**6, row_start=0, row_stop=600, byte_start=7, line_start=1)
    parts = list(planning.pack([rng], 1000, target_partitions=8))
    ranges = [(p.inputs[0].row_start, p.inputs[0].row_stop, p.inputs[0].byte_start)
              for p in parts]
    assert ranges == [(n * 75, n * 75 + 75, 7 if n == 0 else -1) for n in range(8)]
    monkeypatch.setattr(planning, "LOOKAHEAD_RECORDS", 40)
    items = [InputItem(f"/i/{n}.jpg", 10) for n in range(100)]
    parts = list(planning.pack(items, 1000, target_partitions=4))
    _covers(parts, items)
    assert {len(p.inputs) for p in parts} == {10}               # ceil(40 / 4), not 25


def test_an_explicit_size_and_zero_keep_the_size(tmp_path):
    workers = ProcessWorkers("sizing", new_run_id(), cpus=2)
    try:
        assert target_partitions(_spec(PHOTOS, tmp_path / "o"), workers) == 8
        assert target_partitions(_spec(PHOTOS, tmp_path / "o", source={
            "partition_size": 1000}), workers) == 0
        assert target_partitions(_spec(PHOTOS, tmp_path / "o", runtime={
            "partitions_per_worker": 0}), workers) == 0
        assert target_partitions(_spec(PHOTOS, tmp_path / "o", runtime={
            "num_workers": 3}), workers) == 12
    finally:
        workers.close()


def test_a_manifest_job_cut_for_two_workers_reads_every_row_once_and_resumes_its_plan(
        tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    photos = sorted(PHOTOS.glob("*.jpg"))[:40]
    with open(src / "photos.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "caption"])
        for n, p in enumerate(photos):
            shutil.copy(p, src / p.name)
            w.writerow([p.name, f"photo {n}"])
    out = tmp_path / "out"
    spec = _spec(src / "photos.csv", out, source={"kind": "manifest"},
                 dedup={"exact": False, "near": False})
    workers = ProcessWorkers("sizing", new_run_id(), cpus=2)
    try:
        workers.prestart(2)
        report = run_job(spec, processes=workers)
    finally:
        workers.close()
    assert report.complete and report.partitions_total == 8       # 40 rows, 2 workers x 4
    markers = check_accounting(str(out))
    assert sorted(m.rows_in for m in markers.values()) == [5] * 8
    rows = read_output(str(out), ["key", "status", "source_uri", "caption"]).to_table()
    assert rows.num_rows == 40 and set(rows.column("status").to_pylist()) == {"ok"}
    got = {local_path(u).rsplit(b"/", 1)[-1].decode(): c for u, c in zip(
        rows.column("source_uri").to_pylist(), rows.column("caption").to_pylist())}
    assert got == {p.name: f"photo {n}" for n, p in enumerate(photos)}
    # a resume on another machine size keeps the stored plan (and the fingerprint)
    again = _spec(src / "photos.csv", out, source={"kind": "manifest"},
                  dedup={"exact": False, "near": False}, runtime={"num_workers": 1})
    workers = ProcessWorkers("sizing", new_run_id(), cpus=1)
    try:
        report = run_job(again, processes=workers)
    finally:
        workers.close()
    assert report.partitions_total == 8 and len(report.partitions_skipped) == 8
    assert report.plan.startswith("stored")
