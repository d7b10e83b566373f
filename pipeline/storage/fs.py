"""The filesystem layer: every path the job touches goes through here.

``resolve(uri)`` maps a URI or local path to a ``pyarrow.fs`` ``(FileSystem, path)``;
the helpers below add retries (``pipeline.storage.retry``) and the conditional create used
by commit markers. Only ``pipeline.storage.s3`` knows ``s3://`` specifics.

Local file names that are not valid UTF-8 (Linux allows any bytes but ``/`` and NUL):
a URI is always a ``str``; the raw bytes of a local name are decoded as UTF-8 with
``surrogateescape`` (each undecodable byte ``0xNN`` becomes the lone surrogate
``U+DCNN``, as ``os.fsdecode`` does on Linux), so ``uri_to_bytes``/``uri_from_bytes``
round-trip losslessly. ``list_files``, ``read_bytes``, ``staged``, ``file_size`` and
``exists`` open local paths through the OS with those raw bytes (``pyarrow`` cannot:
it needs UTF-8). ``display_uri`` is the valid-UTF-8 text for messages (``\\xNN`` per
undecodable byte); the ``source_uri`` column percent-encodes instead
(``pipeline.input.source_uri``). S3 keys are always valid UTF-8.
"""

from __future__ import annotations

import contextlib
import hashlib
import dataclasses
import os
import shutil
import stat
import tempfile
import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow.fs as pafs

from pipeline.storage import retry, s3

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """A listed file: full ``uri``, ``size_bytes`` and ``mtime_s`` (last modified,
    seconds since the epoch; None if the store does not say)."""

    uri: str
    size_bytes: int
    mtime_s: float | None = None


#: ``storage.local_permissions`` -> (file mode, folder mode) of what is created locally.
PERMISSIONS: dict[str, tuple[int, int]] = {"owner": (0o600, 0o700), "group": (0o640, 0o750),
                                           "all": (0o644, 0o755)}
_modes: tuple[int, int] = PERMISSIONS["owner"]


def configure(endpoint_url: str | None = None, region: str | None = None,
              max_attempts: int = 8, max_concurrency_per_prefix: int = 64,
              from_env: bool = True, local_permissions: str = "owner",
              outage_s: float = 300.0) -> None:
    """Set this process's object-store endpoint/region, retry policy and the modes of the
    local files and folders it creates (``local_permissions``: a key of ``PERMISSIONS``;
    ``ValueError`` for another). ``from_env=False`` (actors of a job): None means AWS
    itself, not this process's ``AWS_ENDPOINT_URL*`` / ``AWS_REGION`` (see
    ``resolved_storage``)."""
    if local_permissions not in PERMISSIONS:
        raise ValueError(f"local_permissions {local_permissions!r}: one of {sorted(PERMISSIONS)}")
    s3.configure(endpoint_url, region, from_env)
    retry.configure(max_attempts, max_concurrency_per_prefix, outage_s)  # outage_s: retry.py
    set_local_permissions(local_permissions)


def set_local_permissions(local_permissions: str = "owner") -> None:
    """Set only the modes of what this process creates locally (``configure``'s
    ``local_permissions``; ``ValueError`` for a name not in ``PERMISSIONS``)."""
    global _modes
    if local_permissions not in PERMISSIONS:
        raise ValueError(f"local_permissions {local_permissions!r}: one of {sorted(PERMISSIONS)}")
    _modes = PERMISSIONS[local_permissions]


def local_modes() -> tuple[int, int]:
    """``(file mode, folder mode)`` this process gives the local files and folders it
    creates (``configure``; default owner-only, 0600/0700)."""
    return _modes


def make_dirs(path: str) -> None:
    """Create the local directory ``path`` and its missing parents, each with the folder
    mode of ``local_modes`` set exactly (not masked by the umask); existing ones are left
    as they are. Raises ``OSError``."""
    missing = []
    head = os.path.abspath(path)
    while not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, _modes[1])
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            continue
        os.chmod(d, _modes[1])


