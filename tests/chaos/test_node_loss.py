"""Losing a worker node mid-job (multi-node Ray on one machine): only the partitions that
were in flight there run again, and the output equals a clean run's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.output.checkpoint import CheckpointStore
from tests.conftest import REPO
from tests.e2e.jobs import PARTITIONS, assert_same_output, clean_ray_env


def test_worker_node_removed_mid_job(tmp_path):
    result_path = tmp_path / "result.json"
    killed, clean = str(tmp_path / "killed"), str(tmp_path / "clean")
    env = clean_ray_env(HOME=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-X", "faulthandler",
                           "tests/chaos/multinode_scenario.py", killed, clean,
                           str(result_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=420)
    if proc.returncode != 0:   # pytest.fail: an assert's repr would cut the traceback out
        tail = proc.stderr[proc.stderr.rfind("Traceback"):] if "Traceback" in proc.stderr \
            else proc.stderr[-4000:]
        pytest.fail(f"scenario exited {proc.returncode}\nstdout: {proc.stdout[-2000:]}\n"
                    f"stderr from its traceback: {tail[-6000:]}", pytrace=False)
    r = json.loads(result_path.read_text())
    report = r["killed"]
    assert report["complete"] and r["workers_on_removed_node"] == 2
    assert len(r["after"]) == PARTITIONS
    before = r["before"]
    assert 4 <= len(before) < PARTITIONS
    assert {p: r["after"][p] for p in before} == before     # committed work untouched
    replayed = sorted(p for p, a in report["attempts"].items() if len(a) > 1)
    assert not set(replayed) & set(before)                   # no committed work redone
    final = CheckpointStore(killed).markers()
    # the partitions in flight on the lost node: replayed elsewhere, or committed by a zombie
    # attempt still running there after the removal (allowed: the marker is the fence)
    zombies = sorted(p for p, m in final.items()
                     if p not in before and m.ran_on["node_id"] == r["removed_node"])
    affected = set(replayed) | set(zombies)
    # (a worker there may even return a result after the removal and be handed another
    # partition before Ray declares the node dead, so more than 2 can be affected)
    assert affected, (replayed, zombies)
    for pid in affected:                                      # the visible attempt is this run's
        assert r["after"][pid] in report["attempts"][pid]
    assert_same_output(killed, clean, embeddings=False)
    print(f"node loss: {len(before)} partitions committed before it; replayed {replayed}; "
          f"committed by zombie attempts on the lost node {zombies}")
