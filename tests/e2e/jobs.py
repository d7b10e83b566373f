"""Helpers to run ``mmpipe run`` as a user does: a subprocess with its own fresh local Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.storage import fs
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import read_committed
from tests.conftest import REPO

PARTITIONS = 19  # 57 photos / partition_size 3


def mmpipe_run(out: str, home: Path, extra_env: dict | None = None, input_uri: str | None = None,
               report: Path | None = None, sets: tuple[str, ...] = (),
               executor: str = "ray", **popen) -> subprocess.Popen:
    """Start the quickstart job (19 partitions of 3, one worker) writing to ``out``, with
    ``sets`` as further ``--set KEY=VALUE`` overrides; ``executor="processes"``: its
    partition workers as worker processes of the driver, no Ray (tests/runtime/
    test_process_executor.py covers that executor itself)."""
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", "local",                 # a new local Ray even if others are running
           "--executor", executor,               # the Ray path unless told (processes: below)
           "--output", out, "--set", "source.partition_size=3",
           "--set", "runtime.num_workers=1", "--set", "runtime.batch_size=3"]
    for item in sets:
        cmd += ["--set", item]
    if input_uri:
        cmd += ["--input", input_uri]
    if report:
        cmd += ["--report-json", str(report)]
    env = clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1", **(extra_env or {}))
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, **popen)


def clean_ray_env(**extra: str) -> dict[str, str]:
    """This process's environment without the RAY_* variables that an in-process
    ``ray.init`` added (RAY_ADDRESS, RAY_AUTH_MODE, ...), plus ``extra``: a child then
    starts its own Ray the way a user's shell would."""
    keep = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k in keep}
    env.update(extra)
    return env


