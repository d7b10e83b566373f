"""A local Ray head (``ray start --head --block``) on 127.0.0.1 for job-submission and
metrics tests: every port chosen free, token authentication on, HOME isolated, and
stopped at the end by the process ids it started (never ``ray stop``, which would stop
every Ray on the machine)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from pipeline.runtime.local_ray import free_ports

RAY = str(Path(sys.executable).with_name("ray"))


@dataclasses.dataclass
class LocalHead:
    """A running head: its addresses, token, environment and the ``ray start`` process."""

    gcs_address: str
    dashboard_url: str
    metrics_url: str
    token: str
    env: dict[str, str]
    proc: subprocess.Popen
    temp_dir: Path
    session_dir: Path | None = None   # the head's session (its processes' files are there)

    def client_env(self, **extra: str) -> dict[str, str]:
        """Environment for a client process (``mmpipe submit``): same HOME, the token."""
        return dict(self.env, **extra)

    def stop(self, grace_s: float = 15) -> None:
        """Stop the ``ray start`` process and every process it started, by pid."""
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        procs += [p for p in _session_processes(self.session_dir or self.temp_dir)
                  if p not in procs]
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _session_processes(temp_dir: Path) -> list[psutil.Process]:
    """Processes whose command line names this head's temp (or session) dir (raylet, gcs,
    agents)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(temp_dir) in part for part in (p.info["cmdline"] or [])):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


@contextlib.contextmanager
def head_under_ray_tmpdir(base: Path, prefix: str, **kwargs):
    """``start_head`` under a new short ``RAY_TMPDIR`` (``prefix``: its name's start), as a
    user's plain ``ray start`` there; yields ``(head, ray_tmpdir)``, then stops the head
    and removes the folder."""
    ray_tmpdir = Path(tempfile.mkdtemp(prefix=prefix))  # short: Ray's socket paths
    head = start_head(base, ray_tmpdir=ray_tmpdir, **kwargs)
    try:
        yield head, ray_tmpdir
    finally:
        head.stop()
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


def start_head(base: Path, num_cpus: int = 2, timeout_s: float = 90,
               extra_env: dict[str, str] | None = None, venv_on_path: bool = True,
               ray_tmpdir: Path | None = None, agent_port: int | None = None) -> LocalHead:
    """Start a head on 127.0.0.1 with token auth; return once job submission works.

    ``ray_tmpdir``: start it as a plain ``ray start`` under ``RAY_TMPDIR=ray_tmpdir`` does
    (temp dir ``ray_tmpdir/ray``), so its ``ray_current_cluster`` file is the one a
    ``ray.init`` under the same ``RAY_TMPDIR`` reads; keep the path short (Ray's socket
    paths must stay under 107 bytes). Default: a temp dir of its own. ``agent_port``: the
    dashboard agent's HTTP port (default a free one).

    ``venv_on_path``: put this virtual environment's ``bin`` first on the head's PATH (as
    an activated venv does); False removes it from PATH, as for a user who runs
    ``.venv/bin/ray start`` without activating the venv: a bare ``python`` in a job's
    entrypoint is then not this venv's."""
    home = base / "home"
    # Ray's unix socket paths must stay under 107 bytes: a short temp dir, not pytest's
    temp_dir = (ray_tmpdir / "ray") if ray_tmpdir else \
        Path(tempfile.mkdtemp(prefix="mmpipe-ray-"))
    home.mkdir(parents=True, exist_ok=True)
    (gcs, dash, metrics, agent_http, agent_grpc, rt_env, client, node_mgr,
     obj_mgr) = free_ports(9)
    agent_http = agent_port or agent_http
    token = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    if not venv_on_path:
        env.pop("VIRTUAL_ENV", None)
    env.update(PATH=os.pathsep.join(([venv_bin] if venv_on_path else []) + path),
               HOME=str(home), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",   # bind and advertise 127.0.0.1 only
               RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1", **(extra_env or {}))
    if ray_tmpdir:
        env["RAY_TMPDIR"] = str(ray_tmpdir)
    cmd = [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
           f"--metrics-export-port={metrics}", f"--dashboard-agent-listen-port={agent_http}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={rt_env}",
           f"--ray-client-server-port={client}", f"--node-manager-port={node_mgr}",
           f"--object-manager-port={obj_mgr}", f"--num-cpus={num_cpus}", "--num-gpus=0",
           "--include-dashboard=true", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    log = open(base / "ray-start.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    head = LocalHead(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}",
                     f"http://127.0.0.1:{metrics}/metrics", token, env, proc, temp_dir)
    try:
        _wait_ready(head, timeout_s, base / "ray-start.log")
    except BaseException:
        head.stop()
        raise
    head.session_dir = (temp_dir / "session_latest").resolve()   # before another Ray moves it
    return head


def _wait_ready(head: LocalHead, timeout_s: float, log_path: Path) -> None:
    """Wait until the job API answers (the head node's job agent is registered)."""
    deadline = time.time() + timeout_s
    req = urllib.request.Request(f"{head.dashboard_url}/api/jobs/",
                                 headers={"Authorization": f"Bearer {head.token}"})
    while time.time() < deadline:
        if head.proc.poll() is not None:
            raise RuntimeError(f"ray start exited: {log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"Ray head not ready in {timeout_s}s: {log_path.read_text()[-3000:]}")
