"""Reading Parquet, CSV and JSONL manifests: profile a file once, read row ranges as batches.

A manifest row is read in the same way by ``profile`` (which counts the rows and decides
the types of the carried columns from ALL rows, in one streaming pass) and by
``read_rows`` (which yields the rows ``[start, stop)`` in batches), so the planned row
counts and the rows read always agree: every row in ``[start, stop)`` yields exactly one
output row, a row that cannot be read yields one row with an ``errors`` entry, never a
failed manifest. Memory is one block (CSV/JSONL: one buffered MiB and one batch of rows;
Parquet: one record batch) whatever the file size.

Columns are of two kinds:

* ``used``: the columns mmpipe interprets itself (path/url, caption, key). They are not
  typed and come out raw (Python values as read: CSV: ``str``, or the cell's original
  ``bytes`` when they are not valid UTF-8 - e.g. a Windows-1252 export - so that the
  caller decodes them with ``pipeline.text.decode_text`` and keeps its flags;
  ``normalize_caption`` does that for captions. JSONL: any JSON value (a top-level string
  on a line that was not valid UTF-8 comes out as its original ``bytes``). Parquet:
  ``str`` for string columns (``bytes`` for a value that is not valid UTF-8), ``bytes``
  for binary columns, dictionaries decoded, other types as ``to_pylist`` gives them).
* carried: every other column. ``profile`` decides its type per file from all rows,
  ``union_columns`` across files, and ``read_rows`` converts values to that type.

Carried types (per file): CSV: ``int64`` if every non-empty cell is an integer (ASCII
digits, optional sign, no leading zeros - ids like ``000123`` stay text - within
int64), else ``float64`` if every non-empty cell is a decimal number, else ``bool`` if
every non-empty cell is true/True/TRUE/false/False/FALSE, else ``large_string``; an empty
cell is None. JSONL: ``int64`` (ints within int64), ``float64`` (floats, or ints and
floats), ``bool``, else ``large_string`` (strings; any mix of kinds, e.g. ``"a-17"`` and
``4711``; objects and lists) where non-strings are their JSON text. Parquet: the stored
type (a dictionary: its value type). A column with no non-null value is ``pa.null()``.
Text values are cleaned with ``pipeline.text.clean_text`` (bytes: ``decode_text``).

Text encoding of CSV/JSONL (``pipeline.text.sniff_encoding`` on the first 4 KiB): a BOM
(UTF-8, UTF-16, UTF-32) or BOM-less UTF-16/32 names the encoding; otherwise UTF-8 read
with ``errors="surrogateescape"`` so that each cell's original bytes are recovered and
decoded by itself (``decode_text``: cp1252 cells get ``encoding_fixed``).
CSV: Python's ``csv`` module (excel dialect: ``,`` and ``"``; quoted newlines work);
the first non-blank row is the header (names decoded like cells; a repeated name gets
``.1``, ``.2``...); blank lines are skipped; a row with a different number of fields
than the header is an error row. JSONL: one ``json.loads`` per line (``strict=False``:
raw control characters in strings are accepted, then cleaned); blank lines are skipped;
a line that is not a JSON object is an error row.

JSON (``.json``, or ``manifest_format: json``): what most tools write as ``.json`` - one
JSON array of objects (pretty-printed or on one line), concatenated objects
(``{...}{...}``, ``{...}\n{...}``), or JSON Lines. A file of at most ``DOCUMENT_LIMIT``
bytes is decoded whole and read value by value (``json.JSONDecoder.raw_decode``): each
top-level object is a row, each element of a top-level array is a row (an element that
is not an object is an error row naming its index; an empty array is one error row
saying the file holds no records), any other top-level value is an error row. Invalid
JSON is one error row, then reading resumes at the next line that starts with ``{`` or
``[`` (so a JSON Lines file with one bad line loses only that line). A larger file is
read as JSON Lines (an array that large is one error row: convert it to JSON Lines,
which streams). No row offsets are kept: a partition of a JSON file re-reads it from the
start (at most ``DOCUMENT_LIMIT`` bytes).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import posixpath
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.errors import PartitionError, PlanError
from pipeline.storage import fs
from pipeline.input import manifest_types as mt
from pipeline.text import clean_text, decode_text, sniff_encoding

_EXTENSIONS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "json",
               ".ndjson": "jsonl"}

_BUFFER_BYTES = 1 << 20
_HEAD_BYTES = 4096
_CSV_FIELD_LIMIT = 64 << 20  # characters; Python's default (128 KiB) is below long captions
#: The longest manifest line read (bytes of UTF-8, else characters): a longer line is
#: skipped in pieces, never held whole, and stands as ``TOO_LONG`` (one error row).
LINE_LIMIT = _CSV_FIELD_LIMIT
TOO_LONG = "\x00mmpipe: line too long\x00"
_ESCAPED = re.compile("[\udc80-\udcff]")  # surrogateescape'd bytes


@dataclasses.dataclass(frozen=True)
class ManifestProfile:
    """What one pass over a manifest file found.

    ``rows``: data rows (the rows ``read_rows`` yields for ``[0, rows)``). ``columns``:
    carried column name -> Arrow type decided from all rows (module docstring), in file
    order, the ``used`` columns excluded. ``names``: every column name of the file (CSV:
    the header; Parquet: the schema; JSONL: every key seen, in order of first sight).
    ``offsets``: with ``profile(..., every=n)``, where rows ``n, 2n, ...`` start (UTF-8
    CSV/JSONL; empty for Parquet, which seeks by row group, and for UTF-16/32 files).
    """

    rows: int
    columns: dict[str, pa.DataType]
    names: list[str]
    offsets: tuple[RowOffset, ...] = ()


@dataclasses.dataclass
class ManifestRows:
    """One batch of manifest rows: rows ``first_row .. first_row + num_rows - 1`` of the file
    (0-based, data rows only; row numbers are contiguous).

    ``values``: column name -> list (one value per row) for every ``used`` column (raw
    values, module docstring) and every ``carried`` column (converted to its type); None
    where the file or the row lacks the column, and in every column of an error row.
    ``errors``: per row, None or why the row could not be read (it then counts as one
    error row). ``names``: the file's columns (CSV: header; Parquet: schema; JSONL: the
    keys of this batch's rows).
    """

    first_row: int
    values: dict[str, list[Any]]
    errors: list[str | None]
    names: tuple[str, ...] = ()

    @property
    def num_rows(self) -> int:
        """Rows in this batch."""
        return len(self.errors)


def manifest_format(uri: str, declared: str) -> str:
    """Return ``declared`` unless it is ``auto``, else the format from the extension.

    Raises ``PlanError`` for an unknown extension.
    """
    if declared != "auto":
        return declared
    ext = posixpath.splitext(uri)[1].lower()
    if ext not in _EXTENSIONS:
        raise PlanError(f"{uri}: cannot tell the manifest format from {ext!r}; "
                        f"set source.manifest_format")
    return _EXTENSIONS[ext]


def list_manifests(uri: str, declared: str) -> list[tuple[str, int]]:
    """Return ``(uri, size_bytes)`` of the manifest file ``uri`` or the manifests under it, sorted.

    Under a prefix, a ``.json`` file beside a media file of the same stem (``x.jpg`` +
    ``x.json``) is that file's sidecar (the WebDataset/img2dataset convention), not a JSONL
    manifest, and is left out; a ``.json`` with no such neighbour is a manifest."""
    size = fs.file_size(uri)
    if size is not None:
        return [(fs.normalize(uri), size)]
    from pipeline.spec import VIDEO_EXTENSIONS, image_extensions

    media = set(image_extensions()) | set(VIDEO_EXTENSIONS)
    found, media_stems = [], set()
    for entry in fs.list_files(uri):
        stem, ext = posixpath.splitext(entry.uri)
        ext = ext.lower()
        if ext in media:
            media_stems.add(stem)
        elif (declared == "auto" and ext in _EXTENSIONS) or _EXTENSIONS.get(ext) == declared \
                or (declared == "jsonl" and ext == ".json"):  # .json read as JSON Lines
            found.append((entry.uri, entry.size_bytes))
    return [(u, n) for u, n in found
            if not (u.lower().endswith(".json") and posixpath.splitext(u)[0] in media_stems)]


# ---------------------------------------------------------------------------------------
# Values: kinds, types, conversions


class _BadRow:
    """A CSV record the ``csv`` module could not parse (one error row)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


