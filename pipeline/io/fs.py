"""The filesystem layer: every path the job touches goes through here.

``resolve(uri)`` maps a URI or local path to a ``pyarrow.fs`` ``(FileSystem, path)``;
the helpers below add retries (``pipeline.io.retry``) and the conditional create used
by commit markers. Only ``pipeline.io.s3`` knows ``s3://`` specifics.
"""

from __future__ import annotations

import contextlib
import hashlib
import dataclasses
import os
import shutil
import tempfile
import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pyarrow.fs as pafs

from pipeline.io import retry, s3

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """A listed file: full ``uri``, ``size_bytes`` and ``mtime_s`` (last modified,
    seconds since the epoch; None if the store does not say)."""

    uri: str
    size_bytes: int
    mtime_s: float | None = None


def configure(endpoint_url: str | None = None, region: str | None = None,
              max_attempts: int = 8, max_concurrency_per_prefix: int = 64) -> None:
    """Set this process's object-store endpoint/region and retry policy."""
    s3.configure(endpoint_url, region)
    retry.configure(max_attempts, max_concurrency_per_prefix)


def is_local(uri: str) -> bool:
    """True if ``uri`` is a plain path or a ``file://`` URI."""
    return "://" not in uri or uri.startswith("file://")


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, path)`` for ``uri``; relative local paths become absolute.

    Raises ``ValueError`` for an unsupported scheme.
    """
    if is_local(uri):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return pafs.LocalFileSystem(), os.path.abspath(path)
    if s3.is_s3(uri):
        bucket, key = s3.split(uri)
        return s3.filesystem(), f"{bucket}/{key}".rstrip("/")
    raise ValueError(f"{uri}: unsupported URI scheme (use a local path or s3://)")


def _for_call(uri: str) -> tuple[pafs.FileSystem, str]:
    """Like ``resolve``, for one whole request retried by ``with_retries`` (S3: no SDK retries)."""
    fsys, path = resolve(uri)
    return (s3.filesystem(sdk_retries=False), path) if s3.is_s3(uri) else (fsys, path)


def normalize(uri: str) -> str:
    """Canonical form of ``uri``: absolute path for local files, no trailing ``/``."""
    return resolve(uri)[1] if is_local(uri) else uri.rstrip("/")


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI or path with ``/``."""
    return posixpath.join(uri.rstrip("/"), *parts) if parts else uri


