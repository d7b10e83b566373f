"""A fault-injecting HTTP file server on 127.0.0.1 for download tests.

``FaultHTTPServer(root)`` serves the files of ``root`` (default: the bundled photos
``data/photos``) on a free port, in a background thread, under these routes
(``<name>`` is a file name in ``root``):

- ``/ok/<name>``: 200 and the file.
- ``/status/<code>/<name>``: that status (a small text body), never the file.
- ``/flaky/<n>/<name>``: the first ``n`` requests for this path answer 503, then the file.
- ``/slow/<seconds>/<name>``: sleep that long, then the file.
- ``/slowbody/<seconds>/<name>``: headers and half the file at once, the rest after the sleep.
- ``/trickle/<seconds>/<name>``: the file in 20 pieces spread over that many seconds.
- ``/truncated/<name>``: ``Content-Length`` of the whole file, half the bytes, then close.
- ``/html/<name>``: 200, an HTML error page with ``Content-Type: image/jpeg``.
- ``/robots/<directive>/<name>``: the file with ``X-Robots-Tag: <directive>`` (URL-decoded,
  e.g. ``otherbot%3A%20noai``); ``/robots2/<d1>/<d2>/<name>`` sends two such headers.
- ``/retryafter/<seconds>/<name>``: first request 503 with ``Retry-After``, then the file.
- ``/redirect/<name>``: 302 to ``/ok/<name>``.
- ``/redirectto/<quoted url>/<name>``: 302 to the URL-decoded ``<quoted url>`` (any
  scheme, host or port: redirect checks); ``<name>`` must exist. The header is written
  in Latin-1 (``http.server``), so ``%E9`` in ``<quoted url>`` (decoded as Latin-1) is
  the raw byte ``E9``.
- ``/chunked/<name>``: the file with chunked transfer encoding (no ``Content-Length``).
- ``/encoded/<codings>/<name>``: the file with a ``Content-Encoding``: ``<codings>`` is a
  comma-separated (URL-quoted) list applied in order, each ``gzip``, ``x-gzip``,
  ``deflate`` (zlib format), ``rawdeflate`` (raw DEFLATE sent as ``deflate``, as some
  servers do), ``br`` or ``identity`` (in any case); ``fake-<coding>`` sends
  ``<coding>`` in the header but leaves the body as it is (bad compressed data); any
  other name is sent in the header with the body left as it is. ``Content-Length`` is
  the encoded length (RFC 9110 §8.6).
- ``/encodedcut/<codings>/<name>``: the first half of that encoded body, as a complete
  response (``Content-Length`` of the half): the compressed stream is cut.
- ``/encodedtruncated/<codings>/<name>``: ``Content-Length`` of the whole encoded body,
  half of it, then close.
- ``/encodedchunked/<codings>/<name>``: the encoded body, chunked (no ``Content-Length``).
- ``/bomb/<codings>/<megabytes>/<name>``: that many MiB of zero bytes, encoded (a
  compression bomb: 64 MiB of zeros is ~64 KiB of gzip); ``<name>`` must exist.

It records ``counts`` (requests per path), ``targets`` (request targets as sent, with
their query), ``user_agents`` and ``hosts`` (the ``Host``
headers; both in arrival order),
``max_in_flight`` (most requests being handled at once; a handler still sleeping from
an earlier test counts too), ``max_in_flight_by_route`` (the same per path without the
file name, e.g. ``/slow/0.3``) and ``body_bytes_sent`` (per
path: bytes of file body written). The handler does not log.
"""

from __future__ import annotations

import collections
import gzip
import os
import socket
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PHOTOS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "data", "photos")

HTML_PAGE = (b"<!DOCTYPE html><html><head><title>404 Not Found</title></head>"
             b"<body><h1>Not Found</h1><p>The image you asked for is gone.</p></body></html>")