@dataclasses.dataclass(frozen=True)
class RowOffset:
    """Where data row ``row`` of a CSV/JSONL manifest starts: ``byte`` (offset of its first
    line in the file) and ``line`` (lines before it). ``profile(..., every=n)`` records one
    every ``n`` rows so that ``read_rows`` seeks to a partition's first row instead of
    streaming the file from its start (which would make reading a file in ``k`` ranges cost
    ``k`` times the file)."""

    row: int
    byte: int
    line: int


@dataclasses.dataclass
class _Position:
    byte: int = 0
    line: int = 0


def _utf8_lines(buf: io.BufferedReader, at: _Position) -> Iterator[str]:
    """The lines of a UTF-8 file from byte ``at.byte`` (``surrogateescape``: each cell's
    original bytes stay recoverable), advancing ``at`` past each line as it is yielded.
    A UTF-8 BOM at byte 0 is dropped. A line over ``LINE_LIMIT`` bytes is ``TOO_LONG``."""
    buf.seek(at.byte)
    while True:
        raw = buf.readline(LINE_LIMIT + 1)
        if not raw:
            return
        size = len(raw)
        if size > LINE_LIMIT and not raw.endswith(b"\n"):
            size += _skip_line(buf.readline, b"\n")
            text = TOO_LONG
        else:
            text = raw.decode("utf-8", "surrogateescape")
        if at.byte == 0 and text.startswith("\ufeff"):
            text = text[1:]
        at.byte += size
        at.line += 1
        yield text


