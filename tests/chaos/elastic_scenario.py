"""Run by test_elastic_pool.py in its own process: a job that starts on a head with one
CPU (``ray.cluster_utils.Cluster``, nothing else in the cluster) and gets two worker nodes
of one CPU each once its first partition has committed. The elastic pool starts workers
there; the commit markers say where each partition ran.

Every partition takes at least ``SLOW_S`` seconds (``slow_partitions``, installed in each
Ray worker process by ``worker_process_setup_hook``), so the job outlasts the nodes' start.

Usage: python elastic_scenario.py OUT RESULT_JSON
"""

from __future__ import annotations

import json
import sys
import threading
import time

SLOW_S = 0.8


def slow_partitions() -> None:
    """Make every batch of this process sleep ``SLOW_S`` s first (patches
    ``partition._run_steps``, which ``run_partition`` calls by its module global; one batch
    per partition here), so the sleep lies between a marker's ``started_at`` and
    ``finished_at``."""
    from pipeline.runtime import partition

    original = partition._run_steps  # noqa: SLF001 - fault injection

    def slowed(*args, **kwargs):
        time.sleep(SLOW_S)
        return original(*args, **kwargs)

    partition._run_steps = slowed  # noqa: SLF001


def main(out: str, result_path: str) -> None:
    import ray

    from pipeline.output.checkpoint import CheckpointStore
    from pipeline.runtime.driver import run_job
    from pipeline.spec import load_spec
    from tests.chaos.multinode_scenario import start_cluster

    cluster = start_cluster(num_cpus=1)
    ray.init(address=cluster.address, logging_level="WARNING", runtime_env={
        "worker_process_setup_hook": "tests.chaos.elastic_scenario.slow_partitions",
        "env_vars": {"HF_HUB_OFFLINE": "1"}})
    result: dict = {"head": cluster.head_node.node_id}
    try:
        spec = load_spec("examples/quickstart.yaml", [
            "source.partition_size=3", "runtime.batch_size=3", "text_embedding.enabled=false",
            "name=elastic"], output_uri=out)
        reports: dict = {}
        job = threading.Thread(target=lambda: reports.update(r=run_job(spec)))
        job.start()
        store = CheckpointStore(out)
        while job.is_alive() and not store.markers():
            time.sleep(0.05)
        result["committed_before_join"] = len(store.markers())
        result["added"] = [cluster.add_node(num_cpus=1).node_id for _ in range(2)]
        job.join(240)
        result["report"] = reports["r"].to_dict()
        result["ran_on"] = {p: m.ran_on for p, m in store.markers().items()}
        result["intervals"] = [(m.started_at, m.finished_at) for m in store.markers().values()]
    finally:
        ray.shutdown()
        cluster.shutdown()
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
