"""Whole-request deadlines for blocking socket I/O.

A per-read socket timeout does not bound a request: a server sending one byte just before
every timeout holds a thread for ever, and a read of N bytes inside ``http.client`` loops
over many socket reads before returning. ``Watchdog.watch(seconds)`` gives the calling
thread a ``Watch``; the connections it uses attach their sockets to it
(``current()``), and when the deadline passes one watchdog thread shuts those sockets
down, so the blocked read returns at once (an error or EOF) and ``Watch.expired`` tells
why. One thread per ``Watchdog``, whatever the number of requests in flight.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator

_local = threading.local()


class DeadlineExceeded(ValueError):
    """Raised by ``Watch.check`` once the deadline has passed (a ``ValueError``, so
    urllib3 does not retry it)."""


class Watch:
    """The deadline of one request (``deadline``: ``time.monotonic()`` seconds)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.expired = False
        self.done = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def attach(self, sock: socket.socket | None) -> None:
        """Shut ``sock`` down when the deadline passes (at once if it has)."""
        if sock is None:
            return
        with self._lock:
            if not self.expired:
                self._socks.append(sock)
                return
        _shutdown(sock)

    def check(self) -> None:
        """Raise ``DeadlineExceeded`` if the deadline has passed (marking it expired)."""
        if not self.expired and time.monotonic() >= self.deadline:
            self.fire()
        if self.expired:
            raise DeadlineExceeded("deadline passed")

    def fire(self) -> None:
        """Mark the watch expired and shut its sockets down (the watchdog calls this)."""
        with self._lock:
            if self.done:
                return
            self.expired = True
            socks, self._socks = self._socks, []
        for sock in socks:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def current() -> Watch | None:
    """The calling thread's active ``Watch``, or None."""
    return getattr(_local, "watch", None)


class Watchdog:
    """Fires ``Watch`` deadlines from one daemon thread (``name``), started on first use
    and stopped by ``close()``."""

    def __init__(self, name: str = "mmpipe-deadline"):
        self.name = name
        self._heap: list[tuple[float, int, Watch]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def watch(self, seconds: float) -> Iterator[Watch]:
        """A ``Watch`` expiring ``seconds`` from now, active for the calling thread
        inside the ``with`` block (and cancelled when it ends)."""
        w = Watch(time.monotonic() + seconds)
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (w.deadline, next(self._seq), w))
            self._cond.notify()
        previous, _local.watch = current(), w
        try:
            yield w
        finally:
            _local.watch = previous
            with w._lock:
                w.done = True

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                    _, _, w = heapq.heappop(self._heap)
                    if not w.done:
                        w.fire()
                wait = self._heap[0][0] - now if self._heap else None
                self._cond.wait(wait)

    def close(self) -> None:
        """Stop the thread (watches still open never fire)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(5)
