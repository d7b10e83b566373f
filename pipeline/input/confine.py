"""Input confinement: a job reads only under its input roots, and only regular files.

A job's input is written by strangers: a manifest row may name ``/etc/passwd``,
``../../secrets``, ``file:///proc/self/environ`` or another bucket's object, and a
``files`` input may hold a symlink out of it. ``InputRoots`` says what may be read:
``source.uri``, ``source.allowed_roots`` and, for a manifest that ``source.uri`` names
itself, that manifest's directory or prefix (``manifest_root``, ``with_root``; never a
bucket root or ``/``: a stranger's manifest there would open the whole bucket or disk).
Hidden files and folders (a path component starting with ``.`` below the root, e.g.
``.aws/credentials``, ``.ssh/id_rsa``, ``.ray/auth_token``) are refused under every root
unless ``source.allow_hidden`` (a root that is itself hidden, declared in
``source.allowed_roots``, admits what is below it). Local paths are compared by real path
(symlinks resolved, ``..`` collapsed: ``os.path.realpath``), and checked again on the file actually opened
(``/proc/self/fd``), so a symlink swapped in between the check and the open does not
escape. S3 keys are compared by bucket and prefix (a key with a ``.`` or ``..`` segment
is refused: stores differ on whether they collapse it). ``file://`` URIs in manifest rows
are refused outright.

``read_bounded`` reads one object under these rules: a local path is opened without
blocking (a FIFO never blocks the worker), must be a regular file (a FIFO, a device such
as ``/dev/zero``, a directory: ``not_a_file``), and at most ``max_bytes + 1`` bytes are
ever read (``too_large`` past ``max_bytes``), locally and from S3 (a ranged read).
Refusals are ``RowError`` values (``outside_input_root``, ``not_a_file``, ``too_large``,
``read_failed``), never exceptions.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Iterable

from pipeline.records import ErrorReason, RowError
from pipeline.storage import fs, s3
from pipeline.storage.http import lower_scheme

CHUNK_BYTES = 1 << 20  # local read size (bytes)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def _under(path: str, root: str, sep: str = "/") -> bool:
    """True if ``path`` is ``root`` or below it (a ``/`` boundary: ``/a/bc`` is not
    under ``/a/b``)."""
    return path == root or path.startswith(root.rstrip(sep) + sep)


def _real(uri: str) -> str:
    """The real absolute path of a local ``uri`` (plain path or ``file://``), symlinks resolved."""
    return fs.uri_from_bytes(os.path.realpath(fs._local_bytes(uri)))


class InputRoots:
    """The roots a job may read under (see the module docstring).

    ``roots``: local paths or ``s3://bucket/prefix`` URIs (a root may be a single file, e.g.
    a shard named by ``source.uri``). Local roots are resolved to real paths when made.
    Immutable; ``with_root`` returns a new instance. Raises ``ValueError`` for a root
    that is neither local nor ``s3://``.
    """

    def __init__(self, roots: Iterable[str], allow_hidden: bool = False):
        self.allow_hidden = allow_hidden
        local, remote = [], []
        for root in roots:
            root = lower_scheme(root) if "://" in root else root
            if s3.is_s3(root):
                s3.split(root)  # ValueError without a bucket
                remote.append(root.rstrip("/"))
            elif fs.is_local(root):
                local.append(_real(root))
            else:
                raise ValueError(f"input root {root!r}: use a local path or s3://bucket/prefix")
        self.local = tuple(dict.fromkeys(local))
        self.s3 = tuple(dict.fromkeys(remote))

    @classmethod
    def of_source(cls, uri: str, allowed_roots: Iterable[str] = (),
                  allow_hidden: bool = False) -> InputRoots:
        """The roots of a source: ``source.uri`` and ``source.allowed_roots``;
        ``allow_hidden``: ``source.allow_hidden`` (see the module docstring)."""
        return cls([uri, *allowed_roots], allow_hidden)

    def with_root(self, uri: str) -> InputRoots:
        """These roots plus ``uri`` (e.g. a manifest's directory)."""
        out = InputRoots((), self.allow_hidden)
        extra = InputRoots([uri])
        out.local = tuple(dict.fromkeys(self.local + extra.local))
        out.s3 = tuple(dict.fromkeys(self.s3 + extra.s3))
        return out

    def describe(self) -> str:
        """The roots as text for messages."""
        return ", ".join(fs.display_uri(r) for r in self.local + self.s3) or "(none)"

    def _refused(self, uri: str, why: str) -> RowError:
        return RowError(ErrorReason.OUTSIDE_INPUT_ROOT,
                        f"{fs.display_uri(uri)}: {why}; input roots: {self.describe()} "
                        f"(add a root to source.allowed_roots to read it)")

    def contains_real(self, real: str) -> bool:
        """True if the real local path ``real`` is under a local root (and, unless
        ``allow_hidden``, not hidden below it: ``_admits``)."""
        return self._admits(real, self.local) is None

    def _admits(self, path: str, roots: tuple[str, ...]) -> str | None:
        """None if ``path`` is under one of ``roots`` with no hidden component below that
        root (any component, with ``allow_hidden``), else why not."""
        under = [root for root in roots if _under(path, root)]
        if not under:
            return "outside the input roots"
        if self.allow_hidden:
            return None
        hidden = None
        for root in under:
            below = path[len(root.rstrip("/")):].strip("/")
            found = next((c for c in below.split("/") if c.startswith(".")), None)
            if found is None:
                return None
            hidden = hidden or found
        return (f"hidden file or folder {hidden!r} (set source.allow_hidden: true to "
                "read hidden paths)")

    def check(self, uri: str) -> RowError | None:
        """None if ``uri`` (a local path, ``s3://`` URI) is under a root (and, unless
        ``allow_hidden``, has no hidden component below it), else the
        ``outside_input_root`` error naming it and why. ``file://`` is always refused; other
        schemes are left to the reader (which fails with ``read_failed``). Never raises."""
        if uri[:5].lower() == "file:":
            return self._refused(uri, "file:// URIs are not read from the input")
        uri = lower_scheme(uri)
        if s3.is_s3(uri):
            try:
                bucket, key = s3.split(uri)
            except ValueError as e:
                return self._refused(uri, str(e))
            if any(seg in (".", "..") for seg in key.split("/")):
                return self._refused(uri, "'.' or '..' in an object key")
            why = self._admits(f"s3://{bucket}/{key}".rstrip("/"), self.s3)
            return None if why is None else self._refused(uri, why)
        if "://" in uri:
            return None
        try:
            real = _real(uri)
        except (OSError, ValueError) as e:
            return self._refused(uri, f"cannot resolve: {e}")
        why = self._admits(real, self.local)
        if why is None:
            return None
        shown = "" if real == os.path.abspath(uri) else f" (resolves to {fs.display_uri(real)})"
        return self._refused(uri, f"{why}{shown}")


def _too_large(size: str, max_bytes: int) -> RowError:
    return RowError(ErrorReason.TOO_LARGE, f"{size} bytes > max_bytes {max_bytes}")


def _fd_real(fd: int, fallback: str) -> str:
    """The real path of the open file ``fd`` (Linux ``/proc/self/fd``), else ``fallback``
    resolved again."""
    try:
        return fs.uri_from_bytes(os.readlink(f"/proc/self/fd/{fd}".encode()))
    except OSError:
        return _real(fallback)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read_local(uri: str, max_bytes: int,
                roots: InputRoots) -> tuple[bytes | None, RowError | None]:
    """Open without blocking, check regular file and real path, read <= max_bytes + 1."""
    try:
        fd = os.open(fs._local_bytes(uri), _OPEN_FLAGS)
    except OSError as e:
        return None, read_error(fs.display_uri(uri), e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, RowError(ErrorReason.NOT_A_FILE, f"{fs.display_uri(uri)}: "
                                  f"{_kind(st.st_mode)}; only regular files are read")
        if not roots.contains_real(_fd_real(fd, uri)):  # swapped since the check
            return None, roots._refused(uri, "outside the input roots (changed while opening)")
        if st.st_size > max_bytes:
            return None, _too_large(str(st.st_size), max_bytes)
        chunks, got = [], 0
        while got <= max_bytes:
            chunk = os.read(fd, min(CHUNK_BYTES, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:  # grew since fstat
            return None, _too_large(f"more than {max_bytes}", max_bytes)
        return b"".join(chunks), None
    except OSError as e:
        return None, RowError(ErrorReason.READ_FAILED, f"{fs.display_uri(uri)}: {e.strerror}")
    finally:
        os.close(fd)


def not_a_regular_file(uri: str) -> RowError | None:
    """The ``not_a_file`` error of a local ``uri`` that exists but is not a regular file
    (symlinks followed), else None. Never raises."""
    try:
        st = os.stat(fs._local_bytes(uri))
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(st.st_mode):
        return None
    return RowError(ErrorReason.NOT_A_FILE, f"{fs.display_uri(uri)}: {_kind(st.st_mode)}; "
                    "only regular files are read")


def read_error(where: str, e: BaseException) -> RowError:
    """The row error of a failed read of ``where``: ``input_missing`` when the object is
    not there (``FileNotFoundError``, ``ENOENT``: planned and deleted since, or a
    manifest row naming an object that is not there), else ``read_failed``."""
    missing = isinstance(e, FileNotFoundError) or getattr(e, "errno", None) == errno.ENOENT
    text = getattr(e, "strerror", None) if isinstance(e, OSError) and fs.is_local(where) else None
    return RowError(ErrorReason.INPUT_MISSING if missing else ErrorReason.READ_FAILED,
                    f"{where}: {text or e}")


def read_bounded(uri: str, max_bytes: int,
                 roots: InputRoots | None) -> tuple[bytes | None, RowError | None]:
    """Read the object ``uri`` (local path or ``s3://``): ``(bytes, None)`` or
    ``(None, RowError)`` (see the module docstring); ``roots`` None reads anywhere (no
    confinement). At most ``max_bytes + 1`` bytes are read. Never raises for a per-object
    problem."""
    if roots is not None:
        error = roots.check(uri)
        if error is not None:
            return None, error
    if fs.is_local(uri):
        return _read_local(uri, max_bytes, roots or InputRoots(["/"], allow_hidden=True))
    try:
        data = fs.read_head(lower_scheme(uri), max_bytes + 1)
    except Exception as e:  # noqa: BLE001 - a read failure is this record's error
        return None, read_error(uri, e)
    if len(data) > max_bytes:
        return None, _too_large(f"more than {max_bytes}", max_bytes)
    return data, None


def manifest_root(manifest_uri: str, source_uri: str) -> str | None:
    """The implicit input root of a manifest: the directory (local) or prefix (``s3://``)
    holding it when ``source_uri`` names that manifest file itself, else None (a manifest
    found under a ``source.uri`` prefix is covered by that root; its own folder is not a
    root). Never a bucket root (``s3://bucket``) or ``/``: those must be declared in
    ``source.allowed_roots``."""
    if fs.normalize(lower_scheme(manifest_uri)) != fs.normalize(lower_scheme(source_uri)):
        return None
    folder = posixpath.dirname(fs.normalize(lower_scheme(manifest_uri)).rstrip("/"))
    if s3.is_s3(folder):
        try:
            _, prefix = s3.split(folder)
        except ValueError:
            return None
        return folder if prefix.strip("/") else None
    return folder if folder not in ("", "/") else None
