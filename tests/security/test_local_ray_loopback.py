"""Attack: the local Ray that ``mmpipe run`` starts must not be reachable from another
machine, and its token must not be readable by other users.

Before the fix, Ray on Linux bound its daemons to the machine's routable address (and
0.0.0.0 / ``::``), advertised it, and wrote ``~/.ray/auth_token`` 0644: a process that could
only read that file joined the job's Ray and read the worker's S3 secret, and the metrics
port answered anyone on the network. Here ``mmpipe run`` runs as a user runs it (a
subprocess, its own HOME, *without* the ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` that
``tests/conftest.py`` sets for in-process Rays), and while its job runs every listening
socket of every process of its Ray session is listed (``psutil.net_connections``)."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline.runtime import local_ray
from tests.conftest import REPO
from tests.e2e.jobs import clean_ray_env


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if getattr(addr, "ipv4_mapped", None) is not None:     # ::ffff:127.0.0.1
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _run(tmp_path: Path, home: Path) -> subprocess.Popen:
    env = clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1")
    env.pop(local_ray.CLUSTER_ENV, None)                # as in a user's shell
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", "local", "--executor", "ray", "--output", str(tmp_path / "out"),
           "--set", "source.partition_size=3", "--set", "runtime.num_workers=1",
           "--set", "runtime.batch_size=3"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _session(home: Path, proc: subprocess.Popen, timeout_s: float = 180) -> tuple[str, list]:
    """The session directory of the run's local Ray and its processes, once a
    PartitionWorker is up (the job is running)."""
    state = home / ".cache/mmpipe/local-ray"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-5000:]
        records = list(state.glob("*.json")) if state.is_dir() else []
        if records:
            session_dir = json.loads(records[0].read_text())["session_dir"]
            procs = local_ray.session_processes(session_dir)
            names = " ".join(p.name() for p in procs if p.is_running())
            if "PartitionWorker" in names:
                return session_dir, procs
        time.sleep(0.5)
    pytest.fail("the run's local Ray did not start a PartitionWorker in time")


def _with_descendants(procs: list, driver_pid: int) -> list:
    """``procs`` and the driver with every process under it (the GCS and the raylet are
    its children, the agents and workers the raylet's)."""
    found = {p.pid: p for p in procs}
    try:
        driver = psutil.Process(driver_pid)
        for p in [driver, *driver.children(recursive=True)]:
            found.setdefault(p.pid, p)
    except psutil.NoSuchProcess:
        pass
    return list(found.values())


def _listening(procs: list) -> list[tuple[str, str, int]]:
    pids = {p.pid: p for p in procs}
    found = []
    for c in psutil.net_connections(kind="inet"):
        if c.pid in pids and c.status == psutil.CONN_LISTEN:
            try:
                name = pids[c.pid].name()
            except psutil.NoSuchProcess:
                continue
            found.append((name, c.laddr.ip, c.laddr.port))
    return found


def test_mmpipe_runs_local_ray_on_loopback_only_with_a_private_token(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    proc = _run(tmp_path, home)
    try:
        session_dir, procs = _session(home, proc)
        deadline = time.monotonic() + 60      # the agents open their ports after the raylet
        while True:
            procs = _with_descendants(procs, proc.pid)
            sockets = _listening(procs)
            names = {n for n, _, _ in sockets}
            if ({"gcs_server", "raylet"} <= names and any("DashboardAgent" in n for n in names)
                    and any("RuntimeEnvAgent" in n for n in names)) \
                    or time.monotonic() > deadline:
                break
            time.sleep(1)
            procs = local_ray.session_processes(session_dir)
        metrics = [int(p.read_text()) for p in Path(session_dir).glob("metrics_export_port_*")]
        token = home / ".ray" / "auth_token"
        token_mode = stat.S_IMODE(token.stat().st_mode)
    finally:
        proc.kill()
        proc.wait()
        local_ray.cleanup_stale(home / ".cache/mmpipe/local-ray")
    # the GCS, the raylet (and its object manager), the agents, the workers and the driver
    assert {"gcs_server", "raylet"} <= names and len(sockets) >= 6, sockets
    assert any("DashboardAgent" in n for n in names) and any(
        "RuntimeEnvAgent" in n for n in names), names
    exposed = [s for s in sockets if not _loopback(s[1])]
    assert exposed == [], exposed
    assert metrics and all(any(port == m and _loopback(ip) for _, ip, port in sockets)
                           for m in metrics), (metrics, sockets)
    assert token_mode == 0o600, oct(token_mode)


def test_an_existing_world_readable_token_is_made_owner_only(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    token = home / ".ray" / "auth_token"
    token.write_text("a" * 32)
    os.chmod(token, 0o644)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert local_ray.secure_token() == token
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text() == "a" * 32
    token.unlink()
    assert local_ray.secure_token() == token            # a new one, owner-only from birth
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) >= 32
