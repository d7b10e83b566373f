"""``Fetcher``: the bytes of one record's media, for one partition read.

Separate from listing/planning (``Datasource.list_inputs`` + ``pipeline.io.plan``) and
from reading a partition (``Datasource.read_partition``): a datasource asks a fetcher for
bytes and local files, and the fetcher knows where they live - a local path, an object
store (``pipeline.io.fs``), an ``http(s)://`` URL (``HttpFetcher``) - and how to stage
them to a temporary file (video decoding needs a local file).

A fetcher lives for one partition read: its HTTP session and download threads are made on
first use and closed by ``close()`` when the partition ends, and its download counters
are that partition's.
"""

from __future__ import annotations

import contextlib
import posixpath
from concurrent.futures import ThreadPoolExecutor

from pipeline.io import fs
from pipeline.io.http import HttpFetcher
from pipeline.records import ErrorReason, RowError
from pipeline.spec import DownloadSpec


def is_url(uri: str | None) -> bool:
    """True for an ``http://`` or ``https://`` URI."""
    return bool(uri) and uri.startswith(("http://", "https://"))


def too_large(size_bytes: int, max_bytes: int) -> RowError:
    return RowError(ErrorReason.TOO_LARGE, f"{size_bytes} bytes > max_bytes {max_bytes}")


class Fetcher:
    """Reads media for one partition.

    ``max_bytes``: the largest object accepted (bytes; ``decode.max_bytes``).
    ``download``: HTTP settings. ``temp_dir``: where staged files go (None: the system
    temp dir). ``stage_media``: the media are decoded from local files (video), so
    ``fetch`` checks sizes but leaves local/object-store media unread.
    """

    def __init__(self, max_bytes: int, download: DownloadSpec, temp_dir: str | None,
                 stage_media: bool):
        self.max_bytes = max_bytes
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

    def fetch(self, uri: str, size_bytes: int | None) -> tuple[bytes | None, RowError | None]:
        """Read one media object: ``(bytes, None)`` or ``(None, RowError)``.

        ``size_bytes``: the listed size, checked against ``max_bytes`` before reading, or
        None if unknown (then checked after). URLs go through ``HttpFetcher`` (which stops
        reading past ``max_bytes``). With ``stage_media``, local and object-store media are
        not read here (``(None, None)``): ``stage`` makes them a local file.
        """
        if size_bytes is not None and size_bytes > self.max_bytes:
            return None, too_large(size_bytes, self.max_bytes)
        if is_url(uri):
            self.downloads()
            return self._http.fetch(uri)
        try:
            if self.stage_media:
                size_bytes = fs.file_size(uri) if size_bytes is None else size_bytes
                if size_bytes is None:
                    raise FileNotFoundError(uri)
                if size_bytes > self.max_bytes:
                    return None, too_large(size_bytes, self.max_bytes)
                return None, None
            data = fs.read_bytes(uri)
        except Exception as e:  # noqa: BLE001 - a read failure is this record's error
            return None, RowError(ErrorReason.READ_FAILED, f"{uri}: {e}")
        if len(data) > self.max_bytes:
            return None, too_large(len(data), self.max_bytes)
        return data, None

    def stage(self, uri: str, data: bytes | None,
              stack: contextlib.ExitStack) -> tuple[str | None, RowError | None]:
        """A local file holding a record's media, deleted when ``stack`` closes:
        ``data`` (already in memory) spooled to a temp file, else the object ``uri``
        itself (local: in place; object store: streamed to a temp file)."""
        try:
            if data is None:
                return stack.enter_context(fs.staged(uri, self.temp_dir)), None
            suffix = posixpath.splitext(uri.split("#")[-1])[1][:8]
            return stack.enter_context(fs.spooled(data, self.temp_dir, suffix)), None
        except Exception as e:  # noqa: BLE001 - a staging failure is this record's error
            return None, RowError(ErrorReason.READ_FAILED, f"{uri}: {e}")

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
