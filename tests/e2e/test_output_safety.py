"""Issue 12, the output side, on a real local Ray: gc during a running job, overwrite as a
new generation, one writer per output."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.output import gc, generations, job_lease, lease
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import committed_files
from pipeline.read import read_output
from pipeline.runtime.driver import run_job
from pipeline.runtime.preflight import preflight
from tests.e2e.jobs import check_accounting
from tests.e2e.test_job import make_spec


def _spec(src: Path, out: Path, **over):
    over.setdefault("text_embedding", {"enabled": False})
    runtime = {"batch_size": 1, "num_workers": 1, "max_attempts": 3, **over.pop("runtime", {})}
    return make_spec(src, out, source={"partition_size": 2}, runtime=runtime, **over)


def _verify_every_committed_file(root: str) -> dict:
    markers = CheckpointStore(root).markers()
    for pid, m in markers.items():
        for rel in m.files:
            blob = fs.read_bytes(fs.join(root, rel))          # FileNotFoundError: deleted
            assert hashlib.sha256(blob).hexdigest() == m.sha256[rel], (pid, rel)
    return markers


def _short_side(out: Path) -> int:
    """The largest short side (pixels) of the ok images readers see."""
    rows = read_output(str(out), ["image_width", "image_height", "status"]).to_table()
    return max(min(r["image_width"], r["image_height"]) for r in rows.to_pylist()
               if r["status"] == "ok")


def _in_thread(fn, *args):
    box: dict = {}

    def run():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_gc_every_second_during_a_job_deletes_nothing_it_needs(ray_local, mixed_input,
                                                               tmp_path):
    """The finding: with gc running every second, a job reported complete while 15 of its
    58 committed files were gone. Short leases (2 s, renewed every 0.5 s) and a 0.5 s gc
    margin: every committed file must still match its marker's checksum."""
    out = tmp_path / "out"
    spec = _spec(mixed_input, out, runtime={"lease_s": 2.0, "lease_renew_s": 0.5})
    job, box = _in_thread(run_job, spec)
    runs, kept_live, deleted = 0, 0, 0
    while job.is_alive():
        if (out / "_plan").exists():
            found = gc.collect(str(out), margin_s=0.5)
            gc.delete(str(out), found)
            runs, kept_live, deleted = runs + 1, kept_live + len(found.live), \
                deleted + len(found.garbage)
        time.sleep(0.2)   # at least every second (a 10-partition job here takes ~2 s)
    job.join()
    if "error" in box:
        raise box["error"]
    report = box["result"]
    assert report.complete and report.partitions_total == 10, report.format()
    assert runs >= 2, f"gc ran {runs} times during the job"
    markers = _verify_every_committed_file(str(out))
    check_accounting(str(out))
    assert sorted(markers) == sorted(report.partitions_committed)
    assert json.loads((out / "_SUCCESS").read_text())["complete"] is True
    assert sum(pq.read_metadata(f).num_rows for f in committed_files(str(out))) == 19
    # the job is over: nothing is live any more, and a last gc finds nothing to delete
    assert lease.attempt_leases(str(out)) == {}
    assert gc.collect(str(out), margin_s=0.5).garbage == []


