"""Losing a worker node mid-job (multi-node Ray on one machine): only the partitions that
were in flight there run again, and the output equals a clean run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.e2e.jobs import COMPARED, PARTITIONS, rows_by_key


def test_worker_node_removed_mid_job(tmp_path):
    result_path = tmp_path / "result.json"
    killed, clean = str(tmp_path / "killed"), str(tmp_path / "clean")
    env = dict(os.environ, HOME=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "tests/chaos/multinode_scenario.py", killed, clean,
                           str(result_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(result_path.read_text())
    report = r["killed"]
    assert report["complete"] and r["workers_on_removed_node"] == 2
    assert len(r["after"]) == PARTITIONS
    before = r["before"]
    assert 4 <= len(before) < PARTITIONS
    assert {p: r["after"][p] for p in before} == before     # committed work untouched
    replayed = sorted(p for p, a in report["attempts"].items() if len(a) > 1)
    assert 1 <= len(replayed) <= 2                           # the two in flight on that node
    assert not set(replayed) & set(before)
    for pid in replayed:                                      # the visible attempt is one of them
        assert r["after"][pid] in report["attempts"][pid]
    got, want = rows_by_key(killed), rows_by_key(clean)
    assert sorted(got) == sorted(want) and len(got) == 57
    for key, w in want.items():
        for col in COMPARED:
            if col != "text_embedding":
                assert got[key][col] == w[col], (key, col)
    print(f"replayed partitions: {replayed}; committed before the node loss: {len(before)}")
