"""``mmpipe submit | logs | stop`` against a real local Ray head (``ray start --head`` on
127.0.0.1 with token authentication), through Ray's job API.

As a user who has not activated the virtual environment: the head is started by the
venv's ``ray`` and ``mmpipe`` is run by its path, with no venv on PATH (a bare ``python``
there is not the venv's; issue 16)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.runtime import submit
from tests.conftest import REPO
from tests.deploy.local_head import free_ports, start_head


MMPIPE = str(Path(sys.executable).with_name("mmpipe"))   # .venv/bin/mmpipe


def mmpipe(*args: str, env: dict, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([MMPIPE, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    h = start_head(tmp_path_factory.mktemp("submit-head"), venv_on_path=False)
    yield h
    h.stop()


@pytest.fixture
def env(head):
    """A client's environment: the token in RAY_AUTH_TOKEN, no RAY_AUTH_MODE."""
    e = head.client_env()
    e.pop("RAY_AUTH_MODE")
    assert str(Path(sys.executable).parent) not in e["PATH"].split(os.pathsep)
    return e


def submission_id(stdout: str) -> str:
    match = re.search(r"^submitted (\S+)$", stdout, re.M)
    assert match, stdout
    return match.group(1)


def test_submit_runs_the_quickstart_and_logs_show_its_report(head, env, tmp_path):
    out = tmp_path / "out"
    done = mmpipe("submit", "examples/quickstart.yaml", "--address", head.dashboard_url,
                  "--output", str(out), "--wait", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    sid = submission_id(done.stdout)
    assert sid.startswith("mmpipe-quickstart-")
    assert f"dashboard: {head.dashboard_url}/#/jobs/{sid}" in done.stdout
    assert f"job {sid}: SUCCEEDED" in done.stdout
    logs = mmpipe("logs", sid, "--address", head.dashboard_url, env=env)
    assert logs.returncode == 0, logs.stderr
    assert "job 'quickstart': complete" in logs.stdout
    assert "partitions: 4 total, 4 committed now, 0 skipped" in logs.stdout
    assert "rows: ok=57 rejected=0 error=0" in logs.stdout
    assert json.loads((out / "_SUCCESS").read_text())["complete"] is True

    # a resubmission of the same spec resumes from the markers: nothing is redone
    again = mmpipe("submit", "examples/quickstart.yaml", "--address", head.dashboard_url,
                   "--output", str(out), "--wait", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "partitions: 4 total, 0 committed now, 4 skipped" in again.stdout


def test_stop_a_running_job(head, env, tmp_path, monkeypatch):
    started = mmpipe("submit", "examples/quickstart.yaml", "--address", head.dashboard_url,
                     "--output", str(tmp_path / "out"), "--set", "source.partition_size=1",
                     env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    sid = submission_id(started.stdout)
    monkeypatch.setenv("RAY_AUTH_TOKEN", head.token)
    jobs = submit.client(head.dashboard_url)
    deadline = time.time() + 120
    while "progress: 0/57 records" not in submit.logs(jobs, sid) and time.time() < deadline:
        time.sleep(0.5)                                    # the driver is running partitions
    stopped = mmpipe("stop", sid, "--address", head.dashboard_url, "--wait", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert f"job {sid}: stop requested" in stopped.stdout
    assert f"job {sid}: STOPPED" in stopped.stdout
    # the driver got SIGTERM: one line saying what is committed, no stack dump
    logs = submit.logs(jobs, sid)
    assert re.search(r"^stopped \(SIGTERM\): \d+ of 57 partitions committed \(\d+ records\); "
                     r"run or submit the same spec again to resume$", logs, re.M), logs
    assert "SIGTERM received" not in logs and "Traceback" not in logs, logs


def test_a_wrong_or_missing_token_is_refused(head, env, tmp_path):
    for token in ("not-the-token", None):
        e = dict(env, HOME=str(tmp_path))           # no ~/.ray/auth_token there
        e.pop("RAY_AUTH_TOKEN")
        if token:
            e["RAY_AUTH_TOKEN"] = token
        done = mmpipe("logs", "whatever", "--address", head.dashboard_url, env=e, timeout_s=60)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "refused" in done.stderr and "RAY_AUTH_TOKEN" in done.stderr, done.stderr


def test_a_bad_spec_fails_before_anything_is_submitted(env):
    (port,) = free_ports(1)                          # nothing listens there
    done = mmpipe("submit", "examples/quickstart.yaml", "--address", f"http://127.0.0.1:{port}",
                  "--set", "resize.size_px=-3", env=env, timeout_s=60)
    assert done.returncode == 2
    assert "resize.size_px" in done.stderr and "submitted" not in done.stdout
    # a local head sees this machine's paths: a missing input is refused here too
    done = mmpipe("submit", "examples/quickstart.yaml", "--address", f"http://127.0.0.1:{port}",
                  "--input", "/nonexistent/photos", env=env, timeout_s=60)
    assert done.returncode == 2 and "submitted" not in done.stdout
    assert "error: source.uri '/nonexistent/photos' does not exist" in done.stderr


class FakeJobs:
    """Records what ``submit`` would send to Ray's job API."""

    def __init__(self):
        self.calls = []

    def submit_job(self, **kwargs):
        self.calls.append(kwargs)
        self.packages = {Path(p).name: json.loads((Path(p) / "env.json").read_text())
                         for p in kwargs["runtime_env"].get("py_modules", [])}
        return kwargs["submission_id"]

    def get_address(self):
        return "http://head:8265"


@pytest.mark.parametrize("installed", [False, True])
@pytest.mark.parametrize("address", ["http://head:8265", "http://127.0.0.1:8265"])
def test_submit_packages_the_checkout_or_only_the_spec(monkeypatch, tmp_path, installed,
                                                      address):
    jobs = FakeJobs()
    monkeypatch.setattr(submit, "client", lambda address: jobs)
    monkeypatch.chdir(REPO / "pipeline")              # the checkout is found upwards
    sub = submit.submit(str(REPO / "examples" / "quickstart.yaml"),
                        ["--output", "s3://bucket/out", "--set", "runtime.num_workers=4"],
                        address=address, installed=installed, env={"AWS_REGION": "eu-west-1"},
                        job_name="q", submission_id="mmpipe-q-1")
    (call,) = jobs.calls
    spec_arg = "quickstart.yaml" if installed else "examples/quickstart.yaml"
    args = f"-m pipeline run {spec_arg} --output s3://bucket/out --set runtime.num_workers=4"
    if installed or address == "http://head:8265":      # the head's own python
        assert call["entrypoint"] == f"python {args}"
    else:     # a head on this machine: this interpreter, if the head has it (else python)
        assert call["entrypoint"] == (f'PY={shlex.quote(sys.executable)}; [ -x "$PY" ] || PY=python; '
                                      f'"$PY" {args}')
        # the shell picks that interpreter where it exists, else `python` from PATH
        (tmp_path / "python").write_text("#!/bin/sh\necho python-from-PATH\n")
        (tmp_path / "python").chmod(0o755)
        probe = ["python", "-c", "import sys; print(sys.executable)"]
        for exe, expected in ((sys.executable, sys.executable),
                              ("/nonexistent/python", "python-from-PATH")):
            ran = subprocess.run(["/bin/sh", "-c", submit.entrypoint(probe, exe)], text=True,
                                 capture_output=True, check=True, env={"PATH": str(tmp_path)})
            assert ran.stdout.strip() == expected
    env = call["runtime_env"]
    # the --env value travels in a package of its own, never in the job's env_vars
    (package,) = jobs.packages
    assert env["env_vars"] == {"MMPIPE_JOB_ENV_MODULE": package}
    assert jobs.packages[package] == {"AWS_REGION": "eu-west-1"}
    assert "eu-west-1" not in json.dumps(call) and not Path(env["py_modules"][0]).exists()
    if installed:       # a staging dir with the spec only, removed after the upload
        assert env["excludes"] == [] and not Path(env["working_dir"]).exists()
    else:
        assert env["working_dir"] == str(REPO)
        assert {".venv", "output", "bench/out", ".git", ".env", "**/.env"} <= set(env["excludes"])
    assert sub.dashboard_url == "http://head:8265/#/jobs/mmpipe-q-1"


def test_submit_refuses_reserved_env_and_specs_outside_the_working_dir(tmp_path):
    with pytest.raises(submit.SubmitError, match="HF_HUB_OFFLINE"):
        submit.submit(str(REPO / "examples" / "quickstart.yaml"), [],
                      env={"HF_HUB_OFFLINE": "0"})
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\n")
    with pytest.raises(submit.SubmitError, match="inside the working dir"):
        submit.submit(str(spec), [], working_dir=str(REPO))


def test_address_and_token_resolution(monkeypatch, tmp_path):
    for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert submit.resolve_address(None) == "http://127.0.0.1:8265"
    assert submit.resolve_address("head:8265/") == "http://head:8265"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")           # a GCS address: not the job API
    assert submit.resolve_address(None) == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "https://ray.example:443")
    assert submit.resolve_address(None) == "https://ray.example:443"
    with pytest.raises(submit.SubmitError):
        submit.resolve_address("ray://head:10001")
    assert submit.auth_token() is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-file\n")
    assert submit.auth_token() == "from-file"
    path = tmp_path / "tok"
    path.write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert submit.auth_token() == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert submit.auth_token() == "from-env"


def test_env_files_and_a_local_output_are_not_uploaded(tmp_path):
    """``.env`` files and the job's output location stay out of the working_dir upload
    (checked with Ray's own exclude matcher on a real directory tree)."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    root = tmp_path / "checkout"
    for rel in ("pipeline/__init__.py", "examples/job.yaml", ".env", "deploy/.env.prod",
                "data/out/_SUCCESS", "data/in/a.jpg", "environment.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    excludes = submit.WORKING_DIR_EXCLUDES + submit.output_exclude(root, str(root / "data/out"))
    files: list[Path] = []
    _dir_travel(root, [_get_excludes(root, excludes)],
                lambda p: files.append(p) if p.is_file() else None, include_gitignore=False)
    kept = sorted(p.relative_to(root).as_posix() for p in files)
    assert kept == ["data/in/a.jpg", "environment.md", "examples/job.yaml",
                    "pipeline/__init__.py"]
    assert submit.output_exclude(root, "s3://bucket/out") == []
    assert submit.output_exclude(root, str(tmp_path / "elsewhere")) == []


def test_job_env_package_round_trip(tmp_path, monkeypatch):
    """What a job's process does with the package: ``apply`` sets the values; mmpipe prints
    the keys only."""
    from pipeline.runtime import job_env

    pkg = job_env.write_package({"MMPIPE_T_SECRET": "hunter2"}, tmp_path)
    assert (pkg / "env.json").stat().st_mode & 0o777 == 0o600
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(job_env.ENV_MODULE, pkg.name)
    monkeypatch.delenv("MMPIPE_T_SECRET", raising=False)
    assert job_env.apply() == ["MMPIPE_T_SECRET"]
    assert os.environ["MMPIPE_T_SECRET"] == "hunter2"
    assert job_env.describe({"MMPIPE_T_SECRET": "hunter2"}) == "MMPIPE_T_SECRET (values not shown)"


def test_env_values_reach_the_job_but_not_the_job_api(head, env, tmp_path, monkeypatch):
    """``--env`` values were readable by anyone with the job API (the job's runtime_env):
    now the job API, the logs and mmpipe's own output hold none, and the job's workers still
    get them (the chaos variable makes the worker of p-000000 exit, so it fails)."""
    import uuid

    secret = f"s3cr3t-{uuid.uuid4().hex}"
    done = mmpipe("submit", "examples/quickstart.yaml", "--address", head.dashboard_url,
                  "--output", str(tmp_path / "out"), "--set", "source.partition_size=57",
                  "--set", "text_embedding.enabled=false", "--set", "runtime.max_attempts=1",
                  "--env", "MMPIPE_CHAOS_KILL_WORKER_ON=p-000000",
                  "--env", f"MMPIPE_T_SECRET={secret}", "--wait", env=env)
    sid = submission_id(done.stdout)
    assert done.returncode == 1 and "FAILED p-000000" in done.stdout, done.stdout + done.stderr
    assert "env:       MMPIPE_CHAOS_KILL_WORKER_ON, MMPIPE_T_SECRET (values not shown)" \
        in done.stdout
    monkeypatch.setenv("RAY_AUTH_TOKEN", head.token)
    jobs = submit.client(head.dashboard_url)
    seen = [done.stdout, done.stderr, submit.logs(jobs, sid), repr(jobs.get_job_info(sid)),
            repr(jobs.list_jobs())]
    assert not [text for text in seen if secret in text]
    assert "MMPIPE_JOB_ENV_MODULE" in repr(jobs.get_job_info(sid).runtime_env)
