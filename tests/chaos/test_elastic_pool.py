"""The elastic worker pool on a growing cluster (multi-node Ray on one machine): a job that
starts on a one-CPU head uses the two nodes added after its first commit, and finishes."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.e2e.jobs import PARTITIONS, clean_ray_env


def test_nodes_added_mid_job_get_partitions(tmp_path):
    result_path = tmp_path / "result.json"
    env = clean_ray_env(HOME=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "tests/chaos/elastic_scenario.py",
                           str(tmp_path / "out"), str(result_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(result_path.read_text())
    report = r["report"]
    assert report["complete"] and report["rows_out"] == 57
    assert len(r["ran_on"]) == PARTITIONS
    assert r["committed_before_join"] < PARTITIONS // 2      # the nodes came mid-job
    nodes = {m["node_id"] for m in r["ran_on"].values()}
    assert set(r["added"]) <= nodes, (r["added"], nodes)       # both new nodes did work
    assert r["head"] in nodes
    assert {m["run_id"] for m in r["ran_on"].values()} == {report["run_id"]}
    # sooner than without them: the head has one CPU, so without the added nodes no two
    # attempts could overlap; with them, attempts ran side by side
    assert max_overlap(r["intervals"]) >= 2, r["intervals"]


def max_overlap(intervals: list) -> int:
    """The most (start, end) intervals (seconds) open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best