def _skip_line(readline: Callable[[int], Any], newline: Any) -> int:
    """Read the rest of an over-long line in 1 MiB pieces; return its length."""
    skipped = 0
    while True:
        piece = readline(1 << 20)
        skipped += len(piece)
        if not piece or piece.endswith(newline):
            return skipped


def _text_lines(text: io.TextIOWrapper, at: _Position) -> Iterator[str]:
    """The lines of a text stream (UTF-16/32, or CR-only line ends: no byte offsets), counting
    ``at.line``. A line over ``LINE_LIMIT`` characters is ``TOO_LONG``."""
    while True:
        line = text.readline(LINE_LIMIT + 1)
        if not line:
            return
        if len(line) > LINE_LIMIT and not line.endswith(("\n", "\r")):
            _skip_line(text.readline, ("\n", "\r"))
            line = TOO_LONG
        at.line += 1
        yield line


def _csv_records(lines: Iterable[str], at: _Position) -> Iterator[list[str] | _BadRow]:
    """Non-blank CSV records of ``lines`` as lists of cells, or ``_BadRow``. The ``csv``
    module reads only the lines of the record it returns (no read-ahead), so ``at`` is the
    end of the last record yielded."""
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)
    reader = csv.reader(lines)
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            yield _BadRow(f"line {at.line}: {e}")
            continue
        if record and TOO_LONG in record:
            yield _BadRow(f"line {at.line}: longer than {LINE_LIMIT} bytes")
        elif record:
            yield record


