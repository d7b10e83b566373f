"""Storage outages: every request 503 SlowDown for a while (a proxy on 127.0.0.1 in front
of the local SeaweedFS). A 10 s outage in the middle of a job is ridden out and the job
completes, though its requests may fail only twice each and its partitions once each
(``storage.max_attempts=2``, ``runtime.max_attempts=1``): what rides it out is
``storage.outage_s``; one longer than ``storage.outage_s`` stops the run with the
runtime-failure exit code (3, not the bad-spec 2), naming the storage request that gave up.

The jobs run without the text embedding (``NO_MODEL``): the claims are about storage."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from pipeline import cli
from tests.conftest import REPO
from tests.e2e.jobs import NO_MODEL, PARTITIONS, clean_ray_env, markers, mmpipe_run, shared_photos
from tests.servers import FaultProxy


def test_a_request_rides_out_an_outage_shorter_than_outage_s(s3_server, s3_env, monkeypatch):
    """One request through the proxy: a 2 s outage is ridden out with outage_s=30 and only
    2 attempts (which alone give up within 0.3 s); with outage_s=1 (and 2 attempts) the
    request gives up after about 1 s, ``gave_up`` set and the URI named. The default
    policy of before (8 attempts, no horizon) gave up after about 6 s of 503s."""
    from pipeline.storage import fs, retry

    s3_server.client().put_object(Bucket=s3_env, Key="k/one.json", Body=b'{"a": 1}')
    proxy = FaultProxy(s3_server.port, fault_rate=0.0)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint_url)
        uri = f"s3://{s3_env}/k/one.json"
        fs.configure(max_attempts=2, outage_s=30)
        proxy.outage(2)
        t0 = time.monotonic()
        assert fs.read_bytes(uri) == b'{"a": 1}'
        assert time.monotonic() - t0 >= 1.8 and len(proxy.outage_answers) >= 3
        assert retry.POLICY.throttled_requests >= 3
        fs.configure(max_attempts=2, outage_s=1)
        proxy.outage(60)
        t0 = time.monotonic()
        try:
            fs.read_bytes(uri)
            raise AssertionError("read through a 60 s outage")
        except retry.StorageError as e:
            assert e.gave_up and uri in str(e) and "(storage.outage_s=1)" in str(e), e
        assert 0.9 <= time.monotonic() - t0 < 10
    finally:
        proxy.stop()
        fs.configure()


def _wait_for_markers(out: str, n: int, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    """Wait until ``out`` has ``n`` commit markers (read around the proxy)."""
    deadline = time.monotonic() + timeout_s
    while len(markers(out)) < n:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no marker in time"
        time.sleep(0.1)


def test_a_10_s_slowdown_outage_mid_job_is_ridden_out(s3_server, s3_env, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = f"s3://{s3_env}/outage"
    report_path = tmp_path / "report.json"
    proxy = FaultProxy(s3_server.port, fault_rate=0.0)
    try:
        # 2 attempts per request (alone they give up within 0.3 s) and 1 per partition: only
        # outage_s (30 s) rides the 10 s out, for requests and for lost partition attempts
        proc = mmpipe_run(out, home, s3_server.env(proxy.endpoint_url), shared_photos(s3_server),
                          report_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, sets=(*NO_MODEL, "storage.max_attempts=2",
                                           "storage.outage_s=30", "runtime.max_attempts=1"))
        _wait_for_markers(out, 2, proc)       # the job is running: its workers write
        proxy.outage(10)
        text, _ = proc.communicate(timeout=600)
    finally:
        proxy.stop()
    answers = proxy.outage_answers
    assert len(answers) > 10 and answers[-1] - answers[0] > 8, (len(answers), text[-3000:])
    assert proc.returncode == 0, text[-5000:]
    report = json.loads(report_path.read_text())
    assert report["complete"] and len(report["partitions_committed"]) == PARTITIONS
    assert not report["partitions_failed"]
    assert len(markers(out)) == PARTITIONS


def test_an_outage_past_outage_s_exits_3_naming_the_storage(s3_server, s3_env, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = f"s3://{s3_env}/gives-up"
    proxy = FaultProxy(s3_server.port, fault_rate=0.0)
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml", "--address",
           "local", "--executor", "ray", "--input", shared_photos(s3_server),
           "--output", out,
           "--set", "source.partition_size=3", "--set", "runtime.num_workers=1",
           "--set", "runtime.batch_size=3", "--set", "runtime.max_attempts=1",
           "--set", "storage.outage_s=2", "--set", "storage.max_attempts=2",
           "--set", NO_MODEL[0]]
    env = clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1", **s3_server.env(proxy.endpoint_url))
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _wait_for_markers(out, 1, proc)
        proxy.outage(600)                 # for the rest of the run
        t0 = time.monotonic()
        text, _ = proc.communicate(timeout=300)
    finally:
        proxy.stop()
    assert proc.returncode == cli.EXIT_RUNTIME == 3, text[-5000:]
    assert time.monotonic() - t0 < 240    # seconds: gives up, does not hang
    last = [line for line in text.splitlines() if line.startswith("error: ")][-1]
    assert last.startswith("error: the run stopped: storage unavailable past "
                           "storage.outage_s: "), last
    assert f"s3://{s3_env}/gives-up" in last and "gave up after" in last, last
    assert "(storage.outage_s=2)" in last and "Traceback" not in text