def restrict_local_tree(path: str) -> None:
    """Give every file and folder below the local directory ``path`` (not ``path``
    itself) the modes of ``local_modes``: for files a library wrote with its own modes
    (``mmpipe export``'s ``pyarrow.dataset.write_dataset``). Raises ``OSError``."""
    for top, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(top, name), _modes[1])
        for name in files:
            os.chmod(os.path.join(top, name), _modes[0])


def open_new_local(path: str, exclusive: bool = False):
    """A binary file object writing the local file ``path`` (truncated if it exists;
    ``exclusive``: ``FileExistsError`` if it does), created with the file mode of
    ``local_modes`` set exactly, its parent folders by ``make_dirs``. Raises ``OSError``."""
    make_dirs(os.path.dirname(os.path.abspath(path)))
    flags = (os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
             | (os.O_EXCL if exclusive else os.O_TRUNC))
    fd = os.open(path, flags, _modes[0])
    try:
        os.fchmod(fd, _modes[0])
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "wb")


def open_output(uri: str):
    """A ``pyarrow`` output stream writing ``uri``: local files are created first with
    ``open_new_local``'s modes (pyarrow keeps the mode of a file it truncates); S3 objects
    have no mode. Raises ``OSError``/``StorageError``."""
    fsys, path = resolve(uri)
    if is_local(uri):
        open_new_local(path).close()
    return fsys.open_output_stream(path)


def resolved_storage() -> dict[str, str | None]:
    """``{"endpoint_url": ..., "region": ...}`` as this process resolves them now (the
    spec's values, else its environment's, else AWS and ``us-east-1``): what the driver
    writes into the spec it sends to its actors, so that they use the job's storage."""
    s = s3.SETTINGS.resolved()
    return {"endpoint_url": s.endpoint_url, "region": s.region}


def is_local(uri: str) -> bool:
    """True if ``uri`` is a plain path or a ``file://`` URI."""
    return "://" not in uri or uri.startswith("file://")


def uri_to_bytes(uri: str) -> bytes:
    """The raw bytes of ``uri``: UTF-8, each lone surrogate ``U+DC80..U+DCFF`` back to
    its byte ``0x80..0xFF`` (``surrogateescape``; the inverse of ``uri_from_bytes``, for
    storing URIs losslessly, e.g. as Parquet ``binary``). Raises ``UnicodeEncodeError``
    (a ``ValueError``) for another lone surrogate, which no file name can produce."""
    return uri.encode("utf-8", "surrogateescape")


def uri_from_bytes(raw: bytes) -> str:
    """The URI ``str`` of raw name bytes: UTF-8 with ``surrogateescape`` (each undecodable
    byte ``0xNN`` -> ``U+DCNN``, as ``os.fsdecode`` on Linux). Never raises; lossless:
    ``uri_to_bytes(uri_from_bytes(b)) == b``."""
    return raw.decode("utf-8", "surrogateescape")


def is_valid_name(uri: str) -> bool:
    """True if ``uri`` is valid Unicode text (encodable as strict UTF-8), False if it
    holds undecodable name bytes (lone surrogates, see ``uri_from_bytes``)."""
    try:
        uri.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def display_uri(uri: str) -> str:
    """``uri`` as valid UTF-8 text for output columns, logs and error messages: each
    undecodable name byte ``0xNN`` (lone surrogate ``U+DCNN``) is written as the four
    characters ``\\xNN`` (e.g. ``b"caf\\xe9.jpg"`` -> ``"caf\\xe9.jpg"``). A valid
    ``uri`` is returned unchanged. Not reversible (a name may spell ``\\xNN``
    literally): keep ``uri``/``uri_to_bytes`` to reopen the file. Never raises."""
    if is_valid_name(uri):
        return uri
    try:
        raw = uri.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:      # a surrogate no name decodes to: show its code point
        return uri.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _local_bytes(uri: str) -> bytes:
    """Absolute local path of ``uri`` (plain path or ``file://``) as raw OS bytes."""
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return os.path.abspath(uri_to_bytes(path))