def encode(data: bytes, codings: str) -> tuple[bytes, str]:
    """``data`` encoded with the comma-separated ``codings`` in order, and the
    ``Content-Encoding`` header value (see the module docstring)."""
    names = []
    for coding in (c.strip() for c in codings.split(",") if c.strip()):
        name = coding.lower()
        if name in ("gzip", "x-gzip"):
            data = gzip.compress(data, mtime=0)
        elif name == "deflate":
            data = zlib.compress(data)
        elif name == "rawdeflate":
            c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
            data, coding = c.compress(data) + c.flush(), "deflate"
        elif name.startswith("fake-"):
            coding = coding[len("fake-"):]
        elif name == "br":
            import brotli

            data = brotli.compress(data, quality=5)
        names.append(coding)
    return data, ", ".join(names)


_BOMBS: dict[tuple[str, int], tuple[bytes, str]] = {}


def bomb(codings: str, megabytes: int) -> tuple[bytes, str]:
    """``megabytes`` MiB of zero bytes encoded with ``codings`` (cached)."""
    if (codings, megabytes) not in _BOMBS:
        _BOMBS[codings, megabytes] = encode(bytes(megabytes << 20), codings)
    return _BOMBS[codings, megabytes]


def _route_of(path: str) -> str:
    """``/slow/0.3/a.jpg`` -> ``/slow/0.3`` (the path without the file name)."""
    return path.rsplit("/", 1)[0]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        owner = self.server.owner
        owner.targets.append(self.path)
        path = urllib.parse.urlsplit(self.path).path
        owner._enter(path, self.headers.get("User-Agent"), self.headers.get("Host"))
        try:
            self._route(owner, path)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            owner._leave(path)

    def _file(self, name: str) -> bytes | None:
        name = urllib.parse.unquote(name)
        if "/" in name or name.startswith("."):
            return None
        p = os.path.join(self.server.owner.root, name)
        if not os.path.isfile(p):
            return None
        with open(p, "rb") as f:
            return f.read()

    def _send(self, code: int, body: bytes, ctype: str = "image/jpeg",
              headers: dict | list | None = None, path: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers.items() if isinstance(headers, dict) else headers or []):
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if path is not None:
            self.server.owner._sent(path, len(body))

    def _route(self, owner: FaultHTTPServer, path: str) -> None:
        parts = path.strip("/").split("/")
        kind, args = parts[0], parts[1:]
        data = self._file(args[-1]) if args else None
        if data is None and kind != "status":
            self._send(404, b"not found\n", "text/plain")
            return
        if kind == "ok" and len(args) == 1:
            self._send(200, data, path=path)
        elif kind == "status" and len(args) == 2:
            code = int(args[0])
            self._send(code, f"status {code}\n".encode(), "text/plain")
        elif kind == "flaky" and len(args) == 2:
            if owner.counts[path] <= int(args[0]):
                self._send(503, b"busy\n", "text/plain")
            else:
                self._send(200, data, path=path)
        elif kind == "retryafter" and len(args) == 2:
            if owner.counts[path] <= 1:
                self._send(503, b"busy\n", "text/plain", {"Retry-After": args[0]})
            else:
                self._send(200, data, path=path)
        elif kind == "slow" and len(args) == 2:
            time.sleep(float(args[0]))
            self._send(200, data, path=path)
        elif kind == "slowbody" and len(args) == 2:
            half = len(data) // 2
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:half])
            self.wfile.flush()
            time.sleep(float(args[0]))
            self.wfile.write(data[half:])
            owner._sent(path, len(data))
        elif kind == "trickle" and len(args) == 2:  # the body in 20 pieces over <seconds>
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            step = -(-len(data) // 20)
            try:
                for i in range(0, len(data), step):
                    self.wfile.write(data[i:i + step])
                    self.wfile.flush()
                    time.sleep(float(args[0]) / 20)
            except OSError:  # the client gave up
                return
            owner._sent(path, len(data))
        elif kind == "truncated" and len(args) == 1:
            half = len(data) // 2
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[:half])
            self.wfile.flush()
            owner._sent(path, half)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        elif kind == "html" and len(args) == 1:
            self._send(200, HTML_PAGE, "image/jpeg")
        elif kind == "robots" and len(args) == 2:
            self._send(200, data, headers={"X-Robots-Tag": urllib.parse.unquote(args[0])},
                       path=path)
        elif kind == "robots2" and len(args) == 3:
            self._send(200, data, headers=[("X-Robots-Tag", urllib.parse.unquote(a))
                                           for a in args[:2]], path=path)
        elif kind == "redirect" and len(args) == 1:
            self.send_response(302)
            self.send_header("Location", f"/ok/{args[0]}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif kind == "redirectto" and len(args) == 2:
            self.send_response(302)
            self.send_header("Location", urllib.parse.unquote(args[0], encoding="latin-1"))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif kind == "chunked" and len(args) == 1:
            self._chunked(data, path)
        elif kind in ("encoded", "encodedcut", "encodedchunked") and len(args) == 2:
            body, header = encode(data, urllib.parse.unquote(args[0]))
            if kind == "encodedcut":
                body = body[:len(body) // 2]
            if kind == "encodedchunked":
                self._chunked(body, path, {"Content-Encoding": header})
            else:
                self._send(200, body, headers={"Content-Encoding": header}, path=path)
        elif kind == "encodedtruncated" and len(args) == 2:
            body, header = encode(data, urllib.parse.unquote(args[0]))
            half = len(body) // 2
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Encoding", header)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[:half])
            self.wfile.flush()
            owner._sent(path, half)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        elif kind == "bomb" and len(args) == 3:
            body, header = bomb(urllib.parse.unquote(args[0]), int(args[1]))
            self._send(200, body, "application/octet-stream",
                       headers={"Content-Encoding": header}, path=path)
        else:
            self._send(404, b"no such route\n", "text/plain")


    def _chunked(self, body: bytes, path: str, headers: dict | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        for i in range(0, len(body), 8192):
            piece = body[i:i + 8192]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")
        self.server.owner._sent(path, len(body))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64
    owner: FaultHTTPServer

    def handle_error(self, request, client_address):  # quiet: clients hang up on purpose
        pass


class FaultHTTPServer:
    """The server; use as a context manager or call ``start()``/``stop()``.

    ``base_url`` is ``http://<host>:<port>``; ``url(route, name)`` builds a URL. ``host``:
    the loopback address it listens on (``127.0.0.2`` is loopback on Linux too).
    """

    def __init__(self, root: str = PHOTOS, host: str = "127.0.0.1"):
        self.root = root
        self.host = host
        self.hosts: list[str | None] = []
        self.targets: list[str] = []
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.body_bytes_sent: collections.Counter[str] = collections.Counter()
        self.user_agents: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._route_in_flight: collections.Counter[str] = collections.Counter()
        self.max_in_flight_by_route: collections.Counter[str] = collections.Counter()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, route: str, name: str) -> str:
        """``url("slow/0.3", "a.jpg")`` -> ``http://127.0.0.1:<port>/slow/0.3/a.jpg``."""
        return f"{self.base_url}/{route.strip('/')}/{name}" if route else f"{self.base_url}/{name}"

    def start(self) -> FaultHTTPServer:
        self._httpd = _Server((self.host, 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(5)
            self._httpd = None

    def reset(self) -> None:
        """Forget the recorded counts (the flaky routes start over)."""
        with self._lock:
            self.counts.clear()
            self.body_bytes_sent.clear()
            self.user_agents.clear()
            self.hosts.clear()
            self.targets.clear()
            self.max_in_flight = self.in_flight
            self.max_in_flight_by_route.clear()
            self.max_in_flight_by_route.update(+self._route_in_flight)

    def __enter__(self) -> FaultHTTPServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _enter(self, path: str, user_agent: str | None, host: str | None = None) -> None:
        with self._lock:
            self.counts[path] += 1
            self.user_agents.append(user_agent)
            self.hosts.append(host)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            route = _route_of(path)
            self._route_in_flight[route] += 1
            self.max_in_flight_by_route[route] = max(self.max_in_flight_by_route[route],
                                                     self._route_in_flight[route])

    def _leave(self, path: str) -> None:
        with self._lock:
            self.in_flight -= 1
            self._route_in_flight[_route_of(path)] -= 1

    def _sent(self, path: str, n: int) -> None:
        with self._lock:
            self.body_bytes_sent[path] += n
