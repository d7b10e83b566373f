"""WebDataset ``.tar`` shards: reading samples robustly, and writing shards.

WebDataset conventions (https://github.com/webdataset/webdataset): a shard is an
uncompressed tar; a *sample* is the run of consecutive members sharing a *key*. A
member's key is its path up to the first ``.`` of its basename (directories kept:
``a/b/x.seg.png`` -> key ``a/b/x``) and its *extension* is the rest, lower-cased
(``seg.png``). Directories, links and other non-regular members are skipped, and so are
regular members whose basename has no ``.`` or starts with one (no key or no extension;
``webdataset`` skips them too).

Reading (``read_shard``) never raises for a bad shard; every problem becomes a row:

- duplicate member (same key and extension twice) or a non-contiguous key (its members
  separated by another key's) -> ONE ``bad_sample`` row for that key, with no members
  (never a half-sample);
- a truncated (or, past its first member, corrupt) shard -> the samples wholly before the
  cut are yielded, the sample being cut is dropped, then ONE ``truncated_shard`` row with
  key ``"<shard stem>#shard"`` (e.g. ``"shard-000001#shard"`` for ``.../shard-000001.tar``);
- a shard that is missing, unreadable or not a tar -> ONE ``read_failed`` row with that
  same key.

Writing (``WebDatasetWriter``) streams one partition attempt's samples into shards under
``wds/<partition_id>/a-<attempt_id>/`` with deterministic headers, so equal input gives
byte-identical shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import posixpath
import tarfile
from collections.abc import Iterator

from pipeline.io import fs
from pipeline.io.layout import OutputLayout
from pipeline.records import ErrorReason, RowError
from pipeline.spec import WebDatasetSinkSpec

SHARD_KEY_SUFFIX = "#shard"
_BLOCK = tarfile.BLOCKSIZE          # 512
_RECORD = tarfile.RECORDSIZE        # 10240
_FORMAT = tarfile.PAX_FORMAT
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"


@dataclasses.dataclass(frozen=True)
class ShardSample:
    """One sample of a shard, or one error row.

    ``key``: the sample key within the shard (for a shard-level error row:
    ``"<shard stem>#shard"``, see ``shard_error_key``). ``shard_uri``: the shard as given
    to ``read_shard``. ``members``: extension -> member bytes, in tar order (empty for
    every error row). ``error``: a ``RowError`` (reason ``bad_sample``,
    ``truncated_shard`` or ``read_failed``; ``str()`` gives ``"<reason>: <message>"``) or
    None for a good sample.
    """

    key: str
    shard_uri: str
    members: dict[str, bytes]
    error: RowError | None


def split_member_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member path by the WebDataset rule, or None when the
    basename has no ``.`` or starts with one. The extension is lower-cased."""
    head, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    if not stem or not dot or not ext:
        return None
    return (posixpath.join(head, stem) if head else stem), ext.lower()


