"""HTTP(S) download of manifest URLs, following img2dataset's conventions.

``HttpFetcher.fetch(url)`` returns ``(body, None)`` or ``(None, RowError)`` and never
raises for a per-URL problem. The error's reason is ``failed_to_download`` (img2dataset's status name for any download failure: HTTP error
status, timeout, connection error, truncated body, opted out by ``X-Robots-Tag``,
unsupported scheme) or ``too_large`` (the body is over ``max_bytes``).

Retries are urllib3's ``Retry`` (in a ``requests`` ``HTTPAdapter``): connection errors,
read timeouts before the response headers, and HTTP 429/500/502/503/504 are retried
``DownloadSpec.retries`` times with exponential backoff plus jitter, honouring
``Retry-After`` (capped at ``RETRY_AFTER_MAX_S``). Other statuses (4xx) fail at once. A
failure while reading the body (truncation, reset, timeout mid-body) is not retried.

Politeness: at most ``DownloadSpec.max_per_host`` requests per host are in flight from
one fetcher (one ``threading.BoundedSemaphore`` per host name, held for the whole request
including retries, backoff sleeps and the body read); every request carries
``DownloadSpec.user_agent``; an image whose response carries an ``X-Robots-Tag``
directive in ``DownloadSpec.disallowed_header_directives`` (for all agents, for ``*`` or
for our user-agent token) is not downloaded (img2dataset's ``is_disallowed``,
https://github.com/rom1504/img2dataset/blob/main/img2dataset/downloader.py).
"""

from __future__ import annotations

import http.cookiejar
import logging
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable
from urllib.parse import urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from pipeline.records import ErrorReason, RowError
from pipeline.spec import DownloadSpec

RETRY_STATUSES = (429, 500, 502, 503, 504)
RETRY_AFTER_MAX_S = 30.0   # longest Retry-After honoured (seconds); a larger value is capped
BACKOFF_MAX_S = 60.0       # longest backoff sleep between two attempts (seconds)
CHUNK_BYTES = 64 * 1024    # body read size (bytes)


def user_agent_token(user_agent: str) -> str:
    """The product token of a User-Agent string, lower case: ``"mmpipe/0.1 (...)"`` ->
    ``"mmpipe"``. This is the name an ``X-Robots-Tag: <token>: noai`` entry addresses."""
    first = user_agent.strip().split(None, 1)[0] if user_agent.strip() else ""
    return first.split("/", 1)[0].lower()


def is_disallowed(robots_values: Iterable[str], token: str,
                  disallowed: Iterable[str]) -> str | None:
    """The first disallowed ``X-Robots-Tag`` directive that applies to us, else None.

    Same semantics as img2dataset's ``is_disallowed(headers, user_agent_token,
    disallowed_header_directives)``: each header value (every ``X-Robots-Tag`` header
    counts, not only the first) is ``[<ua>:] d1, d2, ...``; with a ``<ua>:`` prefix the
    directives apply only when ``<ua>`` is our token (we also accept ``*``), without one
    they apply to every agent. Comparison is case-insensitive.
    """
    bad = {d.strip().lower() for d in disallowed}
    if not bad:
        return None
    token = token.lower()
    for value in robots_values:
        parts = value.split(":", 1)
        ua = parts[0].strip().lower() if len(parts) == 2 else None
        if ua is not None and ua not in (token, "*"):
            continue
        for directive in parts[-1].split(","):
            if directive.strip().lower() in bad:
                return directive.strip().lower()
    return None


class _Retry(Retry):
    """urllib3 ``Retry`` with three changes: the first retry already waits
    ``backoff_factor`` seconds (urllib3 retries the first time at once, then waits
    ``2 * backoff_factor``; ``DownloadSpec.backoff_s`` is documented as the first delay),
    ``Retry-After`` is capped at ``RETRY_AFTER_MAX_S``, and each retry calls ``on_retry``
    (for the fetcher's counters)."""

    def __init__(self, *args, on_retry=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_retry = on_retry

    def new(self, **kw):
        retry = super().new(**kw)
        retry.on_retry = self.on_retry
        return retry

    def increment(self, *args, **kwargs):
        retry = super().increment(*args, **kwargs)  # raises MaxRetryError when exhausted
        if self.on_retry is not None:
            self.on_retry()
        return retry

    def get_backoff_time(self) -> float:
        errors = 0
        for h in reversed(self.history):  # the last run of errors (redirects reset it)
            if h.redirect_location is not None:
                break
            errors += 1
        if errors < 1 or self.backoff_factor <= 0:
            return 0.0
        value = self.backoff_factor * (2 ** (errors - 1)) + random.random() * self.backoff_jitter
        return float(max(0.0, min(self.backoff_max, value)))

    def get_retry_after(self, response):
        seconds = super().get_retry_after(response)
        return None if seconds is None else min(seconds, RETRY_AFTER_MAX_S)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it wraps (args, ``reason``, cause, context)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 20:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo.extend(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))
        for attr in ("reason", "__cause__", "__context__"):
            v = getattr(e, attr, None)
            if isinstance(v, BaseException):
                todo.append(v)
    return seen


