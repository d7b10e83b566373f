"""HTTP(S) download of manifest URLs, following img2dataset's conventions.

``HttpFetcher.fetch(url)`` returns ``(body, None)`` or ``(None, RowError)`` and never
raises for a per-URL problem. The error's reason is ``failed_to_download`` (img2dataset's status name for any download failure: HTTP error
status, timeout, connection error, truncated body, opted out by ``X-Robots-Tag``,
unsupported scheme or ``Content-Encoding``, undecodable or cut compressed body) or
``too_large`` (the decoded body is over ``max_bytes``).

URLs: the scheme is case-insensitive (RFC 3986 §3.1): ``HTTP://h/x`` is fetched as
``http://h/x`` (``lower_scheme``). Only absolute ``http``/``https`` URLs are fetched here;
``data:`` URIs and protocol-relative ``//host/path`` references are
``pipeline.input.fetch``'s business (``fetch.normalize_url``).

Content codings (RFC 9110 §8.4): every request asks for ``Accept-Encoding: identity``
(images are compressed already), but a server may encode the body anyway. ``gzip``
(and ``x-gzip``, §8.4.1.3), ``deflate`` (zlib format per §8.4.1.2; raw DEFLATE, as some
servers send, is accepted too) and ``br`` (RFC 7932; needs ``brotli>=1.2``) are decoded
here as the body streams, in pieces of at most ``CHUNK_BYTES`` (a compressed "bomb" is
never inflated past ``max_bytes`` + one piece); any other coding is a
``failed_to_download`` row naming it. Size rules with a coding: ``max_bytes`` applies to
the decoded bytes; ``Content-Length`` is the length of the encoded body (§8.6), so the
truncation check compares it with the bytes received on the wire, and a compressed
stream that stops before its end (a cut gzip member, a brotli stream without its last
meta-block) is a truncated body even when the wire length matches.

Retries are urllib3's ``Retry`` (in a ``requests`` ``HTTPAdapter``): connection errors,
read timeouts before the response headers, and HTTP 429/500/502/503/504 are retried
``DownloadSpec.retries`` times with exponential backoff plus jitter, honouring
``Retry-After`` (capped at ``RETRY_AFTER_MAX_S``; a value that is neither whole seconds
nor an HTTP date, e.g. ``0.5`` or junk, is ignored: that retry waits the policy's
backoff, RFC 9110 §10.2.3). Other statuses (4xx) fail at once. A
failure while reading the body (truncation, reset, timeout mid-body) is not retried.

Egress (``pipeline.storage.egress``): every connection, redirect hops included, goes to an
address the policy permits (by default no loopback, private, link-local, shared, multicast
or reserved address; ``download.allow_networks``/``deny_networks``), resolved once and
connected to as checked; a refusal is an ``egress_refused`` row, its body never read.
At most ``download.max_redirects`` redirects are followed, to ``http``/``https`` only. A
``Location`` holding raw bytes that are not UTF-8 (a Latin-1 ``é`` as byte ``E9``) is
followed with those bytes percent-encoded (``%E9``, RFC 3986 §2.1), as browsers do.
The environment's proxies and ``.netrc`` are not used (``trust_env`` off): a proxy would
hide the target address from the check, and ``.netrc`` would send credentials to
strangers' URLs.

Time: ``download.max_time_s`` bounds a whole fetch (headers and body, retries included,
but not waiting for the per-host slot): a ``pipeline.storage.deadline`` watchdog shuts the
socket down when it passes, so a server trickling bytes cannot hold a thread.

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
import re
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import urlsplit

import requests
import urllib3
from urllib3.util import Retry

from pipeline.storage.deadline import Watchdog
from pipeline.storage.deadline import current as current_watch
from pipeline.storage.egress import EgressPolicy, EgressRefused, GuardedAdapter
from pipeline.records import ErrorReason, RowError
from pipeline.spec import DownloadSpec

RETRY_STATUSES = (429, 500, 502, 503, 504)
RETRY_AFTER_MAX_S = 30.0   # longest Retry-After honoured (seconds); a larger value is capped
BACKOFF_MAX_S = 60.0       # longest backoff sleep between two attempts (seconds)
CHUNK_BYTES = 64 * 1024    # body read size, and largest decoded piece (bytes)

try:  # br needs brotli's bounded output (output_buffer_limit, brotli >= 1.2)
    import brotli as _brotli

    _brotli.Decompressor().process(b"", output_buffer_limit=1)
except (ImportError, TypeError, AttributeError):
    _brotli = None

#: Content codings decoded (RFC 9110 §8.4.1; compared lower case). ``identity`` is none.
SUPPORTED_CODINGS: frozenset[str] = frozenset(
    {"gzip", "x-gzip", "deflate"} | ({"br"} if _brotli is not None else set()))

# RFC 3986 §3.1: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then "://" here.
_SCHEME_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def lower_scheme(uri: str) -> str:
    """``uri`` with its scheme in lower case when it has the ``scheme://`` form
    (``"HTTP://Host/A.jpg"`` -> ``"http://Host/A.jpg"``, ``"S3://b/k"`` -> ``"s3://b/k"``);
    anything else (a path, ``data:``) is returned unchanged. Schemes are case-insensitive
    and lower case is their canonical form (RFC 3986 §3.1); the rest of the URI is left
    as it is (paths and queries are case-sensitive). Never raises."""
    m = _SCHEME_AUTHORITY.match(uri)
    if m is None or m.group(1).islower():
        return uri
    return m.group(1).lower() + uri[m.end(1):]


def content_codings(header: str | None) -> list[str]:
    """The content codings of a ``Content-Encoding`` value, in the order they were
    applied (RFC 9110 §8.4: ``#content-coding``, the sender lists them in that order;
    repeated header lines arrive joined by ``", "``), lower case (codings are
    case-insensitive, §8.4.1), without ``identity`` and empty entries.
    ``"gzip, BR"`` -> ``["gzip", "br"]``; None or ``""`` -> ``[]``."""
    if not header:
        return []
    codings = (c.strip().lower() for c in header.split(","))
    return [c for c in codings if c and c != "identity"]


def encoded_bound(max_bytes: int) -> int:
    """The most bytes (on the wire) a ``gzip``/``deflate``/``br`` encoding of at most
    ``max_bytes`` bytes needs: a stored (uncompressed) deflate block adds 5 bytes per
    64 KiB and a brotli uncompressed meta-block a few bytes per 64 KiB, plus headers
    (zlib's ``deflateBound``; RFC 7932 §9.2). A larger encoded body cannot decode to
    ``max_bytes`` or fewer from a real compressor, so it is ``too_large`` unread."""
    return max_bytes + max_bytes // 1024 + 1024


class ContentDecodeError(ValueError):
    """A content-coded body that cannot be decoded. ``kind``: ``"truncated"`` (the
    compressed stream stops before its end) or ``"decoding"`` (invalid data)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


_GZIP_MAGIC = b"\x1f\x8b"


def _is_zlib_header(head: bytes) -> bool:
    """RFC 1950 §2.2: CM = 8 (deflate), CINFO <= 7 and (CMF * 256 + FLG) % 31 == 0."""
    return (len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7
            and (head[0] * 256 + head[1]) % 31 == 0)


def _zlib_decode(chunks: Iterable[bytes], coding: str, piece: int) -> Iterator[bytes]:
    """gzip (RFC 1952; several members are concatenated, §2.2) or deflate (RFC 1950
    zlib format, else raw RFC 1951 DEFLATE) in pieces of at most ``piece`` bytes, and
    at least one (maybe empty) piece per input chunk. Bytes after the end of the
    stream that do not start another gzip member are ignored (as gzip(1) and urllib3
    do)."""
    gzip = coding in ("gzip", "x-gzip")
    d = None        # the decompressor of the current member
    head = b""      # input not yet given to a decompressor (choosing the format)
    members = 0     # members (streams) finished
    done = False    # the stream ended; the rest is ignored
    try:
        for chunk in chunks:
            data = chunk
            while not done:
                if d is None:
                    head += data
                    data = b""
                    if len(head) < 2:
                        break
                    if gzip:
                        if members and head[:2] != _GZIP_MAGIC:
                            done = True  # trailing bytes after the last member
                            break
                        wbits = 16 + zlib.MAX_WBITS
                    else:
                        wbits = zlib.MAX_WBITS if _is_zlib_header(head) else -zlib.MAX_WBITS
                    d, data, head = zlib.decompressobj(wbits), head, b""
                out = d.decompress(data, piece)
                data = d.unconsumed_tail
                if out:
                    yield out
                if d.eof:
                    members += 1
                    if not gzip:
                        done = True
                        break
                    data, d = d.unused_data + data, None
                    continue
                if not data and len(out) < piece:
                    break  # needs more input
            yield b""
    except zlib.error as e:
        raise ContentDecodeError("decoding", f"bad {coding} data: {e}") from e
    # Cut inside a stream, or one lone byte of a first header; an empty body is empty.
    if not done and (d is not None or (head and not members)):
        raise ContentDecodeError("truncated", f"the {coding} stream ends before its end")


def _brotli_decode(chunks: Iterable[bytes], coding: str, piece: int) -> Iterator[bytes]:
    """br (RFC 7932) in pieces of about ``piece`` bytes (brotli's
    ``output_buffer_limit`` stops the output buffer growing once it holds ``piece``
    bytes), and at least one (maybe empty) piece per input chunk. Bytes after the end
    of the stream are ignored."""
    d = _brotli.Decompressor()
    try:
        for chunk in chunks:
            data = chunk
            while not d.is_finished():
                out = d.process(data, output_buffer_limit=piece)
                data = b""
                if out:
                    yield out
                if d.can_accept_more_data() and (not out or len(out) < piece):
                    break
            yield b""
        while not d.is_finished():  # output still held back by the limit
            out = d.process(b"", output_buffer_limit=piece)
            if not out:
                break
            yield out
    except _brotli.error as e:
        raise ContentDecodeError("decoding", f"bad {coding} data: {e}") from e
    if not d.is_finished():
        raise ContentDecodeError("truncated", f"the {coding} stream ends before its end")


def decode_content(chunks: Iterable[bytes], codings: Sequence[str],
                   piece_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Decode a body streamed as ``chunks`` (bytes as received) whose ``Content-Encoding``
    is ``codings`` (``content_codings``: in the order applied, so they are undone last
    first, RFC 9110 §8.4). Lazily yields decoded pieces of at most about ``piece_bytes``
    bytes (and empty pieces while input yields no output), so a caller that stops
    consuming at its size limit never holds more than that limit plus one piece: a
    compression bomb costs memory for what is read of it only.

    Raises ``ContentDecodeError`` (kind ``"decoding"``: invalid data; ``"truncated"``:
    the input ends inside the compressed stream) and ``ValueError`` for a coding not in
    ``SUPPORTED_CODINGS``. With no codings the chunks are passed through."""
    stream: Iterable[bytes] = chunks
    for coding in reversed(codings):
        if coding not in SUPPORTED_CODINGS:
            raise ValueError(f"unsupported Content-Encoding {coding!r}")
        decode = _brotli_decode if coding == "br" else _zlib_decode
        stream = decode(stream, coding, piece_bytes)
    yield from stream


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
    (for the fetcher's counters). Both waits also end at the thread's download deadline
    (``pipeline.storage.deadline``): the next attempt then fails at once."""

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
        return _until_deadline(float(max(0.0, min(self.backoff_max, value))))

    def get_retry_after(self, response):
        seconds = super().get_retry_after(response)
        return None if seconds is None else _until_deadline(min(seconds, RETRY_AFTER_MAX_S))


    def parse_retry_after(self, retry_after: str) -> float | None:
        """Seconds of a ``Retry-After`` value (delay-seconds or an HTTP date), or None
        when it is neither (``0.5``, junk): the retry then waits the policy's backoff
        instead of failing the download (urllib3 raises ``InvalidHeader``)."""
        try:
            return super().parse_retry_after(retry_after)
        except urllib3.exceptions.InvalidHeader:
            return None


class _Session(requests.Session):
    """A ``requests.Session`` whose redirects survive a ``Location`` that is not UTF-8."""

    def get_redirect_target(self, resp):
        """The redirect target of ``resp``: ``requests`` decodes the header's bytes as
        UTF-8 (and raises ``UnicodeDecodeError`` on a raw Latin-1 byte); bytes that are
        not valid UTF-8 are percent-encoded instead (RFC 3986 §2.1)."""
        if not resp.is_redirect:
            return None
        raw = resp.headers["location"].encode("latin1", "replace")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in raw)


def _until_deadline(seconds: float) -> float:
    """``seconds``, cut to what is left of the calling thread's download deadline."""
    watch = current_watch()
    if watch is None:
        return seconds
    return max(0.0, min(seconds, watch.deadline - time.monotonic()))


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
    longest wait for any bytes from the server); ``spec.max_time_s`` is the whole-request
    deadline (enforced by a watchdog thread, see the module docstring).
    ``max_bytes`` (bytes) is the largest body accepted, counted after any
    ``Content-Encoding`` is decoded (see the module docstring). Thread-safe: ``fetch`` may be
    called from many threads at once (the connection pool holds ``spec.threads``
    connections per host). ``stats`` counts ``fetches`` (calls), ``requests`` (HTTP
    attempts including retries), ``retries``, ``ok``, ``bytes`` (body bytes returned) and
    ``failed:<kind>`` per failure kind (``http_404``, ``timeout``, ``opted_out``,
    ``egress_refused``, ...).
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
        adapter = GuardedAdapter(EgressPolicy(spec.allow_networks, spec.deny_networks),
                                 max_retries=retry, pool_connections=max(10, spec.threads),
                                 pool_maxsize=max(spec.threads, spec.max_per_host))
        session = _Session()
        session.trust_env = False  # no proxies (they hide the address) and no .netrc
        session.max_redirects = spec.max_redirects
        self._watchdog = Watchdog()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers["User-Agent"] = spec.user_agent
        # Ask for the body as the server stores it (media are compressed already; a
        # coding would only cost CPU). A server may encode it anyway: _read_body decodes.
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
        """A ``failed_to_download`` row; any failure after the deadline fired (the
        watchdog shut the socket) is reported as the deadline."""
        watch = current_watch()
        if watch is not None and watch.expired:
            kind, text = "timeout", self._late()
        self._count(f"failed:{kind}")
        return None, RowError(ErrorReason.FAILED_TO_DOWNLOAD, f"{url}: {text}")

    def _late(self) -> str:
        return f"download took longer than max_time_s {self.spec.max_time_s} s"

    def _refused(self, url: str, exc: EgressRefused) -> tuple[None, RowError]:
        self._count("failed:egress_refused")
        return None, RowError(ErrorReason.EGRESS_REFUSED, f"{url}: {exc}")

    def _too_large(self, text: str) -> tuple[None, RowError]:
        self._count("failed:too_large")
        return None, RowError(ErrorReason.TOO_LARGE, text)

    def fetch(self, url: str) -> tuple[bytes | None, RowError | None]:
        """Download ``url`` (an absolute ``http``/``https`` URL; the scheme in any case,
        RFC 3986 §3.1, requested in lower case): ``(body, None)`` with the body decoded
        from its ``Content-Encoding``, or ``(None, RowError)`` (reason
        ``failed_to_download`` or ``too_large``; the message starts with ``url`` as
        given). Never raises for a per-URL problem (bad URL or scheme, network, HTTP
        status, size, opt-out, content coding)."""
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
        with self._host_slot(host), self._watchdog.watch(self.spec.max_time_s):
            try:
                return self._fetch(url, lower_scheme(url))
            except Exception as e:  # noqa: BLE001 - a per-URL failure is this row's error
                return self._classify(url, e, None)

    def _fetch(self, url: str, request_url: str) -> tuple[bytes | None, RowError | None]:
        self._count("requests")
        timeout = (self.spec.timeout_s, self.spec.timeout_s)
        deadline = time.monotonic() + self.spec.max_time_s
        resp = self._session.get(request_url, timeout=timeout, stream=True,
                                 allow_redirects=True)
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
            codings = content_codings(resp.headers.get("Content-Encoding"))
            unknown = [c for c in codings if c not in SUPPORTED_CODINGS]
            if unknown:  # checked before reading any of the body
                return self._fail("content_encoding", url, f"unsupported Content-Encoding "
                                  f"{unknown[0]!r} (decoded: "
                                  f"{', '.join(sorted(SUPPORTED_CODINGS))})")
            length = self._content_length(resp)  # of the encoded body (RFC 9110 §8.6)
            wire_max = encoded_bound(self.max_bytes) if codings else self.max_bytes
            if length is not None and length > wire_max:
                coded = f" ({', '.join(codings)}-encoded)" if codings else ""
                return self._too_large(f"{length} bytes{coded} > max_bytes {self.max_bytes}")
            return self._read_body(url, resp, codings, length, wire_max, deadline)
        finally:
            resp.close()

    def _read_body(self, url: str, resp: requests.Response, codings: list[str],
                   length: int | None, wire_max: int,
                   deadline: float) -> tuple[bytes | None, RowError | None]:
        """Stream the body, decoding ``codings``: the size limit applies to the decoded
        bytes as they come, the truncation check to the bytes on the wire."""
        wire = 0  # body bytes received (after chunked transfer coding, before decoding)

        def raw() -> Iterator[bytes]:
            nonlocal wire
            for chunk in resp.raw.stream(CHUNK_BYTES, decode_content=False):
                wire += len(chunk)
                yield chunk

        body = bytearray()
        try:
            for piece in decode_content(raw(), codings, CHUNK_BYTES):
                body += piece
                if time.monotonic() > deadline:
                    return self._fail("timeout", url, self._late())
                if len(body) > self.max_bytes:
                    decoded = " decoded" if codings else ""
                    return self._too_large(f"more than {self.max_bytes}{decoded} bytes "
                                           f"> max_bytes {self.max_bytes}")
                if wire > wire_max:  # encoded data that decodes to (almost) nothing
                    return self._too_large(f"more than {wire_max} bytes "
                                           f"({', '.join(codings)}-encoded) > max_bytes "
                                           f"{self.max_bytes}")
        except ContentDecodeError as e:
            if length is not None and wire < length:
                return self._fail("truncated", url, f"truncated body: got {wire} of "
                                  f"{length} bytes")
            if e.kind == "truncated":
                return self._fail("truncated", url, f"truncated body: {e} (got {wire} "
                                  f"bytes)")
            return self._fail("decoding", url, f"bad content encoding: {e}")
        except Exception as e:  # noqa: BLE001 - classified below
            return self._classify(url, e, (resp, length))
        if length is not None and wire < length:  # enforce_content_length off?
            return self._fail("truncated", url, f"truncated body: got {wire} of "
                              f"{length} bytes")
        watch = current_watch()
        if watch is not None and watch.expired:  # EOF from the watchdog's shutdown
            return self._fail("timeout", url, self._late())
        self._count("ok")
        self._count("bytes", len(body))
        return bytes(body), None

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
        refused = next((e for e in chain if isinstance(e, EgressRefused)), None)
        if refused is not None:
            return self._refused(url, refused)

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
        """Close the pooled connections and the deadline thread; the fetcher is not
        used afterwards."""
        self._session.close()
        self._watchdog.close()

    def __enter__(self) -> HttpFetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