def test_a_second_writer_fails_fast_and_success_describes_only_its_data(
        ray_local, mixed_input, tmp_path):
    """The finding: a second job with another image size adopted the first one's
    partitions and wrote a _SUCCESS describing 256 px output over 128 px data."""
    out = tmp_path / "out"
    small = _spec(mixed_input, out, resize={"size_px": 128})
    big = _spec(mixed_input, out, resize={"size_px": 256})
    job, box = _in_thread(run_job, small)
    deadline = time.time() + 60
    while time.time() < deadline and job_lease.current_job_lease(str(out))[1] is None:
        time.sleep(0.05)
    _, holder = job_lease.current_job_lease(str(out))
    assert holder is not None and job.is_alive()
    for other in (big, small):            # another spec, and a resume of the same spec
        with pytest.raises(job_lease.OutputBusy) as e:
            preflight(other, models=False)
        assert f"pid {holder.pid}" in str(e.value) and f"run {holder.run_id}" in str(e.value)
        with pytest.raises(job_lease.OutputBusy, match=f"run {holder.run_id}"):
            run_job(other)
    job.join()
    if "error" in box:
        raise box["error"]
    first = box["result"]
    assert first.complete
    success = json.loads((out / "_SUCCESS").read_text())
    markers = CheckpointStore(str(out)).markers()
    assert {m.fingerprint for m in markers.values()} == {first.fingerprint}
    assert success["fingerprint"] == first.fingerprint and success["generation"] == 1
    assert _short_side(out) == 128
    # once free: the other spec is refused on resume, and an overwrite is a new generation
    with pytest.raises(PlanError, match="another spec fingerprint"):
        run_job(big)
    second = run_job(big.model_copy(update={"runtime": big.runtime.model_copy(
        update={"mode": "overwrite"})}))
    assert second.complete and second.fingerprint != first.fingerprint
    root = generations.read_root(str(out))
    assert root.endswith("/_generations/g-000002")
    success = json.loads(fs.read_bytes(fs.join(root, "_SUCCESS")))
    assert success["fingerprint"] == second.fingerprint and success["generation"] == 2
    assert {m.fingerprint for m in CheckpointStore(root).markers().values()} == {
        second.fingerprint}
    assert _short_side(out) == 256


def test_overwrite_keeps_the_old_generation_until_the_new_one_is_complete(
        ray_local, mixed_input, tmp_path, capsys):
    out = tmp_path / "out"
    first = run_job(_spec(mixed_input, out, resize={"size_px": 96}))
    assert first.complete
    old_files = committed_files(str(out))
    (out / "README.txt").write_text("notes kept beside the output")
    over = _spec(mixed_input, out, resize={"size_px": 160}, runtime={"mode": "overwrite"})
    job, box = _in_thread(run_job, over)
    seen_running = False
    while job.is_alive():
        files = committed_files(str(out))
        status = json.loads(_cli_json(capsys, ["status", str(out), "--json"]))
        if files == old_files and status["generation"] == 2 and not status["complete"]:
            seen_running = True          # gen 2 being written, readers on gen 1 in full
            assert status["readable_generation"] == 1
            assert len(read_output(str(out)).to_table()) == 19
        else:
            assert all("/_generations/g-000002/" in f for f in files) or files == old_files
        time.sleep(0.1)
    job.join()
    if "error" in box:
        raise box["error"]
    assert box["result"].complete and seen_running
    assert (out / "README.txt").exists()                  # overwrite deleted nothing else
    assert not (out / "data").exists() and not (out / "_checkpoints").exists()
    status = json.loads(_cli_json(capsys, ["status", str(out), "--json"]))
    assert (status["generation"], status["generations"], status["readable_generation"],
            status["complete"]) == (2, [2], 2, True)
    _verify_every_committed_file(generations.read_root(str(out)))
    dest = tmp_path / "export"
    assert cli.main(["export", str(out), str(dest)]) == 0
    assert "19 rows written" in capsys.readouterr().out