def _json_lines(lines: Iterable[str], at: _Position) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of the non-blank lines (line numbers from 1)."""
    for line in lines:
        if line.strip():
            yield at.line, line


def _header(record: list[str] | _BadRow | None, uri: str) -> list[str]:
    """Column names from a CSV header record: decoded, cleaned, repeated names numbered."""
    if record is None:
        return []
    if isinstance(record, _BadRow):
        raise PartitionError(f"manifest {uri}: cannot read the CSV header: {record.message}")
    names: list[str] = []
    for cell in record:
        name, n = mt.cell_text(cell), 1
        while name in names:
            name, n = f"{mt.cell_text(cell)}.{n}", n + 1
        names.append(name)
    return names


class _Cursor:
    """The data rows of a CSV/JSONL manifest, taken in chunks, from row 0 or from a
    ``RowOffset``.

    The encoding is the one ``sniff_encoding`` picks from the first 4 KiB. A UTF-8 file
    (the usual case) is read as binary lines, so the cursor knows the byte offset after
    the last row it took (``at``; ``tracked``); UTF-16/32 files and CR-only line ends are
    read through a text stream from the start (no offsets). A chunk is taken under
    ``fs.with_retries``: a storage error mid-stream reopens the file at the offset after
    the last row taken (untracked: from the start, skipping the rows taken), so a resumed
    stream neither loses nor repeats a row.
    """

    def __init__(self, uri: str, fmt: str, seek: RowOffset | None = None):
        self.uri, self.fmt = uri, fmt
        self.pos = seek.row if seek else 0
        self.at = _Position(seek.byte, seek.line) if seek else _Position()
        self.names: list[str] = []
        self.tracked = False
        self._file: io.IOBase | None = None
        self._rows: Iterator[Any] | None = None

    def _open(self) -> Iterator[Any]:
        fsys, path = fs.resolve(self.uri)
        buf = io.BufferedReader(fsys.open_input_file(path), _BUFFER_BYTES)
        self._file = buf
        head = buf.peek(_HEAD_BYTES)[:_HEAD_BYTES]
        codec, _ = sniff_encoding(head)
        if self.fmt == "json":
            values = _json_document(buf, codec)
            if values is not None:
                self.tracked, self.at = False, _Position()
                rows: Iterator[Any] = values
                for _ in itertools.islice(rows, self.pos):
                    pass
                return rows
            buf.seek(0)  # over DOCUMENT_LIMIT and not an array: read as JSON Lines
        self.tracked = codec.startswith("utf-8") and (b"\n" in head or b"\r" not in head)
        if self.tracked:
            if self.fmt == "csv" and (not self.names or self.at.byte == 0):
                header = _Position()
                self.names = _header(next(_csv_records(_utf8_lines(buf, header), header),
                                          None), self.uri)
                if self.at.byte == 0:
                    self.at = header
            lines: Iterator[str] = _utf8_lines(buf, self.at)
            skip = 0
        else:
            buf.seek(0)
            text = io.TextIOWrapper(buf, encoding=codec, errors="surrogateescape"
                                    if codec.startswith("utf-8") else "replace",
                                    newline="" if self.fmt == "csv" else "\n")
            self._file, self.at = text, _Position()
            lines, skip = _text_lines(text, self.at), self.pos
        if self.fmt in ("jsonl", "json"):
            rows = _json_lines(lines, self.at)
        else:
            rows = _csv_records(lines, self.at)
            if not self.tracked:
                self.names = _header(next(rows, None), self.uri)
        for _ in itertools.islice(rows, skip):
            pass
        return rows

    def take(self, n: int) -> list[Any]:
        """The next ``n`` rows (fewer at the end of the file)."""
        def attempt() -> list[Any]:
            saved = dataclasses.replace(self.at)
            try:
                if self._rows is None:
                    self._rows = self._open()
                return list(itertools.islice(self._rows, n))
            except BaseException:
                self.close()
                self.at = saved  # the rows of this chunk are taken again
                raise
        chunk = fs.with_retries(self.uri, "read manifest", attempt)
        self.pos += len(chunk)
        return chunk

    def offset(self) -> RowOffset | None:
        """Where the next row starts (None when this file's offsets are not tracked)."""
        return RowOffset(self.pos, self.at.byte, self.at.line) if self.tracked else None

    def close(self) -> None:
        """Close the stream (a later ``take`` reopens it)."""
        if self._file is not None:
            self._file.close()
        self._file, self._rows = None, None


#: The largest ``.json`` manifest decoded whole (bytes): JSON arrays and concatenated
#: objects have no line to stream by; a larger file is read as JSON Lines.
DOCUMENT_LIMIT = LINE_LIMIT
_DECODER = json.JSONDecoder(strict=False)
_RESYNC = re.compile(r"\n[ \t\r]*(?=[\[{])")


@dataclasses.dataclass(frozen=True)
class _Parsed:
    """One row of a JSON document: the parsed object, or why there is none."""

    obj: dict[str, Any] | None
    why: str | None


def _json_document(buf: io.BufferedReader, codec: str) -> Iterator[tuple[int, _Parsed]] | None:
    """The rows of a JSON document (module docstring, JSON) as ``(line, _Parsed)``, or
    None when the file is over ``DOCUMENT_LIMIT`` bytes and does not start with ``[`` (the
    caller reads it as JSON Lines)."""
    raw = buf.read(DOCUMENT_LIMIT + 1)
    if len(raw) > DOCUMENT_LIMIT:
        if not raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            return None
        return iter([(1, _Parsed(None, f"a JSON array of more than {DOCUMENT_LIMIT} bytes "
                                       "(not read): write it as JSON Lines, which streams"))])
    if codec.startswith("utf-8"):
        text = raw.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    else:
        text = raw.decode(codec, "replace")
    return _document_values(text)


def _document_values(text: str) -> Iterator[tuple[int, _Parsed]]:
    pos, line, counted = 0, 1, 0
    end = len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos >= end:
            return
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            value, stop = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError) as e:
            yield line, _Parsed(None, f"invalid JSON: {str(e)[:200]}")
            found = _RESYNC.search(text, pos)
            pos = found.end() if found else end
            continue
        piece = text[pos:stop]
        pos = stop
        if not isinstance(value, list):
            yield line, _Parsed(*_record(value, piece))
        elif not value:
            yield line, _Parsed(None, "an empty JSON array: the file holds no records")
        else:
            for i, element in enumerate(value):
                obj, why = _record(element, piece)
                yield line, _Parsed(obj, why and f"element {i} of the JSON array: {why}")


