"""Metrics on the Ray dashboard: a job on a local Ray head, its Prometheus endpoint scraped,
the counters checked against the job report; actor names and namespaces on the state API."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.output.checkpoint import CommitMarker
from pipeline.runtime import metrics
from pipeline.runtime.partition import AttemptOutcome
from tests.conftest import PHOTOS, REPO, coco_captions
from tests.deploy.local_head import start_head

JOB = "metrics-check"
ACTOR = "ModelActor-text_embedding-0"


class Recorder:
    """Stands in for ``metrics.metric``: keeps (name, tags) -> summed or last value."""

    def __init__(self):
        self.values: dict = collections.defaultdict(float)
        self.observed: dict = collections.defaultdict(list)

    def __call__(self, name):
        rec = self

        class _M:
            def inc(self, value, tags):
                rec.values[name, tuple(sorted(tags.items()))] += value

            def set(self, value, tags):
                rec.values[name, tuple(sorted(tags.items()))] = value

            def observe(self, value, tags):
                rec.observed[name, tuple(sorted(tags.items()))].append(value)
        return _M()


def test_worker_metrics_count_committed_rows_by_status_and_reason(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(metrics, "metric", rec)
    wm = metrics.WorkerMetrics("j", 3)
    def outcome(committed, rows, bytes_written):
        marker = CommitMarker(partition_id="p-000000", attempt_id="a", fingerprint="f",
                              files=[], rows_in=sum(rows.values()), rows_by_status={},
                              bytes_written=bytes_written)
        return AttemptOutcome(marker, committed, rows)

    wm.partition_done(outcome(True, {("ok", "none"): 5, ("rejected", "duplicate"): 2,
                                     ("rejected", "too_small"): 1, ("error", "truncated"): 1},
                              1000), 2.5)
    wm.partition_done(outcome(False, {("ok", "none"): 9}, 7), 1.0)  # lost the race: not counted
    wm.partition_failed(0.5)
    counts = {(n, dict(t).get("status"), dict(t).get("reason")): v
              for (n, t), v in rec.values.items() if n == "mmpipe_records"}
    assert counts == {("mmpipe_records", "ok", "none"): 5,
                      ("mmpipe_records", "rejected", "duplicate"): 2,
                      ("mmpipe_records", "rejected", "too_small"): 1,
                      ("mmpipe_records", "error", "truncated"): 1}
    assert rec.values["mmpipe_bytes_written", (("job_name", "j"),)] == 1000
    assert rec.values["mmpipe_partitions_committed", (("job_name", "j"),)] == 1
    outcomes = {dict(t)["outcome"]: v for (n, t), v in rec.observed.items()}
    assert outcomes == {"committed": [2.5], "lost_race": [1.0], "failed": [0.5]}


def test_model_busy_fraction_is_windowed(monkeypatch):
    monkeypatch.setattr(metrics, "metric", Recorder())
    mm = metrics.ModelMetrics("some/dir/minilm", "ModelActor-text_embedding-0", window_s=3600)
    assert mm.tags["model"] == "minilm"
    time.sleep(0.2)
    mm.batch(8, 0.05)
    assert 0 < mm.busy_fraction() <= 0.3
    time.sleep(0.05)
    assert mm.busy_fraction() == 0.0          # a new window: idle since


def scrape(url: str, token: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text from the node's metrics agent: sample name -> [(labels, value)]."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out: dict = collections.defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("ray_mmpipe_"):
                out[s.name].append((s.labels, s.value))
    return out


def total(samples, name: str, **labels) -> float:
    return sum(v for lab, v in samples.get(name, [])
               if all(lab.get(k) == val for k, val in labels.items()))


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    h = start_head(tmp_path_factory.mktemp("metrics-head"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def job_report(head, tmp_path_factory):
    """The quickstart (with a stricter filter, so there are rejects) driven against the head."""
    tmp = tmp_path_factory.mktemp("metrics-job")
    report_path = tmp / "report.json"
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", head.gcs_address, "--output", str(tmp / "out"),
           "--set", f"name={JOB}", "--set", "filters.min_height_px=430",
           "--report-json", str(report_path)]
    done = subprocess.run(cmd, cwd=REPO, env=head.client_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(report_path.read_text())


def test_dashboard_counters_agree_with_the_job_report(head, job_report):
    report = job_report
    assert report["complete"] and report["rows_by_status"]["rejected"] > 0
    committed = len(report["partitions_committed"])
    deadline, samples = time.time() + 60, {}
    while time.time() < deadline:       # workers and driver export every few seconds
        samples = scrape(head.metrics_url, head.token)
        if (total(samples, "ray_mmpipe_partitions_committed_total", job_name=JOB) == committed
                and total(samples, "ray_mmpipe_records_read_total", job_name=JOB) == 57
                and samples.get("ray_mmpipe_partitions_remaining")):
            break
        time.sleep(1)
    assert total(samples, "ray_mmpipe_partitions_committed_total", job_name=JOB) == committed == 4
    for status, n in report["rows_by_status"].items():
        assert total(samples, "ray_mmpipe_records_total", job_name=JOB, status=status) == n, status
    for key, n in report["rows_by_reason"].items():
        status, reason = key.split(":")
        assert total(samples, "ray_mmpipe_records_total", job_name=JOB, status=status,
                     reason=reason) == n, key
    assert total(samples, "ray_mmpipe_records_total", job_name=JOB, reason="none") == \
        report["rows_by_status"]["ok"]
    assert total(samples, "ray_mmpipe_bytes_written_total", job_name=JOB) == report["bytes_written"]
    assert total(samples, "ray_mmpipe_records_read_total", job_name=JOB) == report["rows_processed"]
    photo_bytes = sum((PHOTOS / r["file"]).stat().st_size for r in coco_captions())
    assert total(samples, "ray_mmpipe_bytes_read_total", job_name=JOB) == photo_bytes
    assert total(samples, "ray_mmpipe_partitions_remaining", job_name=JOB) == 0
    assert total(samples, "ray_mmpipe_partitions_failed_total", job_name=JOB) == 0
    assert total(samples, "ray_mmpipe_partition_duration_s_count", job_name=JOB,
                 outcome="committed") == committed
    # model actors: every forward pass, record and worker request the actors' stats count
    stats = report["model_actors"]
    assert [a["name"] for a in stats] == [ACTOR]
    assert stats[0]["batches"] > 0
    assert total(samples, "ray_mmpipe_model_batch_latency_s_count", actor=ACTOR,
                 model="text_embedding") == stats[0]["batches"]
    assert total(samples, "ray_mmpipe_model_records_total", actor=ACTOR) == stats[0]["records"]
    assert total(samples, "ray_mmpipe_model_busy_seconds_total", actor=ACTOR) > 0
    assert total(samples, "ray_mmpipe_model_batch_roundtrip_s_count", job_name=JOB) == \
        stats[0]["requests"]
    assert total(samples, "ray_mmpipe_model_batches_in_flight", job_name=JOB) == 0
    for _, v in samples.get("ray_mmpipe_model_busy_fraction", []):
        assert 0 <= v <= 1


def test_actors_are_named_per_job_namespace(head, job_report):
    req = urllib.request.Request(f"{head.dashboard_url}/api/v0/actors?limit=1000&detail=1",
                                 headers={"Authorization": f"Bearer {head.token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        actors = json.loads(r.read())["data"]["result"]["result"]
    namespace = f"mmpipe-{JOB}-{job_report['run_id']}"   # one namespace per run
    ours = {a["name"]: a for a in actors if a.get("ray_namespace") == namespace}
    assert {"PartitionWorker-0", ACTOR} <= set(ours), sorted(ours)
    assert ours["PartitionWorker-0"]["class_name"] == "PartitionWorker"
