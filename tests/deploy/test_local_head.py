"""``mmpipe head start|address|stop`` and the README's local submit recipe (issue 30,
point 3), next to another Ray whose dashboard agent lost its port: a plain ``ray start``
head with ``--dashboard-agent-listen-port`` held by a socket listener of this test.

- ``mmpipe submit`` to that head fails in one line naming the port (read from the agent's
  log under the head's session), not with Ray's ``No available agent to submit job``;
- ``mmpipe head start`` refuses a port it is given that someone holds, before starting;
- the README's recipe (head start, submit, head stop) runs as written, with a temp dir of
  its own, and its stop leaves the other Ray running."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from pipeline.runtime import head as local_head
from tests.conftest import REPO
from tests.deploy.local_head import head_under_ray_tmpdir
from tests.e2e.jobs import clean_ray_env
from tests.test_readme import readme_commands

MMPIPE = str(Path(sys.executable).with_name("mmpipe"))


@pytest.fixture(scope="module")
def held_port():
    """A port someone else listens on (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def other_ray(tmp_path_factory, held_port):
    """Another Ray: a ``ray start`` head under its own RAY_TMPDIR (so it is the newest
    session of Ray's default temp dir for a client with that RAY_TMPDIR) whose agent port
    is held; yields (head, ray_tmpdir)."""
    with head_under_ray_tmpdir(tmp_path_factory.mktemp("other-head"), "mmpipe-other-",
                               num_cpus=1, agent_port=held_port) as other:
        yield other


def client_env(other_ray, home: Path) -> dict[str, str]:
    head, ray_tmpdir = other_ray
    home.mkdir(exist_ok=True)
    return clean_ray_env(HOME=str(home), RAY_TMPDIR=str(ray_tmpdir), RAY_AUTH_TOKEN=head.token,
                         HF_HUB_OFFLINE="1")


def mmpipe(*args: str, env: dict, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([MMPIPE, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def test_submit_names_the_port_the_heads_agent_could_not_bind(other_ray, held_port, tmp_path):
    head, _ = other_ray
    run = mmpipe("submit", "examples/quickstart.yaml", "--address", head.dashboard_url,
                 "--output", str(tmp_path / "out"), env=client_env(other_ray, tmp_path / "home"))
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith(f"error: submit failed: the Ray head's dashboard agent could "
                                f"not listen on port {held_port} (")
    assert "address already in use" in errors[0] and "mmpipe head start" in errors[0]
    assert "Traceback" not in run.stderr


def test_head_start_refuses_a_port_that_is_taken(held_port, tmp_path):
    temp_dir = Path(tempfile.mkdtemp(prefix="mmpipe-h-"))
    try:
        run = mmpipe("head", "start", "--temp-dir", str(temp_dir), "--agent-port",
                     str(held_port), env=clean_ray_env(HOME=str(tmp_path)))
        assert run.returncode == 2, run.stdout + run.stderr
        assert run.stderr.strip() == (f"error: port {held_port} (--dashboard-agent-listen-port)"
                                      f" is taken on 127.0.0.1: leave it out and a free one is "
                                      f"chosen")
        assert not local_head.running(temp_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_the_readme_recipe_runs_and_stops_only_its_head(other_ray, tmp_path):
    """The README's three commands, with ``--temp-dir`` of this test added to the head's."""
    head, _ = other_ray
    recipe = [c.text for c in readme_commands() if c.language == "bash" and re.match(
        r"\.venv/bin/mmpipe (head (start|stop)|submit examples/quickstart\.yaml)", c.text)]
    assert len(recipe) == 3, recipe
    temp_dir = Path(tempfile.mkdtemp(prefix="mmpipe-h-"))
    env = client_env(other_ray, tmp_path / "home")
    env.pop("RAY_AUTH_TOKEN")          # the head's own token, from ~/.ray/auth_token
    out = tmp_path / "quickstart"
    try:
        for command in recipe:
            command = re.sub(r"mmpipe head (\w+)", rf"mmpipe head \1 --temp-dir {temp_dir}",
                             command).replace("/tmp/quickstart", str(out))
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=REPO,
                                  env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, command + "\n" + done.stdout + done.stderr[-3000:]
            if "submit" in command:
                assert "SUCCEEDED" in done.stdout and "rows: ok=57" in done.stdout
            if "head stop" in command:
                assert re.match(r"stopped \d+ processes of the head of ", done.stdout)
        assert json.loads((out / "_SUCCESS").read_text())["complete"] is True
        assert local_head.running(temp_dir) is None
        # the other Ray still answers
        req = urllib.request.Request(f"{head.dashboard_url}/api/jobs/",
                                     headers={"Authorization": f"Bearer {head.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
    finally:
        local_head.stop(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
