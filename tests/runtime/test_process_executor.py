"""``mmpipe run`` without Ray (issue 32, items 1 and 4): a local job with no model stage on
GPUs runs its partitions in worker processes of the driver (``--executor auto``, the default, or
``processes``), through the same ``PartitionWorker``, scheduler and commit protocol as on
Ray. Real runs of the bundled photos (57 records, 4 partitions of 15).

The runs whose claim is about the process, that no Ray starts and what a user's terminal
shows (``auto_run``, the MiniLM job), are ``mmpipe run`` subprocesses; one model-less
``auto`` run serves every test that reads it. The others (a worker that dies, a hung attempt,
a refused ``--executor processes``) are ``mmpipe run`` in this process (``mmpipe_here``:
the same ``cli.main``, its worker processes children of this one, ``local_ray.start``
made to fail the test if called): their claims are exit codes, what the command printed
and logged and what it left in the output. The Ray runs compared with are this process's
driver on the session's ``ray_local``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import read_output
from tests.conftest import REPO
from tests.e2e.jobs import clean_ray_env

NO_MODEL = ["--set", "text_embedding.enabled=false"]
# the example runs the dataset-wide dedup pass (Ray tasks); these tests are about the
# partition workers, so every run leaves it out unless its own --set turns it on again
NO_DATASET_PASS = ["--set", "dedup.dataset.enabled=false"]


def mmpipe_run(out: Path, home: Path, *extra: str, env: dict | None = None,
               timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``python -m pipeline run examples/images.yaml --output OUT ...`` as a user runs it."""
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/images.yaml",
           "--output", str(out), *NO_DATASET_PASS, *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          env=clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1", **(env or {})))


def mmpipe_here(request, out: Path, home: Path, *extra: str, env: dict | None = None
                ) -> subprocess.CompletedProcess:
    """``mmpipe_run``'s command (``examples/images.yaml``, the same arguments) run in this
    process: ``cli.main`` from the repository root with ``HOME=home``, ``env`` and no
    ``RAY_*`` variable of the session's ``ray_local`` in ``os.environ`` (which the worker
    processes it spawns inherit, as a subprocess's would), the environment restored after.
    ``local_ray.start`` fails the test if the command calls it (these runs start no Ray).
    Its stdout is what it printed, its stderr what it printed there followed by what it
    logged (INFO and up, which ``mmpipe``'s ``logging.basicConfig`` sends to stderr)."""
    from pipeline.runtime import local_ray
    from tests.inproc import command, restored_environ

    caplog = request.getfixturevalue("caplog")

    def no_ray(address, **kwargs):
        raise AssertionError(f"local_ray.start({address!r}) in a run without Ray")

    argv = ["run", "examples/images.yaml", "--output", str(out), *NO_DATASET_PASS, *extra]
    caplog.clear()
    with pytest.MonkeyPatch.context() as m, restored_environ(), caplog.at_level(logging.INFO):
        for key in [k for k in os.environ if k.startswith("RAY_")]:
            if key != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER":
                m.delenv(key)                             # ray_local's ray.init set them
        m.setenv("HOME", str(home))
        for key, value in (env or {}).items():
            m.setenv(key, value)
        m.setattr(local_ray, "start", no_ray)
        m.chdir(REPO)                                     # the example's relative source.uri
        done = command(request.getfixturevalue("capsys"), *argv)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout,
                                       done.stderr + caplog.text)


def ray_run(out: Path, *sets: str):
    """The same job (``mmpipe_run``'s spec and overrides) on Ray: its partition workers (and
    model actors) as Ray actors of the session's ``ray_local``, run by this process's driver
    (``run_job``, what ``mmpipe run --executor ray`` calls after ``ray.init``), one
    partition worker (``runtime.num_workers`` is not part of the fingerprint nor of what a
    worker writes). Returns the job report."""
    from pipeline.runtime.driver import run_job
    from pipeline.spec.load import load_spec

    overrides = [s for s in NO_DATASET_PASS if s != "--set"] + ["runtime.num_workers=1",
                                                                *sets]
    with contextlib.chdir(REPO):          # the example's relative source.uri
        report = run_job(load_spec(REPO / "examples/images.yaml", overrides, None, str(out)))
    assert report.complete, report.format()
    return report


def rows(out: Path) -> dict[str, tuple]:
    table = read_output(str(out), ["key", "status", "width", "height", "sha256"]).to_table()
    return {r["key"]: (r["status"], r["width"], r["height"], r["sha256"])
            for r in table.to_pylist()}


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    """One model-less ``mmpipe run`` subprocess with the default ``--executor auto`` and
    ``--report-json``, for every test that reads it: ``(home, out, report path, the
    completed process)``."""
    tmp = tmp_path_factory.mktemp("auto-run")
    home = tmp / "home"
    home.mkdir()
    report = tmp / "report.json"
    run = mmpipe_run(tmp / "processes", home, *NO_MODEL, "--report-json", str(report))
    return home, tmp / "processes", report, run