def _named(exc: OSError, uri: str) -> OSError:
    """``exc`` again (same type and errno) with a message naming ``display_uri(uri)``."""
    if exc.errno is None:
        return exc
    return type(exc)(exc.errno, f"{exc.strerror}: {display_uri(uri)}")


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, path)`` for ``uri``; relative local paths become absolute.

    A local path that is not valid UTF-8 (``is_valid_name`` False) is returned as is,
    but ``pyarrow`` cannot open it (``UnicodeEncodeError``): read such files with
    ``read_bytes``/``staged``/``file_size``/``exists``. Raises ``ValueError`` for an
    unsupported scheme.
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
    """Read a whole object. Raises ``FileNotFoundError`` or ``StorageError`` naming ``uri``
    (local: any ``OSError``, e.g. ``IsADirectoryError``, naming ``display_uri(uri)``).
    A local ``uri`` may hold undecodable name bytes (see the module docstring)."""
    if is_local(uri):
        path_b = _local_bytes(uri)

        def read_local() -> bytes:
            try:
                with open(path_b, "rb") as f:
                    return f.read()
            except OSError as e:
                raise _named(e, uri) from None
        return with_retries(display_uri(uri), "read", read_local)
    fsys, path = _for_call(uri)

    def read() -> bytes:
        with fsys.open_input_stream(path) as f:
            return f.read()
    return with_retries(uri, "read", read)


