"""Types of a manifest's carried columns: per-value kinds, one type per file, one per job.

``pipeline.input.manifest_rows`` decides each carried column's type per file from all its rows
(``csv_kind`` / ``json_kind`` per value, ``type_of`` per column), unites the files'
columns (``union_columns``: a conflict becomes text, with a warning) and converts each
value to its column's type while reading (``csv_value``, ``json_value``). The rules are
in ``pipeline.input.manifest_rows``'s module docstring.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from pipeline.text import clean_text, decode_text

_INT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)\Z")
_FLOAT = re.compile(r"[+-]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_TRUE = frozenset({"true", "True", "TRUE"})
_FALSE = frozenset({"false", "False", "FALSE"})
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def int_in_range(v: int) -> bool:
    """True if ``v`` fits in int64 (Arrow ``int64``)."""
    return _INT64_MIN <= v <= _INT64_MAX


def csv_kind(cell: str) -> str | None:
    """Kind of a CSV cell: None (empty), ``int``, ``float``, ``bool`` or ``text``."""
    if not cell:
        return None
    if not cell.isascii():
        return "text"
    if _INT.match(cell):
        return "int" if int_in_range(int(cell)) else "text"
    if _FLOAT.match(cell):
        return "float"
    if cell in _TRUE or cell in _FALSE:
        return "bool"
    return "text"


def json_kind(v: Any) -> str | None:
    """Kind of a JSON value: None (null), ``int``, ``float``, ``bool`` or ``text``."""
    if v is None:
        return None
    if v is True or v is False:
        return "bool"
    if type(v) is int:
        return "int" if int_in_range(v) else "text"
    if type(v) is float:
        return "float"
    return "text"


def type_of(kinds: set[str]) -> pa.DataType:
    """Arrow type of a column whose non-null values are of ``kinds``."""
    if not kinds:
        return pa.null()
    if kinds == {"int"}:
        return pa.int64()
    if kinds <= {"int", "float"}:
        return pa.float64()
    if kinds == {"bool"}:
        return pa.bool_()
    return pa.large_string()


def is_text_type(t: pa.DataType) -> bool:
    """True for Arrow string, large_string and string_view."""
    return (pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_string_view(t))


def is_binary_type(t: pa.DataType) -> bool:
    """True for Arrow binary, large_binary, binary_view and fixed_size_binary."""
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t))


def bytes_text(b: bytes) -> str:
    """Text of bytes: valid UTF-8 cleaned as is, anything else by ``decode_text``."""
    try:
        return clean_text(b.decode("utf-8"))[0]
    except UnicodeDecodeError:
        return decode_text(b)[0]


def to_text(v: Any) -> str | None:
    """Text of any value for a text column: str cleaned, bytes decoded, others JSON text."""
    if v is None:
        return None
    if isinstance(v, str):
        return clean_text(v)[0]
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes_text(bytes(v))
    return clean_text(json.dumps(v, ensure_ascii=False, default=str))[0]


def cell_raw(cell: str) -> str | bytes:
    """A CSV cell as read: str, or its original bytes if they are not valid UTF-8."""
    if cell.isascii():
        return cell
    try:
        cell.encode("utf-8")
        return cell
    except UnicodeEncodeError:
        return cell.encode("utf-8", "surrogateescape")


def cell_text(cell: str) -> str:
    """A CSV cell as clean text (original bytes decoded by ``decode_text`` if needed)."""
    raw = cell_raw(cell)
    return decode_text(raw)[0] if isinstance(raw, bytes) else clean_text(raw)[0]


def generic(v: Any, target: pa.DataType) -> Any:
    """``v`` converted to ``target`` by Arrow's cast (a type no reader infers itself)."""
    return pa.scalar(v).cast(target).as_py()