def shard_error_key(uri: str) -> str:
    """Key of a shard-level error row: the shard's file name without ``.tar``/``.tgz``/
    ``.tar.gz`` (or its last extension) plus ``"#shard"``."""
    base = posixpath.basename(uri.rstrip("/"))
    for suffix in (".tar.gz", ".tgz", ".tar"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    else:
        base = posixpath.splitext(base)[0]
    return base + SHARD_KEY_SUFFIX


def _error_row(uri: str, key: str, reason: ErrorReason, message: str) -> ShardSample:
    return ShardSample(key=key, shard_uri=uri, members={}, error=RowError(reason, message))


@dataclasses.dataclass
class _Member:
    info: tarfile.TarInfo
    key: str
    ext: str


def read_shard(uri: str, temp_dir: str | None = None) -> Iterator[ShardSample]:
    """Yield the samples of the WebDataset shard ``uri`` (local path, ``file://`` or
    ``s3://``), in the order of each sample's first member.

    The shard is staged with ``fs.staged`` (a local shard is read in place; an S3 shard is
    copied to one temp file in ``temp_dir``, deleted when the generator finishes or is
    closed, so disk use is one shard). Only member headers are scanned up front; member
    bytes are read for the sample being yielded only, so memory holds one sample.

    Good samples have ``error=None`` and ``members`` = extension -> bytes. Samples without
    any media member (e.g. only ``.txt``) are yielded too: the caller decides. Error rows
    (``members={}``) are described in the module docstring:

    - ``bad_sample: key '<key>' in shard <uri>: duplicate extension '<ext>'`` or
      ``... members not contiguous (positions i, j, ...)`` (positions = 0-based indices
      among the shard's key-bearing regular members), one row per bad key, at its place;
    - ``truncated_shard: <uri>: tar ends at byte N inside member '<name>'; K complete
      samples kept; incomplete sample '<key>' dropped`` (other wordings for a cut inside a
      header, a missing end-of-archive marker, or an invalid header), the last row. When
      the member being cut cannot be named, the last complete key is dropped too, since
      it may be missing members;
    - ``read_failed: <uri>: ...`` when the shard is missing, cannot be read or is not an
      (uncompressed) tar: the only row.

    Raises nothing for bad shards; programming errors (e.g. a bad ``temp_dir``
    propagating from the OS) may still raise ``OSError``.
    """
    shard_key = shard_error_key(uri)
    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(fs.staged(uri, temp_dir))
            size = os.path.getsize(path)
            tf = stack.enter_context(tarfile.open(path, mode="r:", encoding=_ENCODING,
                                                  errors=_ERRORS))
        except FileNotFoundError:
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED, f"{uri}: shard not found")
            return
        except (tarfile.TarError, EOFError) as exc:
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED,
                             f"{uri}: not a readable uncompressed tar archive ({exc})")
            return
        except (OSError, ValueError) as exc:   # StorageError is an OSError
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED, f"{uri}: {exc}")
            return
        yield from _samples(uri, shard_key, tf, size)


def _scan(tf: tarfile.TarFile, size: int) -> tuple[list[_Member], str | None, str | None]:
    """Scan headers: ``(complete members, cut description or None, name of the member
    being cut or None)``. A non-None description means the shard is truncated/corrupt."""
    members: list[_Member] = []
    last_name: str | None = None
    try:
        while True:
            info = tf.next()
            if info is None:
                break
            if info.offset_data + info.size > size:
                return members, f"tar ends at byte {size} inside member '{info.name}'", info.name
            last_name = info.name
            if not info.isreg():
                continue
            split = split_member_name(info.name)
            if split is not None:
                members.append(_Member(info, *split))
    except (tarfile.ReadError, EOFError) as exc:
        after = f" after member '{last_name}'" if last_name else ""
        return members, f"tar ends or breaks at byte {size}{after} ({exc})", None
    # tarfile stops silently at a cut or invalid header past the first member: check
    # that what follows the last member is the end-of-archive marker (a zero block).
    tf.fileobj.seek(tf.offset)
    block = tf.fileobj.read(_BLOCK)
    after = f" after member '{last_name}'" if last_name else ""
    if len(block) == _BLOCK and block == tarfile.NUL * _BLOCK:
        return members, None, None
    if not block:
        return members, (f"tar ends at byte {size}{after} without the end-of-archive "
                         "marker"), None
    if len(block) < _BLOCK:
        name = _partial_header_name(block)
        what = f"the header of member '{name}'" if name else "a member header"
        return members, f"tar ends at byte {size} inside {what}{after}", name
    return members, f"invalid tar header at byte {tf.offset}{after}", None


def _partial_header_name(block: bytes) -> str | None:
    """The member name in a cut header block, if its NUL-terminated name field is whole."""
    end = block.find(tarfile.NUL, 0, 100)
    if end <= 0:
        return None
    return block[:end].decode(_ENCODING, _ERRORS)