def with_retries(uri: str, what: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` under the retry policy (throttling tracked per S3 prefix)."""
    prefix = s3.throttle_prefix(uri) if s3.is_s3(uri) else None
    return retry.POLICY.call(fn, uri, what, prefix)


def read_bytes(uri: str) -> bytes:
    """Read a whole object. Raises ``FileNotFoundError`` or ``StorageError`` naming ``uri``."""
    fsys, path = _for_call(uri)

    def read() -> bytes:
        with fsys.open_input_stream(path) as f:
            return f.read()
    return with_retries(uri, "read", read)


@contextlib.contextmanager
def _temp_file(temp_dir: str | None, suffix: str, write: Callable[[str], None]) -> Iterator[str]:
    """A new file in ``temp_dir`` (default: the system temp dir) filled by ``write(path)``;
    yields its path and deletes it when the ``with`` block ends, also on error."""
    fd, local = tempfile.mkstemp(prefix="mmpipe-stage-", suffix=suffix, dir=temp_dir)
    os.close(fd)
    try:
        write(local)
        yield local
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(local)


@contextlib.contextmanager
def staged(uri: str, temp_dir: str | None = None,
           chunk_bytes: int = 8 * 2**20) -> Iterator[str]:
    """Yield a local path holding the object ``uri``; delete it on exit.

    A local ``uri`` is yielded as is (no copy). An object-store ``uri`` is streamed, in
    ``chunk_bytes`` chunks (never whole in memory), into a new file in ``temp_dir``
    (default: the system temp dir), which is deleted when the ``with`` block ends -
    so disk use is one object per ``with`` block in flight. Raises
    ``FileNotFoundError`` or ``StorageError`` naming ``uri``.
    """
    if is_local(uri):
        yield resolve(uri)[1]
        return
    fsys, path = _for_call(uri)

    def copy(local: str) -> None:
        def attempt() -> None:
            with fsys.open_input_stream(path) as src, open(local, "wb") as dst:
                shutil.copyfileobj(src, dst, chunk_bytes)
        with_retries(uri, "stage", attempt)
    with _temp_file(temp_dir, posixpath.splitext(path)[1], copy) as local:
        yield local


def spooled(data: bytes, temp_dir: str | None = None, suffix: str = ""):
    """A context manager yielding a temporary file in ``temp_dir`` that holds ``data``
    (bytes), deleted when the ``with`` block ends - ``staged`` for bytes already in
    memory (a downloaded body, a tar member). ``suffix``: the file name's extension."""
    def write(local: str) -> None:
        with open(local, "wb") as f:
            f.write(data)
    return _temp_file(temp_dir, suffix, write)


class HashingOutput:
    """A file-like output stream to ``uri`` that counts (``size``, bytes) and hashes
    (``sha256``, hex) what is written through it, so a datasink knows its files'
    checksums without reading them back. Local parent directories are created.

    Writes are not retried (a stream cannot be replayed): a storage error propagates as
    ``OSError``/``StorageError`` and the caller aborts the attempt. After ``discard()``
    writes go nowhere (a writer's final flush during an abort).
    """

    def __init__(self, uri: str):
        fsys, path = resolve(uri)
        if is_local(uri):
            fsys.create_dir(posixpath.dirname(path), recursive=True)
        self._stream = fsys.open_output_stream(path)
        self._sha = hashlib.sha256()
        self.size = 0
        self.closed = False
        self._discard = False

    def write(self, data) -> int:
        if not self._discard:
            self._stream.write(data)
            self._sha.update(data)
            self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        """Nothing to do: the underlying stream buffers and uploads by itself."""

    def discard(self) -> None:
        self._discard = True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._stream.close()

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object (creating parent directories on local filesystems)."""
    fsys, path = _for_call(uri)

    def write() -> None:
        if is_local(uri):
            fsys.create_dir(posixpath.dirname(path), recursive=True)
        with fsys.open_output_stream(path) as f:
            f.write(data)
    with_retries(uri, "write", write)


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create ``uri`` with ``data`` only if it does not exist; False if it existed.

    Local: write a temporary file and ``os.link`` it to the final name (atomic; fails if
    the name exists, POSIX). S3: ``PutObject`` with ``If-None-Match: *`` (412 = exists;
    409 ConditionalRequestConflict is retried).
    """
    if s3.is_s3(uri):
        return with_retries(uri, "conditional put", lambda: s3.put_if_absent(uri, data))
    _, path = resolve(uri)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def list_files(uri: str) -> Iterator[FileEntry]:
    """Yield the files under the prefix ``uri`` in sorted order; a missing prefix yields nothing.

    S3 listings stream page by page (memory does not grow with the listing); local
    directories are walked and sorted.
    """
    if s3.is_s3(uri):
        token = None
        while True:
            page, token = with_retries(uri, "list", lambda t=token: s3.list_page(uri, t))
            for item_uri, size, mtime in page:
                yield FileEntry(item_uri, size, mtime)
            if token is None:
                return
    fsys, path = resolve(uri)
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    infos = with_retries(uri, "list", lambda: fsys.get_file_info(selector))
    for info in sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path):
        yield FileEntry(info.path, info.size, info.mtime.timestamp() if info.mtime else None)


def file_size(uri: str) -> int | None:
    """Size in bytes of the file at ``uri``, or None if there is no file there."""
    fsys, path = _for_call(uri)
    info = with_retries(uri, "stat", lambda: fsys.get_file_info(path))
    return info.size if info.type == pafs.FileType.File else None


def exists(uri: str) -> bool:
    """True if a file (or, locally, a directory) exists at ``uri``."""
    if s3.is_s3(uri):
        return file_size(uri) is not None
    fsys, path = resolve(uri)
    return fsys.get_file_info(path).type != pafs.FileType.NotFound


def delete_file(uri: str) -> None:
    """Delete one file; a missing file is not an error."""
    fsys, path = _for_call(uri)
    try:
        with_retries(uri, "delete", lambda: fsys.delete_file(path))
    except FileNotFoundError:
        pass


def delete_tree(uri: str) -> None:
    """Delete ``uri`` and everything under it; a missing path is not an error."""
    if s3.is_s3(uri):
        for entry in list(list_files(uri)):
            delete_file(entry.uri)
        if file_size(uri) is not None:
            delete_file(uri)
        return
    fsys, path = resolve(uri)
    info = fsys.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fsys.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fsys.delete_file(path)