def read_head(uri: str, n_bytes: int) -> bytes:
    """Read at most the first ``n_bytes`` bytes of the object ``uri`` (an object store: a
    bounded read, never the whole object; local: ``pipeline.input.confine`` reads local
    files). Raises ``FileNotFoundError`` or ``StorageError`` naming ``uri``."""
    fsys, path = _for_call(uri)

    def read() -> bytes:
        with fsys.open_input_stream(path) as f:
            return f.read(n_bytes)
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

    A local ``uri`` is yielded as its absolute path (no copy). When that path is not
    valid UTF-8 (``is_valid_name`` False), a symbolic link with a valid name
    (``mmpipe-stage-*<ext>``, in ``temp_dir``) to the raw-bytes path is yielded instead,
    and removed on exit, so libraries that need UTF-8 paths (pyarrow, FFmpeg) open it
    too; ``FileNotFoundError`` naming ``display_uri(uri)`` if there is no such file.
    An object-store ``uri`` is streamed, in
    ``chunk_bytes`` chunks (never whole in memory), into a new file in ``temp_dir``
    (default: the system temp dir), which is deleted when the ``with`` block ends -
    so disk use is one object per ``with`` block in flight. Raises
    ``FileNotFoundError`` or ``StorageError`` naming ``uri``.
    """
    if is_local(uri):
        path = resolve(uri)[1]
        if is_valid_name(path):
            yield path
            return
        with _safe_link(uri, temp_dir) as link:
            yield link
        return
    fsys, path = _for_call(uri)

    def copy(local: str) -> None:
        def attempt() -> None:
            with fsys.open_input_stream(path) as src, open(local, "wb") as dst:
                shutil.copyfileobj(src, dst, chunk_bytes)
        with_retries(uri, "stage", attempt)
    with _temp_file(temp_dir, posixpath.splitext(path)[1], copy) as local:
        yield local


@contextlib.contextmanager
def _safe_link(uri: str, temp_dir: str | None) -> Iterator[str]:
    """A valid-UTF-8 path in ``temp_dir`` that opens the local file ``uri`` (whose name is
    not valid UTF-8): a symlink, or a copy where symlinks fail; removed on exit."""
    target = _local_bytes(uri)
    if not os.path.exists(target):
        raise FileNotFoundError(2, f"No such file or directory: {display_uri(uri)}")
    ext = posixpath.splitext(display_uri(uri))[1]
    ext = ext if ext.isascii() and "\\" not in ext and len(ext) <= 16 else ""
    link = os.path.join(temp_dir or tempfile.gettempdir(),
                        f"mmpipe-stage-{uuid.uuid4().hex}{ext}")
    try:
        os.symlink(target, link)
    except OSError:
        def copy(local: str) -> None:
            try:
                shutil.copyfile(target, local)
            except OSError as e:
                raise _named(e, uri) from None
        with _temp_file(temp_dir, ext, copy) as local:
            yield local
        return
    try:
        yield link
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(link)


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
        self._stream = open_output(uri)
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
    """Write a whole object, atomically: a reader sees the old content or the new, never
    a part (a full disk, a crash mid-write). Local: ``write_local_atomic`` (parent
    directories created); S3: one ``PutObject``, atomic by itself."""
    fsys, path = _for_call(uri)

    def write() -> None:
        if is_local(uri):
            write_local_atomic(path, lambda f: f.write(data))
            return
        with fsys.open_output_stream(path) as f:
            f.write(data)
    with_retries(uri, "write", write)


def write_local_atomic(path: str, write: Callable[[Any], object]) -> None:
    """Fill the local file ``path`` atomically: ``write(f)`` writes a new temporary file
    beside it (``<name>.tmp-<hex>``, modes of ``open_new_local``), which is flushed,
    ``fsync``-ed and renamed over ``path`` (``os.replace``: atomic on POSIX). If ``write``
    or any step raises, the temporary file is removed and ``path`` is left as it was;
    the exception propagates (``OSError``, e.g. ENOSPC)."""
    _publish_local(path, write, os.replace)


def _publish_local(path: str, write: Callable[[Any], object],
                   publish: Callable[[str, str], None]) -> None:
    """``write(f)`` a new temporary file beside ``path`` (flushed, ``fsync``-ed), then
    ``publish(tmp, path)`` (``os.replace``: overwrite; ``os.link``: create only, raising
    ``FileExistsError``). The temporary file is gone afterwards, whatever raised: never
    a partial file under ``path``."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open_new_local(tmp, exclusive=True) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)
    finally:                     # also when the write failed (a full disk)
        with contextlib.suppress(OSError):
            os.unlink(tmp)       # after os.replace it is already gone


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create ``uri`` with ``data`` only if it does not exist; False if it existed.

    Local: write a temporary file and ``os.link`` it to the final name (atomic; fails if
    the name exists, POSIX). S3: ``PutObject`` with ``If-None-Match: *`` (412 = exists;
    409 ConditionalRequestConflict is retried).
    """
    if s3.is_s3(uri):
        return with_retries(uri, "conditional put", lambda: s3.put_if_absent(uri, data))
    _, path = resolve(uri)
    try:
        _publish_local(path, lambda f: f.write(data), os.link)
        return True
    except FileExistsError:
        return False


def list_files(uri: str, skipped: Callable[[str, str], None] | None = None
               ) -> Iterator[FileEntry]:
    """Yield the files under the prefix ``uri`` in sorted order; a missing prefix yields nothing.

    Sorted means ascending ``FileEntry.uri`` as Python ``str`` comparison (code point
    order), so a caller may check the order with ``<``. For valid UTF-8 names this is
    the order of their UTF-8 bytes, i.e. S3's key order; either way all names with a
    common prefix (all files of one stem ``s.``) are contiguous.

    S3 listings stream page by page (memory does not grow with the listing). Local
    directories are walked (``os.scandir`` on raw byte paths; symbolic links to files and
    directories are followed, a link back to a directory being walked is not), and
    sorted in memory: every regular file is listed, whatever bytes its name holds; its
    ``uri`` is its absolute path (no ``file://``) decoded with ``uri_from_bytes``
    (undecodable bytes -> lone surrogates; ``display_uri`` for text). Raises
    ``StorageError`` (an ``OSError``) if a local ``uri`` is a file or a directory under it
    cannot be read, and for S3 errors; ``ValueError`` for an unsupported scheme.
    ``skipped(uri, kind)``, if given, is called for each local entry that is neither a
    regular file nor a directory (``kind``: ``fifo``, ``socket``, ``character device``,
    ``block device``, ``dangling link``), so a caller can account for it.
    """
    if s3.is_s3(uri):
        token = None
        while True:
            page, token = with_retries(uri, "list", lambda t=token: s3.list_page(uri, t))
            for item_uri, size, mtime in page:
                yield FileEntry(item_uri, size, mtime)
            if token is None:
                return
    if not is_local(uri):
        resolve(uri)                    # ValueError: unsupported scheme
    root = _local_bytes(uri)
    odd: list[tuple[str, str]] = []

    def walk() -> list[FileEntry]:
        odd.clear()
        return _walk_local(root, uri, odd)
    entries = with_retries(display_uri(uri), "list", walk)
    if skipped is not None:
        for name, kind in sorted(odd):
            skipped(name, kind)
    entries.sort(key=lambda e: e.uri)
    yield from entries


_ODD_KINDS = ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
              (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


def _walk_local(root: bytes, uri: str,
                odd: list[tuple[str, str]] | None = None) -> list[FileEntry]:
    """Every regular file under the local directory ``root`` (raw bytes), unsorted; the
    other entries that are not directories go to ``odd`` as ``(uri, kind)``."""
    out: list[FileEntry] = []
    try:
        st = os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return out
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(20, f"Not a directory, cannot list: {display_uri(uri)}")
    stack: list[tuple[bytes, frozenset]] = [(root, frozenset({(st.st_dev, st.st_ino)}))]
    while stack:
        directory, ancestors = stack.pop()
        try:
            with os.scandir(directory) as it:
                found = list(it)
        except OSError as e:
            raise _named(e, uri_from_bytes(directory)) from None
        for entry in found:
            try:
                est = entry.stat()         # follows symlinks
            except OSError:                # a dangling link, or gone meanwhile
                if odd is not None and entry.is_symlink():
                    odd.append((uri_from_bytes(entry.path), "dangling link"))
                continue
            if stat.S_ISDIR(est.st_mode):
                ident = (est.st_dev, est.st_ino)
                if ident not in ancestors:   # a link to an enclosing directory: a cycle
                    stack.append((entry.path, ancestors | {ident}))
            elif stat.S_ISREG(est.st_mode):
                out.append(FileEntry(uri_from_bytes(entry.path), est.st_size, est.st_mtime))
            elif odd is not None:
                kind = next((k for test, k in _ODD_KINDS if test(est.st_mode)), "special file")
                odd.append((uri_from_bytes(entry.path), kind))
    return out


def file_size(uri: str) -> int | None:
    """Size in bytes of the file at ``uri``, or None if there is no (regular) file there.
    A local ``uri`` may hold undecodable name bytes. Raises ``StorageError``."""
    if is_local(uri):
        def stat_local() -> os.stat_result | None:
            try:
                return os.stat(_local_bytes(uri))
            except (FileNotFoundError, NotADirectoryError):
                return None
        st = with_retries(display_uri(uri), "stat", stat_local)
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None
    fsys, path = _for_call(uri)
    info = with_retries(uri, "stat", lambda: fsys.get_file_info(path))
    return info.size if info.type == pafs.FileType.File else None


def exists(uri: str) -> bool:
    """True if a file (or, locally, a directory) exists at ``uri``."""
    if s3.is_s3(uri):
        return file_size(uri) is not None
    if is_local(uri):
        return os.path.exists(_local_bytes(uri))
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
