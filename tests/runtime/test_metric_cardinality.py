"""Bounded metric series: a 40-partition job on a local Ray head creates a number of
Prometheus series for Ray's task and actor metrics that does not grow with the partitions.

Ray labels ``ray_tasks`` / ``ray_actors`` by the task or actor name; a name holding the
partition id (``PartitionWorker-0.run(p-000042/a-…)``) made one series family per attempt.
The driver now names every attempt's task ``PartitionWorker.run`` (the partition id is in
the worker's log lines and the commit marker), so the series are bounded by the number of
task kinds and states, whatever the number of partitions.

The bound (``MAX_SERIES``) is a constant, not a function of the partitions, so a job of 40
partitions tests it as well as one of 200 did: names holding the partition id would give
about 9 series per attempt, some 360 here, six times the bound (and any name with a
partition id in it fails the test by itself)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PHOTOS, REPO, coco_captions
from tests.deploy.local_head import start_head

PARTITIONS = 40
JOB = "cardinality-check"
# Ray's own per-task and per-actor state metrics, labelled by name
NAMED = ("ray_tasks", "ray_actors")
# series of those metrics this job may create: a handful of names times states, never
# one per partition (the old names gave about 9 per attempt: 360 here)
MAX_SERIES = 60


def manifest(path, n: int) -> None:
    """A JSONL manifest of ``n`` records cycling over the bundled photos, unique keys."""
    rows = coco_captions()
    with open(path, "w") as f:
        for i in range(n):
            row = rows[i % len(rows)]
            f.write(json.dumps({"key": f"k{i:05d}", "file": str(PHOTOS / row["file"]),
                                "captions": row["captions"]}) + "\n")


def named_series(url: str, token: str) -> dict[str, set[tuple]]:
    """Prometheus samples of ``NAMED`` metrics on ``url``: metric -> {label tuples}
    (empty while the endpoint does not answer yet)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    out: dict = collections.defaultdict(set)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
    except OSError:                      # the metrics agent starts after the head
        return out
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in NAMED:
                out[s.name].add(tuple(sorted(s.labels.items())))
    return out


def run_and_scrape(cmd: list[str], head, after_s: float = 15) -> dict[str, set[tuple]]:
    """Run ``cmd`` against ``head`` and scrape the head's metrics every second while it
    runs and for ``after_s`` after: every series seen (the driver's task series go away
    some time after it exits, so one scrape at the end could miss them)."""
    seen: dict = collections.defaultdict(set)
    proc = subprocess.Popen(cmd, cwd=REPO, env=head.client_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline, ended = time.time() + 300, None
    try:
        while time.time() < deadline:
            if ended is None and proc.poll() is not None:
                ended = time.time()
            for name, labels in named_series(head.metrics_url, head.token).items():
                seen[name] |= labels
            names = {dict(s).get("Name") for s in seen.get("ray_tasks", ())}
            if ended is not None and (time.time() > ended + after_s
                                      or "PartitionWorker.run" in names):
                break
            time.sleep(1)
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate()[0]
    assert proc.returncode == 0, out[-3000:]
    return seen


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    h = start_head(tmp_path_factory.mktemp("cardinality-head"))
    yield h
    h.stop()


def test_a_40_partition_job_creates_a_bounded_number_of_task_series(head, tmp_path):
    manifest(tmp_path / "m.jsonl", PARTITIONS)
    report_path = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", head.gcs_address, "--input", str(tmp_path / "m.jsonl"),
           "--output", str(tmp_path / "out"), "--set", f"name={JOB}",
           "--set", "source.partition_size=1", "--set", "text_embedding.enabled=false",
           "--set", "dedup.near=false", "--set", "resize.mode=none",
           "--set", "runtime.num_workers=2", "--set", "runtime.progress_interval_s=60",
           "--set", f"source.allowed_roots=[{PHOTOS}]",   # the manifest names the photos
           "--report-json", str(report_path)]
    series = run_and_scrape(cmd, head)
    report = json.loads(report_path.read_text())
    assert report["complete"] and len(report["partitions_committed"]) == PARTITIONS
    tasks = series.get("ray_tasks", set())
    names = {dict(s).get("Name") for s in tasks}
    assert "PartitionWorker.run" in names, sorted(names)
    assert not [n for n in names if n and "p-0" in n], sorted(names)   # no partition ids
    total = sum(len(s) for s in series.values())
    assert total <= MAX_SERIES, (total, sorted(names))
    assert len(names) <= 15, sorted(names)
