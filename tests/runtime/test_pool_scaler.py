"""Model pools that follow the bottleneck (issue 27, item 2): ``replicas: {min, max}``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.errors import SpecError
from pipeline.spec import ReplicasSpec, load_spec
from tests.conftest import REPO
from tests.e2e.jobs import clean_ray_env

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def test_replicas_is_a_number_or_min_max():
    fixed = load_spec(QUICKSTART, ["text_embedding.replicas=3"]).text_embedding
    assert fixed.replicas == 3 and fixed.pool == ReplicasSpec(min=3, max=3)
    elastic = load_spec(QUICKSTART, ["text_embedding.replicas={min: 1, max: 4, idle_s: 5}"])
    assert elastic.text_embedding.pool == ReplicasSpec(min=1, max=4, idle_s=5)
    with pytest.raises(SpecError, match=r"text_embedding\.replicas\.pool: Value error, "
                       r"replicas\.max=1 is less than replicas\.min=2"):
        load_spec(QUICKSTART, ["text_embedding.replicas={min: 2, max: 1}"])
    with pytest.raises(SpecError, match=r"text_embedding\.replicas\.n: Input should be "
                       r"greater than or equal to 1 \(got 0\)"):
        load_spec(QUICKSTART, ["text_embedding.replicas=0"])


@pytest.mark.slow
def test_the_slow_stage_gets_a_replica_and_gives_it_back(tmp_path):
    result_path = tmp_path / "result.json"
    env = clean_ray_env(HOME=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "tests/runtime/pool_scenario.py",
                           str(tmp_path / "work"), str(result_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(result_path.read_text())
    report = r["report"]
    assert report["complete"] and report["rows_out"] == 57
    assert r["second_after_s"] is not None and r["second_gone_after_s"] is not None, r
    pools = {p["stage"]: p for p in report["model_pools"]}
    slow, fast = pools["text_embedding"], pools["image_embedding"]
    assert [t["replicas"] for t in slow["timeline"]] == [1, 2, 1], slow
    assert "the bottleneck" in slow["timeline"][1]["reason"]
    assert slow["timeline"][2]["reason"].startswith("idle for 3 s")
    assert [t["replicas"] for t in fast["timeline"]] == [1], fast
    assert 0 < slow["busy_fraction"] <= 1 and fast["busy_fraction"] < slow["busy_fraction"]
    log = proc.stderr
    assert ("model stage text_embedding: adding replica ModelActor-text_embedding-1 "
            "(1 -> 2): busy") in log, log[-4000:]
    assert "model stage text_embedding: removed a replica (2 -> 1): idle for 3 s" in log
    assert "model stage image_embedding: adding" not in log
    assert "model stage text_embedding (replicas 1..2): 1 at 0s, 2 at " in r["formatted"]
    # both replicas of the slow stage served batches (the workers learned the second)
    served = {a["name"]: a["records"] for a in report["model_actors"]
              if a["model"] == "text_embedding"}
    assert set(served) == {"ModelActor-text_embedding-0", "ModelActor-text_embedding-1"}
    assert all(n > 0 for n in served.values()), served
    print(r["formatted"])
    print("\n".join(line for line in log.splitlines() if "model stage" in line))


def test_the_minimum_packs_fractional_gpus_and_skips_actors_that_ask_nothing():
    from pipeline.runtime.admission import fits, minimum, total

    spec = load_spec(QUICKSTART, ["text_embedding.num_gpus=0.25", "text_embedding.num_cpus=0",
                                  "text_embedding.replicas={min: 4, max: 8}",
                                  "runtime.worker_resources={cpu_node: 1}"])
    need = minimum(spec)
    assert need == {**{f"ModelActor-text_embedding-{i}": {"GPU": 0.25} for i in range(4)},
                    "PartitionWorker-0": {"CPU": 1.0, "cpu_node": 1.0}}
    assert total(need.values()) == {"GPU": 1.0, "CPU": 1.0, "cpu_node": 1.0}
    assert fits({"GPU": 0.25}, {"GPU": 1.0, "CPU": 0.0}) == 4     # four share one GPU
    cpu_only = minimum(load_spec(QUICKSTART, ["text_embedding.num_cpus=0"]))
    assert cpu_only == {"PartitionWorker-0": {"CPU": 1.0}}       # no empty bundle


def test_growth_leaves_a_waiting_jobs_minimum_free(ray_local):
    from ray.util.placement_group import placement_group, remove_placement_group

    from pipeline.runtime.admission import fits, spare, waiting_demand

    ray = ray_local
    running = placement_group([{"CPU": 1.0}], name="mmpipe-running-test")
    assert running.wait(60)
    waiting = placement_group([{"CPU": 1.0}, {"CPU": 1.0}], name="mmpipe-waiting-test")
    try:
        assert not waiting.wait(2)                       # 1 CPU free, 2 needed: pending
        assert ray.available_resources().get("CPU") == 1.0
        assert waiting_demand(running) == {"CPU": 2.0}
        assert spare(running)["CPU"] == 0.0               # the free CPU is kept for it
        assert fits({"CPU": 1.0}, spare(running)) == 0    # so the running job does not grow
        remove_placement_group(running)
        assert waiting.wait(60)                          # the running job ended: admitted
        assert waiting_demand() == {}
    finally:
        for group in (running, waiting):
            remove_placement_group(group)