def finish(proc: subprocess.Popen, timeout_s: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return out


def markers(out: str) -> dict[str, str]:
    """partition id -> attempt id of every commit marker."""
    return {p: m.attempt_id for p, m in CheckpointStore(out).markers().items()}


def rows_by_key(out: str, key: str = "key") -> dict[str, dict]:
    """The committed output rows, keyed by the column ``key`` (read through the pipeline's
    fs layer); ``source_uri`` where keys repeat (WebDataset keys across shards)."""
    return {r[key]: r for r in read_committed(out).to_pylist()}


def check_accounting(out: str, planned: bool = True) -> dict[str, dict]:
    """Every commit marker reconciles: ``rows_in == ok + rejected + error`` == the rows of
    its Parquet data file, and (``planned``) == ``rows_planned``. Returns the markers."""
    markers = CheckpointStore(out).markers()
    for pid, m in markers.items():
        s = m.rows_by_status
        assert m.rows_in == s["ok"] + s["rejected"] + s["error"], pid
        if planned:
            assert m.rows_in == m.rows_planned, pid
        data = [f for f in m.files if f.startswith("data/")]
        fsys, path = fs.resolve(fs.join(out, data[0]))
        assert pq.read_metadata(path, filesystem=fsys).num_rows == m.rows_in, pid
    return markers


COMPARED = ("status", "reject_reason", "sha256", "phash", "caption", "captions", "source_uri",
            "width", "height", "image_width", "image_height", "partition_id", "image")


def assert_same_output(got_root: str, want_root: str, rows: int = 57,
                       embeddings: bool = True, input_bases: tuple[str, str] | None = None
                       ) -> None:
    """The committed output under ``got_root`` equals a clean run's under ``want_root``:
    the same keys (``rows`` of them), every ``COMPARED`` column, and (``embeddings``)
    ``text_embedding`` within 1e-5. ``input_bases``: ``(got_base, want_base)`` where the
    two runs read the same files from different places (S3 and the local copy): every
    ``source_uri`` under ``got_root`` is ``got_base`` + what follows ``want_base`` in the
    clean run's."""
    import numpy as np

    got, want = rows_by_key(got_root), rows_by_key(want_root)
    assert sorted(got) == sorted(want) and len(got) == rows
    for key, w in want.items():
        for col in COMPARED:
            if col == "source_uri" and input_bases is not None:
                got_base, want_base = input_bases
                assert w[col].startswith(want_base), (key, w[col])
                assert got[key][col] == got_base + w[col][len(want_base):], (key, col)
                continue
            assert got[key][col] == w[col], (key, col)
        if embeddings:
            np.testing.assert_allclose(got[key]["text_embedding"], w["text_embedding"], atol=1e-5)


def wait_for_workers_gone(session_dir: str, timeout_s: float = 120) -> list:
    """After a ``kill -9`` of a ``mmpipe run`` driver on a local Ray (its session directory
    ``session_dir``): wait until no ``PartitionWorker`` process of that session is left.
    Such a worker outlives its driver for a moment and may still commit the partition it
    had in hand (seen: one marker more after the kill), then exits as its raylet is gone;
    once none is left, nothing of the killed run can write a marker. Returns the
    session's processes left then (Ray's agents: what the next local run stops)."""
    import psutil

    from pipeline.runtime.local_ray import session_processes

    deadline = time.monotonic() + timeout_s
    while True:
        left = session_processes(session_dir)
        workers = [p for p in left if _cmdline(p).startswith("ray::PartitionWorker")]
        if not workers:
            return left
        assert time.monotonic() < deadline, [_cmdline(p) for p in workers]
        # wait on those workers' exits (not a rescan of every process each 0.1 s), then
        # look again: a scan that finds none is what returns
        psutil.wait_procs(workers, timeout=max(0.1, deadline - time.monotonic()))


def _cmdline(proc) -> str:
    import psutil

    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""


#: ``--set`` overrides (and the same for ``clean_reference``) of runs whose claim is not about
#: the text embedding or model actors: no MiniLM, no model actor (a run ~10 s shorter).
NO_MODEL = ("text_embedding.enabled=false",)

_SHARED: dict[tuple, str] = {}


def shared_photos(server) -> str:
    """``s3://BUCKET/photos/captions.jsonl`` on ``server``: data/photos uploaded once per
    process and S3 server into a bucket of its own, which the tests only read (each test
    writes its output into its own ``s3_env`` bucket). Tests that compare with
    ``clean_reference`` read this input, so their ``source_uri`` values are the same."""
    key = ("photos", server.endpoint_url)
    if key not in _SHARED:
        import uuid

        from tests.conftest import PHOTOS, upload_dir

        bucket = f"photos-{uuid.uuid4().hex[:12]}"
        server.client().create_bucket(Bucket=bucket)
        upload_dir(server.client(), bucket, "photos", PHOTOS)
        _SHARED[key] = f"s3://{bucket}/photos/captions.jsonl"
    return _SHARED[key]


def clean_reference(tmp_path_factory, server=None, sets: tuple[str, ...] = NO_MODEL,
                    executor: str = "ray") -> str:
    """The output root of a clean, uninterrupted quickstart run (the ``mmpipe_run`` settings
    plus ``sets``), computed once per process and reused by every test that compares with
    it. On the local filesystem (the quickstart's own relative input): run in this process
    (``run_job`` on the connected Ray: the caller requests ``ray_local``; with
    ``executor="processes"``, on worker processes of this process, no Ray: what a clean
    run commits does not depend on where its partition workers ran). Given the S3
    ``server``: ``mmpipe_run`` from ``shared_photos(server)`` to a bucket of its own (a
    subprocess: ``ray_local``'s workers lack the S3 credentials, which only the
    environment carries)."""
    assert executor in ("ray", "processes") and (server is None or executor == "ray"), executor
    key = ("clean", server.endpoint_url if server else "local", tuple(sets), executor)
    if key not in _SHARED:
        import contextlib
        import uuid

        if server is None:
            from pipeline.runtime.driver import run_job
            from pipeline.spec.load import load_spec

            out = str(tmp_path_factory.mktemp("clean-reference"))
            overrides = ["source.partition_size=3", "runtime.num_workers=1",
                         "runtime.batch_size=3", *sets]
            with contextlib.chdir(REPO):      # the quickstart's relative source.uri
                spec = load_spec(REPO / "examples/quickstart.yaml", overrides, None, out)
                if executor == "processes":
                    from pipeline.runtime.executors import ProcessWorkers, new_run_id

                    workers = ProcessWorkers(spec.name, new_run_id())
                    try:
                        report = run_job(spec, processes=workers)
                    finally:
                        workers.close()
                else:
                    report = run_job(spec)
            assert report.complete and len(report.partitions_committed) == PARTITIONS, \
                report.format()
        else:
            bucket = f"clean-{uuid.uuid4().hex[:12]}"
            server.client().create_bucket(Bucket=bucket)
            out = f"s3://{bucket}/clean"
            finish(mmpipe_run(out, tmp_path_factory.mktemp("clean-home"), server.env(),
                              shared_photos(server), sets=sets, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True))
            assert len(markers(out)) == PARTITIONS
        _SHARED[key] = out
    return _SHARED[key]
