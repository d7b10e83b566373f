"""Run by test_node_loss.py in its own process: a 3-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: head without CPUs + 2 worker nodes of 2 CPUs), the
quickstart job with 4 workers, and one worker node removed ungracefully while its
partitions are in flight. Then a clean run of the same job on the surviving nodes.

Usage: python multinode_scenario.py OUT_KILLED OUT_CLEAN RESULT_JSON
"""

from __future__ import annotations

import json
import sys
import threading
import time

import ray
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from pipeline.testing.seaweedfs import free_port
from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.driver import run_job
from pipeline.spec import load_spec


def markers(out: str) -> dict[str, str]:
    return {p: m.attempt_id for p, m in CheckpointStore(out).markers().items()}


def start_cluster(tries: int = 3, num_cpus: int = 0) -> Cluster:
    """The head (``num_cpus``, default none), on fresh ports; retried because a loaded
    machine can make the GCS miss Ray's start-up deadline."""
    for attempt in range(1, tries + 1):
        try:
            return Cluster(initialize_head=True, head_node_args={
                "num_cpus": num_cpus, "redis_port": free_port(), "dashboard_port": free_port(),
                "_system_config": {"health_check_period_ms": 1000,
                                   "health_check_failure_threshold": 3}})
        except RuntimeError:
            if attempt == tries:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def main(out_killed: str, out_clean: str, result_path: str) -> None:
    cluster = start_cluster()
    # the driver joins while the head is the only node: with several nodes on one IP,
    # ray.init may attach to any of their raylets, and removing the one it attached to
    # shuts the driver down (Cluster.remove_node raises ValueError); seen in CI under load.
    # The state API is given the address too: without it, it looks for Ray instances on
    # this machine and fails when the suite's other clusters are running (CI, stop 56)
    ray.init(address=cluster.address, logging_level="WARNING")
    keep = cluster.add_node(num_cpus=2)
    doomed = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    driver_node = ray.get_runtime_context().get_node_id()
    assert driver_node == cluster.head_node.node_id, (driver_node, doomed.node_id)
    overrides = ["source.partition_size=3", "runtime.num_workers=4", "runtime.batch_size=1",
                 "text_embedding.enabled=false"]
    result: dict = {}
    try:
        spec = load_spec("examples/quickstart.yaml", overrides, output_uri=out_killed)
        reports = {}
        job = threading.Thread(target=lambda: reports.update(killed=run_job(spec)))
        job.start()
        doomed_id = doomed.node_id
        on_doomed: list = []
        # remove the node once it has both its workers up and 4 partitions are committed
        while job.is_alive() and (len(markers(out_killed)) < 4 or len(on_doomed) < 2):
            time.sleep(0.1)
            alive = list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")])
            on_doomed = [a for a in alive
                         if a.node_id == doomed_id and a.class_name == "PartitionWorker"]
        result["before"] = markers(out_killed)
        result["workers_on_removed_node"] = len(on_doomed)
        result["removed_node"] = doomed_id
        cluster.remove_node(doomed, allow_graceful=False)
        result["removed_at"] = time.time()
        job.join(300)
        report = reports["killed"]
        result["killed"] = report.to_dict()
        result["after"] = markers(out_killed)
        clean = load_spec("examples/quickstart.yaml", overrides, output_uri=out_clean)
        result["clean"] = run_job(clean).to_dict()
        result["surviving_node"] = keep.node_id
    finally:
        ray.shutdown()
        cluster.shutdown()
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
