"""A fault-injecting HTTP proxy for tests, in front of the local SeaweedFS
(``pipeline.testing.seaweedfs.SeaweedS3``, re-exported here).

``FaultProxy`` sits in front of it and, for a configured fraction of requests, answers
``503 SlowDown``, resets the connection before forwarding, drops the response after the
server applied the request (the client sees a reset), or delays the response; ``outage(s)``
answers every request ``503 SlowDown`` for ``s`` seconds (a store that throttles everyone).
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time

from pipeline.testing.seaweedfs import SeaweedS3, free_port  # noqa: F401


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 injecting faults into a fraction of requests.

    Each client connection carries one request (forwarded with ``Connection: close``).
    ``fault_rate`` of requests get one of ``modes`` (chosen uniformly): ``slowdown``
    (503 SlowDown, not forwarded), ``reset`` (connection reset, not forwarded), ``drop``
    (forwarded, then the response is replaced by a reset), ``delay`` (forwarded after
    ``delay_s``). ``counts`` records what happened; the random stream is seeded.
    ``throttle_every_other``: ``(method, path fragment)``; matching requests are answered
    503 SlowDown and forwarded in turn (the first one throttled). With ``("HEAD", key)``
    every read of that object (pyarrow sends one HEAD, then GETs) is throttled once and
    then served on its retry, each replayed attempt's read included.
    """

    def __init__(self, upstream_port: int, fault_rate: float = 0.1, seed: int = 7,
                 modes: tuple[str, ...] = ("slowdown", "reset", "drop", "delay"),
                 delay_s: float = 0.3,
                 throttle_every_other: tuple[str, str] | None = None):
        self.upstream_port = upstream_port
        self.throttle_every_other, self.alternate_seen = throttle_every_other, 0
        self.fault_rate, self.modes, self.delay_s = fault_rate, modes, delay_s
        self.rng = random.Random(seed)
        self.counts = {"requests": 0, **{m: 0 for m in modes}}
        self.outage_until = 0.0                 # time.monotonic(): all 503 before it
        self.outage_answers: list[float] = []   # time.monotonic() of each outage 503
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)
        self.endpoint_url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    def outage(self, seconds: float) -> None:
        """Answer every request ``503 SlowDown`` (not forwarded) for ``seconds`` from now."""
        self.outage_until = time.monotonic() + seconds

    def stop(self) -> None:
        def shutdown():
            self.server.close()
            self.loop.stop()
        self.loop.call_soon_threadsafe(shutdown)
        self.thread.join(10)

    async def _read_request(self, reader, writer) -> bytes | None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = [line for line in lines[1:] if line]
        lower = {h.split(":", 1)[0].strip().lower(): h.split(":", 1)[1].strip() for h in headers}
        if lower.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = b""
        if "content-length" in lower:
            body = await reader.readexactly(int(lower["content-length"]))
        elif "chunked" in lower.get("transfer-encoding", "").lower():
            while True:
                size_line = await reader.readuntil(b"\r\n")
                body += size_line
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:  # then trailer lines, ended by an empty line
                    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                        body += line
                    body += line
                    break
                body += await reader.readexactly(size + 2)
        keep = [h for h in headers if h.split(":", 1)[0].strip().lower() not in ("connection", "expect")]
        return ("\r\n".join([lines[0], *keep, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body

    @staticmethod
    def _reset(writer) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()

    async def _handle(self, reader, writer) -> None:
        try:
            request = await self._read_request(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            writer.close()
            return
        self.counts["requests"] += 1
        mode = self.rng.choice(self.modes) if self.rng.random() < self.fault_rate else None
        if mode:
            self.counts[mode] += 1
        method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + ["", ""]
        if self.throttle_every_other and method == self.throttle_every_other[0] \
                and self.throttle_every_other[1] in path:
            self.alternate_seen += 1
            mode = "slowdown" if self.alternate_seen % 2 else None
        if time.monotonic() < self.outage_until:
            mode = "slowdown"
            self.outage_answers.append(time.monotonic())
        if mode == "slowdown":
            body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                    b"<Message>Please reduce your request rate.</Message></Error>")
            writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
            writer.close()
            return
        if mode == "reset":
            self._reset(writer)
            return
        if mode == "delay":
            await asyncio.sleep(self.delay_s)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            up_writer.write(request)
            await up_writer.drain()
            response = await up_reader.read()
            up_writer.close()
        except (ConnectionError, OSError):
            self._reset(writer)
            return
        if mode == "drop":
            self._reset(writer)
            return
        writer.write(response)
        try:
            await writer.drain()
        except ConnectionError:
            pass
        writer.close()
