"""A whole job on S3 with 10% of requests failing (503 SlowDown, resets, lost responses,
delays) completes with output identical to a clean run's."""

from __future__ import annotations

import json
import subprocess


from tests.conftest import PHOTOS, upload_dir
from tests.e2e.jobs import PARTITIONS, assert_same_output, finish, markers, mmpipe_run
from tests.servers import FaultProxy


def test_job_survives_ten_percent_faulty_requests(s3_server, s3_env, tmp_path):
    upload_dir(s3_server.client(), s3_env, "photos", PHOTOS)
    input_uri = f"s3://{s3_env}/photos/captions.jsonl"
    home = tmp_path / "home"
    home.mkdir()
    clean = f"s3://{s3_env}/clean"
    finish(mmpipe_run(clean, home, s3_server.env(), input_uri, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True))
    proxy = FaultProxy(s3_server.port, fault_rate=0.10, seed=11)
    try:
        faulty = f"s3://{s3_env}/faulty"
        report_path = tmp_path / "report.json"
        finish(mmpipe_run(faulty, home, s3_server.env(proxy.endpoint_url), input_uri, report_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    finally:
        proxy.stop()
    injected = {k: v for k, v in proxy.counts.items() if k != "requests"}
    assert proxy.counts["requests"] > 300 and all(v > 0 for v in injected.values()), proxy.counts
    report = json.loads(report_path.read_text())
    assert report["complete"] and len(report["partitions_committed"]) == PARTITIONS
    assert report["throttled_requests"] > 0 and report["retried_requests"] > 0
    assert len(markers(faulty)) == PARTITIONS
    assert_same_output(faulty, clean)
    print(f"faults injected: {proxy.counts}; partitions replayed: "
          f"{sum(len(a) - 1 for a in report['attempts'].values())}")
