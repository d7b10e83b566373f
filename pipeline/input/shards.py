"""WebDataset shards (``.tar``, gzip-compressed ``.tar.gz``/``.tgz``): reading samples
robustly, and writing (uncompressed) shards.

WebDataset conventions (https://github.com/webdataset/webdataset): a shard is a tar,
uncompressed or gzip-compressed (recognised here by the gzip magic bytes ``1f 8b``, not
by the name); a *sample* is the run of consecutive members sharing a *key*. A
member's key is its path up to the first ``.`` of its basename (directories kept:
``a/b/x.seg.png`` -> key ``a/b/x``) and its *extension* is the rest, lower-cased
(``seg.png``). Directories are skipped, and so are members whose basename has no ``.``
or starts with one (no key or no extension; ``webdataset`` skips them too). A hard or
symbolic link to a member of the same shard is read as that member; any other
non-regular member (a device, a FIFO, a link outside the shard or to nothing in it)
makes its sample a ``not_a_file`` row naming the kind.

Reading (``read_shard``) never raises for a bad shard; every problem becomes a row:

- duplicate member (same key and extension twice) or a non-contiguous key (its members
  separated by another key's) -> ONE ``bad_sample`` row for that key, with no members
  (never a half-sample);
- a truncated (or, past its first member, corrupt) shard -> the samples wholly before the
  cut are yielded, the sample being cut is dropped, then ONE ``truncated_shard`` row with
  key ``"<shard stem>#shard"`` (e.g. ``"shard-000001#shard"`` for ``.../shard-000001.tar``);
- a gzip shard whose gzip stream is cut short or corrupt past its first tar member ->
  the same: the samples wholly before the cut, then ONE ``truncated_shard`` row naming
  the compressed byte where the gzip stream stopped and the tar member/byte it cut;
- a shard past a cap (``ShardCaps``: members, member bytes) -> the samples wholly before
  the cap, then ONE ``too_large`` row with the shard key naming the cap;
- a shard that is missing, unreadable or not a tar (nor a gzip-compressed tar, e.g. a
  corrupt gzip header) -> ONE ``read_failed`` row with that same key.

Writing (``WebDatasetWriter``) streams one partition attempt's samples into shards under
``wds/<partition_id>/a-<attempt_id>/`` with deterministic headers, so equal input gives
byte-identical shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import os
import posixpath
import tarfile
import zlib
from collections.abc import Iterator

from pipeline.storage import fs
from pipeline.records import ErrorReason, RowError
from pipeline.storage.tar import BLOCK, ENCODING, ERRORS

SHARD_KEY_SUFFIX = "#shard"
_GZIP_MAGIC = b"\x1f\x8b"
_SHARD_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_GZ_DRAIN_MAX = 2**20       # decompressed bytes read past the tar's end to check gzip's CRC


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


def is_shard_name(name: str) -> bool:
    """True if the file name or URI ``name`` ends with ``.tar``, ``.tar.gz`` or ``.tgz``
    (any case): a WebDataset shard for the datasource's listing. The name only selects
    files; ``read_shard`` decides compressed or not by the content."""
    return name.lower().endswith(_SHARD_SUFFIXES)


def shard_error_key(uri: str) -> str:
    """Key of a shard-level error row: the shard's file name without ``.tar``/``.tgz``/
    ``.tar.gz`` (any case; else without its last extension) plus ``"#shard"``."""
    base = posixpath.basename(uri.rstrip("/"))
    for suffix in _SHARD_SUFFIXES:
        if base.lower().endswith(suffix):
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
    data: tarfile.TarInfo | None = None   # whose bytes: ``info``, or a link's target
    problem: str | None = None            # why it cannot be read (not a regular file)

    def __post_init__(self):
        if self.data is None and self.problem is None:
            self.data = self.info


@dataclasses.dataclass(frozen=True)
class ShardCaps:
    """Per-shard caps (``source.webdataset``): ``max_members`` tar members of any kind,
    ``max_bytes`` bytes of member data (decompressed for gzip) and of a staged copy."""

    max_members: int = 100_000
    max_bytes: int = 16 * 2**30


class _Cap(str):
    """A cut that is a cap reached (``too_large``), not a truncation."""


_KINDS = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
          tarfile.FIFOTYPE: "a FIFO", tarfile.DIRTYPE: "a directory"}
_MAX_LINK_HOPS = 8


def _norm(name: str) -> str:
    return posixpath.normpath(name.lstrip("/")) if name else name


def _resolve(info: tarfile.TarInfo, by_name: dict[str, tarfile.TarInfo],
             stream: bool) -> tuple[tarfile.TarInfo | None, str | None]:
    """``(regular member whose bytes ``info`` stands for, None)`` or ``(None, why not)``.
    A hard link names an archive path, a symbolic link a path relative to its own folder
    (GNU tar; https://www.gnu.org/software/tar/manual/html_node/Standard.html); either
    resolves only to a member of the same shard (chains up to ``_MAX_LINK_HOPS``). In a
    gzip shard (read as a stream) the target must come before the link."""
    start = info
    for _ in range(_MAX_LINK_HOPS + 1):
        if info.isreg():
            if stream and info.offset > start.offset:
                return None, (f"a link to '{info.name}', a later member (a gzip shard is "
                              "read as a stream: only earlier members resolve)")
            return info, None
        if not (info.islnk() or info.issym()):
            return None, _KINDS.get(info.type, f"a member of tar type {info.type!r}")
        kind = "hard link" if info.islnk() else "symbolic link"
        target = info.linkname if info.islnk() else posixpath.join(
            posixpath.dirname(info.name), info.linkname)
        if info.linkname.startswith("/") or _norm(target).split("/")[0] == "..":
            return None, f"a {kind} to '{info.linkname}', outside the shard"
        found = by_name.get(_norm(target))
        if found is None or found is info:
            return None, f"a {kind} to '{info.linkname}', which is not a member of the shard"
        info = found
    return None, f"a chain of more than {_MAX_LINK_HOPS} links"


def _members(infos: list[tarfile.TarInfo], stream: bool) -> list[_Member]:
    """The key-bearing members of ``infos`` (headers in tar order): regular files, and
    links resolved to a regular member of the shard; any other kind (a device, a FIFO, a
    link that does not resolve) is kept with its ``problem`` (the sample is an error
    row). Directories and members without a key are skipped."""
    by_name = {_norm(i.name): i for i in infos}
    out = []
    for info in infos:
        if info.isdir():
            continue
        split = split_member_name(info.name)
        if split is None:
            continue
        if info.isreg():
            out.append(_Member(info, *split))
            continue
        target, problem = _resolve(info, by_name, stream)
        out.append(_Member(info, *split, data=target, problem=problem))
    return out


def _over_cap(info: tarfile.TarInfo, count: int, total: int,
              caps: ShardCaps | None) -> _Cap | None:
    """The cut at ``info`` (the ``count``-th member, ``total`` member bytes up to and
    including it) when it passes a cap, else None."""
    if caps is None:
        return None
    if count > caps.max_members:
        return _Cap(f"more than source.webdataset.max_members={caps.max_members} members "
                    f"(stopped at member '{info.name}'; the rest of the shard is not read)")
    if total > caps.max_bytes:
        return _Cap(f"more than source.webdataset.max_bytes={caps.max_bytes} bytes of "
                    f"members (stopped at member '{info.name}'; the rest of the shard is "
                    "not read)")
    return None


def read_shard(uri: str, temp_dir: str | None = None,
               max_member_bytes: int | None = None,
               caps: ShardCaps | None = None) -> Iterator[ShardSample]:
    """Yield the samples of the WebDataset shard ``uri`` (local path, ``file://`` or
    ``s3://``), in the order of each sample's first member.

    The shard is staged with ``fs.staged`` (a local shard is read in place; an S3 shard is
    copied to one temp file in ``temp_dir``, deleted when the generator finishes or is
    closed, so disk use is one shard). Memory holds one sample (plus one small header
    record per member).

    - Uncompressed tar: member headers are scanned up front; member bytes are read for
      the sample being yielded only.
    - gzip-compressed tar (the file starts with ``1f 8b``, whatever its name): read as a
      stream (``gzip`` + ``tarfile`` mode ``"r|"``), never decompressed whole to memory
      or disk, in two sequential passes: the first decompresses and skips through the
      stream to read the headers (so duplicate and non-contiguous keys and the cut are
      known before anything is yielded, as for a plain tar), the second decompresses
      again and yields each sample as its last member is read. The CPU cost is two
      decompressions; what is yielded is exactly what the same tar uncompressed gives.

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
      it may be missing members. For a gzip shard ``N`` counts decompressed tar bytes and
      the message starts ``<uri>: gzip stream cut at byte C of S (<error>); tar ends ...``
      (or ``gzip data corrupt near byte C ...``), ``C``/``S`` in compressed bytes;
    - ``input_missing: <uri>: shard not found ...`` when the shard is gone;
    - ``read_failed: <uri>: ...`` when the shard cannot be read, is not a
      tar, or is gzip whose header or first tar member cannot be read (or whose CRC
      check fails): the only row.

    - ``too_large: key '<key>' in shard <uri>: member '<ext>' of N bytes > max_bytes M``
      when a member's header size is over ``max_member_bytes`` (None: no limit): the
      member is never read, the sample is one error row.

    - ``too_large: <uri>: more than source.webdataset.max_members=N members (stopped at
      member '<name>'; ...); K complete samples kept; incomplete sample '<key>' dropped``
      (or ``max_bytes``: member bytes, decompressed) when the shard passes one of
      ``caps`` (None: no caps): the samples wholly before the cap are yielded, then this
      one row (the last); the rest of the shard is not read. An object-store shard
      larger than ``caps.max_bytes`` is not staged: one ``too_large`` row.
    - ``not_a_file: key '<key>' in shard <uri>: member '<name>' is a FIFO (not read)``
      (a character/block device, a link outside the shard or to no member of it): the
      sample is one error row. Hard and symbolic links to a member of the same shard are
      read as that member (``_resolve``).

    ``<uri>`` in messages is ``fs.display_uri(uri)`` (valid UTF-8 text). Raises nothing
    for bad shards; programming errors (e.g. a bad ``temp_dir`` propagating from the OS)
    may still raise ``OSError``.
    """
    shard_key = shard_error_key(uri)
    name = fs.display_uri(uri)
    with contextlib.ExitStack() as stack:
        try:
            if caps is not None and not fs.is_local(uri):
                staged_size = fs.file_size(uri)
                if staged_size is not None and staged_size > caps.max_bytes:
                    yield _error_row(uri, shard_key, ErrorReason.TOO_LARGE,
                                     f"{name}: {staged_size} bytes > source.webdataset."
                                     f"max_bytes={caps.max_bytes} (not staged)")
                    return
            path = stack.enter_context(fs.staged(uri, temp_dir))
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                compressed = f.read(len(_GZIP_MAGIC)) == _GZIP_MAGIC
            if not compressed:
                tf = stack.enter_context(tarfile.open(path, mode="r:", encoding=ENCODING,
                                                      errors=ERRORS))
        except FileNotFoundError:
            yield _error_row(uri, shard_key, ErrorReason.INPUT_MISSING,
                             f"{name}: shard not found (planned, no longer there)")
            return
        except (tarfile.TarError, EOFError) as exc:
            what = ("not gzip-compressed (no 1f 8b magic bytes) and not a readable "
                    "uncompressed tar archive" if uri.lower().endswith((".gz", ".tgz"))
                    else "not a readable uncompressed tar archive")
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED, f"{name}: {what} ({exc})")
            return
        except (OSError, ValueError) as exc:   # StorageError is an OSError
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED, f"{name}: {exc}")
            return
        if compressed:
            yield from _gz_samples(uri, shard_key, path, size, max_member_bytes, caps)
        else:
            yield from _samples(uri, shard_key, tf, size, max_member_bytes, caps)


def _scan(tf: tarfile.TarFile, size: int,
          caps: ShardCaps | None = None) -> tuple[list[_Member], str | None, str | None]:
    """Scan headers: ``(complete members, cut description or None, name of the member
    being cut or None)``. A non-None description means the shard is truncated/corrupt,
    or (a ``_Cap``) past one of ``caps``."""
    infos: list[tarfile.TarInfo] = []
    last_name: str | None = None
    total = 0
    try:
        while True:
            info = tf.next()
            if info is None:
                break
            total += info.size
            cap = _over_cap(info, len(infos) + 1, total, caps)
            if cap is not None:
                return _members(infos, False), cap, info.name
            if info.offset_data + info.size > size:
                return (_members(infos, False),
                        f"tar ends at byte {size} inside member '{info.name}'", info.name)
            last_name = info.name
            infos.append(info)
    except (tarfile.ReadError, EOFError) as exc:
        after = f" after member '{last_name}'" if last_name else ""
        return _members(infos, False), f"tar ends or breaks at byte {size}{after} ({exc})", None
    # tarfile stops silently at a cut or invalid header past the first member: check
    # that what follows the last member is the end-of-archive marker (a zero block).
    tf.fileobj.seek(tf.offset)
    return (_members(infos, False),
            *_classify_end(tf.fileobj.read(BLOCK), size, tf.offset, last_name))


def _classify_end(block: bytes, size: int, offset: int,
                  last_name: str | None) -> tuple[str | None, str | None]:
    """``(problem, cut member name)`` from the block after a tar's last member: a whole
    zero block is the end-of-archive marker (POSIX ustar; no problem); nothing, a short
    block (a cut header) or a non-zero block are truncation or a bad header. ``size``:
    bytes of the tar read; ``offset``: where ``block`` starts."""
    after = f" after member '{last_name}'" if last_name else ""
    if len(block) == BLOCK and block == tarfile.NUL * BLOCK:
        return None, None
    if not block:
        return f"tar ends at byte {size}{after} without the end-of-archive marker", None
    if len(block) < BLOCK:
        name = _partial_header_name(block)
        what = f"the header of member '{name}'" if name else "a member header"
        return f"tar ends at byte {size} inside {what}{after}", name
    return f"invalid tar header at byte {offset}{after}", None


def _partial_header_name(block: bytes) -> str | None:
    """The member name in a cut header block, if its NUL-terminated name field is whole."""
    end = block.find(tarfile.NUL, 0, 100)
    if end <= 0:
        return None
    return block[:end].decode(ENCODING, ERRORS)


@dataclasses.dataclass
class _Plan:
    """What to yield, decided from the complete members before any byte is yielded."""

    members: list[_Member]              # complete members, the cut sample's removed
    by_key: dict[str, list[int]]        # key -> positions in ``members``, first-member order
    problems: dict[str, str]            # bad key -> why
    not_files: set[str]                 # bad keys with a member that is not a file
    kept: int                           # good samples
    dropped: str | None                 # key of the sample being cut, if any


def _plan(members: list[_Member], cut: str | None, cut_name: str | None) -> _Plan:
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
    not_files: set[str] = set()
    for key, positions in by_key.items():
        odd = next((members[p] for p in positions if members[p].problem), None)
        if odd is not None:
            problems[key] = f"member '{odd.info.name}' is {odd.problem} (not read)"
            not_files.add(key)
            continue
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
    return _Plan(members, by_key, problems, not_files, len(by_key) - len(problems), dropped)


def _bad_row(uri: str, key: str, plan: _Plan) -> ShardSample:
    return _error_row(uri, key, ErrorReason.NOT_A_FILE if key in plan.not_files
                      else ErrorReason.BAD_SAMPLE,
                      f"key '{key}' in shard {fs.display_uri(uri)}: {plan.problems[key]}")


def _cut_row(uri: str, shard_key: str, cut: str, plan: _Plan) -> ShardSample:
    tail = f"; incomplete sample '{plan.dropped}' dropped" if plan.dropped else ""
    reason = ErrorReason.TOO_LARGE if isinstance(cut, _Cap) else ErrorReason.TRUNCATED_SHARD
    return _error_row(uri, shard_key, reason,
                      f"{fs.display_uri(uri)}: {cut}; {plan.kept} complete samples kept{tail}")


def _member_bytes(tf: tarfile.TarFile, info: tarfile.TarInfo,
                  max_bytes: int | None) -> bytes | int:
    """A member's bytes, or its size (an int) when over ``max_bytes``: known from the
    header, unread; a link member's target is read up to ``max_bytes + 1`` bytes."""
    if max_bytes is not None and info.size > max_bytes:
        return info.size
    fobj = tf.extractfile(info)
    if fobj is None:
        return b""
    data = fobj.read() if max_bytes is None else fobj.read(max_bytes + 1)
    return len(data) if max_bytes is not None and len(data) > max_bytes else data


def _sample(uri: str, key: str, data: dict[str, bytes | int],
            max_bytes: int | None) -> ShardSample:
    """The sample of ``data`` (``_member_bytes`` values), or a ``too_large`` error row."""
    big = {ext: n for ext, n in data.items() if isinstance(n, int)}
    if big:
        ext, n = next(iter(big.items()))
        return _error_row(uri, key, ErrorReason.TOO_LARGE,
                          f"key '{key}' in shard {fs.display_uri(uri)}: member '{ext}' of "
                          f"{n} bytes > max_bytes {max_bytes}")
    return ShardSample(key=key, shard_uri=uri, members=data, error=None)


def _samples(uri: str, shard_key: str, tf: tarfile.TarFile, size: int,
             max_bytes: int | None = None,
             caps: ShardCaps | None = None) -> Iterator[ShardSample]:
    members, cut, cut_name = _scan(tf, size, caps)
    plan = _plan(members, cut, cut_name)
    for key, positions in plan.by_key.items():          # dicts keep first-member order
        if key in plan.problems:
            yield _bad_row(uri, key, plan)
            continue
        try:
            data = {}
            for pos in positions:
                data[plan.members[pos].ext] = _member_bytes(tf, plan.members[pos].data,
                                                            max_bytes)
        except (OSError, tarfile.TarError, EOFError) as exc:
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED,
                             f"{fs.display_uri(uri)}: reading member of sample '{key}' "
                             f"failed: {exc}")
            return
        yield _sample(uri, key, data, max_bytes)

    if cut is not None:
        yield _cut_row(uri, shard_key, cut, plan)


# ---- gzip-compressed shards: two sequential streaming passes -------------------------

class _GzipSource:
    """The decompressed bytes of a gzip file (all its members), for ``tarfile``'s stream
    mode. A gzip error (stream cut short: ``EOFError``; corrupt data: ``zlib.error``;
    bad header or CRC: ``gzip.BadGzipFile``) ends the stream (``read`` -> ``b""``) and
    is kept in ``error``, with ``error_at`` = the compressed bytes consumed by then, so
    ``tarfile`` sees a plain truncated tar and ``delivered`` counts the decompressed
    bytes exactly up to the cut."""

    def __init__(self, raw: io.BufferedReader):
        self._raw = raw
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self.delivered = 0
        self.done = False
        self.error: Exception | None = None
        self.error_at = 0

    def read(self, size: int = -1) -> bytes:
        if self.done:
            return b""
        try:
            # read1: one decompression step; never loses the bytes before an error
            data = self._gz.read1(size if size and size > 0 else io.DEFAULT_BUFFER_SIZE)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            self.done, self.error, self.error_at = True, exc, self._raw.tell()
            return b""
        if not data:
            self.done = True
        self.delivered += len(data)
        return data

    def describe(self, size: int) -> str:
        """``"gzip stream cut at byte C of S (<error>); "`` or ``""`` if no gzip error."""
        if self.error is None:
            return ""
        if isinstance(self.error, EOFError):
            return f"gzip stream cut at byte {self.error_at} of {size} ({self.error}); "
        return (f"gzip data corrupt near byte {self.error_at} of {size} "
                f"({type(self.error).__name__}: {self.error}); ")


def _recording_tarinfo(last_block: list[bytes]) -> type[tarfile.TarInfo]:
    """A ``TarInfo`` class that keeps the last header block ``tarfile`` parsed in
    ``last_block[0]`` (in stream mode the block at an archive's end cannot be re-read)."""

    class _TarInfo(tarfile.TarInfo):
        @classmethod
        def frombuf(cls, buf, encoding, errors):
            last_block[:] = [buf]
            return super().frombuf(buf, encoding, errors)
    return _TarInfo


@contextlib.contextmanager
def _open_gz(path: str, last_block: list[bytes],
             holder: list[_GzipSource]) -> Iterator[tarfile.TarFile]:
    """A stream-mode ``TarFile`` over the gzip file ``path``; its ``_GzipSource`` is put
    in ``holder[0]`` first (to describe a gzip error even when opening fails). Raises
    ``tarfile.ReadError`` when not even the first tar header can be read."""
    with open(path, "rb") as raw:
        src = _GzipSource(raw)
        holder[:] = [src]
        tf = tarfile.open(fileobj=src, mode="r|", encoding=ENCODING, errors=ERRORS,
                          tarinfo=_recording_tarinfo(last_block))
        try:
            yield tf
        finally:
            tf.close()


def _gz_samples(uri: str, shard_key: str, path: str, size: int,
                max_bytes: int | None = None,
                caps: ShardCaps | None = None) -> Iterator[ShardSample]:
    name = fs.display_uri(uri)
    last_block: list[bytes] = []
    # Pass 1: headers only (member data decompressed and skipped, never kept).
    holder: list[_GzipSource] = []
    try:
        with _open_gz(path, last_block, holder) as tf:
            src = holder[0]
            members, cut, cut_name = _scan_stream(tf, src, last_block, caps)
            if cut is None:
                src_error = _drain(src)
                if src_error is not None:   # e.g. CRC mismatch: some bytes are wrong
                    yield _error_row(uri, shard_key, ErrorReason.READ_FAILED,
                                     f"{name}: gzip check at the end of the stream failed "
                                     f"({type(src_error).__name__}: {src_error}): the "
                                     "decompressed data is corrupt, no sample is kept")
                    return
    except (tarfile.TarError, EOFError) as exc:
        gz = holder[0].describe(size) if holder else ""
        yield _error_row(uri, shard_key, ErrorReason.READ_FAILED,
                         f"{name}: not a readable gzip-compressed tar archive ({gz}{exc})")
        return
    except (OSError, ValueError) as exc:
        yield _error_row(uri, shard_key, ErrorReason.READ_FAILED, f"{name}: {exc}")
        return
    if cut is not None and not isinstance(cut, _Cap):
        cut = src.describe(size) + cut
    plan = _plan(members, cut, cut_name)

    # Pass 2: decompress again; read the members of good samples, yield each sample as
    # its last member arrives, a bad key's row at its first member, stop after the last.
    if plan.members:
        by_offset = {m.info.offset: pos for pos, m in enumerate(plan.members)}
        last_needed = max(p[-1] if k not in plan.problems else p[0]
                          for k, p in plan.by_key.items())
        # link targets of good samples: their bytes are held from the target (always
        # earlier in the stream) until the last link to them is read
        refs: dict[int, int] = {}
        for k, p in plan.by_key.items():
            for m in (plan.members[i] for i in p if k not in plan.problems):
                if m.data is not m.info:
                    refs[m.data.offset] = refs.get(m.data.offset, 0) + 1
        held: dict[int, bytes | int] = {}
        data: dict[str, bytes | int] = {}
        key = "?"
        try:
            holder2: list[_GzipSource] = []
            with _open_gz(path, [], holder2) as tf:
                for info in tf:
                    pos = by_offset.get(info.offset)
                    if info.offset in refs:
                        held[info.offset] = _member_bytes(tf, info, max_bytes)
                    if pos is None:
                        continue
                    member = plan.members[pos]
                    key = member.key
                    positions = plan.by_key[key]
                    if key in plan.problems:
                        if pos == positions[0]:
                            yield _bad_row(uri, key, plan)
                    elif member.data is member.info:
                        data[member.ext] = (held[info.offset] if info.offset in held
                                            else _member_bytes(tf, info, max_bytes))
                    else:
                        target = member.data.offset
                        data[member.ext] = held[target]
                        refs[target] -= 1
                        if not refs[target]:
                            del refs[target], held[target]
                    if key not in plan.problems and pos == positions[-1]:
                        yield _sample(uri, key, data, max_bytes)
                        data = {}
                    if pos == last_needed:
                        break
                else:
                    raise tarfile.ReadError(f"shard changed between passes "
                                            f"({holder2[0].describe(size)}ended early)")
        except (OSError, tarfile.TarError, EOFError, ValueError) as exc:
            yield _error_row(uri, shard_key, ErrorReason.READ_FAILED,
                             f"{name}: reading member of sample '{key}' failed: {exc}")
            return
    if cut is not None:
        yield _cut_row(uri, shard_key, cut, plan)


def _scan_stream(tf: tarfile.TarFile, src: _GzipSource, last_block: list[bytes],
                 caps: ShardCaps | None = None
                 ) -> tuple[list[_Member], str | None, str | None]:
    """``_scan`` for a stream-mode tar: ``(complete members, cut description or None,
    name of the member being cut or None)``. Byte offsets are decompressed tar bytes.
    Past a cap the stream is not decompressed further."""
    infos: list[tarfile.TarInfo] = []
    last: tarfile.TarInfo | None = None
    failure: str | None = None
    total_bytes = 0
    try:
        for info in iter(tf.next, None):
            total_bytes += info.size
            cap = _over_cap(info, len(infos) + 1, total_bytes, caps)
            if cap is not None:
                return _members(infos, True), cap, info.name
            last = info
            infos.append(info)
    except tarfile.ReadError as exc:
        failure = str(exc)
    members = _members(infos, True)
    total = src.delivered
    after = f" after member '{last.name}'" if last is not None else ""
    if last is not None and src.done and last.offset_data + last.size > total:
        if members and members[-1].info is last:
            members.pop()
        return members, f"tar ends at byte {total} inside member '{last.name}'", last.name
    if failure is not None:
        return members, f"tar ends or breaks at byte {total}{after} ({failure})", None
    block = last_block[0] if last_block else b""
    return (members, *_classify_end(block, total, tf.offset,
                                    last.name if last is not None else None))


def _drain(src: _GzipSource) -> Exception | None:
    """Read what follows the tar's end (record padding) so that gzip checks its CRC and
    length; a gzip error there other than a cut is returned. Reads at most
    ``_GZ_DRAIN_MAX`` bytes (past that the check is skipped)."""
    stop = src.delivered + _GZ_DRAIN_MAX
    while src.delivered < stop and src.read(65536):
        pass
    err = src.error
    return None if err is None or isinstance(err, EOFError) else err


