"""A model actor killed mid-job: its batches are retried on the other replica and every
row still gets its embedding."""

from __future__ import annotations

import threading
import time

import numpy as np
import ray

from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.driver import run_job
from pipeline.runtime.metrics import job_namespace
from pipeline.spec import load_spec
from tests.conftest import REPO
from tests.e2e.jobs import PARTITIONS, rows_by_key


def test_model_actor_killed_mid_job(ray_local, tmp_path):
    out = str(tmp_path / "out")
    spec = load_spec(REPO / "examples" / "quickstart.yaml", [
        "source.partition_size=3", "runtime.num_workers=1", "runtime.batch_size=3",
        "text_embedding.replicas=2", "text_embedding.num_cpus=0.25", "name=actorloss"],
        input_uri=str(REPO / "data/photos/captions.jsonl"), output_uri=out)
    reports = {}
    job = threading.Thread(target=lambda: reports.update(r=run_job(spec, run_id="r1")))
    job.start()
    store = CheckpointStore(out)
    deadline = time.time() + 240
    while len(store.markers()) < 3 and time.time() < deadline:
        time.sleep(0.1)
    victim = ray.get_actor("ModelActor-text_embedding-0", namespace=job_namespace(spec.name, "r1"))
    ray.kill(victim, no_restart=True)
    killed_after = len(store.markers())
    job.join(300)
    report = reports["r"]
    assert report.run_id == "r1"
    assert report.complete and killed_after < PARTITIONS
    assert len(report.partitions_committed) == PARTITIONS
    assert all(len(a) == 1 for a in report.attempts.values())   # no partition had to rerun
    rows = rows_by_key(out)
    assert len(rows) == 57
    for r in rows.values():
        assert r["status"] == "ok"
        vec = np.asarray(r["text_embedding"], dtype=np.float32)
        assert vec.shape == (384,) and abs(np.linalg.norm(vec) - 1) < 1e-4
    survivors = [a for a in report.model_actors if a.get("name", "").endswith("-1")]
    assert survivors and survivors[0]["records"] > 0
