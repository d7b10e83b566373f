"""``mmpipe`` commands run in this process (``cli.main``) on the session's shared Ray
(``ray_local``), for end-to-end tests whose claim is a command's exit code, output and
what it leaves in the output, not the process (dedup, append, Delta table, S3 faults).

A ``mmpipe run``/``mmpipe dedup`` subprocess starts and stops a local Ray of its own (~6 s
wall, ~4 CPU-s on a 2-core machine); what these tests claim is the commands' exit codes,
what they print and what they leave in the output, none of which depends on whose Ray it
is. ``mmpipe`` here runs the same ``cli.main`` as from a user's shell (no ``RAY_ADDRESS``:
the command asks for a local Ray of its own), with ``local_ray.start``/``shutdown``
keeping the connected Ray instead (tests/runtime covers ``local_ray`` itself), and
returns what the command printed as a ``CompletedProcess``.

``env`` (``MMPIPE_CHAOS_KILL_WORKER_ON``, S3 credentials) reaches the command's actors as
a subprocess's environment would: every ``PartitionWorker`` and ``DedupWorker`` actor of
the command is created with it as ``runtime_env`` ``env_vars`` (Ray merges them with the
job's), so ``pipeline.runtime.chaos`` in that actor reads it from ``os.environ``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys

import pytest

from pipeline import cli
from pipeline.runtime import dedup_pass, executors, local_ray


class _WithEnv:
    """An actor class whose actors are created with ``env`` in their environment."""

    def __init__(self, actor_class, env: dict[str, str]):
        self._cls, self._env = actor_class, dict(env)

    def options(self, **kwargs):
        assert "runtime_env" not in kwargs, kwargs
        return self._cls.options(runtime_env={"env_vars": dict(self._env)}, **kwargs)

    def remote(self, *args, **kwargs):
        return self.options().remote(*args, **kwargs)


@contextlib.contextmanager
def restored_environ():
    """``os.environ`` as it was on entry, on exit: what a command set (``quiet_env``'s
    ``RAY_*`` defaults, ``HF_HUB_OFFLINE``) removed, what it changed put back."""
    environ = dict(os.environ)
    try:
        yield
    finally:
        for k in set(os.environ) - set(environ):
            del os.environ[k]
        os.environ.update(environ)


def command(capsys, *args: str) -> subprocess.CompletedProcess:
    """``mmpipe ARGS`` for a command that starts no job (``status``, ``ls``, ``validate``,
    ``spec``) in this process: its exit code and what it printed (``capsys``), as a
    ``CompletedProcess``. An exception ``cli.main`` lets through (a subprocess would print
    its traceback) fails the calling test. Saves the ~1 CPU-s of a Python start and
    ``pipeline`` import per command."""
    before = capsys.readouterr()                          # not the command's output
    code = cli.main(list(args))
    got = capsys.readouterr()
    sys.stdout.write(before.out)                          # kept for the test's report
    sys.stderr.write(before.err)
    return subprocess.CompletedProcess(["mmpipe", *args], code, got.out, got.err)


def mmpipe(capsys, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    """``mmpipe ARGS`` in this process on the connected Ray; ``env`` in its actors'
    environment. Its stdout and stderr are what it printed (``capsys``; read before)."""
    import ray

    assert ray.is_initialized(), "request the ray_local fixture"

    def keep_connected(address, **kwargs):
        assert address == "local", address                # a Ray of its own, as a user's
        return local_ray.RaySession(local=False)

    with pytest.MonkeyPatch.context() as m, restored_environ():
        m.delenv("RAY_ADDRESS", raising=False)            # set by ray_local's ray.init
        m.setattr(local_ray, "start", keep_connected)
        m.setattr(local_ray, "shutdown", lambda session: None)   # ray_local stays up
        if env:
            cls = executors.remote_worker()
            m.setattr(executors, "remote_worker", lambda: _WithEnv(cls, env))
            m.setattr(dedup_pass, "DedupWorker", _WithEnv(dedup_pass.DedupWorker, env))
        return command(capsys, *args)


def json_out(stdout: str) -> dict:
    """The JSON object ``--json`` printed (``json.dumps(indent=1)``: its opening brace on
    a line of its own), whatever else reached stdout before it (Ray forwards its workers'
    lines to the driver's)."""
    starts = [m.start() for m in re.finditer(r"^\{$", stdout, re.M)]
    assert starts, stdout
    report, _ = json.JSONDecoder().raw_decode(stdout, starts[-1])
    return report
