"""Connecting ``mmpipe run`` to Ray quietly, and cleaning up a local Ray a killed run left.

``start`` calls ``ray.init`` with the knobs that keep a terminal readable:
- worker log lines stay in the session's log files (``log_to_driver=False``) unless
  ``verbose``; where they are is logged once (``worker logs: DIR``);
- Ray's warning that it turned token authentication on (printed by every ``ray.init``
  that starts a local Ray, or joins a cluster with a token at hand) is dropped by a logging
  filter: it needs no action. Authentication itself is left as Ray sets it; the warning
  that it is *off* is kept;
- when stderr is not a terminal, ``RAY_COLOR_PREFIX=0`` and ``RAY_DEDUP_LOGS=0``, so
  forwarded worker lines carry no ANSI colour codes (Ray's ``print_worker_logs`` colours the
  prefix, its log deduplication the ``[repeated Nx]`` note); Ray reads the second when it is
  imported, so call ``quiet_env()`` before ``import ray``;
- the dashboard of a local Ray only with ``dashboard=True``, bound to 127.0.0.1;
- a local Ray's metrics agent serves Prometheus text on a port chosen free here
  (``_metrics_export_port``), logged as ``metrics: http://127.0.0.1:PORT/metrics`` and kept
  in the record below, where ``mmpipe metrics`` finds it (``runtime/metrics_text.py``);
- the job's ``metadata`` (``mmpipe_job``, ``fingerprint``, ``run_id``) goes into its
  ``JobConfig``: the dashboard's Jobs page lists a driver that joined a cluster with it
  (a driver's log shows there only for a submitted job: ``runtime/local_job.py``).

A local Ray is kept on this machine (``loopback_env``, ``secure_token``): Ray binds each
daemon to its node's address, and on Linux it takes the machine's routable one; with
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it takes 127.0.0.1 (``get_node_ip_address`` in
``ray/_private/services.py``; Ray meant it for laptops), so the GCS, the raylet and its
object manager, the dashboard agent (HTTP, gRPC and the metrics export port), the runtime
env agent and every worker listen on loopback only; ``start`` checks the node's address
afterwards and refuses to go on with another. Its token file (``~/.ray/auth_token``, or
``RAY_AUTH_TOKEN_PATH``), which Ray writes world-readable (0644), is created owner-only
(0600) before Ray looks for it, and tightened to 0600 if it exists with wider modes: a
process that can read it can join the job's Ray and read what its workers hold.

A local Ray started here is recorded in ``~/.cache/mmpipe/local-ray/<driver pid>.json``
(driver pid and start time, session directory) until ``shutdown``. A driver killed with
``kill -9`` never removes it: its GCS and raylet die with it (Ray's kernel fate sharing),
but the raylet's agents and workers stay. The next local ``start`` finds the record of a
driver that is gone and stops the processes that hold files of that session's directory
open (every process of a Ray session writes its logs there), and only those: a Ray the user
started, or another running mmpipe's, has its own session directory.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import socket
import stat
import sys
import time
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

STATE_DIR = Path("~/.cache/mmpipe/local-ray")
#: Ray's ``_system_config`` for a local Ray: no idle worker processes started ahead (one
#: per CPU, plus one for the first driver), which on a small machine compete with the
#: driver and the actors' own worker processes for the CPUs while a run starts
#: (bench/startup.py, bench/RESULTS.md "Start-up of a local run on Ray").
SYSTEM_CONFIG = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
TERM_GRACE_S = 2.0  # Ray's agents can ignore SIGTERM once their raylet is gone: then SIGKILL


@dataclasses.dataclass
class RaySession:
    """What ``start`` connected to: ``local`` (a Ray started by this process), the
    session's ``logs_dir`` (on this machine when local; on the head node otherwise),
    the ``dashboard_url`` (``http://127.0.0.1:8265``) or None, the ``state_file``
    recording a local Ray (None otherwise) and the ``metrics_url`` of a local Ray's
    metrics agent (None when joined)."""

    local: bool
    logs_dir: str | None = None
    dashboard_url: str | None = None
    state_file: Path | None = None
    metrics_url: str | None = None


def start(address: str | None, *, dashboard: bool = False, verbose: bool = False,
          env_vars: dict[str, str] | None = None, metadata: dict[str, str] | None = None
          ) -> RaySession:
    """``ray.init`` for ``mmpipe run``: a new local Ray when ``address`` is None or
    ``"local"``, else join the cluster at ``address``. Logs where worker logs go, a local
    Ray's metrics endpoint and, if started, the dashboard's URL (``dashboard`` applies to
    a local Ray; without Ray's dashboard packages it logs so and goes on without one).
    ``env_vars``: environment variables every worker of the job gets: for a local Ray in
    this process's environment before ``ray.init`` (its daemons, and so its workers,
    inherit it), on a cluster as the job's ``runtime_env`` ``env_vars``. A ``runtime_env``
    makes Ray start each worker through its ``setup_worker.py`` (one more Python start and
    ``import ray`` before the worker's own): measured 0.35 CPU-s and about 0.4 s more per
    actor on a 2-core machine (6 actors: 5.1 against 3.0 CPU-s), which a local Ray has no
    need for. ``metadata``: the Ray job's metadata (shown on the dashboard's Jobs page)."""
    import ray

    local = address in (None, "local")
    quiet_env(local=local)
    runtime_env = None
    if env_vars and local:
        os.environ.update(env_vars)
    elif env_vars:
        runtime_env = {"env_vars": dict(env_vars)}
    if local:
        cleanup_stale()
        secure_token()
    kwargs: dict = {}
    if local:
        kwargs["_system_config"] = SYSTEM_CONFIG
        kwargs["_metrics_export_port"], = free_ports(1)
        kwargs["include_dashboard"] = dashboard and _dashboard_available()
        if kwargs["include_dashboard"]:
            kwargs["dashboard_host"] = "127.0.0.1"
    ctx = ray.init(address=address, logging_level=logging.WARNING, log_to_driver=verbose,
                   runtime_env=runtime_env, **kwargs,
                   job_config=ray.job_config.JobConfig(metadata=dict(metadata or {})))
    node = ray._private.worker.global_worker.node  # noqa: SLF001 - Ray has no public getter
    if local and node is not None and node.node_ip_address != LOOPBACK:
        ray.shutdown()
        raise RuntimeError(f"the local Ray took the address {node.node_ip_address}, not "
                           f"{LOOPBACK}: it would listen beyond this machine; stopped it")
    session = RaySession(local, logs_dir=node.get_logs_dir_path() if node else None)
    if local:
        session.metrics_url = f"http://{LOOPBACK}:{kwargs['_metrics_export_port']}/metrics"
        log.info("metrics: %s (mmpipe metrics prints mmpipe's series)", session.metrics_url)
        session.state_file = record(node.get_session_dir_path(), session.metrics_url)
    if ctx.dashboard_url and (kwargs.get("include_dashboard") or not local):
        session.dashboard_url = ("" if "://" in ctx.dashboard_url else "http://") + ctx.dashboard_url
        log.info("dashboard: %s", session.dashboard_url)
    _log_cluster(local, ctx)
    where = session.logs_dir if local else f"{session.logs_dir} on each node of the cluster"
    log.info("worker logs: %s%s", where, "" if verbose else " (--verbose shows them here)")
    return session


def _log_cluster(local: bool, ctx) -> None:
    """One INFO line saying which Ray this run uses: ``started a local Ray ...`` or
    ``joined the Ray cluster at <GCS address> ...``, with the cluster's CPUs and GPUs."""
    import ray

    try:
        res = ray.cluster_resources()
        what = f"{res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs"
    except Exception:  # noqa: BLE001 - the line is informational
        what = "resources unknown"
    gcs = (getattr(ctx, "address_info", None) or {}).get("gcs_address", "?")
    if local:
        log.info("started a local Ray (%s, GCS %s); --address or RAY_ADDRESS joins a "
                 "cluster instead", what, gcs)
    else:
        log.info("joined the Ray cluster at %s (%s)", gcs, what)


def shutdown(session: RaySession | None) -> None:
    """``ray.shutdown()`` and forget the local Ray's record."""
    import ray

    ray.shutdown()
    if session is not None and session.state_file is not None:
        session.state_file.unlink(missing_ok=True)


def cleanup_stale(state_dir: Path | None = None) -> int:
    """Stop the processes left by local Rays whose mmpipe driver is gone (records in
    ``state_dir``, default ``STATE_DIR``); return how many were stopped. A record whose
    driver still runs is left alone."""
    state_dir = (state_dir or STATE_DIR).expanduser()
    stopped = 0
    for path in sorted(state_dir.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if _alive(rec.get("driver_pid"), rec.get("driver_started")):
            continue
        procs = session_processes(rec["session_dir"])
        if procs:
            stop_processes(procs)
            stopped += len(procs)
            log.warning("stopped %d processes of a local Ray left by a killed mmpipe run "
                        "(driver pid %s, %s)", len(procs), rec.get("driver_pid"),
                        rec["session_dir"])
        path.unlink(missing_ok=True)
    return stopped


def live_records(state_dir: Path | None = None) -> list[dict]:
    """The records (``record``) of local Rays whose mmpipe driver still runs, newest first."""
    state_dir = (state_dir or STATE_DIR).expanduser()
    found = []
    for path in state_dir.glob("*.json"):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(rec.get("driver_pid"), rec.get("driver_started")):
            found.append(rec)
    return sorted(found, key=lambda r: r.get("recorded_at", 0), reverse=True)


def session_processes(session_dir: str) -> list[psutil.Process]:
    """This user's live processes (this one excepted) with a file under ``session_dir``
    open: every Ray process of that session (GCS, raylet, agents, workers) has its logs
    there."""
    prefix = os.path.realpath(session_dir).rstrip("/") + "/"
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        try:
            if (p.pid == os.getpid() or p.info["uids"] is None
                    or p.info["uids"].real != os.getuid()
                    or p.info["status"] == psutil.STATUS_ZOMBIE):
                continue
            if any(os.path.realpath(f.path).startswith(prefix) for f in p.open_files()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_processes(procs: list[psutil.Process], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM ``procs``, SIGKILL those still alive after ``grace_s`` seconds, and wait up
    to ``grace_s`` more for them to go."""
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def _alive(pid: int | None, started: float | None) -> bool:
    try:
        return pid is not None and abs(psutil.Process(pid).create_time() - (started or 0)) < 1
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def record(session_dir: str, metrics_url: str | None = None, **extra) -> Path | None:
    """Write this driver's local-Ray record (its ``session_dir``: what ``cleanup_stale``
    stops once this driver is gone; the ``metrics_url`` ``mmpipe metrics`` reads by
    default; ``extra`` fields, e.g. the ``dashboard_url``); None (and a debug line) if
    that fails."""
    state_dir = STATE_DIR.expanduser()
    path = state_dir / f"{os.getpid()}.json"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"driver_pid": os.getpid(),
                                    "driver_started": psutil.Process().create_time(),
                                    "session_dir": session_dir, "recorded_at": time.time(),
                                    "metrics_url": metrics_url, **extra}))
    except OSError as e:
        log.debug("cannot record the local Ray in %s: %s", path, e)
        return None
    return path


class _DropAuthEnabledNotice(logging.Filter):
    """Drops Ray's "Token authentication is enabled for this Ray cluster" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(AUTH_ENABLED_NOTICE)


AUTH_ENABLED_NOTICE = "Token authentication is enabled for this Ray cluster"
AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def quiet_env(local: bool = False) -> None:
    """Install the logging filter and set the environment variables Ray reads (module
    docstring); with ``local`` (a local Ray will be started) also ``loopback_env()``;
    idempotent. Call it before ``import ray`` (``start`` calls it too)."""
    auth = logging.getLogger(AUTH_LOGGER)
    if not any(isinstance(f, _DropAuthEnabledNotice) for f in auth.filters):
        auth.addFilter(_DropAuthEnabledNotice())
    if not sys.stderr.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if local:
        loopback_env()


LOOPBACK = "127.0.0.1"
CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR


def loopback_env() -> None:
    """Make the Ray this process starts take 127.0.0.1 as its node address, so that every
    daemon listens on loopback only (module docstring): ``CLUSTER_ENV=0`` in the
    environment (Ray reads it when imported, here and in each process it starts) and, if
    ``ray`` is imported already, in its constant. Only for a local Ray: a node of a
    cluster must advertise an address the other nodes reach."""
    os.environ[CLUSTER_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def token_path() -> Path | None:
    """The token file a local Ray uses: ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``
    (Ray's ``AuthenticationTokenLoader`` order after ``RAY_AUTH_TOKEN``); None when the
    token is in ``RAY_AUTH_TOKEN`` or authentication is off (``RAY_AUTH_MODE=disabled``)."""
    if os.environ.get("RAY_AUTH_TOKEN") or \
            os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()


def secure_token() -> Path | None:
    """Before a local ``ray.init``: create the token file (``token_path``) owner-only
    (0600, its folder 0700 when created here) with Ray's own generator, so Ray finds it
    and never writes its world-readable one; or, if it exists and is this user's, set its
    mode to 0600 when group or others could read it. Returns the path (None: no file)."""
    path = token_path()
    if path is None:
        return None
    if path.exists():
        st = path.stat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, 0o600)
            log.info("%s was readable by others: now 0600 (owner only)", path)
        return path
    from ray._private.authentication.authentication_token_generator import (
        generate_new_authentication_token,
    )

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:      # another process made it meanwhile
        return secure_token()
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())
    return path


def _dashboard_available() -> bool:
    """Whether Ray's dashboard packages are installed (Ray's own check: importing
    ``ray.dashboard.optional_deps``); logs one line if not."""
    try:
        importlib.import_module("ray.dashboard.optional_deps")
        return True
    except ImportError as e:
        log.warning("dashboard: not started, Ray's dashboard packages are missing (%s); "
                    "pip install 'ray[default]' to have it", e)
        return False