def test_auto_runs_a_model_less_job_without_ray_and_writes_what_ray_writes(auto_run, tmp_path,
                                                                          ray_local):
    home, out, _, procs = auto_run
    assert procs.returncode == 0, procs.stdout + procs.stderr
    assert "(worker processes, no Ray)" in procs.stderr
    assert "started a local Ray" not in procs.stderr
    assert not (home / ".ray").exists()       # no Ray started: no token written either
    on_ray = ray_run(tmp_path / "ray", NO_MODEL[1])
    assert {m.ran_on["node_id"].split(":")[0] for m in
            CheckpointStore(str(tmp_path / "ray")).markers().values()} != {"local"}  # on Ray
    # the same job: same fingerprint, same committed rows, byte for byte
    fingerprint = [line for line in procs.stdout.splitlines() if "fingerprint" in line]
    assert fingerprint and fingerprint[0].split("fingerprint ")[1][:16] == on_ray.fingerprint[:16]
    got, want = rows(out), rows(tmp_path / "ray")
    assert len(got) == 57 and got == want
    markers = CheckpointStore(str(out)).markers()
    assert len(markers) == 4
    assert {m.ran_on["node_id"].split(":")[0] for m in markers.values()} == {"local"}
    assert {m.ran_on["worker"] for m in markers.values()} <= {"PartitionWorker-0",
                                                              "PartitionWorker-1"}


def test_a_worker_process_that_dies_is_replaced_and_its_partition_retried_then_reported(
        tmp_path, request):
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    run = mmpipe_here(request, out, home, *NO_MODEL, "--set", "runtime.max_attempts=2",
                      "--set", "runtime.num_workers=1",    # one process: each death a new one
                      env={"MMPIPE_CHAOS_KILL_WORKER_ON": "p-000001"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.count("died during p-000001") == 2   # both attempts, a new worker each
    assert "partition p-000001 failed after 2 attempts" in run.stderr
    store = CheckpointStore(str(out))
    assert sorted(store.markers()) == ["p-000000", "p-000002", "p-000003"]
    failure = store.failures()["p-000001"]
    assert len(failure["attempts"]) == 2 and "exited with code 137" in failure["error"]
    table = read_output(str(out), ["key"]).to_table()
    assert table.num_rows == 57 - 15
    # resuming without the fault runs only the failed partition
    again = mmpipe_here(request, out, home, *NO_MODEL, "--set", "runtime.num_workers=1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 skipped (already committed)" in again.stdout
    assert read_output(str(out), ["key"]).to_table().num_rows == 57


def test_a_hung_attempt_is_cancelled_after_the_attempt_timeout(tmp_path, request):
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    run = mmpipe_here(request, out, home, *NO_MODEL, "--set", "runtime.max_attempts=1",
                      "--set", "runtime.attempt_timeout_s=3", "--set", "runtime.num_workers=1",
                      env={"MMPIPE_CHAOS_HANG_ON": "p-000002"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "ran longer than runtime.attempt_timeout_s=3 s" in run.stderr
    assert sorted(CheckpointStore(str(out)).markers()) == ["p-000000", "p-000001", "p-000003"]


def test_auto_runs_the_minilm_job_in_worker_processes_with_the_embeddings_of_model_actors(
        tmp_path, ray_local):
    """A CPU model stage no longer needs Ray: each worker process loads MiniLM itself and
    the committed embeddings are those of the ModelActor path, row for row."""
    home = tmp_path / "home"
    home.mkdir()
    procs = mmpipe_run(tmp_path / "processes", home, "--set", "runtime.num_workers=2")
    assert procs.returncode == 0, procs.stdout + procs.stderr
    assert "(worker processes, no Ray)" in procs.stderr
    assert not (home / ".ray").exists()
    logs = [line.split("worker logs: ")[1].split(" ")[0] for line in procs.stderr.splitlines()
            if "worker logs: " in line]
    loaded = [p for p in Path(logs[0]).glob("PartitionWorker-*.log")
              if "Loading SentenceTransformer model" in p.read_text()]
    assert len(loaded) == 2   # one copy of the model in each worker process
    on_ray = ray_run(tmp_path / "ray")
    assert [p["stage"] for p in on_ray.model_pools] == ["text_embedding"]  # a ModelActor

    def embeddings(out: Path) -> dict[str, list | None]:
        table = read_output(str(out), ["key", "text_embedding"]).to_table()
        return dict(zip(table["key"].to_pylist(), table["text_embedding"].to_pylist()))

    got, want = embeddings(tmp_path / "processes"), embeddings(tmp_path / "ray")
    assert got.keys() == want.keys() and len(got) == 57
    assert {k for k, v in got.items() if v is None} == {k for k, v in want.items() if v is None}
    embedded = [k for k, v in want.items() if v is not None]
    assert len(embedded) == 57 and len(want[embedded[0]]) == 384
    diff = max(abs(a - b) for k in embedded for a, b in zip(got[k], want[k]))
    assert diff < 1e-5, diff


def test_processes_are_refused_where_the_run_needs_ray(tmp_path, request):
    home = tmp_path / "home"
    home.mkdir()
    run = mmpipe_here(request, tmp_path / "out", home, "--executor", "processes",
                      "--set", "text_embedding.num_gpus=1")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--executor" in run.stderr and "text_embedding.num_gpus=1" in run.stderr
    assert not (tmp_path / "out").exists()     # refused before anything was written
    run = mmpipe_here(request, tmp_path / "out", home, "--executor", "processes",
                      "--set", "dedup.dataset.enabled=true")
    assert run.returncode == 2 and "dedup.dataset.enabled=true" in run.stderr, run.stderr


def test_the_report_json_of_a_process_run_counts_every_row(auto_run):
    _, out, report, run = auto_run
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(report.read_text())
    assert data["partitions_total"] == 4 and len(data["partitions_committed"]) == 4
    assert data["rows_out"] == 57
    statuses = read_output(str(out), ["status"]).to_table()["status"]
    assert pc.sum(pc.equal(statuses, "ok")).as_py() == 57
