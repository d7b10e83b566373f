"""Storage outages: every request 503 SlowDown for a while (a proxy on 127.0.0.1 in front
of the local SeaweedFS). A 10 s outage in the middle of a job is ridden out and the job
completes, though its requests may fail only twice each and its partitions once each
(``storage.max_attempts=2``, ``runtime.max_attempts=1``): what rides it out is
``storage.outage_s``; one longer than ``storage.outage_s`` stops the run with the
runtime-failure exit code (3, not the bad-spec 2), naming the storage request that gave up.

The jobs run without the text embedding (``NO_MODEL``): the claims are about storage. They
are ``mmpipe run --executor ray`` in this process on the session's Ray (``ray_local``;
``tests/s3/inproc_jobs.py``): the driver's and the partition actors' requests go through
the proxy, as in a subprocess of their own, without its Ray's start-up and shutdown
(~6 s each); ``cli.main``'s return code is the process's exit code
(``pipeline/__main__.py``). Their proxy runs in a process of its own
(``tests/s3/proxy_process.py``: the driver's delta-rs calls hold this process's GIL)."""

from __future__ import annotations

import json
import logging
import time

from pipeline import cli
from tests.inproc import mmpipe
from tests.e2e.jobs import NO_MODEL, PARTITIONS, markers, shared_photos
from tests.s3.inproc_jobs import WhenCommitted, own_output, point_at, quickstart_argv
from tests.s3.proxy_process import ProxyProcess
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


def _run_through(proxy, s3_server, monkeypatch, capsys, argv, outage_after: int,
                 outage_s: float):
    """``mmpipe ARGV`` (this process, ``ray_local``) with every request of the job through
    ``proxy``, which answers only 503 SlowDown for ``outage_s`` seconds from when the job
    has committed ``outage_after`` partitions (listed on the server, around the proxy).
    Returns the command's ``CompletedProcess`` and when the outage began."""
    out = argv[argv.index("--output") + 1]
    watch = None
    try:
        point_at(monkeypatch, proxy.endpoint_url)
        watch = WhenCommitted(s3_server.client(), out, outage_after,
                              lambda: proxy.outage(outage_s))
        run = mmpipe(capsys, *argv, env=s3_server.env(proxy.endpoint_url))
    finally:
        if watch is not None:
            watch.stop()
        proxy.stop()
        point_at(monkeypatch, s3_server.endpoint_url)   # read the output around the proxy
    assert watch.fired_at is not None, (watch.seen, run.returncode, run.stderr[-3000:])
    return run, watch.fired_at


def test_a_10_s_slowdown_outage_mid_job_is_ridden_out(ray_local, s3_server, s3_env, tmp_path,
                                                      monkeypatch, capsys):
    out = f"s3://{s3_env}/outage"
    report_path = tmp_path / "report.json"
    proxy = ProxyProcess(s3_server.port, fault_rate=0.0)
    # 2 attempts per request (alone they give up within 0.3 s) and 1 per partition: only
    # outage_s (30 s) rides the 10 s out, for requests and for lost partition attempts
    argv = quickstart_argv(out, shared_photos(s3_server), report_path,
                           sets=(*NO_MODEL, "storage.max_attempts=2", "storage.outage_s=30",
                                 "runtime.max_attempts=1"))
    run, _ = _run_through(proxy, s3_server, monkeypatch, capsys, argv, 2, 10)
    text = run.stdout + run.stderr
    answers = proxy.outage_answers
    assert len(answers) > 10 and answers[-1] - answers[0] > 8, (len(answers), text[-3000:])
    assert run.returncode == 0, text[-5000:]
    report = json.loads(report_path.read_text())
    assert report["complete"] and len(report["partitions_committed"]) == PARTITIONS
    assert not report["partitions_failed"]
    assert len(markers(out)) == PARTITIONS


def test_an_outage_past_outage_s_exits_3_naming_the_storage(ray_local, s3_server, s3_env,
                                                            monkeypatch, capsys, caplog):
    caplog.set_level(logging.INFO)        # what `mmpipe run` logs to its stderr (cli.main)
    out = f"s3://{s3_env}/gives-up"
    proxy = ProxyProcess(s3_server.port, fault_rate=0.0)
    argv = quickstart_argv(out, shared_photos(s3_server),
                           sets=("runtime.max_attempts=1", "storage.outage_s=2",
                                 "storage.max_attempts=2", *NO_MODEL))
    run, began = _run_through(proxy, s3_server, monkeypatch, capsys, argv, 1,
                              600)                # for the rest of the run
    text = run.stdout + run.stderr
    assert run.returncode == cli.EXIT_RUNTIME == 3, text[-5000:]
    assert time.monotonic() - began < 240    # seconds: gives up, does not hang
    last = [line for line in run.stderr.splitlines() if line.startswith("error: ")][-1]
    assert last.startswith("error: the run stopped: storage unavailable past "
                           "storage.outage_s: "), last
    assert f"s3://{s3_env}/gives-up" in last and "gave up after" in last, last
    assert "(storage.outage_s=2)" in last
    # no traceback in what it printed (the actors' own log lines aside: see own_output), nor
    # in what it logged (a subprocess's stderr; here pytest captures the records: caplog)
    assert "Traceback" not in own_output(text) and "Traceback" not in caplog.text
