"""A whole job on S3 with 10% of requests failing (503 SlowDown, resets, lost responses,
delays) completes with output identical to a clean run's.

No text embedding (``NO_MODEL``): the claim is about storage requests, not the model; the
clean run compared with is ``clean_reference`` (one per process, shared with
tests/e2e/test_resume.py), from the same input (``shared_photos``)."""

from __future__ import annotations

import json
import subprocess


from tests.e2e.jobs import (NO_MODEL, PARTITIONS, assert_same_output, clean_reference, finish,
                            markers, mmpipe_run, shared_photos)
from tests.servers import FaultProxy


def test_job_survives_ten_percent_faulty_requests(s3_server, s3_env, tmp_path,
                                                  tmp_path_factory):
    input_uri = shared_photos(s3_server)
    home = tmp_path / "home"
    home.mkdir()
    # delayed responses by 0.1 s (the proxy's default 0.3 s: ~15 s more of waits in one
    # worker, the same fault: a late answer well inside every timeout)
    # and every read of one photo throttled once: whichever attempt commits its partition
    # saw a SlowDown (random ones may all land on the driver's or a failed attempt's requests)
    proxy = FaultProxy(s3_server.port, fault_rate=0.10, seed=11, delay_s=0.1,
                       throttle_every_other=("HEAD", "/photos/000000000790.jpg"))
    try:
        faulty = f"s3://{s3_env}/faulty"
        report_path = tmp_path / "report.json"
        finish(mmpipe_run(faulty, home, s3_server.env(proxy.endpoint_url), input_uri, report_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          sets=NO_MODEL))
    finally:
        proxy.stop()
    injected = {k: v for k, v in proxy.counts.items() if k != "requests"}
    assert proxy.counts["requests"] > 300 and all(v > 0 for v in injected.values()), proxy.counts
    report = json.loads(report_path.read_text())
    assert report["complete"] and len(report["partitions_committed"]) == PARTITIONS
    assert report["throttled_requests"] > 0 and report["retried_requests"] > 0
    assert len(markers(faulty)) == PARTITIONS
    assert_same_output(faulty, clean_reference(tmp_path_factory, s3_server), embeddings=False)
    print(f"faults injected: {proxy.counts}; partitions replayed: "
          f"{sum(len(a) - 1 for a in report['attempts'].values())}")
