"""``source_uri``: where a record came from, as URI text - one rule, applied to every row
by ``Datasource.read_partition`` (``SourceUris``).

- ``s3://bucket/key``, ``http(s)://`` URLs and other ``scheme://`` URIs: as read, the
  scheme in lower case (RFC 3986 §3.1).
- A ``data:`` URI: its first 64 characters and its length (it can be megabytes).
- A local file: ``file:///abs/path``, percent-encoded as ``pathlib.Path.as_uri()`` does
  (RFC 8089; ``%20`` for a space, ``%23`` for ``#``, ``%XX`` for each byte of a name that
  is not valid UTF-8, so every local name is representable as text). But when the input
  root was given as a relative path (``source.uri: data/photos/captions.jsonl``), a file
  under the directory it was relative to is the relative URI reference from that
  directory (``data/photos/000000000790.jpg``; ``../x/y.jpg`` for ``source.uri: ../x``),
  percent-encoded the same way, so the output names no directory of the machine that
  wrote it. That directory is the driver's working directory at planning, recovered from
  the absolute root the plan recorded (``input_root``) and the spec's ``source.uri``
  string - never a worker's working directory.
- A WebDataset sample: ``<shard>#<member>``: the shard in the form above (a ``#`` in its
  name is ``%23`` there), ``#``, and the member's name in the tar (``fs.display_uri`` text).

Reopen a local one with ``local_path``. Pure string work: no I/O.
"""

from __future__ import annotations

import os
import pathlib
import posixpath
from collections.abc import Iterable
from urllib.parse import quote_from_bytes, unquote_to_bytes

from pipeline.storage import fs
from pipeline.storage.http import lower_scheme

DATA_URI_SHOWN = 64  # characters of a data: URI kept in source_uri


class SourceUris:
    """Turns the URIs a datasource read into ``source_uri`` text (module docstring).

    ``given_root``: ``source.uri`` as the spec gives it. ``planned_root``: its absolute
    form at planning (``Datasource.plan_metadata()["input_root"]``); None: computed here
    (``fs.normalize``, i.e. this process's working directory). ``shards``: the WebDataset
    shard URIs of the partition, so ``<shard>#<member>`` is split at the right ``#``.
    Calling it never raises for a ``str``.
    """

    def __init__(self, given_root: str, planned_root: str | None = None,
                 shards: Iterable[str] = ()):
        self.shards = tuple(shards)
        self.anchor, self.prefix = _anchor(given_root, planned_root)

    def __call__(self, uri: str) -> str:
        for shard in self.shards:
            if uri.startswith(shard + "#"):
                return f"{self._one(shard)}#{fs.display_uri(uri[len(shard) + 1:])}"
        return self._one(uri)

    def _one(self, uri: str) -> str:
        if uri[:5].lower() == "data:":
            if len(uri) > DATA_URI_SHOWN:
                return f"{fs.display_uri(uri[:DATA_URI_SHOWN])}... ({len(uri)} characters)"
            return fs.display_uri(uri)
        uri = lower_scheme(uri)
        if not fs.is_local(uri):
            return fs.display_uri(uri)
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        path = posixpath.normpath(path) if path.startswith("/") else fs.normalize(path)
        rel = self.relative_to_root(path)
        try:
            if rel is not None:
                return quote_from_bytes(fs.uri_to_bytes(rel))
            return pathlib.PurePosixPath(path).as_uri()
        except (UnicodeEncodeError, ValueError):  # a surrogate no file name decodes to
            return fs.display_uri(path)

    def relative_to_root(self, path: str) -> str | None:
        """``path`` relative to the anchor directory (with the ``../`` prefix), or None."""
        if self.anchor is None:
            return None
        if path == self.anchor:
            return self.prefix.rstrip("/") or "."
        base = self.anchor.rstrip("/") + "/"
        return self.prefix + path[len(base):] if path.startswith(base) else None


def _anchor(given: str, planned: str | None) -> tuple[str | None, str]:
    """``(directory, prefix)``: the absolute directory a relative ``given`` root is
    relative to (its ``..`` parts resolved: that many levels above it, written ``../``
    in ``prefix``), or ``(None, "")`` when ``given`` is absolute or not local."""
    if not given or "://" in given or given.startswith("/"):
        return None, ""
    parts = [p for p in posixpath.normpath(given).split("/") if p != "."]
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    root = posixpath.normpath(planned) if planned else fs.normalize(given)
    anchor = root
    for _ in parts[up:]:
        anchor = posixpath.dirname(anchor)
    if posixpath.join(anchor, *parts[up:]) != root:  # a root that does not end in `given`
        return None, ""
    return anchor, "../" * up


def local_path(source_uri: str, cwd: str | None = None) -> bytes:
    """The local file a ``source_uri`` of a local record names, as raw OS path bytes
    (``open()`` takes them; names that are not valid UTF-8 included): a ``file://`` URI's
    path, or a relative reference joined to ``cwd`` (default: the current directory),
    percent-decoded; a WebDataset ``#<member>`` is dropped (the shard's path). Raises
    ``ValueError`` for another scheme (``s3://``, ``http(s)://``, ``data:``)."""
    ref = source_uri
    if ref.startswith("file://"):
        ref = ref[len("file://"):]
    elif "://" in ref or ref[:5].lower() == "data:":
        raise ValueError(f"{source_uri!r} is not a local file")
    raw = unquote_to_bytes(ref.split("#", 1)[0])
    return raw if raw.startswith(b"/") else os.path.join(os.fsencode(cwd or "."), raw)
