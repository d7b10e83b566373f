"""A local Ray head (``ray start --head --block``) on 127.0.0.1 for job-submission and
metrics tests: every port chosen free, token authentication on, HOME isolated, and
stopped at the end by the process ids it started (never ``ray stop``, which would stop
every Ray on the machine)."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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

    def client_env(self, **extra: str) -> dict[str, str]:
        """Environment for a client process (``mmpipe submit``): same HOME, the token."""
        return dict(self.env, **extra)

    def stop(self, grace_s: float = 15) -> None:
        """Stop the ``ray start`` process and every process it started, by pid."""
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        procs += [p for p in _session_processes(self.temp_dir) if p not in procs]
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
    """Processes whose command line names this head's temp dir (raylet, gcs, agents)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(temp_dir) in part for part in (p.info["cmdline"] or [])):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def start_head(base: Path, num_cpus: int = 2, timeout_s: float = 90,
               extra_env: dict[str, str] | None = None, venv_on_path: bool = True) -> LocalHead:
    """Start a head on 127.0.0.1 with token auth; return once job submission works.

    ``venv_on_path``: put this virtual environment's ``bin`` first on the head's PATH (as
    an activated venv does); False removes it from PATH, as for a user who runs
    ``.venv/bin/ray start`` without activating the venv: a bare ``python`` in a job's
    entrypoint is then not this venv's."""
    home = base / "home"
    # Ray's unix socket paths must stay under 107 bytes: a short temp dir, not pytest's
    temp_dir = Path(tempfile.mkdtemp(prefix="mmpipe-ray-"))
    home.mkdir(parents=True, exist_ok=True)
    (gcs, dash, metrics, agent_http, agent_grpc, rt_env, client, node_mgr,
     obj_mgr) = free_ports(9)
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
