"""``Fetcher``: the bytes of one record's media, for one partition read.

Separate from listing/planning (``Datasource.list_inputs`` + ``pipeline.output.plan``) and
from reading a partition (``Datasource.read_partition``): a datasource asks a fetcher for
bytes and local files, and the fetcher knows where they live - a local path, an object
store (``pipeline.storage.fs``), an ``http(s)://`` URL (``HttpFetcher``), the text of a
``data:`` URI itself - and how to stage them to a temporary file (video decoding needs a
local file).

URL rules (``normalize_url``; ``is_url`` is True exactly for the values it accepts):

- Schemes are case-insensitive (RFC 3986 §3.1): ``HTTP://``, ``Https://``, ``DATA:`` are
  URLs, fetched with the scheme in lower case. Storage URIs too: ``S3://b/k`` and
  ``FILE:///x`` are read as ``s3://b/k`` and ``file:///x`` (``http.lower_scheme``).
- A protocol-relative reference ``//host/path`` (RFC 3986 §4.2, a "network-path
  reference", common in scraped HTML) is ``https://host/path``
  (``PROTOCOL_RELATIVE_SCHEME``), as a browser on an https page, the usual case today,
  resolves it. ``///path`` (an empty authority) stays a local path.
- ``data:[<mediatype>][;base64],<data>`` (RFC 2397) is decoded here, without any network,
  by ``read_data_uri``; ``max_bytes`` applies to the decoded bytes.

A fetcher lives for one partition read: its HTTP session and download threads are made on
first use and closed by ``close()`` when the partition ends, and its download counters
are that partition's.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import mimetypes
import posixpath
import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote_to_bytes, urlsplit

from pipeline.storage import fs
from pipeline.input.confine import InputRoots, not_a_regular_file, read_bounded, read_error
from pipeline.storage.http import HttpFetcher, lower_scheme
from pipeline.records import ErrorReason, RowError
from pipeline.spec import DownloadSpec

#: The scheme a protocol-relative ``//host/path`` is fetched with (see the module docstring).
PROTOCOL_RELATIVE_SCHEME = "https"
#: Schemes whose URIs ``Fetcher.fetch`` fetches itself (compared lower case).
URL_SCHEMES = ("http", "https", "data")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")  # RFC 3986 §3.1
_B64_SPACE = " \t\n\r\f"  # ASCII whitespace, skipped inside base64 (WHATWG forgiving-base64)


def normalize_url(value: str | None) -> str | None:
    """The URL ``Fetcher.fetch`` fetches for a manifest value, or None when ``value``
    is not such a URL (a local path, ``s3://``, ``file://``, empty, None).

    - ``http``/``https``/``data`` in any case -> the scheme in lower case, the rest
      unchanged (RFC 3986 §3.1: schemes are case-insensitive):
      ``"HTTP://Host/A.jpg"`` -> ``"http://Host/A.jpg"``.
    - ``//host/path`` (a protocol-relative, "network-path" reference, RFC 3986 §4.2)
      -> ``"https://host/path"`` (``PROTOCOL_RELATIVE_SCHEME``); ``///path`` is a path.

    The value is not stripped or otherwise validated (a bad URL becomes a row error when
    fetched). Never raises."""
    if not value:
        return None
    if value.startswith("//") and not value.startswith("///"):
        return f"{PROTOCOL_RELATIVE_SCHEME}:{value}"
    m = _SCHEME.match(value)
    if m is None or m.group(1).lower() not in URL_SCHEMES:
        return None
    return m.group(1).lower() + value[m.end(1):]


def is_url(uri: str | None) -> bool:
    """True when ``Fetcher.fetch`` fetches ``uri`` itself rather than reading storage:
    an ``http``/``https``/``data`` URI with its scheme in any case, or a
    protocol-relative ``//host/path`` (``normalize_url`` is not None)."""
    return normalize_url(uri) is not None


def is_data_uri(uri: str | None) -> bool:
    """True for a ``data:`` URI (RFC 2397), the scheme in any case."""
    return bool(uri) and uri[:5].lower() == "data:"


def _short(uri: str, n: int = 64) -> str:
    """``uri`` cut to ``n`` characters for a message (a data: URI can be megabytes)."""
    return uri if len(uri) <= n else f"{uri[:n]}... ({len(uri)} characters)"


def data_uri_media_type(uri: str) -> str:
    """The media type of a ``data:`` URI without parameters, lower case
    (``"data:Image/PNG;base64,..."`` -> ``"image/png"``); ``"text/plain"`` when absent
    (RFC 2397 §2); ``""`` when ``uri`` is not a ``data:`` URI with a ``,``."""
    if not is_data_uri(uri) or "," not in uri:
        return ""
    return uri[5:uri.index(",")].split(";", 1)[0].strip().lower() or "text/plain"


def read_data_uri(uri: str, max_bytes: int) -> tuple[bytes | None, RowError | None]:
    """The bytes of a ``data:[<mediatype>][;base64],<data>`` URI (RFC 2397):
    ``(data, None)`` or ``(None, RowError)``; never raises.

    The data is percent-decoded (RFC 3986 §2.1); with ``;base64`` (case-insensitive, the
    last parameter) it is then base64-decoded (RFC 4648 §4), ASCII whitespace skipped
    and the ``=`` padding optional (the WHATWG URL standard's "forgiving-base64", what
    browsers accept). ``max_bytes`` (bytes) applies to the decoded data, and is checked
    before decoding where the size is known from the text: base64 without ``%``
    escapes (the decoded size is 3/4 of the base64 characters), plain text of ASCII
    characters without ``%``; a data part longer than ``4 * max_bytes + 1024``
    characters (more than any encoding of ``max_bytes`` bytes, percent-encoded base64
    included) is refused unread. Over the limit: reason ``too_large``
    (``"<n> bytes > max_bytes <m>"``). Malformed (no ``,``, bad base64): reason
    ``failed_to_download``, the message naming the fault and the URI's first 64
    characters."""
    if not is_data_uri(uri):
        return None, RowError(ErrorReason.FAILED_TO_DOWNLOAD, f"{_short(uri)}: not a data: URI")
    header, comma, payload = uri[5:].partition(",")
    if not comma:
        return None, RowError(ErrorReason.FAILED_TO_DOWNLOAD, f"{_short(uri)}: malformed "
                              "data: URI: no ',' before the data (RFC 2397)")
    params = header.split(";")
    b64 = len(params) > 1 and params[-1].strip().lower() == "base64"
    if len(payload) > 4 * max_bytes + 1024:
        return None, RowError(ErrorReason.TOO_LARGE, f"data: URI with {len(payload)} "
                              f"characters of data > max_bytes {max_bytes}")
    if not b64:
        if "%" not in payload and payload.isascii():
            if len(payload) > max_bytes:
                return None, too_large(len(payload), max_bytes)
            data = payload.encode("ascii")
        else:
            data = unquote_to_bytes(payload)  # not larger than the text (UTF-8 aside)
        if len(data) > max_bytes:
            return None, too_large(len(data), max_bytes)
        return data, None
    # Percent-decoded (as latin-1 text: one character per byte; non-ASCII fails below).
    text = unquote_to_bytes(payload).decode("latin-1") if "%" in payload else payload
    chars = len(text) - sum(text.count(c) for c in _B64_SPACE)
    end = text.rstrip(_B64_SPACE)
    pad = (2 if end.endswith("==") else 1 if end.endswith("=") else 0) if chars % 4 == 0 else 0
    size = (chars - pad) * 3 // 4
    if size > max_bytes:  # known from the text: refused before decoding
        return None, too_large(size, max_bytes)
    if chars != len(text):
        text = text.translate({ord(c): None for c in _B64_SPACE})
    if chars % 4 == 1:
        return None, RowError(ErrorReason.FAILED_TO_DOWNLOAD, f"{_short(uri)}: malformed "
                              f"data: URI: invalid base64 ({chars} characters)")
    text += "=" * (-chars % 4)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        return None, RowError(ErrorReason.FAILED_TO_DOWNLOAD, f"{_short(uri)}: malformed "
                              f"data: URI: invalid base64: {e}")
    if len(data) > max_bytes:  # (not reached: size is exact)
        return None, too_large(len(data), max_bytes)
    return data, None


def too_large(size_bytes: int, max_bytes: int) -> RowError:
    """The ``too_large`` error of an object of ``size_bytes`` bytes over ``max_bytes``."""
    return RowError(ErrorReason.TOO_LARGE, f"{size_bytes} bytes > max_bytes {max_bytes}")


class Fetcher:
    """Reads media for one partition.

    ``max_bytes``: the largest object accepted (bytes; ``decode.max_bytes``).
    ``download``: HTTP settings. ``temp_dir``: where staged files go (None: the system
    temp dir). ``stage_media``: the media are decoded from local files (video), so
    ``fetch`` checks sizes but leaves local/object-store media unread. ``roots``: the
    input roots local/object-store media must be under (``pipeline.input.confine``; None:
    anywhere), unless a ``fetch`` call names others.
    """

    def __init__(self, max_bytes: int, download: DownloadSpec, temp_dir: str | None,
                 stage_media: bool, roots: InputRoots | None = None):
        self.max_bytes = max_bytes
        self.roots = roots
        self.download = download
        self.temp_dir = temp_dir
        self.stage_media = stage_media
        self._http: HttpFetcher | None = None
        self._pool: ThreadPoolExecutor | None = None

    def downloads(self) -> ThreadPoolExecutor:
        """The download threads (``download.threads``), made on first use."""
        if self._http is None:
            self._http = HttpFetcher(self.download, self.max_bytes)
            self._pool = ThreadPoolExecutor(self.download.threads,
                                            thread_name_prefix="mmpipe-download")
        return self._pool

    def fetch(self, uri: str, size_bytes: int | None,
              roots: InputRoots | None = None) -> tuple[bytes | None, RowError | None]:
        """Read one media object: ``(bytes, None)`` or ``(None, RowError)``.

        ``size_bytes``: the listed size, checked against ``max_bytes`` before reading, or
        None if unknown (then checked after). URLs (``normalize_url``: any scheme case,
        protocol-relative -> https) go through ``HttpFetcher`` (which stops reading past
        ``max_bytes`` decoded bytes); ``data:`` URIs are decoded by ``read_data_uri``.
        Storage URIs are read with their scheme in lower case (``S3://`` -> ``s3://``),
        only under ``roots`` (default: the fetcher's; else ``outside_input_root``), only
        regular files, never more than ``max_bytes + 1`` bytes (``confine.read_bounded``).
        With ``stage_media``, local and object-store media are not read here
        (``(None, None)``): ``stage`` makes them a local file.
        """
        if size_bytes is not None and size_bytes > self.max_bytes:
            return None, too_large(size_bytes, self.max_bytes)
        url = normalize_url(uri)
        if url is not None:
            if is_data_uri(url):
                return read_data_uri(url, self.max_bytes)
            self.downloads()
            return self._http.fetch(url)
        roots = roots if roots is not None else self.roots
        error = roots.check(uri) if roots is not None else None
        if error is not None:
            return None, error
        try:
            uri = lower_scheme(uri)
            if self.stage_media:
                odd = not_a_regular_file(uri) if fs.is_local(uri) else None
                if odd is not None:  # decoded in place later: a FIFO would block FFmpeg
                    return None, odd
                size_bytes = fs.file_size(uri) if size_bytes is None else size_bytes
                if size_bytes is None:
                    raise FileNotFoundError(uri)
                if size_bytes > self.max_bytes:
                    return None, too_large(size_bytes, self.max_bytes)
                return None, None
        except Exception as e:  # noqa: BLE001 - a read failure is this record's error
            return None, read_error(uri, e)
        return read_bounded(uri, self.max_bytes, roots)

    def stage(self, uri: str, data: bytes | None,
              stack: contextlib.ExitStack) -> tuple[str | None, RowError | None]:
        """A local file holding a record's media, deleted when ``stack`` closes:
        ``data`` (already in memory) spooled to a temp file, else the object ``uri``
        itself (local: in place; object store: streamed to a temp file)."""
        try:
            if data is None:
                return stack.enter_context(fs.staged(lower_scheme(uri), self.temp_dir)), None
            return stack.enter_context(fs.spooled(data, self.temp_dir, _suffix(uri))), None
        except Exception as e:  # noqa: BLE001 - a staging failure is this record's error
            return None, read_error(uri, e)

    def stats(self) -> dict[str, int]:
        """HTTP counters of this fetcher (``HttpFetcher.stats``); empty if nothing was
        downloaded."""
        return self._http.stats if self._http is not None else {}

    def close(self) -> None:
        """Close the HTTP session and stop the download threads."""
        if self._http is not None:
            self._http.close()
            self._pool.shutdown(wait=True)
            self._http = self._pool = None


def _suffix(uri: str) -> str:
    """A file name suffix for staged bytes of ``uri`` (up to 8 characters): a ``data:``
    URI's media type's usual extension, a URL path's, else the part after ``#``'s."""
    if is_data_uri(uri):
        return (mimetypes.guess_extension(data_uri_media_type(uri)) or "")[:8]
    url = normalize_url(uri)
    if url is not None:
        try:
            return posixpath.splitext(urlsplit(url).path)[1][:8]
        except ValueError:
            return ""
    return posixpath.splitext(uri.split("#")[-1])[1][:8]
