"""bench/throughput.py (issue 32): a second run in the same --workdir (variant (a) then
overwrites its kept output as generation 2, whose commit markers are not at the root)
reads the markers of the current generation instead of crashing, and ``--no-model`` runs
the plain loop without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.output import generations
from pipeline.output.checkpoint import CheckpointStore

REPO = Path(__file__).resolve().parents[2]


def test_rerun_in_one_workdir_and_model_less_plain_loop(tmp_path):
    summary = tmp_path / "results" / "c1-s0-p20-nomodel-summary.json"
    for run in (1, 2):
        proc = subprocess.run(
            [sys.executable, str(REPO / "bench" / "throughput.py"), "--copies", "1",
             "--variants", "a,b", "--no-model", "--cores", "2", "--partition-size", "20",
             "--quiet-wait", "0", "--busy-retries", "0", "--workdir", str(tmp_path)],
            capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
        assert proc.returncode == 0, (run, proc.stdout[-3000:], proc.stderr[-3000:])
        s = json.loads(summary.read_text())
        assert s["check_ok"], s["check"]
        for v in ("a", "b"):
            r = s["results"][v]
            by_status = {k: n for k, n in r["rows_by_status"].items() if n}
            assert by_status == {"ok": 57}, (v, r["rows_by_status"])
            assert r["processing_s"] > 0 and r["startup_s"] >= 0, (v, r)
        assert s["counts"]["a"]["rows"] == s["counts"]["b"]["rows"] == 57
        # the plain loop ran no model and imported no torch (it asserts so itself, too)
        assert s["results"]["b"]["torch_threads"] is None
        assert s["results"]["b"]["profile_s"]["model load"] == 0.0
    # the second run overwrote (a)'s kept output: generation 2, no marker at the root
    out = tmp_path / "runs" / "c1-s0-p20-nomodel-a-r1"
    root = generations.read_root(str(out))
    assert root.endswith("g-000002")
    assert CheckpointStore(str(out)).markers() == {}
    assert len(CheckpointStore(root).markers()) == 3  # 57 rows in partitions of 20
