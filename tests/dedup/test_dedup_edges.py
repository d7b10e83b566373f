"""The dataset-wide dedup pass at its edges, on a real local Ray (the session's: jobs and
``mmpipe`` commands run in this process, ``tests/inproc.py``):

- finding 7 (T3-01): distinct flat images are never near duplicates; an exact byte copy of
  one still is; all stay in the deduplicated view;
- finding 9 (T3-21): a pass that finds no duplicate gives a deduplicated view equal to the
  ok rows, and ``export --deduplicated`` exits 0;
- finding 8: a pass stopped with a generation unfinished, rerun after more partitions
  committed, covers every partition; a view over a generation that does not cover every
  committed partition is refused;
- finding 18: ``_dedup/`` files are held by task leases against ``mmpipe gc``, and a task
  whose file is gone before its commit does not commit.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.dedup import tasks
from pipeline.dedup.store import DedupStore, IncompleteDedupError, latest_duplicates
from pipeline.errors import CommitError
from pipeline.read import read_output
from pipeline.runtime.dedup_pass import plan_generation, run_dedup
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec
from tests.conftest import CASES
from tests.dedup.copies import PHOTOS
from tests.inproc import json_out, mmpipe
from tests.dedup.test_dedup_pass import SPEC

T3_01 = CASES / "T3-01_phash_flat_images" / "files"
T3_21 = CASES / "T3-21_dedup_no_duplicates"


def _job(inp: Path, out: Path, partition_size: int, **dataset) -> JobSpec:
    """A job over ``inp`` with the dataset-wide index, run in process on ``ray_local``: one
    partition worker, and one dedup actor for the passes run with its ``dedup.dataset``
    (each a Ray worker process to start; the claims here are about what the pass finds and
    commits, which no actor count changes: tests/dedup/test_dedup_pass.py runs one output
    on 1 and 3 actors)."""
    spec = JobSpec.model_validate({
        "name": "dedup-edges", "source": {"kind": "files", "uri": str(inp),
                                          "partition_size": partition_size},
        "sink": {"uri": str(out)}, "resize": {"size_px": 32},
        "text_embedding": {"enabled": False},
        "dedup": {"dataset": {"enabled": True, "buckets": 4, "workers": 1, **dataset}},
        "runtime": {"batch_size": 16, "num_workers": 1, "max_attempts": 1}})
    report = run_job(spec)
    assert report.complete, report.format()
    return spec


def _rows(out: Path) -> dict[str, dict]:
    return {r["key"]: r for r in read_output(str(out)).to_table().to_pylist()}


def test_t3_01_flat_images_stay_distinct_across_partitions_and_a_byte_copy_is_exact(
        ray_local, tmp_path):
    """ATTACK: before the low_detail flag, black (0x0) and white (0x8000000000000000) were
    1 bit apart: the in-partition step and the pass grouped every flat image."""
    inp, out = tmp_path / "in", tmp_path / "out"
    shutil.copytree(T3_01, inp)
    shutil.copyfile(T3_01 / "a_black.png", inp / "z_black_copy.png")    # another partition
    spec = _job(inp, out, partition_size=3)
    rows = _rows(out)
    flat = ["a_black", "b_white", "c_blue254", "d_white640", "e_red", "f_green_1x1"]
    assert {k: (r["status"], r["low_detail"]) for k, r in rows.items()} == {
        **{k: ("ok", True) for k in flat + ["z_black_copy"]},
        "g_photo": ("ok", False), "h_photo": ("ok", False)}
    assert {rows[k]["phash"] & (2**64 - 1) for k in flat} <= {0, 0x8000000000000000}
    report = run_dedup(str(out), spec.dedup.dataset, spec.storage)
    assert report.complete and report.duplicates == 1 and report.by_kind == {"exact": 1}
    dups = latest_duplicates(str(out)).to_pylist()
    assert [(d["key"], d["duplicate_of"], d["kind"]) for d in dups] == [
        ("z_black_copy", "a_black", "exact")]
    view = read_output(str(out), ["key", "low_detail"], deduplicated=True).to_table()
    assert sorted(view["key"].to_pylist()) == sorted(flat + ["g_photo", "h_photo"])
    # the near index holds no flat image (the exact index has them all)
    near = pq.read_table(out / "_index" / "near")
    assert set(near["key"].to_pylist()) == {"g_photo", "h_photo"}


@pytest.mark.parametrize("case,dropped", [("distinct", []), ("with_copy", ["photo0_copy"])])
def test_t3_21_a_pass_with_or_without_duplicates_gives_the_view_and_export(
        ray_local, tmp_path, case, dropped):
    """ATTACK (distinct): a pass that found no duplicate made the deduplicated view and
    ``export --deduplicated`` raise ArrowTypeError."""
    out = tmp_path / "out"
    spec = _job(T3_21 / case, out, partition_size=1)      # one photo a partition
    report = run_dedup(str(out), spec.dedup.dataset, spec.storage)
    assert report.complete and report.duplicates == len(dropped)
    ok = read_output(str(out)).to_table()
    ok = ok.filter(pc.equal(ok["status"], "ok"))
    view = read_output(str(out), deduplicated=True).to_table()
    assert view.schema == ok.schema
    want = ok.filter(pa.array([k not in dropped for k in ok["key"].to_pylist()]))
    assert view.sort_by("key").equals(want.sort_by("key"))
    assert sorted(view["key"].to_pylist()) == sorted(
        p.stem for p in (T3_21 / case).glob("*.png") if p.stem not in dropped)
    dest = tmp_path / "export"
    assert cli.main(["export", str(out), str(dest), "--deduplicated"]) == 0
    exported = pq.read_table(dest)
    assert sorted(exported["key"].to_pylist()) == sorted(view["key"].to_pylist())


def test_a_stopped_pass_rerun_after_more_commits_covers_every_partition(
        tmp_path, ray_local, capsys):
    """ATTACK: the rerun used to finish the stopped generation (11 of 12 partitions), exit
    0 and report its duplicates as the result; the view then kept the 12th partition's
    duplicates. Now it runs a generation over all 12; a view over a generation that does
    not cover every committed partition is refused."""
    inp = tmp_path / "in"
    inp.mkdir()
    for c in range(6):                      # 4 photos x 6 byte copies, 2 a partition: 12
        for p in PHOTOS[:4]:
            shutil.copyfile(p, inp / f"c{c:02d}-{p.stem}.jpg")
    out = tmp_path / "out"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=inp, out=out).replace("partition_size: 32",
                                                          "partition_size: 2"))
    run = mmpipe(capsys, "run", str(spec), env={"MMPIPE_CHAOS_KILL_WORKER_ON": "p-000011"})
    assert run.returncode == 1 and not (out / "_dedup").exists(), run.stdout + run.stderr
    # the pass stops with generation 1 (11 partitions) unfinished: one task keeps dying
    stopped = mmpipe(capsys, "dedup", str(out), "--json",
                     env={"MMPIPE_CHAOS_KILL_WORKER_ON": "near-b-0002"})
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    store = DedupStore(str(out))
    (gen1,) = store.generations()
    assert len(gen1.partitions) == 11 and "near-b-0002" in gen1.tasks
    assert store.marker(1, "duplicates") is None and store.markers(1)
    with pytest.raises(FileNotFoundError, match="no complete dedup pass"):
        read_output(str(out), deduplicated=True)

    # the job is rerun: p-000011 commits, then the pass finishes generation 1 and, as it
    # does not cover p-000011, runs generation 2 over all 12
    run = mmpipe(capsys, "run", str(spec))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "generation 2, 12 partitions (1 new)" in run.stdout, run.stdout
    assert "duplicates: 20 (exact 20)" in run.stdout, run.stdout
    assert store.marker(1, "duplicates") is not None and store.marker(2, "duplicates")
    dups = latest_duplicates(str(out))
    assert dups.num_rows == 24 - 4 and set(dups["kind"].to_pylist()) == {"exact"}
    view = read_output(str(out), ["key"], deduplicated=True).to_table()
    assert sorted(view["key"].to_pylist()) == sorted(f"c00-{p.stem}" for p in PHOTOS[:4])

    # a result that does not cover every committed partition is refused, by name
    (out / "_dedup/_checkpoints/g-000002/duplicates.json").unlink()   # gen 2 unfinished
    with pytest.raises(IncompleteDedupError, match=r"covers 11 of 12 .*p-000011"):
        read_output(str(out), deduplicated=True)
    assert cli.main(["export", str(out), str(tmp_path / "x"), "--deduplicated"]) == 2
    assert not (tmp_path / "x").exists()
    status = mmpipe(capsys, "status", str(out), "--json")
    assert json_out(status.stdout)["dedup"]["complete"] is False
    again = mmpipe(capsys, "dedup", str(out), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    report = json_out(again.stdout)
    assert (report["generation"], report["partitions"], report["duplicates"],
            report["tasks_run"]) == (2, 12, 20, [])
    assert read_output(str(out), ["key"], deduplicated=True).count_rows() == 4


@pytest.fixture(scope="module")
def indexed_once(ray_local, tmp_path_factory) -> tuple[Path, JobSpec]:
    """An output of 3 byte copies of 2 photos (3 partitions), indexed, not yet deduped:
    the job runs once per module; each test gets a copy of its own (``indexed``)."""
    root = tmp_path_factory.mktemp("indexed")
    inp = root / "in"
    inp.mkdir()
    for c in range(3):
        for p in PHOTOS[:2]:
            shutil.copyfile(p, inp / f"c{c:02d}-{p.stem}.jpg")
    out = root / "out"
    return out, _job(inp, out, partition_size=2)


@pytest.fixture
def indexed(indexed_once, tmp_path) -> tuple[Path, JobSpec]:
    """A copy of ``indexed_once``'s output in ``tmp_path`` (its files are relative to it):
    the tests below run tasks, gc and write files in it."""
    src, spec = indexed_once
    assert not (src / "_dedup").exists()                 # no test wrote into the original
    out = tmp_path / "out"
    shutil.copytree(src, out)
    return out, spec


def _exact_task(out: Path, spec: JobSpec):
    gen = plan_generation(str(out), spec.dedup.dataset)
    task = next(t for t in gen.tasks if t.startswith("exact-"))
    return gen, task


def test_gc_during_a_dedup_task_spares_its_files_by_its_lease(indexed, monkeypatch, capsys):
    """ATTACK: `mmpipe gc --min-age-s 0` while a task is between writing its pairs file and
    committing: the file had no lease, gc deleted it, and the task committed a marker
    naming a file that was gone (the union then failed)."""
    out, spec = indexed
    gen, task = _exact_task(out, spec)
    real = DedupStore.write_table
    ran = []

    def write_then_gc(self, rel, table):
        got = real(self, rel, table)
        if rel.startswith("_dedup/pairs/"):
            ran.append(cli.main(["gc", str(out), "--min-age-s", "0"]))
        return got

    monkeypatch.setattr(DedupStore, "write_table", write_then_gc)
    marker = tasks.run_task(str(out), gen, task)
    assert ran == [0] and marker.pairs > 0
    printed = capsys.readouterr().out
    assert "0 unreferenced files deleted" in printed and "1 unreferenced files of running" \
        in printed, printed
    for f in marker.files:
        assert (out / f).is_file()
    assert DedupStore(str(out)).marker(1, task).attempt_id == marker.attempt_id
    assert not list((out / "_dedup/_leases").iterdir())          # released after the commit


def test_a_dedup_task_whose_file_is_gone_before_its_commit_does_not_commit(
        indexed, monkeypatch):
    """ATTACK: the commit did not re-read the files it names: a pairs file deleted (or
    replaced) before the commit was named by a committed marker."""
    out, spec = indexed
    gen, task = _exact_task(out, spec)
    real = DedupStore.write_table

    def write_then_lose(self, rel, table):
        got = real(self, rel, table)
        if rel.startswith("_dedup/pairs/"):
            (out / rel).unlink()
        return got

    monkeypatch.setattr(DedupStore, "write_table", write_then_lose)
    with pytest.raises(CommitError, match="is gone before the commit"):
        tasks.run_task(str(out), gen, task)
    assert DedupStore(str(out)).marker(1, task) is None
    monkeypatch.setattr(DedupStore, "write_table", real)     # a retry commits
    assert tasks.run_task(str(out), gen, task).pairs > 0


def test_gc_deletes_a_dead_task_attempts_files_once_its_lease_expired(indexed, capsys):
    out, _ = indexed
    store = DedupStore(str(out))
    lease = store.lease("exact-b-0000", "0123456789ab", lease_s=0.5, renew_s=0.2)
    stray = "_dedup/pairs/exact/b-0000/g-000001.a-0123456789ab.parquet"
    (out / stray).parent.mkdir(parents=True)
    (out / stray).write_bytes(b"PAR1 a dead attempt")
    foreign = out / "_dedup/pairs/exact/notes.txt"        # not the pass's: never deleted
    foreign.write_text("a user's notes")
    assert cli.main(["gc", str(out), "--lease-margin-s", "0"]) == 0     # live: kept
    assert (out / stray).exists() and "1 unreferenced files of running" in capsys.readouterr().out
    lease._renewer.stop()                  # the attempt dies without releasing its lease
    # until it has expired by the storage's clock (gc's: the lease file's mtime, its last
    # renewal, plus the 0.5 s it lasts), not a fixed sleep
    expires = os.stat(lease.uri).st_mtime + lease.record.duration_s()
    time.sleep(max(0.0, expires - time.time()) + 0.05)
    assert cli.main(["gc", str(out), "--lease-margin-s", "0"]) == 0
    assert f"delete {out / stray}" in capsys.readouterr().out
    assert not (out / stray).exists() and not Path(lease.uri).exists()
    assert foreign.read_text() == "a user's notes"
