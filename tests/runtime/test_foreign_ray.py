"""The suite's Ray-using paths next to a FOREIGN Ray (issue 30, point 3): a head started
with ``ray start`` under its own ``RAY_TMPDIR`` registers itself in
``$RAY_TMPDIR/ray/ray_current_cluster`` (``ray._common.utils.get_ray_address_file``), the
file a ``ray.init()`` without an address joins. With that file present, the conftest's
``ray.init``, a ``mmpipe run --executor ray`` job and the README's Ray Data snippet each
start a Ray of their own: the foreign cluster's job list stays empty (every driver that
connects to a cluster is listed there) and their GCS addresses differ from its one. The
foreign head is stopped at the end by the processes it started (never ``ray stop``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.deploy.local_head import head_under_ray_tmpdir
from tests.e2e.jobs import clean_ray_env
from tests.test_readme import readme_commands


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """A foreign head whose ``ray_current_cluster`` is where a ``ray.init`` under
    ``RAY_TMPDIR=<its dir>`` looks; yields (head, ray_tmpdir)."""
    with head_under_ray_tmpdir(tmp_path_factory.mktemp("foreign-head"), "mmpipe-foreign-",
                               num_cpus=1) as (head, ray_tmpdir):
        # `ray start` writes the file once its node is up, which can be after the job API
        registered = ray_tmpdir / "ray" / "ray_current_cluster"
        deadline = time.time() + 60
        while not registered.exists() and time.time() < deadline:
            time.sleep(0.2)
        yield head, ray_tmpdir


def user_env(foreign, home: Path) -> dict[str, str]:
    """A shell on the foreign head's machine: its RAY_TMPDIR, no RAY_ADDRESS, own HOME."""
    _, ray_tmpdir = foreign
    home.mkdir(exist_ok=True)
    return clean_ray_env(HOME=str(home), RAY_TMPDIR=str(ray_tmpdir), HF_HUB_OFFLINE="1")


def foreign_jobs(head) -> list[dict]:
    """The foreign cluster's jobs (drivers and submissions) from its job API."""
    req = urllib.request.Request(f"{head.dashboard_url}/api/jobs/",
                                 headers={"Authorization": f"Bearer {head.token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def python(code: str, env: dict, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


GCS_OF_INIT = "import ray; print('gcs', ray.get_runtime_context().gcs_address); ray.shutdown()"


def test_the_foreign_cluster_is_registered_where_ray_looks(foreign, tmp_path):
    """The precondition, shown: the file names the foreign GCS, and a bare
    ``ray.init(num_cpus=2)`` (the old conftest) tries to join it and is refused."""
    head, ray_tmpdir = foreign
    assert (ray_tmpdir / "ray" / "ray_current_cluster").read_text().strip() == head.gcs_address
    done = python("import ray; ray.init(num_cpus=2)", user_env(foreign, tmp_path / "home"))
    assert done.returncode != 0
    assert "When connecting to an existing cluster, num_cpus and num_gpus must not be " \
           "provided" in done.stderr, done.stderr[-2000:]
    assert foreign_jobs(head) == []


def test_the_conftest_ray_is_its_own(foreign, tmp_path):
    head, _ = foreign
    done = python(f"from tests.conftest import start_local_ray; start_local_ray(); {GCS_OF_INIT}",
                  user_env(foreign, tmp_path / "home"))
    assert done.returncode == 0, done.stderr[-3000:]
    gcs = re.search(r"^gcs (\S+)$", done.stdout, re.M).group(1)
    assert gcs.startswith("127.0.0.1:") and gcs != head.gcs_address
    assert foreign_jobs(head) == []


def test_a_ray_job_and_the_readme_ray_data_snippet_use_their_own_ray(foreign, tmp_path):
    head, _ = foreign
    env = user_env(foreign, tmp_path / "home")
    out = tmp_path / "output" / "quickstart"     # where the README snippet reads
    run = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "examples/images.yaml", "--output", str(out),
         "--executor", "ray", "--set", "text_embedding.enabled=false",
         "--set", "dedup.dataset.enabled=false"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "rows: ok=57 rejected=0 error=0" in run.stdout
    started = re.search(r"started a local Ray \(.*GCS (\S+)\)", run.stderr)
    assert started and started.group(1) != head.gcs_address, run.stderr[-3000:]
    assert foreign_jobs(head) == []

    (snippet,) = [c.text for c in readme_commands()
                  if c.language == "python" and c.text.startswith("import ray  # Ray Data")]
    assert 'ray.init(address="local")' in snippet
    done = python(snippet.replace("ray.shutdown()", GCS_OF_INIT), env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "57"
    gcs = re.search(r"^gcs (\S+)$", done.stdout, re.M).group(1)
    assert gcs != head.gcs_address
    assert foreign_jobs(head) == []