class HttpFetcher:
    """Downloads URL bodies with retries, timeouts, a per-host limit and opt-out checks.

    ``spec.timeout_s`` (seconds) is both the connect timeout and the read timeout (the
    longest wait for any bytes from the server, not a whole-request deadline).
    ``max_bytes`` (bytes) is the largest body accepted. Thread-safe: ``fetch`` may be
    called from many threads at once (the connection pool holds ``spec.threads``
    connections per host). ``stats`` counts ``fetches`` (calls), ``requests`` (HTTP
    attempts including retries), ``retries``, ``ok``, ``bytes`` (body bytes returned) and
    ``failed:<kind>`` per failure kind (``http_404``, ``timeout``, ``opted_out``, ...).
    """

    def __init__(self, spec: DownloadSpec, max_bytes: int):
        self.spec = spec
        self.max_bytes = int(max_bytes)
        self.token = user_agent_token(spec.user_agent)
        self._stats: Counter[str] = Counter()
        self._stats_lock = threading.Lock()
        self._hosts: dict[str, threading.BoundedSemaphore] = {}
        self._hosts_lock = threading.Lock()
        # urllib3 logs a WARNING per retried request; at crawl scale that floods the worker
        # logs, and retries are counted in ``stats`` (the commit markers' ``downloads``).
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        retry = _Retry(
            total=spec.retries, connect=spec.retries, read=spec.retries,
            status=spec.retries, other=0, redirect=None,
            backoff_factor=spec.backoff_s, backoff_jitter=spec.backoff_s,
            backoff_max=BACKOFF_MAX_S, status_forcelist=RETRY_STATUSES,
            allowed_methods=frozenset({"GET"}), respect_retry_after_header=True,
            raise_on_status=False, raise_on_redirect=False,
            on_retry=self._on_retry)
        adapter = HTTPAdapter(max_retries=retry, pool_connections=max(10, spec.threads),
                              pool_maxsize=max(spec.threads, spec.max_per_host))
        session = requests.Session()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers["User-Agent"] = spec.user_agent
        # The body as the server stores it: max_bytes then counts bytes on the wire.
        session.headers["Accept-Encoding"] = "identity"
        # A crawler keeps no cookies (and the shared session then has no mutable jar state).
        session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        self._session = session

    @property
    def stats(self) -> dict[str, int]:
        """A snapshot of the counters (see the class docstring)."""
        with self._stats_lock:
            return dict(self._stats)

    def _on_retry(self) -> None:
        with self._stats_lock:
            self._stats["retries"] += 1
            self._stats["requests"] += 1

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self._stats[key] += n

    def _host_slot(self, host: str) -> threading.BoundedSemaphore:
        with self._hosts_lock:
            sem = self._hosts.get(host)
            if sem is None:
                sem = self._hosts[host] = threading.BoundedSemaphore(self.spec.max_per_host)
            return sem

    def _fail(self, kind: str, url: str, text: str) -> tuple[None, RowError]:
        self._count(f"failed:{kind}")
        return None, RowError(ErrorReason.FAILED_TO_DOWNLOAD, f"{url}: {text}")

    def _too_large(self, text: str) -> tuple[None, RowError]:
        self._count("failed:too_large")
        return None, RowError(ErrorReason.TOO_LARGE, text)

    def fetch(self, url: str) -> tuple[bytes | None, RowError | None]:
        """Download ``url``: ``(body, None)``, or ``(None, RowError)`` (reason
        ``failed_to_download`` or ``too_large``); never raises for a per-URL problem (bad
        URL, network, HTTP status, size, opt-out)."""
        self._count("fetches")
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
        except ValueError as e:
            return self._fail("invalid_url", url, f"invalid url: {e}")
        if parts.scheme.lower() not in ("http", "https"):
            return self._fail("unsupported_scheme", url,
                              f"unsupported scheme {parts.scheme or '(none)'!r}")
        if not host:
            return self._fail("invalid_url", url, "invalid url: no host")
        with self._host_slot(host):
            try:
                return self._fetch(url)
            except Exception as e:  # noqa: BLE001 - a per-URL failure is this row's error
                return self._classify(url, e, None)

    def _fetch(self, url: str) -> tuple[bytes | None, RowError | None]:
        self._count("requests")
        timeout = (self.spec.timeout_s, self.spec.timeout_s)
        deadline = time.monotonic() + self.spec.max_time_s
        resp = self._session.get(url, timeout=timeout, stream=True, allow_redirects=True)
        try:
            for r in resp.history:  # redirects followed by requests: one attempt each
                self._count("requests")
                r.close()
            if resp.status_code >= 400 or resp.status_code < 200:
                return self._fail(f"http_{resp.status_code}", url, f"HTTP {resp.status_code}")
            if 300 <= resp.status_code < 400:
                return self._fail("redirect", url, f"HTTP {resp.status_code} without a usable "
                                  "Location")
            robots = resp.raw.headers.getlist("X-Robots-Tag") if resp.raw is not None else []
            directive = is_disallowed(robots, self.token, self.spec.disallowed_header_directives)
            if directive is not None:  # checked before reading any of the body
                return self._fail("opted_out", url, f"opted out by X-Robots-Tag: {directive}")
            length = self._content_length(resp)
            if length is not None and length > self.max_bytes:
                return self._too_large(f"{length} bytes > max_bytes {self.max_bytes}")
            body = bytearray()
            try:
                for chunk in resp.iter_content(CHUNK_BYTES):
                    body += chunk
                    if time.monotonic() > deadline:
                        return self._fail("timeout", url, f"download took longer than "
                                          f"max_time_s {self.spec.max_time_s} s")
                    if len(body) > self.max_bytes:
                        return self._too_large(f"more than {self.max_bytes} bytes "
                                               f"> max_bytes {self.max_bytes}")
            except Exception as e:  # noqa: BLE001 - classified below
                return self._classify(url, e, (resp, length))
            if length is not None and len(body) < length:  # enforce_content_length off?
                return self._fail("truncated", url, f"truncated body: got {len(body)} of "
                                  f"{length} bytes")
            self._count("ok")
            self._count("bytes", len(body))
            return bytes(body), None
        finally:
            resp.close()

    @staticmethod
    def _content_length(resp: requests.Response) -> int | None:
        value = resp.headers.get("Content-Length")
        if value is None or "," in value:
            return None
        try:
            n = int(value.strip())
        except ValueError:
            return None
        return n if n >= 0 else None

    def _classify(self, url: str, exc: BaseException,
                  reading: tuple[requests.Response, int | None] | None) -> tuple[None, RowError]:
        """Turn an exception from ``requests``/urllib3 into a ``failed_to_download`` text."""
        chain = _chain(exc)
        t = self.spec.timeout_s

        def has(*types) -> bool:
            return any(isinstance(e, types) for e in chain)

        if reading is not None:  # the headers arrived; the body read failed
            resp, length = reading
            if has(urllib3.exceptions.ReadTimeoutError, socket.timeout, TimeoutError):
                return self._fail("timeout", url, f"timeout after {t} s reading the body")
            got = resp.raw.tell() if resp.raw is not None else 0
            if has(urllib3.exceptions.IncompleteRead) or (length is not None and got < length):
                return self._fail("truncated", url, f"truncated body: got {got} of "
                                  f"{length if length is not None else '?'} bytes")
            if has(requests.exceptions.ContentDecodingError):
                return self._fail("decoding", url, f"bad content encoding: {exc}")
            return self._fail("connection", url, f"connection broken reading the body: {exc}")
        refused = next((e for e in chain
                        if isinstance(e, urllib3.exceptions.NewConnectionError)), None)
        if refused is not None:  # (a ConnectTimeoutError subclass in urllib3 2)
            return self._fail("connection", url, f"connection error: {refused}")
        if has(requests.exceptions.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError):
            return self._fail("timeout", url, f"timeout after {t} s (connect)")
        if has(requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError,
               socket.timeout, TimeoutError):
            return self._fail("timeout", url, f"timeout after {t} s")
        if has(requests.exceptions.TooManyRedirects):
            return self._fail("redirect", url, "too many redirects")
        if has(requests.exceptions.InvalidSchema):
            return self._fail("unsupported_scheme", url, f"unsupported scheme: {exc}")
        if has(requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
               urllib3.exceptions.LocationParseError):
            return self._fail("invalid_url", url, f"invalid url: {exc}")
        if has(requests.exceptions.SSLError):
            return self._fail("ssl", url, f"ssl error: {exc}")
        if has(requests.exceptions.ConnectionError, ConnectionError, OSError,
               urllib3.exceptions.HTTPError):
            return self._fail("connection", url, f"connection error: {exc}")
        return self._fail("other", url, f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Close the pooled connections; the fetcher is not used afterwards."""
        self._session.close()

    def __enter__(self) -> HttpFetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
