"""A Ray head on this machine for ``mmpipe submit`` (``mmpipe head start|stop``).

``start`` runs ``ray start --head`` on 127.0.0.1 with every port chosen free here (GCS,
dashboard, the dashboard agent's HTTP and gRPC ports, runtime env agent, metrics export,
client server, node manager, object manager) and its own temp dir (``DEFAULT_DIR``, or
``--temp-dir``), so it never collides with a Ray someone else started on Ray's default
ports (a dashboard agent that cannot bind 52365 leaves the head without a job agent, and
``submit`` fails with Ray's ``No available agent to submit job``). A port given explicitly
that someone holds is refused before anything starts, naming it; a port lost to a race is
read from the agent's log (``agent_port_error``) and the head is stopped again.

``stop`` stops the processes of that temp dir's sessions only (each has its log files
there: ``local_ray.session_processes``), never ``ray stop``, which stops every Ray of the
user on the machine. ``submit_failure`` turns a ``No available agent`` failure against a
head on this machine into one line naming the port from the agent's log.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pipeline.errors import MmpipeError
from pipeline.runtime import local_ray

#: The head's temp dir by default: short (Ray's socket paths stay under 107 bytes), per user.
DEFAULT_DIR = Path(tempfile.gettempdir()) / f"mmpipe-head-{getpass.getuser()}"
#: ``ray start`` port options, in the order they are chosen.
PORT_OPTIONS = ("port", "dashboard-port", "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
                "ray-client-server-port", "node-manager-port", "object-manager-port")
RECORD = "mmpipe-head.json"
STOP_GRACE_S = 10.0
AGENT_BIND = re.compile(r"Failed to bind to port (\d+).*?Error: (.*)$|Agent port #(\d+) failed "
                        r"to bind", re.M)


class HeadError(MmpipeError):
    """A head could not start (a port taken, ``ray start`` failed), or none is running."""


@dataclasses.dataclass
class Head:
    """A head started here: its ``temp_dir`` and the ``ports`` by ``ray start`` option."""

    temp_dir: Path
    ports: dict[str, int]

    @property
    def dashboard_url(self) -> str:
        """The dashboard / job API URL that ``mmpipe submit --address`` takes."""
        return f"http://127.0.0.1:{self.ports['dashboard-port']}"

    @property
    def gcs_address(self) -> str:
        """``127.0.0.1:PORT``, what ``ray.init(address=...)`` takes."""
        return f"127.0.0.1:{self.ports['port']}"


def taken(ports: dict[str, int]) -> dict[str, int]:
    """The options among ``ports`` whose port cannot be bound on 127.0.0.1 now."""
    out = {}
    for option, port in ports.items():
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                out[option] = port
    return out


def start(temp_dir: Path | str = DEFAULT_DIR, num_cpus: int | None = None,
          ports: dict[str, int] | None = None, timeout_s: float = 120) -> Head:
    """Start a head (module docstring) and return once its job agent serves; ``ports``
    fixes some ``PORT_OPTIONS`` (the rest are chosen free). Raises ``HeadError`` when a
    head of ``temp_dir`` runs already, a given port is taken, or the head does not come
    up (with the agent's bind error when that is why; the head is stopped then)."""
    temp_dir = Path(temp_dir)
    if running(temp_dir):
        raise HeadError(f"a head of {temp_dir} is running already "
                        f"(mmpipe head stop --temp-dir {temp_dir} stops it)")
    busy = taken(ports or {})
    if busy:
        raise HeadError("port " + ", ".join(f"{p} (--{o})" for o, p in busy.items())
                        + " is taken on 127.0.0.1: leave it out and a free one is chosen")
    chosen = dict(zip(PORT_OPTIONS, local_ray.free_ports(len(PORT_OPTIONS))), **(ports or {}))
    local_ray.secure_token()     # the token file owner-only before Ray writes one
    env = dict(os.environ, **{local_ray.CLUSTER_ENV: "0"})   # loopback only
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head",
           "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
           f"--temp-dir={temp_dir}", "--disable-usage-stats",
           *(f"--{o}={p}" for o, p in chosen.items()),
           *([f"--num-cpus={num_cpus}"] if num_cpus is not None else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    head = Head(temp_dir, chosen)
    if done.returncode != 0:
        stop(temp_dir)
        raise HeadError(f"ray start failed: {_last_line(done.stderr or done.stdout)}")
    (temp_dir / RECORD).write_text(json.dumps({"ports": chosen}))
    try:
        _wait_for_agent(head, time.time() + timeout_s)
    except HeadError:
        stop(temp_dir)
        raise
    return head


def _wait_for_agent(head: Head, deadline: float) -> None:
    """Until the job API lists jobs and the agent's HTTP port is this head's (a failed bind
    in its log raises ``HeadError`` naming the port)."""
    token = local_ray.token_path()
    headers = {"Authorization": f"Bearer {token.read_text().strip()}"} \
        if token and token.exists() else {}
    while time.time() < deadline:
        failure = agent_port_error(head.temp_dir / "session_latest")
        if failure:
            raise HeadError(failure)
        try:
            req = urllib.request.Request(f"{head.dashboard_url}/api/jobs/", headers=headers)
            with urllib.request.urlopen(req, timeout=5):
                pass
            if _agent_listening(head):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise HeadError(f"the head at {head.dashboard_url} did not come up; logs in "
                    f"{head.temp_dir / 'session_latest' / 'logs'}")


def _agent_listening(head: Head) -> bool:
    """Whether a process of this head listens on its agent's HTTP port."""
    port = head.ports["dashboard-agent-listen-port"]
    for p in local_ray.session_processes(str(head.temp_dir)):
        try:
            if any(c.laddr and c.laddr.port == port and c.status == "LISTEN"
                   for c in p.net_connections("tcp")):
                return True
        except Exception:  # noqa: BLE001 - a process that went away or is not ours
            continue
    return False


def running(temp_dir: Path = DEFAULT_DIR) -> Head | None:
    """The head of ``temp_dir`` if its processes run, else None."""
    record = Path(temp_dir) / RECORD
    if not record.exists() or not local_ray.session_processes(str(temp_dir)):
        return None
    return Head(Path(temp_dir), json.loads(record.read_text())["ports"])


def stop(temp_dir: Path | str = DEFAULT_DIR) -> int:
    """Stop the processes of ``temp_dir``'s Ray sessions (no other Ray's); return how many."""
    procs = local_ray.session_processes(str(temp_dir))
    local_ray.stop_processes(procs, STOP_GRACE_S)
    (Path(temp_dir) / RECORD).unlink(missing_ok=True)
    return len(procs)


def agent_port_error(session_dir: Path) -> str | None:
    """One line naming the port the dashboard agent of ``session_dir`` could not bind, and
    why (from ``logs/dashboard_agent.log``); None if it bound or there is no such log."""
    log_path = Path(session_dir) / "logs" / "dashboard_agent.log"
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    matches = list(AGENT_BIND.finditer(text))
    if not matches or not any(m.group(3) for m in matches):   # still retrying, or bound
        return None
    port = matches[-1].group(3)
    why = next((m.group(2) for m in matches if m.group(2)), "address already in use")
    return (f"the Ray head's dashboard agent could not listen on port {port} ({why.strip()}; "
            f"{log_path}): another Ray or program holds it, and without that agent the head "
            f"takes no job; start a head on free ports with `mmpipe head start`")


def submit_failure(message: str) -> str | None:
    """For a ``No available agent`` submit failure: the agent's bind error of a head on
    this machine (the newest session of ``DEFAULT_DIR`` or of Ray's default temp dir), one
    line; None otherwise."""
    if "No available agent" not in message:
        return None
    from ray._common.utils import get_default_ray_temp_dir

    for root in (DEFAULT_DIR, Path(get_default_ray_temp_dir())):
        failure = agent_port_error(root / "session_latest")
        if failure:
            return failure
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