def csv_value(cell: str, target: pa.DataType) -> Any:
    """A CSV cell converted to ``target``; raises ``ValueError`` if it cannot be."""
    if not cell:
        return None
    if is_text_type(target):
        return cell_text(cell)
    if pa.types.is_int64(target) and _INT.match(cell) and int_in_range(int(cell)):
        return int(cell)
    if pa.types.is_float64(target) and _FLOAT.match(cell):
        return float(cell)
    if pa.types.is_boolean(target) and (cell in _TRUE or cell in _FALSE):
        return cell in _TRUE
    if not (pa.types.is_int64(target) or pa.types.is_float64(target)
            or pa.types.is_boolean(target) or pa.types.is_null(target)):
        try:
            return generic(cell_text(cell), target)
        except (pa.ArrowException, ValueError, TypeError):
            pass
    raise ValueError(f"cannot convert {cell_text(cell)[:60]!r} to {target}")


def json_value(v: Any, target: pa.DataType) -> Any:
    """A JSON value converted to ``target``; raises ``ValueError`` if it cannot be."""
    if v is None:
        return None
    if is_text_type(target):
        return to_text(v)
    kind = json_kind(v)
    if pa.types.is_int64(target) and kind == "int":
        return v
    if pa.types.is_float64(target) and kind in ("int", "float"):
        return float(v)
    if pa.types.is_boolean(target) and kind == "bool":
        return v
    if not (pa.types.is_int64(target) or pa.types.is_float64(target)
            or pa.types.is_boolean(target) or pa.types.is_null(target)):
        try:
            return generic(v, target)
        except (pa.ArrowException, ValueError, TypeError):
            pass
    raise ValueError(f"cannot convert {to_text(v)[:60]!r} to {target}")


def note(errors: list[str | None], i: int, message: str) -> None:
    """Add ``message`` to row ``i``'s error (``"; "``-joined when it already has one)."""
    errors[i] = message if errors[i] is None else f"{errors[i]}; {message}"


# ---------------------------------------------------------------------------------------
# Union across files


def numeric(t: pa.DataType) -> bool:
    """True for Arrow integer and floating-point types."""
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def merge(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type holding both ``a`` and ``b`` without turning numbers into text, or None."""
    if a == b or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    if is_text_type(a) and is_text_type(b):
        return pa.large_string()
    if is_binary_type(a) and is_binary_type(b):
        return pa.large_binary()
    if numeric(a) and numeric(b):
        return pa.int64() if pa.types.is_integer(a) and pa.types.is_integer(b) else pa.float64()
    return None


def union_columns(profiles: Iterable[dict[str, pa.DataType]]
                  ) -> tuple[dict[str, pa.DataType], list[str]]:
    """Union of the carried columns (``ManifestProfile.columns``) of several files.

    Returns ``(columns, warnings)``: ``columns`` maps each name (order of first sight) to
    one type: the same type; null with X -> X; string/large_string -> large_string;
    binary kinds -> large_binary; integers -> int64; integers and floats -> float64; a
    column that is null in every file -> large_string. Any other mix is a conflict: the
    column becomes ``pa.large_string()`` (``read_rows`` then gives each value as text) and
    ``warnings`` gets one line naming the column, its types and the conversion. Pure.
    """
    seen: dict[str, list[pa.DataType]] = {}
    for columns in profiles:
        for name, t in columns.items():
            types = seen.setdefault(name, [])
            if t not in types:
                types.append(t)
    out: dict[str, pa.DataType] = {}
    warnings: list[str] = []
    for name, types in seen.items():
        merged: pa.DataType | None = pa.null()
        for t in types:
            merged = merge(merged, t) if merged is not None else None
        if merged is None:
            warnings.append(f"manifest column {name!r} has conflicting types across files "
                            f"({', '.join(str(t) for t in types)}); converted to text "
                            f"(large_string)")
            merged = pa.large_string()
        out[name] = pa.large_string() if pa.types.is_null(merged) else merged
    return out, warnings


def columns_to_text(columns: dict[str, pa.DataType]) -> str:
    """``columns`` (name -> Arrow type) as ASCII text (base64 of an Arrow IPC schema), e.g.
    to store the carried columns in the plan; ``columns_from_text`` reads it back."""
    schema = pa.schema([pa.field(n, t) for n, t in columns.items()])
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def columns_from_text(text: str) -> dict[str, pa.DataType]:
    """The ``columns`` written by ``columns_to_text``. Raises ``ValueError`` on bad text."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"not a serialized column list: {e}") from e
    return {f.name: f.type for f in schema}


# ---------------------------------------------------------------------------------------
# CSV / JSONL row streams