def _record(obj: Any, text: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` if ``obj`` is a JSON object, else ``(None, why)``; ``text``: the
    JSON it was parsed from (surrogateescape'd bytes in it: top-level strings holding
    them become those bytes)."""
    if not isinstance(obj, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
            type(obj), "number")
        return None, f"not a JSON object but {'an' if kind == 'array' else 'a'} {kind}"
    if not text.isascii() and _ESCAPED.search(text):
        obj = {_escaped_text(k) if _ESCAPED.search(k) else k: _escaped_bytes(v)
               for k, v in obj.items()}
    return obj, None


def _parse_json(line: str | _Parsed) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` for a JSON object line, else ``(None, why)``. On a line that
    was not valid UTF-8, top-level strings holding such bytes become those bytes. A row
    of a JSON document (``_Parsed``) is already parsed."""
    if isinstance(line, _Parsed):
        return line.obj, line.why
    if line == TOO_LONG:
        return None, f"line longer than {LINE_LIMIT} bytes (not read)"
    try:
        obj = json.loads(line, strict=False)
    except (ValueError, RecursionError) as e:
        return None, f"invalid JSON: {str(e)[:200]}"
    if not isinstance(obj, dict):
        return None, f"not a JSON object but {type(obj).__name__}"
    return _record(obj, line)


def _escaped_bytes(v: Any) -> Any:
    """A str holding surrogateescape'd bytes as its original bytes; anything else as is."""
    if isinstance(v, str) and _ESCAPED.search(v):
        try:
            return v.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # also holds a JSON-escaped lone surrogate
            pass
    return v


def _escaped_text(s: str) -> str:
    """A str holding surrogateescape'd bytes decoded by ``decode_text`` (key names)."""
    raw = _escaped_bytes(s)
    return decode_text(raw)[0] if isinstance(raw, bytes) else clean_text(raw)[0]


def _read_text(uri: str, fmt: str, start: int, stop: int, used: list[str],
               carried: dict[str, pa.DataType], batch_size: int,
               seek: RowOffset | None) -> Iterator[ManifestRows]:
    cursor = _Cursor(uri, fmt, seek if seek is not None and seek.row <= start else None)
    try:
        if start > 0:
            while cursor.pos < start and cursor.take(min(batch_size * 16, start - cursor.pos)):
                pass
        row = cursor.pos
        while row < stop:
            chunk = cursor.take(min(batch_size, stop - row))
            if not chunk:
                break
            if fmt == "csv":
                yield _csv_batch(chunk, cursor.names, row, used, carried)
            else:
                yield _json_batch(chunk, row, used, carried)
            row += len(chunk)
    finally:
        cursor.close()


def _csv_batch(chunk: list[Any], names: list[str], first: int, used: list[str],
               carried: dict[str, pa.DataType]) -> ManifestRows:
    index = {name: i for i, name in enumerate(names)}
    n = len(chunk)
    values: dict[str, list[Any]] = {c: [None] * n for c in (*used, *carried)}
    errors: list[str | None] = [None] * n
    for j, record in enumerate(chunk):
        if isinstance(record, _BadRow):
            errors[j] = f"row {first + j}: {record.message}"
            continue
        if len(record) != len(names):
            errors[j] = (f"row {first + j}: expected {len(names)} fields (the header's), "
                         f"got {len(record)}")
            continue
        for c in used:
            if c in index:
                values[c][j] = mt.cell_raw(record[index[c]])
        for c, t in carried.items():
            if c in index:
                try:
                    values[c][j] = mt.csv_value(record[index[c]], t)
                except ValueError as e:
                    mt.note(errors, j, f"row {first + j}: column {c!r}: {e}")
    return ManifestRows(first, values, errors, tuple(names))


def _json_batch(chunk: list[tuple[int, str]], first: int, used: list[str],
                carried: dict[str, pa.DataType]) -> ManifestRows:
    n = len(chunk)
    values: dict[str, list[Any]] = {c: [None] * n for c in (*used, *carried)}
    errors: list[str | None] = [None] * n
    names: dict[str, None] = {}
    for j, (line_number, line) in enumerate(chunk):
        obj, why = _parse_json(line)
        if obj is None:
            errors[j] = f"row {first + j} (line {line_number}): {why}"
            continue
        names.update(dict.fromkeys(obj))
        for c in used:
            values[c][j] = obj.get(c)
        for c, t in carried.items():
            try:
                values[c][j] = mt.json_value(obj.get(c), t)
            except ValueError as e:
                mt.note(errors, j, f"row {first + j} (line {line_number}): column {c!r}: {e}")
    return ManifestRows(first, values, errors, tuple(names))


def _profile_text(uri: str, fmt: str, used: set[str], every: int) -> ManifestProfile:
    cursor = _Cursor(uri, fmt)
    kinds: dict[str, set[str]] = {}
    names: dict[str, None] = {}
    offsets: list[RowOffset] = []
    rows = 0
    try:
        while True:
            chunk = cursor.take(min(4096, every - rows % every) if every else 4096)
            if not chunk:
                break
            rows += len(chunk)
            offset = cursor.offset()
            if every and rows % every == 0 and offset is not None:
                offsets.append(offset)
            if fmt == "csv":
                _csv_kinds(chunk, cursor.names, used, kinds)
            else:
                for _, line in chunk:
                    obj, _why = _parse_json(line)
                    if obj is None:
                        continue
                    for k, v in obj.items():
                        names.setdefault(k)
                        if k not in used:
                            kind = mt.json_kind(v)
                            col = kinds.setdefault(k, set())
                            if kind:
                                col.add(kind)
        if fmt == "csv":
            names = dict.fromkeys(cursor.names)
    finally:
        cursor.close()
    columns = {k: mt.type_of(kinds.get(k, set())) for k in names if k not in used}
    return ManifestProfile(rows, columns, list(names), tuple(o for o in offsets if o.row < rows))


def _csv_kinds(chunk: list[Any], names: list[str], used: set[str],
               kinds: dict[str, set[str]]) -> None:
    todo = [(i, kinds.setdefault(name, set())) for i, name in enumerate(names)
            if name not in used]
    todo = [(i, k) for i, k in todo if "text" not in k]
    if not todo:
        return
    width = len(names)
    for record in chunk:
        if isinstance(record, _BadRow) or len(record) != width:
            continue
        for i, col in todo:
            kind = mt.csv_kind(record[i])
            if kind:
                col.add(kind)


# ---------------------------------------------------------------------------------------
# Parquet


def _utf8_or_bytes(b: bytes | None) -> str | bytes | None:
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def _arrow_raw(col: pa.Array) -> list[Any]:
    """A used Parquet column as Python values (module docstring)."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if mt.is_text_type(col.type):
        return [_utf8_or_bytes(b) for b in col.cast(pa.large_binary()).to_pylist()]
    return col.to_pylist()


def _arrow_carried(col: pa.Array, target: pa.DataType, first: int, name: str,
                   errors: list[str | None]) -> list[Any]:
    """A carried Parquet column converted to ``target``; a value that cannot be converted
    is None and notes an error on its row."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    if mt.is_text_type(target):
        if mt.is_text_type(t) or mt.is_binary_type(t):
            try:
                return [None if b is None else mt.bytes_text(b)
                        for b in col.cast(pa.large_binary()).to_pylist()]
            except (pa.ArrowException, ValueError):
                pass
        elif mt.numeric(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t):
            try:
                return col.cast(pa.large_string()).to_pylist()
            except (pa.ArrowException, ValueError):
                pass
        return [mt.to_text(v) for v in col.to_pylist()]
    if t == target:
        return col.to_pylist()
    try:
        return col.cast(target).to_pylist()
    except (pa.ArrowException, ValueError):
        pass
    out = []
    for j, v in enumerate(col.to_pylist()):
        try:
            out.append(None if v is None else mt.generic(v, target))
        except (pa.ArrowException, ValueError, TypeError):
            out.append(None)
            mt.note(errors, j, f"row {first + j}: column {name!r}: cannot convert "
                  f"{mt.to_text(v)[:60]!r} to {target}")
    return out


def _profile_parquet(uri: str, used: set[str]) -> ManifestProfile:
    fsys, path = fs.resolve(uri)

    def read() -> ManifestProfile:
        with fsys.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
            columns = {}
            for field in schema:
                if field.name not in used:
                    t = field.type
                    columns[field.name] = t.value_type if pa.types.is_dictionary(t) else t
            return ManifestProfile(pf.metadata.num_rows, columns, list(schema.names))
    return fs.with_retries(uri, "read footer", read)


#: The most bytes (uncompressed, the columns read) of one Parquet row group read at once:
#: a larger row group is not read, its rows are error rows (Parquet has no line to skip).
ROW_GROUP_LIMIT = 4 * LINE_LIMIT


def _read_parquet(uri: str, start: int, stop: int, used: list[str],
                  carried: dict[str, pa.DataType], batch_size: int) -> Iterator[ManifestRows]:
    """Rows ``start .. stop - 1`` of a Parquet manifest, row group by row group. Bounds
    (``max_bytes`` of the manifest itself, issue 12): a row group whose read columns
    exceed ``ROW_GROUP_LIMIT`` bytes uncompressed (footer metadata, checked before any
    page is read) gives one error row per row; a cell longer than ``LINE_LIMIT`` bytes is
    one error row (its value is not passed on)."""
    fsys, path = fs.resolve(uri)
    f = fs.with_retries(uri, "open", lambda: fsys.open_input_file(path))
    try:
        pf = pq.ParquetFile(f)
        names = tuple(pf.schema_arrow.names)
        # At least one column, so that batches carry their row count.
        wanted = [c for c in names if c in used or c in carried] or list(names[:1])
        index: dict[str, list[int]] = {}  # column -> its leaf columns (a struct has several)
        for i in range(pf.metadata.num_columns):
            index.setdefault(pf.metadata.schema.column(i).path.split(".")[0], []).append(i)
        offset = 0
        for g in range(pf.num_row_groups):
            meta = pf.metadata.row_group(g)
            row, offset = offset, offset + meta.num_rows
            if not meta.num_rows or offset <= start or row >= stop:
                continue
            size = sum(meta.column(i).total_uncompressed_size
                       for c in wanted for i in index.get(c, ()))
            lo, hi = max(start, row), min(stop, offset)
            if size > ROW_GROUP_LIMIT:
                message = (f"Parquet row group {g} holds {size} bytes in the columns read, "
                           f"over {ROW_GROUP_LIMIT} (not read)")
                yield ManifestRows(lo, {c: [None] * (hi - lo) for c in [*used, *carried]},
                                   [message] * (hi - lo), names)
                continue
            for rb in pf.iter_batches(batch_size=batch_size, row_groups=[g], columns=wanted):
                lo, hi = max(start, row), min(stop, row + rb.num_rows)
                if hi > lo:
                    yield _parquet_batch(rb.slice(lo - row, hi - lo), lo, used, carried, names)
                row += rb.num_rows
            if offset >= stop:
                break
    finally:
        f.close()


def _parquet_batch(rb: pa.RecordBatch, first: int, used: list[str],
                   carried: dict[str, pa.DataType], names: tuple[str, ...]) -> ManifestRows:
    n = rb.num_rows
    errors: list[str | None] = [None] * n
    for c in rb.schema.names:  # a cell longer than a manifest line may be: an error row
        col = rb.column(c)
        if pa.types.is_string(col.type) or pa.types.is_binary(col.type) or \
                pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type):
            lengths = pc.binary_length(col)
            if (pc.max(lengths).as_py() or 0) <= LINE_LIMIT:
                continue
            for i, length in enumerate(lengths.to_pylist()):
                if length is not None and length > LINE_LIMIT:
                    errors[i] = f"column {c!r}: a value of {length} bytes, over {LINE_LIMIT}"
    values: dict[str, list[Any]] = {}
    for c in used:
        values[c] = _arrow_raw(rb.column(c)) if c in rb.schema.names else [None] * n
    for c, t in carried.items():
        values[c] = (_arrow_carried(rb.column(c), t, first, c, errors)
                     if c in rb.schema.names else [None] * n)
    for i, error in enumerate(errors):
        if error is not None:  # an error row carries no values
            for column in values.values():
                column[i] = None
    return ManifestRows(first, values, errors, names)


