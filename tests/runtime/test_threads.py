"""A PartitionWorker's thread pools are capped at the CPUs Ray gave it (issue 13, item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pipeline.runtime import threads
from tests.conftest import PHOTOS, REPO

# Runs in a fresh interpreter: the caps change process-wide state (pyarrow's pool, env).
_CAP_SCRIPT = """
import json, os, sys
import cv2, numpy, pyarrow as pa, torch
from threadpoolctl import threadpool_info
before = {"pyarrow": pa.cpu_count(), "torch": torch.get_num_threads()}
from pipeline.runtime import threads
applied = threads.cap_threads(3)
print(json.dumps({"before": before, "applied": applied,
                  "pyarrow": pa.cpu_count(), "torch": torch.get_num_threads(),
                  "cv2": cv2.getNumThreads(),
                  "env": {v: os.environ[v] for v in threads.THREAD_ENV_VARS},
                  "blas": sorted({i["num_threads"] for i in threadpool_info()})}))
"""


def test_cap_threads_sets_every_pool_in_a_fresh_process():
    # a node whose environment asks for 7 threads everywhere (Ray then leaves it alone)
    env = {**os.environ, "OMP_NUM_THREADS": "7", "OPENBLAS_NUM_THREADS": "7",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _CAP_SCRIPT], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"]["pyarrow"] == 7  # the uncapped default
    assert got["pyarrow"] == 3 and got["torch"] == 3 and got["cv2"] == 3
    assert got["env"] == {v: "3" for v in threads.THREAD_ENV_VARS}
    assert got["blas"] == [3]  # numpy's OpenBLAS, loaded before the cap
    assert {"pyarrow", "torch", "cv2", "threadpoolctl"} <= set(got["applied"])


def test_torch_imported_after_the_cap_takes_it():
    script = ("import json\nfrom pipeline.runtime import threads\nthreads.cap_threads(1)\n"
              "import torch\nprint(json.dumps(torch.get_num_threads()))")
    env = {**os.environ, "OMP_NUM_THREADS": "7", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == 1


def test_step_threads_never_exceed_the_cpus():
    assert threads.step_threads(2, 1) == 1
    assert threads.step_threads(2, 4) == 2
    assert threads.step_threads(8, 3) == 3


def test_assigned_cpus_outside_ray_is_the_affinity():
    assert threads.assigned_cpus() == len(os.sched_getaffinity(0))


def test_a_partition_worker_caps_its_pools_at_its_cpus(ray_local, tmp_path):
    from pipeline.assembly import assemble
    from pipeline.runtime.executors import remote_worker
    from pipeline.spec import JobSpec

    spec = JobSpec.model_validate({
        "source": {"kind": "manifest", "uri": str(PHOTOS / "captions.jsonl"),
                   "path_column": "file", "key_column": "key", "partition_size": 20},
        "sink": {"uri": str(tmp_path / "out")},
        "text_embedding": {"enabled": False},
        "runtime": {"decode_threads": 4}})
    fp = assemble(spec).fingerprint

    def worker_state(worker) -> dict:  # runs inside the actor (a local function: by value)
        import os

        import pyarrow as pa

        return {"pyarrow": pa.cpu_count(), "omp": os.environ.get("OMP_NUM_THREADS"),
                "step_threads": worker.step_pool._max_workers,
                "read_threads": worker.pool._max_workers,
                "steps_use": {type(s).__name__: s.executor is worker.step_pool
                              for s in worker.pipeline.steps if hasattr(s, "executor")}}

    # the node's environment asks for 6 OpenMP threads: Ray keeps it, the worker must not
    worker = remote_worker().options(
        num_cpus=1, runtime_env={"env_vars": {"OMP_NUM_THREADS": "6"}}
    ).remote(spec.model_dump_json(), fp, 0, [], "")
    try:
        state = ray_local.get(worker.__ray_call__.remote(worker_state), timeout=120)
    finally:
        ray_local.kill(worker)
    assert state["pyarrow"] == 1 and state["omp"] == "1"
    assert state["step_threads"] == 1 and state["read_threads"] == 4
    assert state["steps_use"] and all(state["steps_use"].values()), state
