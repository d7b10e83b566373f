"""``mmpipe run --dashboard`` on this machine: the driver as a Ray job on a head of its own.

Ray's dashboard shows a driver's log only for a job submitted through its job API (Ray
2.60's Jobs page: "Driver logs are only available when submitting jobs via the Job
Submission API"); a driver that calls ``ray.init`` itself is listed with its metadata but
no log. So a local ``--dashboard`` run:

1. starts a head (``head.start``: 127.0.0.1, free ports, its own temp dir; the dashboard
   on 8265 when that port is free), recorded like a local Ray of ``mmpipe run``
   (``local_ray.record``: a head left by a killed run is stopped by the next run);
2. prints the way in: the job's dashboard URL, the command that prints the sign-in token
   (Ray's token authentication: the dashboard asks for it once, then keeps a cookie) and
   the metrics endpoint (``mmpipe metrics`` reads it);
3. submits ``python -m pipeline run ... --executor ray --run-id ID`` (the same arguments,
   run in this directory by this interpreter) with the metadata ``mmpipe_job``,
   ``fingerprint`` and ``run_id``, its attempts' tasks named by partition
   (``executors.PARTITION_TASK_NAMES_ENV``: this head lives only for the run);
4. streams the job's log here and exits with the driver's exit code; Ctrl-C (or SIGTERM)
   stops the job (its driver says what is committed) and the head, exit 130 (143);
5. with ``keep`` (``--keep-dashboard``) keeps the head after the job until Ctrl-C, then
   stops it and exits with the job's code (0 for a job that succeeded).
Ray's logs of the run stay in the head's temp dir (printed at the end).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from pipeline.runtime import head, local_ray, stops, submit
from pipeline.runtime.executors import PARTITION_TASK_NAMES_ENV

log = logging.getLogger(__name__)

DASHBOARD_PORT = 8265   # Ray's usual dashboard port, taken when free
STOP_WAIT_S = 30.0      # seconds a stopped job's driver has to finish its clean-up


def run(run_argv: list[str], *, job: str, fingerprint: str, run_id: str,
        keep: bool = False, out=None) -> int:
    """Run ``mmpipe run`` with ``run_argv`` (the spec's absolute path first, then the run
    options, without ``--dashboard``/``--keep-dashboard``) as a Ray job on a new local head
    (module docstring); ``job``, ``fingerprint``, ``run_id`` go into the job's metadata and
    submission id. Returns the driver's exit code (130/143 after a stop). Raises
    ``head.HeadError`` if the head cannot start, ``submit.SubmitError`` if the job API
    refuses the job."""
    out = out or sys.stdout
    local_ray.cleanup_stale()
    temp_dir = Path(tempfile.mkdtemp(prefix="mmpipe-run-"))
    ports = {} if head.taken({"dashboard-port": DASHBOARD_PORT}) else \
        {"dashboard-port": DASHBOARD_PORT}
    h = head.start(temp_dir, ports=ports)
    metrics_url = f"http://127.0.0.1:{h.ports['metrics-export-port']}/metrics"
    state = local_ray.record(str(temp_dir), metrics_url, dashboard_url=h.dashboard_url)
    sid = f"mmpipe-{job}-{run_id}"
    code = jobs = None
    try:
        with stops.on_signals():
            jobs = submit.client(h.dashboard_url)
            jobs.submit_job(entrypoint=entrypoint(run_argv, run_id), submission_id=sid,
                            metadata={"mmpipe_job": job, "fingerprint": fingerprint,
                                      "run_id": run_id},
                            runtime_env={"env_vars": {PARTITION_TASK_NAMES_ENV: "1",
                                                      "PYTHONUNBUFFERED": "1"}},
                            entrypoint_num_cpus=0)
            print(way_in(h.dashboard_url, sid, metrics_url), file=out, flush=True)
            code = follow(jobs, sid, out)
            if keep:
                print(f"job {sid} finished (exit {code}); the dashboard stays at "
                      f"{h.dashboard_url}/#/jobs/{sid} until Ctrl-C", file=out, flush=True)
                while True:
                    time.sleep(3600)
    except KeyboardInterrupt:
        if code is None:     # the job still ran: stop it, show its last lines
            code = stops.exit_code() if jobs is None else stop_job(jobs, sid, out)
    finally:
        head.stop(temp_dir)
        if state is not None:
            state.unlink(missing_ok=True)
        print(f"stopped the local Ray head; its logs: {temp_dir}/session_latest/logs",
              file=out, flush=True)
    return code


def entrypoint(run_argv: list[str], run_id: str) -> str:
    """The job's shell command: this interpreter runs ``mmpipe run`` in this directory on
    the head (``RAY_ADDRESS``, set by Ray for the job) with the run id given."""
    cmd = [sys.executable, "-m", "pipeline", "run", *run_argv, "--executor", "ray",
           "--run-id", run_id]
    return f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(cmd)}"


def way_in(dashboard_url: str, sid: str, metrics_url: str) -> str:
    """The lines that say where to watch the job: its page, the token, the metrics."""
    token = local_ray.token_path()
    sign_in = ("no sign-in (RAY_AUTH_MODE=disabled)" if os.environ.get(
        "RAY_AUTH_MODE", "").lower() == "disabled" else
        "paste the token in RAY_AUTH_TOKEN into its sign-in dialog" if token is None else
        f"sign in with the token that `cat {_home(token)}` prints (asked once per browser)")
    return (f"dashboard: {dashboard_url}/#/jobs/{sid}\n"
            f"  {sign_in}\n"
            f"metrics: {metrics_url} (mmpipe metrics prints mmpipe's series)")


def follow(jobs, sid: str, out) -> int:
    """Stream the job's log to ``out`` until it ends; the driver's exit code (1 if Ray
    has none: the job failed before its driver ran)."""
    submit.wait(jobs, sid, follow=True, out=out)
    code = jobs.get_job_info(sid).driver_exit_code
    return 1 if code is None else int(code)


def stop_job(jobs, sid: str, out) -> int:
    """Stop a running job (its driver gets SIGTERM and says what is committed), wait up to
    ``STOP_WAIT_S`` for it, print its log's last lines; ``stops.exit_code()``."""
    print(f"{stops.WHAT.get(stops.received(), 'stopped')}: stopping job {sid}", file=out,
          flush=True)
    try:
        submit.stop(jobs, sid)
        deadline = time.time() + STOP_WAIT_S
        while _status(jobs, sid) not in submit.TERMINAL and time.time() < deadline:
            time.sleep(0.5)
        tail = submit.logs(jobs, sid).splitlines()[-5:]
        print("\n".join(tail), file=out, flush=True)
    except submit.SubmitError as e:
        log.warning("could not stop job %s cleanly: %s", sid, e)
    return stops.exit_code()


def _status(jobs, sid: str) -> str:
    """The job's status name (``RUNNING``, ``STOPPED``, ...)."""
    status = jobs.get_job_status(sid)
    return str(getattr(status, "value", status))


def _home(path: Path) -> str:
    """``path`` with the home directory as ``~``."""
    home = str(Path.home())
    return "~" + str(path)[len(home):] if str(path).startswith(home + "/") else str(path)
