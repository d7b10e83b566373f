"""Many jobs on one Ray cluster, and settings that travel with the job (issue 15, items 2-3).

One Ray head (``ray start``, 127.0.0.1) whose processes - raylet, every worker - have a
wrong ``AWS_ENDPOINT_URL`` in their environment. Two ``mmpipe run --address <head>`` of the
same spec name run at the same time, into two S3 outputs; the test S3 server's endpoint is
in one run's spec (``storage.endpoint_url``) and only in the other driver's environment:
both complete with every row (each run's actors live in their own namespace
``mmpipe-<job>-<run id>``; the driver resolves the endpoint into the spec it sends, and
every actor configures storage from that spec, never from its node's environment).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.status import output_status
from tests.conftest import REPO
from tests.deploy.local_head import start_head

WRONG_ENDPOINT = "http://127.0.0.1:9"  # discard port: nothing answers S3 there


@pytest.fixture(scope="module")
def s3_head(s3_server, tmp_path_factory):
    """A head whose environment has the S3 credentials but a wrong endpoint."""
    env = dict(s3_server.env(), AWS_ENDPOINT_URL=WRONG_ENDPOINT,
               AWS_ENDPOINT_URL_S3=WRONG_ENDPOINT)
    head = start_head(tmp_path_factory.mktemp("shared-head"), num_cpus=3, extra_env=env)
    yield head
    head.stop()


def _run(head, out: str, endpoint: str, report, log, in_spec: bool) -> subprocess.Popen:
    """``mmpipe run`` joining ``head``; the S3 endpoint in the spec (``in_spec``) or only in
    the driver's environment (the driver resolves it into the spec it sends)."""
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", head.gcs_address, "--output", out,
           "--set", "name=shared",
           "--set", "source.partition_size=20", "--set", "runtime.num_workers=1",
           "--set", "text_embedding.num_cpus=0.5", "--report-json", str(report)]
    env = head.client_env()
    if in_spec:
        cmd += ["--set", f"storage.endpoint_url={endpoint}"]
    else:
        env = dict(env, AWS_ENDPOINT_URL=endpoint, AWS_ENDPOINT_URL_S3=endpoint)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def test_two_runs_of_one_spec_share_a_cluster_with_a_wrong_s3_endpoint_in_its_env(
        s3_server, s3_head, tmp_path, monkeypatch):
    bucket = "shared-" + tmp_path.name[-8:].lower().replace("_", "-")
    s3_server.client().create_bucket(Bucket=bucket)
    outs = [f"s3://{bucket}/a", f"s3://{bucket}/b"]
    reports = [tmp_path / "a.json", tmp_path / "b.json"]
    logs = [open(tmp_path / "a.log", "w+"), open(tmp_path / "b.log", "w+")]
    procs = [_run(s3_head, o, s3_server.endpoint_url, r, f, in_spec)
             for o, r, f, in_spec in zip(outs, reports, logs, (True, False))]
    texts = []
    for p, f in zip(procs, logs):
        p.wait(timeout=300)
        f.seek(0)
        texts.append(f.read())
        f.close()
    for p, text in zip(procs, texts):
        assert p.returncode == 0, text[-4000:]
        assert f"joined the Ray cluster at {s3_head.gcs_address}" in text, text[-2000:]
    done = [json.loads(r.read_text()) for r in reports]
    assert done[0]["run_id"] != done[1]["run_id"]
    for d in done:
        assert d["complete"] and d["rows_out"] == 57 and d["job"] == "shared"
    from pipeline.storage import fs

    for key, value in s3_server.env().items():   # credentials; the endpoint from here
        monkeypatch.setenv(key, value)
    fs.configure(endpoint_url=s3_server.endpoint_url)
    try:
        for out, d in zip(outs, done):
            markers = CheckpointStore(out).markers()
            assert sum(m.rows_in for m in markers.values()) == 57
            assert {m.ran_on["run_id"] for m in markers.values()} == {d["run_id"]}
            state = output_status(out)     # `mmpipe status` tells the runs apart
            assert state["runs"] == {d["run_id"]: len(markers)} and state["writer"] is None
    finally:
        fs.configure()