def _cli_json(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    cli.main(argv)
    return capsys.readouterr().out


def test_overwrite_refuses_an_input_inside_the_output_and_deletes_nothing(tmp_path):
    """The finding: `--mode overwrite` deleted the whole output location first, inputs
    stored under it included; `/data/./in` passed the string check."""
    data = tmp_path / "data"
    (data / "in").mkdir(parents=True)
    for i in range(3):
        (data / "in" / f"{i}.jpg").write_bytes(b"\xff\xd8\xff" + bytes(100))
    (data / "list.csv").write_text("path\nin/0.jpg\n")
    before = sorted(data.rglob("*"))
    spec = _spec(data / "." / "in", data, runtime={"mode": "overwrite"})
    spec = spec.model_copy(update={"source": spec.source.model_copy(
        update={"uri": f"{data}/./in"})})
    with pytest.raises(PlanError, match="overlap"):
        preflight(spec, models=False)
    with pytest.raises(PlanError, match="overlap"):
        run_job(spec)
    assert sorted(data.rglob("*")) == before


def test_gc_every_second_during_a_job_on_s3(ray_local, s3_server, s3_env, capsys):
    """The same reproduction on a real S3 API: `mmpipe run --executor ray` writes to the
    local S3 server while gc runs every half second with a 0.5 s margin over 2 s leases.
    The command runs in this process on the session's Ray (``tests/inproc.py``: the
    S3 credentials reach its actors as a subprocess's environment would; a Ray of its own
    would add ~6 s of start-up and shutdown to a job of a few seconds), gc on a thread
    beside it with requests of its own, as before from this process while the command ran in
    another. No text embedding: the claim is about leases and gc, not the model."""
    from tests.inproc import mmpipe
    from tests.e2e.jobs import NO_MODEL, PARTITIONS, shared_photos
    from tests.s3.inproc_jobs import quickstart_argv

    out = f"s3://{s3_env}/out"
    argv = quickstart_argv(out, shared_photos(s3_server),
                           sets=("runtime.lease_s=2", "runtime.lease_renew_s=0.5", *NO_MODEL))
    done = threading.Event()
    runs = {"n": 0}

    def gc_loop():
        while not done.is_set():
            if fs.exists(f"{out}/_plan/partitions.parquet"):
                gc.delete(out, gc.collect(out, margin_s=0.5))
                runs["n"] += 1
            done.wait(0.5)      # the gc interval (ends early once the job is over)
    gc_thread, box = _in_thread(gc_loop)
    try:
        run = mmpipe(capsys, *argv, env=s3_server.env())
    finally:
        done.set()
        gc_thread.join(60)
    if "error" in box:
        raise box["error"]
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    assert runs["n"] >= 2, (runs, run.stdout[-3000:])
    markers = _verify_every_committed_file(out)
    assert len(markers) == PARTITIONS
    assert json.loads(fs.read_bytes(f"{out}/_SUCCESS"))["complete"] is True
    assert gc.collect(out, margin_s=0.5).garbage == []


# --- round 3: delete only what mmpipe wrote; leases by the storage's clock --------------
T3_06 = Path(__file__).resolve().parents[2] / "data/cases/T3-06_gc_foreign_files"


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: file bytes, None for a folder."""
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def test_t3_06_a_project_folder_is_refused_then_its_files_survive_gc_and_overwrite(
        ray_local, tmp_path, capsys):
    """Case T3-06: the project template as the output. A run refuses it before writing
    anything, naming what is there; with sink.allow_foreign_files the job runs, and
    neither `mmpipe gc` nor a completed `--mode overwrite` deletes the user's files."""
    import shutil

    project = tmp_path / "project"
    shutil.copytree(T3_06 / "project_template", project)
    users = _tree(project)
    spec = _spec(T3_06 / "input", project, filters={"min_width_px": 1, "min_height_px": 1},
                 sink={"webdataset": {"enabled": True}})
    with pytest.raises(PlanError, match=r"not an mmpipe output \(it holds README.md, data, "
                                        r"wds\)"):
        preflight(spec, models=False)
    with pytest.raises(PlanError, match="sink.allow_foreign_files"):
        run_job(spec)
    assert _tree(project) == users                          # nothing written, not even _job/
    allowed = spec.model_copy(update={"sink": spec.sink.model_copy(
        update={"allow_foreign_files": True})})
    first = run_job(allowed)
    assert first.complete and first.rows_by_status.get("ok") == 3, first.format()
    assert {k: v for k, v in _tree(project).items() if k in users} == users
    assert cli.main(["gc", str(project)]) == 0
    assert {k: v for k, v in _tree(project).items() if k in users} == users
    over = allowed.model_copy(update={
        "runtime": allowed.runtime.model_copy(update={"mode": "overwrite"}),
        "resize": allowed.resize.model_copy(update={"size_px": 32})})
    second = run_job(over)
    assert second.complete and second.fingerprint != first.fingerprint
    left = _tree(project)
    assert {k: v for k, v in left.items() if k in users} == users
    assert not [k for k in left if k not in users and not k.startswith(("_generations", "_job", "_delta_log"))]
    assert cli.main(["gc", str(project)]) == 0
    assert {k: v for k, v in _tree(project).items() if k in users} == users
    assert generations.read_root(str(project)).endswith("/_generations/g-000002")
    rows = read_output(str(project), ["status"]).to_table().to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 3


def test_a_gc_host_120_s_ahead_deletes_nothing_a_running_job_needs(ray_local, tmp_path):
    """Finding 17c: gc on a host whose clock ran 120 s ahead deleted every running
    attempt's files (the job failed). gc in a subprocess with time.time moved +120 s runs
    every 0.2 s over 2 s leases with a 0.5 s margin while 57 photos are decoded and
    resized in partitions of 10; the job completes, every committed file matches its
    marker."""
    import json as _json
    import subprocess
    import sys

    from tests.conftest import PHOTOS, REPO

    out = tmp_path / "out"
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-m", "tests.output.skewed_host", "120",
                             "gc-loop", str(out), "0.5", str(stop)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not Path(f"{stop}.ready").exists() and time.time() < deadline:
            time.sleep(0.1)
        report = run_job(make_spec(PHOTOS, out, source={"partition_size": 10},
                                   text_embedding={"enabled": False},
                                   runtime={"batch_size": 2, "num_workers": 1,
                                            "max_attempts": 3, "lease_s": 2.0,
                                            "lease_renew_s": 0.5}))
    finally:
        stop.write_text("")
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    gc_run = _json.loads(stdout.strip().splitlines()[-1])
    assert report.complete and report.partitions_total == 6, report.format()
    assert gc_run["runs"] >= 2 and gc_run["kept_live"] >= 1, gc_run
    markers = _verify_every_committed_file(str(out))
    assert sorted(markers) == sorted(report.partitions_committed)
    named = {fs.join(str(out), f) for m in markers.values() for f in m.files}
    assert not named & set(gc_run["deleted"])
    check_accounting(str(out))


def test_a_driver_300_s_ahead_cannot_take_over_a_running_job(ray_local, tmp_path):
    """Finding 17c: a driver whose clock ran 300 s ahead took over a live job's output.
    While a real job runs, `mmpipe run` of another spec from a host 300 s ahead is refused
    for its clock and one 20 s ahead (within the allowed skew) is refused as busy, naming
    the running job; the job keeps its lease and completes with only its own markers."""
    import subprocess
    import sys

    import yaml

    from tests.conftest import PHOTOS, REPO

    out = tmp_path / "out"
    spec = make_spec(PHOTOS, out, source={"partition_size": 3}, text_embedding={"enabled": False},
                     runtime={"batch_size": 1, "num_workers": 1})
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(spec.model_copy(update={"resize": spec.resize.model_copy(
        update={"size_px": 64})}).model_dump(mode="json", exclude_unset=True)))
    drivers = {skew: subprocess.Popen(
        [sys.executable, "-m", "tests.output.skewed_host", str(skew), "cli-when-leased",
         str(out), "run", str(other), "--address", "local"], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for skew in (300, 20)}
    job, box = _in_thread(run_job, spec)
    seen = {}
    for skew, proc in drivers.items():
        log, _ = proc.communicate(timeout=180)
        seen[skew] = (proc.returncode, log, job_lease.current_job_lease(str(out)))
    job.join()
    if "error" in box:
        raise box["error"]
    report = box["result"]
    assert report.complete and report.partitions_total == 19, report.format()
    code, log, _ = seen[300]
    assert code == 2 and re.search(r"30[01] s ahead of the storage's", log), log
    code, log, (n, holder) = seen[20]
    assert code == 2 and f"run {report.run_id}" in log and "another job writes" in log, log
    assert n == 1 and holder.run_id == report.run_id and not holder.released
    assert job_lease.current_job_lease(str(out))[0] == 1         # never taken over
    markers = _verify_every_committed_file(str(out))
    assert {m.fingerprint for m in markers.values()} == {report.fingerprint}
