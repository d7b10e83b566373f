"""Waiting for resources has a limit (``runtime.resource_wait_s``): an actor that no node
can take fails the job with a message naming what is missing, instead of hanging."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.e2e.jobs import clean_ray_env


def test_a_gpu_model_on_a_cpu_only_ray_fails_naming_the_missing_gpu(tmp_path):
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", "local", "--output", str(tmp_path / "out"),
           "--set", "text_embedding.num_gpus=1", "--set", "runtime.resource_wait_s=1"]
    env = clean_ray_env(HOME=str(tmp_path), HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    t0 = time.time()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout + done.stderr
    assert ("no node offers {'CPU': 1.0, 'GPU': 1.0} for ModelActor-text_embedding-0 after "
            "1 s; the cluster has {'CPU':") in done.stderr, done.stderr[-3000:]
    assert "started a local Ray" in done.stderr
    assert time.time() - t0 < 90


def test_a_worker_resource_no_node_offers_fails_the_job(ray_local, tmp_path):
    from pipeline.runtime.driver import run_job
    from pipeline.runtime.model_pool import ResourceWaitError
    from pipeline.spec import load_spec

    spec = load_spec(REPO / "examples" / "quickstart.yaml", [
        "text_embedding.enabled=false", "runtime.worker_resources={cpu_node: 1}",
        "runtime.resource_wait_s=1", "name=nocpunode"],
        input_uri=str(REPO / "data/photos/captions.jsonl"), output_uri=str(tmp_path / "out"))
    t0 = time.time()
    with pytest.raises(ResourceWaitError, match=r"no node offers \{'CPU': 1.0, 'cpu_node': "
                       r"1.0\} for PartitionWorker-0 after 1 s"):
        run_job(spec)
    assert time.time() - t0 < 60
