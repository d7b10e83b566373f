"""The filesystem layer: every path the job touches goes through ``pyarrow.fs``.

``resolve(uri)`` maps a URI or local path to ``(FileSystem, path)``. This is the only
module that knows URI schemes, so object storage plugs in here without rewrites elsewhere.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs


def is_local(uri: str) -> bool:
    """True if ``uri`` is a plain path or a ``file://`` URI."""
    return "://" not in uri or uri.startswith("file://")


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, path)`` for ``uri``; relative local paths become absolute.

    Raises ``pyarrow.ArrowInvalid`` for an unknown scheme.
    """
    if is_local(uri):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return pafs.FileSystem.from_uri(uri)


def normalize(uri: str) -> str:
    """Return a canonical form of ``uri`` (absolute path for local files)."""
    return resolve(uri)[1] if is_local(uri) else uri.rstrip("/")


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI or path with ``/``."""
    return posixpath.join(uri.rstrip("/"), *parts) if parts else uri


def read_bytes(uri: str) -> bytes:
    """Read a whole object. Raises ``FileNotFoundError``/``OSError``."""
    fs, path = resolve(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object (creating parent directories on local filesystems)."""
    fs, path = resolve(uri)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create ``uri`` with ``data`` only if it does not exist; return False if it existed.

    Local filesystems write a temporary file and ``os.link`` it to the final name, which is
    atomic and fails if the name exists (POSIX). Object stores use a conditional PUT
    (``If-None-Match: *``), added with S3 support.
    """
    if not is_local(uri):
        raise NotImplementedError(f"conditional create is not implemented for {uri}")
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


def list_files(uri: str, recursive: bool = True) -> Iterator[pafs.FileInfo]:
    """Yield ``FileInfo`` of the files under ``uri`` (no directories), unsorted.

    A missing prefix yields nothing.
    """
    fs, path = resolve(uri)
    selector = pafs.FileSelector(path, recursive=recursive, allow_not_found=True)
    for info in fs.get_file_info(selector):
        if info.type == pafs.FileType.File:
            yield info


def exists(uri: str) -> bool:
    """True if a file or directory exists at ``uri``."""
    fs, path = resolve(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def delete_tree(uri: str) -> None:
    """Delete ``uri`` and everything under it; a missing path is not an error."""
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def to_uri(fs: pafs.FileSystem, path: str) -> str:
    """Inverse of ``resolve`` for the filesystems we create."""
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    return f"{fs.type_name}://{path}"