def _samples(uri: str, shard_key: str, tf: tarfile.TarFile, size: int) -> Iterator[ShardSample]:
    members, cut, cut_name = _scan(tf, size)
    dropped: str | None = None
    if cut is not None and members:
        cut_split = split_member_name(cut_name) if cut_name else None
        # The sample being cut: the cut member's key if known, else the last complete
        # key (conservatively: it may have been missing members still to come).
        dropped = cut_split[0] if cut_split else members[-1].key
        members = [m for m in members if m.key != dropped]
    elif cut is not None and cut_name:
        cut_split = split_member_name(cut_name)
        dropped = cut_split[0] if cut_split else None

    by_key: dict[str, list[int]] = {}
    for pos, m in enumerate(members):
        by_key.setdefault(m.key, []).append(pos)
    problems: dict[str, str] = {}
    for key, positions in by_key.items():
        seen: set[str] = set()
        for pos in positions:
            ext = members[pos].ext
            if ext in seen:
                problems[key] = f"duplicate extension '{ext}'"
                break
            seen.add(ext)
        else:
            if positions != list(range(positions[0], positions[0] + len(positions))):
                problems[key] = ("members not contiguous (positions "
                                 f"{', '.join(map(str, positions))})")
    kept = len(by_key) - len(problems)

    for key, positions in by_key.items():          # dicts keep first-member order
        if key in problems:
            yield _error_row(uri, key, ErrorReason.BAD_SAMPLE,
                             f"key '{key}' in shard {uri}: {problems[key]}")
            continue
        try:
            data = {}
            for pos in positions:
                fobj = tf.extractfile(members[pos].info)
                data[members[pos].ext] = fobj.read() if fobj is not None else b""
        except (OSError, tarfile.TarError, EOFError) as exc:
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED,
                             f"{uri}: reading member of sample '{key}' failed: {exc}")
            return
        yield ShardSample(key=key, shard_uri=uri, members=data, error=None)

    if cut is not None:
        tail = f"; incomplete sample '{dropped}' dropped" if dropped else ""
        yield _error_row(uri, shard_key, ErrorReason.TRUNCATED_SHARD,
                         f"{uri}: {cut}; {kept} complete samples kept{tail}")


