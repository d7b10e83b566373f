"""A whole job on S3 with 10% of requests failing (503 SlowDown, resets, lost responses,
delays) completes with output identical to a clean run's.

The job is ``mmpipe run`` of the quickstart in this process with its partition workers as
worker processes (``--executor processes``: what ``auto``, the default, runs for a local job
with no model on GPUs; ``tests/s3/inproc_jobs.py``), two of them: nearly all of the run's
time is the AWS SDK's backoff after injected faults (sleeps, not CPU), which two workers
wait out side by side. Every request of the driver and of both workers goes through the
proxy (in a process of its own: ``tests/s3/proxy_process.py``).

No text embedding (``NO_MODEL``): the claim is about storage requests, not the model. The
clean run compared with is ``clean_reference`` on the local filesystem (one per process, run
in this process on ``ray_local``, shared with tests/e2e/test_resume.py): the same photos,
read here from S3 (``shared_photos``), so every compared column is the same and
``source_uri`` differs only by where the input lies (``input_bases``)."""

from __future__ import annotations

import json

from tests.inproc import mmpipe
from tests.e2e.jobs import (NO_MODEL, PARTITIONS, assert_same_output, clean_reference, markers,
                            shared_photos)
from tests.s3.inproc_jobs import point_at, quickstart_argv
from tests.s3.proxy_process import ProxyProcess


def test_job_survives_ten_percent_faulty_requests(ray_local, s3_server, s3_env, tmp_path,
                                                  tmp_path_factory, monkeypatch, capsys):
    input_uri = shared_photos(s3_server)
    # delayed responses by 0.1 s (the proxy's default 0.3 s: ~15 s more of waits in one
    # worker, the same fault: a late answer well inside every timeout)
    # and every read of one photo throttled once: whichever attempt commits its partition
    # saw a SlowDown (random ones may all land on the driver's or a failed attempt's requests)
    proxy = ProxyProcess(s3_server.port, fault_rate=0.10, seed=11, delay_s=0.1,
                         throttle_every_other=("HEAD", "/photos/000000000790.jpg"))
    faulty = f"s3://{s3_env}/faulty"
    report_path = tmp_path / "report.json"
    try:
        point_at(monkeypatch, proxy.endpoint_url)
        run = mmpipe(capsys, *quickstart_argv(faulty, input_uri, report_path,
                                              sets=(*NO_MODEL, "runtime.num_workers=2"),
                                              executor="processes"))
    finally:
        proxy.stop()
        point_at(monkeypatch, s3_server.endpoint_url)   # read the output around the proxy
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    injected = {k: v for k, v in proxy.counts.items() if k != "requests"}
    assert set(injected) == {"slowdown", "reset", "drop", "delay"}, proxy.counts
    assert proxy.counts["requests"] > 300 and all(v > 0 for v in injected.values()), proxy.counts
    report = json.loads(report_path.read_text())
    assert report["complete"] and len(report["partitions_committed"]) == PARTITIONS
    assert report["throttled_requests"] > 0 and report["retried_requests"] > 0
    assert len(markers(faulty)) == PARTITIONS
    base = input_uri.rsplit("/", 1)[0] + "/"
    assert_same_output(faulty, clean_reference(tmp_path_factory), embeddings=False,
                       input_bases=(base, "data/photos/"))
    print(f"faults injected: {proxy.counts}; partitions replayed: "
          f"{sum(len(a) - 1 for a in report['attempts'].values())}")