# ---------------------------------------------------------------------------------------
# Public API


def _guard(uri: str, fmt: str, error: type[Exception], fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a storage or Arrow error raises ``error`` naming the file."""
    try:
        return fn()
    except (PartitionError, PlanError) as e:
        raise error(str(e)) from e
    except (pa.ArrowException, OSError) as e:
        raise error(f"manifest {uri}: cannot read as {fmt}: {e}") from e


def _used(used: Collection[str]) -> list[str]:
    return list(dict.fromkeys(c for c in used if c))


def profile(uri: str, declared: str, used: Collection[str], every: int = 0) -> ManifestProfile:
    """Count the rows of the manifest ``uri`` and type its carried columns, in one pass.

    ``declared``: the spec's manifest format (``auto``: from the extension). ``used``: the
    columns mmpipe interprets (path/url, caption, key); they are left out of ``columns``
    (empty names ignored). CSV/JSONL: one streaming pass over the whole file with the
    reader ``read_rows`` uses (memory: one buffer and one chunk of rows); rows that cannot
    be read count as rows (they are error rows when read) and do not take part in typing.
    ``every``: record a ``RowOffset`` every ``every`` rows (``ManifestProfile.offsets``).
    Parquet: count and types from the footer. Types: module docstring. Raises
    ``PlanError`` naming the file when it cannot be read at all (missing, storage
    failure after retries, a corrupt Parquet footer, an unknown extension).
    """
    fmt = manifest_format(uri, declared)
    names = set(_used(used))
    if fmt == "parquet":
        return _guard(uri, fmt, PlanError, lambda: _profile_parquet(uri, names))
    return _guard(uri, fmt, PlanError, lambda: _profile_text(uri, fmt, names, every))


def read_rows(uri: str, declared: str, start: int, stop: int, used: Collection[str],
              carried: dict[str, pa.DataType], batch_size: int = 1024,
              seek: RowOffset | None = None) -> Iterator[ManifestRows]:
    """Yield the rows ``[start, stop)`` (0-based data rows, as counted by ``profile``) of
    the manifest ``uri`` as ``ManifestRows`` of at most ``batch_size`` rows, in order;
    exactly one output row per row of the range that the file holds (fewer only if the
    file is shorter than ``stop``).

    ``used``: columns returned raw (module docstring); ``carried``: column -> Arrow type
    (``union_columns`` of the files' profiles) - values are converted to it (text
    columns: cleaned text; non-strings as JSON text); a column this file lacks is None.
    A row that cannot be parsed (wrong number of CSV fields, invalid JSON, not an object)
    or whose value cannot be converted has an ``errors`` entry instead of failing the file.
    Parquet reads only the row groups that overlap the range; CSV/JSONL stream from
    ``seek`` (a ``RowOffset`` at or before ``start``, from ``profile``), else from the
    start of the file, up to ``stop``. Raises ``PartitionError`` naming the file when it
    cannot be read (storage failure after retries, corrupt Parquet data).
    """
    fmt = manifest_format(uri, declared)
    cols = _used(used)
    if fmt == "parquet":
        it = _read_parquet(uri, start, stop, cols, dict(carried), batch_size)
    else:
        it = _read_text(uri, fmt, start, stop, cols, dict(carried), batch_size, seek)
    try:
        while True:
            batch = _guard(uri, fmt, PartitionError, lambda: next(it, None))
            if batch is None:
                return
            yield batch
    finally:
        it.close()  # closes the file now if the caller stops early

