"""``tests.servers.FaultProxy`` in a process of its own, for jobs whose driver runs in the
test's process (``tests/s3/inproc_jobs.py``).

The proxy answers on an asyncio thread; a driver in the same process opens its Delta tables
with delta-rs, whose calls hold the GIL while they wait on the network: an in-process proxy
then never answers them (seen: the driver's first Delta table read timed out after 180 s).
In a child process (``multiprocessing`` spawn, ~0.2 s) it answers whatever this process
does. The same face: ``endpoint_url``, ``port``, ``outage(seconds)``, ``counts``,
``outage_answers`` (``time.monotonic()``: one clock for every process of the machine) and
``stop()``; the constructor takes ``FaultProxy``'s arguments.
"""

from __future__ import annotations

import multiprocessing
import threading


class ProxyProcess:
    """A ``FaultProxy(upstream_port, **kwargs)`` on 127.0.0.1, served by a child process."""

    def __init__(self, upstream_port: int, **kwargs):
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(theirs, upstream_port, kwargs),
                                    name="FaultProxy", daemon=True)
        self._process.start()
        theirs.close()
        self._lock = threading.Lock()   # a watcher thread may call outage()
        self._state: dict | None = None  # the last state, kept once stopped
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError("the proxy process did not start")
        self.port, self.endpoint_url = self._conn.recv()

    def _call(self, *message):
        with self._lock:
            self._conn.send(message)
            return self._conn.recv()

    def outage(self, seconds: float) -> None:
        """Answer every request ``503 SlowDown`` for ``seconds`` from now."""
        self._call("outage", seconds)

    def _now(self) -> dict:
        return self._state if self._state is not None else self._call("state")

    @property
    def counts(self) -> dict[str, int]:
        return self._now()["counts"]

    @property
    def outage_answers(self) -> list[float]:
        return self._now()["outage_answers"]

    def stop(self) -> None:
        """Stop the proxy and its process; ``counts`` and ``outage_answers`` stay readable."""
        if self._state is None:
            try:
                self._state = self._call("stop")
            except (EOFError, OSError):
                self._state = {"counts": {}, "outage_answers": []}
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)
        self._conn.close()


def _serve(conn, upstream_port: int, kwargs: dict) -> None:
    from tests.servers import FaultProxy

    proxy = FaultProxy(upstream_port, **kwargs)

    def state() -> dict:
        return {"counts": dict(proxy.counts), "outage_answers": list(proxy.outage_answers)}

    conn.send((proxy.port, proxy.endpoint_url))
    while True:
        try:
            what, *args = conn.recv()
        except (EOFError, OSError):   # the test process is gone
            proxy.stop()
            return
        if what == "outage":
            proxy.outage(*args)
            conn.send(None)
        elif what == "state":
            conn.send(state())
        elif what == "stop":
            proxy.stop()
            conn.send(state())
            return
