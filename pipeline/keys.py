"""Record keys: one rule, so a key is unique, deterministic and the same in every sink.

A key must be usable as a WebDataset ``__key__`` (the WebDataset convention splits a
member name at the first ``.`` of its base name, so a key's last path component holds no
``.``) and must be valid UTF-8 text (Arrow strings). ``escape_key`` maps any text to such
a key *injectively* - two different inputs never give the same key - by percent-encoding
(RFC 3986 §2.1 style, ``%XX`` of the UTF-8 byte):

- ``%`` everywhere (so an escaped text is never confused with a plain one),
- ``.`` in the last path component,
- C0 control characters and DEL,
- the lone surrogates ``U+DC80..U+DCFF`` that ``os.fsdecode`` makes of a file name's
  undecodable bytes: ``%XX`` of the original byte (other lone surrogates become U+FFFD).

Keys without those characters are unchanged (``000000039769``, ``photos/cat``).

How each datasource derives keys (``pipeline.input.base``):

- files: the path relative to ``source.uri`` without its extension; when several media
  files share that stem (``x.jpg`` and ``x.png``), each keeps its extension
  (``x%2Ejpg``, ``x%2Epng``), so neither key is taken by the other.
- manifests: the ``source.key_column`` value when it is a non-blank value (a null or
  blank key is treated as missing); otherwise ``<manifest path relative to source.uri,
  without extension>/<row number, 9 digits>`` (img2dataset's numbering).
- WebDataset: the sample's ``__key__``.

A datasource passes the keys of a partition through ``PartitionKeys``, which gives a
key seen before in the same partition the suffix ``%2A<n>`` (``*`` escaped: a text
``escape_key`` never produces), so keys are unique within every partition and equal in
Parquet and WebDataset output. Keys named by the input (a key column, ``__key__``) are
trusted to be unique across partitions; detecting a repeat across partitions would need
a dataset-wide index.
"""

from __future__ import annotations

import posixpath

DUPLICATE_SUFFIX = "%2A"


def _escape_char(c: str, last: bool) -> str:
    o = ord(c)
    if c == "%" or (c == "." and last) or o < 0x20 or o == 0x7F:
        return f"%{o:02X}"
    if 0xDC80 <= o <= 0xDCFF:  # os.fsdecode's surrogateescape of byte o - 0xDC00
        return f"%{o - 0xDC00:02X}"
    if 0xD800 <= o <= 0xDFFF:
        return "\ufffd"
    return c


def escape_key(text: str) -> str:
    """``text`` as a key: valid UTF-8, no ``.`` in its last ``/`` component, injective
    (see the module docstring for the exact rule)."""
    head, sep, last = text.rpartition("/")
    return ("".join(_escape_char(c, False) for c in head) + sep
            + "".join(_escape_char(c, True) for c in last))


def stem_key(relative_path: str, keep_extension: bool = False) -> str:
    """Key of a file from its path relative to the input root: without the extension
    (``photos/cat.jpg`` -> ``photos/cat``), or with it escaped when ``keep_extension``
    (another media file shares the stem: ``x.jpg`` -> ``x%2Ejpg``)."""
    return escape_key(relative_path if keep_extension
                      else posixpath.splitext(relative_path)[0])


def row_key(source_stem: str, row: int) -> str:
    """Derived key of manifest row ``row`` (0-based): ``<source_stem>/<row:09d>``."""
    return f"{escape_key(source_stem)}/{row:09d}"


def given_key(value: object) -> str | None:
    """A key named by the input (key column value, ``__key__``) as a key, or None when
    it is missing: None, or text that is blank once stripped. Non-text values (a number
    in a JSON key column) use their text form."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    text = str(value).strip()
    return escape_key(text) if text else None


class PartitionKeys:
    """Makes the keys of one partition unique, deterministically (in row order): the
    n-th repeat of a key ``k`` (n >= 1) becomes ``k%2A<n>``."""

    def __init__(self):
        self.seen: dict[str, int] = {}

    def unique(self, key: str) -> str:
        """``key`` if not seen before in this partition, else ``key%2A<n>``."""
        n = self.seen.get(key)
        if n is None:
            self.seen[key] = 0
            return key
        while True:
            n += 1
            candidate = f"{key}{DUPLICATE_SUFFIX}{n}"
            if candidate not in self.seen:
                self.seen[key] = n
                self.seen[candidate] = 0
                return candidate