def _padded(n: int) -> int:
    return -(-n // _BLOCK) * _BLOCK


class WebDatasetWriter:
    """Writes one partition attempt's samples to tar shards under
    ``wds/<partition_id>/a-<attempt_id>/<partition_id>-<n:06d>.tar`` (relative to
    ``output_uri``; ``n`` from 0), local or ``s3://``.

    Each shard is streamed (never whole in memory) through ``fs.resolve`` +
    ``open_output_stream`` with ``tarfile`` mode ``"w|"`` (PAX format, UTF-8), headers
    deterministic (mtime 0, uid/gid 0, mode 0o444, empty uname/gname). A new shard is
    started before a sample that would make the shard's final file size (bytes,
    including tar padding and end-of-archive marker) exceed ``spec.shard_max_bytes`` -
    a single bigger sample goes alone into one shard - and after ``spec.shard_max_samples``
    samples. No empty shard is written. sha256 and size are computed while writing.

    Stream writes are not retried (a stream cannot be replayed): a storage error
    propagates (``OSError``/``StorageError``) and the caller should ``abort()`` and retry
    the attempt.
    """

    def __init__(self, output_uri: str, partition_id: str, attempt_id: str,
                 spec: WebDatasetSinkSpec):
        self.layout = OutputLayout(output_uri)
        self.partition_id, self.attempt_id = partition_id, attempt_id
        self.rel_dir = OutputLayout.rel_attempt_dir("webdataset", partition_id, attempt_id)
        self.spec = spec
        self.files: list[str] = []
        self.sha256: dict[str, str] = {}
        self.total_bytes = 0
        self._out: fs.HashingOutput | None = None
        self._tar: tarfile.TarFile | None = None
        self._shard_bytes = 0       # tar bytes written to the open shard, before the end marker
        self._shard_samples = 0
        self._shard_keys: dict[str, str] = {}
        self._closed = False

    @staticmethod
    def member_key(key: str) -> str:
        """The key as written: ``.`` replaced by ``_`` (a ``.`` would move the key/
        extension split). The caller keeps the original key in its JSON member."""
        return key.replace(".", "_")

    @staticmethod
    def _final_size(content_bytes: int) -> int:
        """File size of a shard with ``content_bytes`` of members: end marker + record pad."""
        return -(-(content_bytes + 2 * _BLOCK) // _RECORD) * _RECORD

    def write(self, key: str, members: dict[str, bytes]) -> None:
        """Append one sample: ``members`` = extension -> bytes, written in the order given
        as ``<key>.<ext>`` (key with ``.`` -> ``_``, see ``member_key``).

        Raises ``ValueError`` for an empty key, no members, an empty extension or one with
        ``/``, a key that (after ``.`` -> ``_``) repeats one already in this shard,
        or after ``close``/``abort``; ``OSError``/``StorageError`` on storage failure.
        """
        if self._closed:
            raise ValueError(f"{self.rel_dir}: writer already closed")
        safe = self.member_key(key)
        if not safe or safe.endswith("/"):
            raise ValueError(f"sample key {key!r}: empty key")
        if not members:
            raise ValueError(f"sample key {key!r}: no members")
        infos = []
        size = 0
        for ext, data in members.items():
            if not ext or "/" in ext or ext.startswith("."):
                raise ValueError(f"sample key {key!r}: bad extension {ext!r}")
            info = tarfile.TarInfo(f"{safe}.{ext}")
            info.size = len(data)
            info.mtime, info.mode, info.uid, info.gid = 0, 0o444, 0, 0
            info.uname = info.gname = ""
            infos.append((info, data))
            size += len(info.tobuf(_FORMAT, _ENCODING, _ERRORS)) + _padded(info.size)
        if self._tar is not None and (
                self._shard_samples >= self.spec.shard_max_samples
                or self._final_size(self._shard_bytes + size) > self.spec.shard_max_bytes):
            self._finish_shard()
        if self._tar is not None and safe in self._shard_keys:
            raise ValueError(f"sample key {key!r} repeats key {self._shard_keys[safe]!r} "
                             f"(written as {safe!r}) in shard {self.files[-1]}")
        if self._tar is None:
            self._open_shard()
        for info, data in infos:
            self._tar.addfile(info, io.BytesIO(data))
        self._shard_bytes += size
        self._shard_samples += 1
        self._shard_keys[safe] = key

    def _open_shard(self) -> None:
        rel = OutputLayout.rel_shard(self.partition_id, self.attempt_id, len(self.files))
        self.files.append(rel)
        self._out = fs.HashingOutput(self.layout.uri(rel))
        self._tar = tarfile.open(fileobj=self._out, mode="w|", format=_FORMAT,
                                 encoding=_ENCODING, errors=_ERRORS)
        self._shard_bytes = self._shard_samples = 0
        self._shard_keys = {}

    def _finish_shard(self) -> None:
        self._tar.close()             # end-of-archive marker + record padding
        self._out.close()
        rel = self.files[-1]
        self.sha256[rel] = self._out.sha256
        self.total_bytes += self._out.size
        self._tar = self._out = None

    def close(self) -> tuple[list[str], dict[str, str], int]:
        """Finish the open shard; return ``(files relative to output_uri, sha256 hex per
        relative file, total bytes of all shards)``. No samples -> ``([], {}, 0)``.
        Raises ``OSError``/``StorageError`` if the last shard cannot be completed."""
        if not self._closed:
            if self._tar is not None:
                self._finish_shard()
            self._closed = True
        return list(self.files), dict(self.sha256), self.total_bytes

    def abort(self) -> None:
        """Stop writing and delete everything this attempt wrote (``fs.delete_tree`` of
        ``wds/<partition_id>/a-<attempt_id>``). Safe to call more than once."""
        self._closed = True
        if self._tar is not None:
            self._out.discard()
            with contextlib.suppress(Exception):
                self._tar.close()
        if self._out is not None:
            with contextlib.suppress(Exception):
                self._out.close()
        self._tar = self._out = None
        fs.delete_tree(self.layout.uri(self.rel_dir))
