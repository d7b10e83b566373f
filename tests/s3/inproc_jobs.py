"""The quickstart job of ``tests/e2e/jobs.py``'s ``mmpipe_run`` (19 partitions of 3, one
worker, no dataset pass) as ``mmpipe run`` in this process, for the S3 fault, outage and gc
tests, and a thread that acts once a job has committed some partitions.

``mmpipe run`` in a subprocess starts and stops a local Ray of its own (~8.6 s wall, ~7 CPU-s
on a 2-core machine, of which the job's work is ~1.2 CPU-s). What these tests claim (exit
codes, what the command prints, what it leaves in the output, what the store saw) does not
depend on whose Ray it is: ``tests/inproc.py`` runs the same ``cli.main`` on the
session's ``ray_local``, the S3 credentials reaching the job's actors as a subprocess's
environment would (``runtime_env`` ``env_vars``). With ``--executor processes`` the worker
processes are children of this process: they inherit its environment, which ``s3_env`` and
``point_at`` set.

The endpoint: the driver resolves it from its own environment (``AWS_ENDPOINT_URL*``) into
the spec it sends to the workers (``pipeline/runtime/driver.py``), so ``point_at`` (here,
during the run) decides where the whole job's requests go: a ``FaultProxy`` in front of the
server, or the server itself.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from tests.conftest import REPO

QUICKSTART = str(REPO / "examples/quickstart.yaml")


def quickstart_argv(out: str, input_uri: str, report=None, sets: tuple[str, ...] = (),
                    executor: str = "ray") -> list[str]:
    """``mmpipe run``'s arguments for the quickstart as ``tests.e2e.jobs.mmpipe_run`` gives
    them (``--address local``, one worker, partitions and batches of 3), then ``sets``."""
    argv = ["run", QUICKSTART, "--address", "local", "--executor", executor,
            "--output", out, "--input", input_uri, "--set", "source.partition_size=3",
            "--set", "runtime.num_workers=1", "--set", "runtime.batch_size=3"]
    for item in sets:
        argv += ["--set", item]
    if report is not None:
        argv += ["--report-json", str(report)]
    return argv


#: The prefix Ray puts on a line it forwards from an actor to its driver, e.g.
#: ``(PartitionWorker-0(p-000001/a-9c699c203fb2) pid=22986) ``, coloured (ANSI) unless
#: ``RAY_COLOR_PREFIX=0``.
_ANSI = r"(?:\x1b\[[0-9;]*m)?"
_FORWARDED = re.compile(rf"^{_ANSI}\((?:.*? )?pid=\d+(?:, ip=[^)]*)?\){_ANSI} ")


def own_output(text: str) -> str:
    """``text`` (what a command run here printed) without the lines Ray forwarded from the
    job's actors: ``ray_local`` forwards them to this process, while ``mmpipe run``'s own
    local Ray keeps them in its session's log files (``log_to_driver=False``,
    ``pipeline/runtime/local_ray.py``), as a user's terminal shows."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not _FORWARDED.match(line))


def point_at(monkeypatch, endpoint_url: str) -> None:
    """This process's S3 endpoint (its driver, the gc it runs, worker processes it spawns
    from now on): ``endpoint_url``, as ``AWS_ENDPOINT_URL`` and ``AWS_ENDPOINT_URL_S3``."""
    from pipeline.storage import fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint_url)
    fs.configure()


class WhenCommitted:
    """Calls ``action()`` on a thread once ``n`` commit markers (``_checkpoints/p-*.json``)
    exist under ``out``, listed with ``client`` (a boto3 client of the S3 server itself, so
    around any proxy; made by the caller: boto3 clients are not made safely on threads).
    ``stop()`` ends the watch; ``fired_at`` (``time.monotonic()``) says when ``action``
    ran, None if it did not (the job ended or failed first, or ``timeout_s`` passed)."""

    POLL_S = 0.1

    def __init__(self, client, out: str, n: int, action: Callable[[], None],
                 timeout_s: float = 240):
        from pipeline.storage.s3 import split

        self.client, self.n, self.action = client, n, action
        self.bucket, key = split(out)
        self.prefix = f"{key.rstrip('/')}/_checkpoints/p-"
        self.deadline = time.monotonic() + timeout_s
        self.fired_at: float | None = None
        self.seen = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="when-committed", daemon=True)
        self._thread.start()

    def _count(self) -> int:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix)
        return sum(1 for page in pages for o in page.get("Contents", [])
                   if o["Key"].endswith(".json"))

    def _watch(self) -> None:
        try:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                self.seen = self._count()
                if self.seen >= self.n:
                    self.action()
                    self.fired_at = time.monotonic()
                    return
                self._stop.wait(self.POLL_S)      # poll the listing, not a sync sleep
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def stop(self) -> None:
        """End the watch (and wait for its thread); raise what the thread raised."""
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error
