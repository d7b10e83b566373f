"""Text decoding and cleaning: the one place that turns bytes or Python strings into text
that is safe to store (always encodable as UTF-8, as Arrow requires).

``decode_text(raw)`` decodes bytes (a ``.txt`` sidecar, a manifest cell, a WebDataset
member) and ``clean_text(s)`` cleans a ``str`` (a JSON value, a Parquet string). Both
return ``(text, flags)``. This module imports nothing from ``pipeline`` (it sits at the
bottom of the import graph, like ``pipeline.records``).

Decoding rules of ``decode_text``, in order:

1. A byte order mark names the encoding: UTF-32 LE/BE (``FF FE 00 00`` / ``00 00 FE FF``),
   UTF-8 (``EF BB BF``), UTF-16 LE/BE (``FF FE`` / ``FE FF``); the BOM is removed. If the
   bytes after the BOM do not decode strictly, the next rule is tried.
2. Without a BOM, UTF-32 or UTF-16 is recognised by ``sniff_unicode``: at least 4 bytes,
   NUL bytes where that encoding puts the high bytes of ASCII characters (UTF-16: NULs at
   one parity in at least half of the 2-byte code units and at least 4 times as many as at
   the other parity; UTF-32: the top byte of every 4-byte unit NUL and the next one NUL in
   at least half of the units), a strict decode, and
   no control character (C0 other than tab, LF, CR; DEL; C1) in the result. UTF-16 text
   without any ASCII (e.g. only CJK) has no such pattern and is not recognised.
3. Strict UTF-8.
4. If UTF-8 fails and the bytes look like 8-bit text - no C0 control byte other than
   tab/LF/CR, no DEL (``0x7F``), and (necessarily, as UTF-8 failed) bytes >= ``0x80`` -
   the single-byte ``fallback_encoding`` (default cp1252, what Windows spreadsheets and
   editors write; the WHATWG Encoding Standard also decodes "latin1" labels as
   windows-1252), strictly. Bytes undefined in it (cp1252: 81 8D 8F 90 9D) fail.
5. Otherwise UTF-8 with ``errors="replace"``: each invalid sequence becomes U+FFFD.

Cleaning rules of ``clean_text`` (always applied by ``decode_text`` too):

* surrogate code points: a high+low pair (two code points in a Python ``str``) is joined
  into the character it encodes; a lone one (e.g. ``json.loads('"\\ud83c"')``, a cut
  emoji) becomes U+FFFD.
* control characters are removed: C0 except tab, LF and CR (so NUL is removed), DEL
  (U+007F) and C1 (U+0080-U+009F). Unicode's "Cc" category is exactly these plus tab,
  LF and CR.

Flags (strings; the caption step stores them in ``caption_flags``):

* ``utf16`` / ``utf32``: decoded as UTF-16 / UTF-32 (with or without a BOM). A UTF-8 BOM
  is removed without a flag.
* ``encoding_fixed``: not UTF-8; decoded with ``fallback_encoding`` (rule 4).
* ``invalid_utf8``: undecodable bytes replaced by U+FFFD (rule 5).
* ``lone_surrogate``: lone surrogate code points replaced by U+FFFD.
* ``control_chars_removed``: NUL or other control characters removed.

The caption step adds its own flags (``replacement_char``, ``missing_caption``, ...;
see ``pipeline.steps.caption``).
"""

from __future__ import annotations

import codecs
import re

ENCODING_FIXED = "encoding_fixed"
INVALID_UTF8 = "invalid_utf8"
LONE_SURROGATE = "lone_surrogate"
CONTROL_CHARS_REMOVED = "control_chars_removed"
UTF16 = "utf16"
UTF32 = "utf32"

# BOMs, longest first: the UTF-32 LE BOM starts with the UTF-16 LE BOM.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le", UTF32), (codecs.BOM_UTF32_BE, "utf-32-be", UTF32),
         (codecs.BOM_UTF8, "utf-8", None), (codecs.BOM_UTF16_LE, "utf-16-le", UTF16),
         (codecs.BOM_UTF16_BE, "utf-16-be", UTF16))
# Stream codecs that consume their BOM themselves (for sniff_encoding).
_STREAM_CODEC = {"utf-32-le": "utf-32", "utf-32-be": "utf-32", "utf-8": "utf-8-sig",
                 "utf-16-le": "utf-16", "utf-16-be": "utf-16"}

_CONTROL_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_BYTES = re.compile(b"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_text(s: str) -> tuple[str, list[str]]:
    """Return ``(text, flags)``: ``s`` with surrogate pairs joined, lone surrogates replaced
    by U+FFFD (flag ``lone_surrogate``) and control characters removed (C0 except tab, LF,
    CR; DEL; C1 - flag ``control_chars_removed``). The result always encodes as UTF-8.
    Never raises for a ``str``. Rules: the module docstring."""
    flags: list[str] = []
    if not s.isascii() and _SURROGATES.search(s):
        before = s.count("\ufffd")
        # UTF-16 round trip: pairs become one character, lone surrogates U+FFFD.
        s = s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        if s.count("\ufffd") > before:
            flags.append(LONE_SURROGATE)
    cleaned = _CONTROL_CHARS.sub("", s)
    if len(cleaned) != len(s):
        flags.append(CONTROL_CHARS_REMOVED)
    return cleaned, flags


def _clean_unicode(data: bytes, codec: str, final: bool) -> str | None:
    """``data`` decoded strictly with ``codec`` if that works and the text has no control
    characters other than tab/LF/CR, else None. ``final=False``: ``data`` is a prefix of a
    longer stream (an incomplete last character is ignored)."""
    try:
        text = codecs.getincrementaldecoder(codec)("strict").decode(data, final)
    except UnicodeDecodeError:
        return None
    return None if _CONTROL_CHARS.search(text) else text


def sniff_unicode(data: bytes, final: bool = True) -> str | None:
    """The codec (``"utf-32-le"``, ``"utf-32-be"``, ``"utf-16-le"``, ``"utf-16-be"``) of BOM-less
    UTF-32/UTF-16 text ``data`` (rule 2 of the module docstring), or None. ``final=False``
    when ``data`` is only the head of a stream (it may end inside a character). Pure."""
    n = len(data)
    if n < 4 or (final and n % 2):
        return None
    if not final or n % 4 == 0:
        # UTF-32: the top byte of every unit NUL, the next one mostly NUL (BMP text).
        whole = data[:n - n % 4]
        for codec, top, nxt in (("utf-32-le", 3, 2), ("utf-32-be", 0, 1)):
            tops, nexts = whole[top::4], whole[nxt::4]
            if (tops.count(0) == len(tops) and 2 * nexts.count(0) >= len(nexts)
                    and _clean_unicode(whole, codec, final) is not None):
                return codec
    units = n // 2
    even, odd = data[0:2 * units:2].count(0), data[1:2 * units:2].count(0)
    for codec, nuls, other in (("utf-16-le", odd, even), ("utf-16-be", even, odd)):
        if 2 * nuls >= units and nuls >= 4 * other:
            if _clean_unicode(data, codec, final) is not None:
                return codec
    return None


def sniff_encoding(head: bytes) -> tuple[str, str | None]:
    """The Python codec to read a whole text stream that starts with ``head`` (its first
    few KiB), and its flag: a BOM -> ``utf-8-sig`` / ``utf-16`` / ``utf-32`` (codecs that
    remove the BOM); BOM-less UTF-16/32 (``sniff_unicode``) -> that codec, flag
    ``utf16``/``utf32``; else ``("utf-8", None)`` - the caller reads UTF-8 (e.g. with
    ``errors="surrogateescape"`` and ``decode_text`` per value). Pure; never raises."""
    for bom, codec, flag in _BOMS:
        if head.startswith(bom):
            return _STREAM_CODEC[codec], flag
    codec = sniff_unicode(head, final=False)
    if codec:
        return codec, UTF32 if "32" in codec else UTF16
    return "utf-8", None


def looks_8bit_text(raw: bytes) -> bool:
    """True if ``raw`` may be text in a single-byte encoding: no C0 control byte other than
    tab/LF/CR, no DEL, and at least one byte >= 0x80 (rule 4 of the module docstring)."""
    return not raw.isascii() and not _CONTROL_BYTES.search(raw)


def decode_text(raw: bytes, fallback_encoding: str = "cp1252") -> tuple[str, list[str]]:
    """Decode ``raw`` (bytes) to ``(text, flags)`` by the rules of the module docstring
    (BOM, BOM-less UTF-16/32, UTF-8, ``fallback_encoding`` for 8-bit text, else UTF-8 with
    U+FFFD), then ``clean_text``. Never raises: an unknown ``fallback_encoding`` counts as
    a failed fallback. The text always encodes as UTF-8."""
    raw = bytes(raw)
    flags: list[str] = []
    text: str | None = None
    for bom, codec, flag in _BOMS:
        if raw.startswith(bom):
            try:
                text = raw[len(bom):].decode(codec)
                flags = [flag] if flag else []
            except UnicodeDecodeError:
                pass
            break
    if text is None:
        codec = sniff_unicode(raw)
        if codec:
            text, flags = raw.decode(codec), [UTF32 if "32" in codec else UTF16]
    if text is None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if looks_8bit_text(raw):
                try:
                    text, flags = raw.decode(fallback_encoding), [ENCODING_FIXED]
                except (UnicodeDecodeError, LookupError):
                    pass
            if text is None:
                text, flags = raw.decode("utf-8", errors="replace"), [INVALID_UTF8]
    text, more = clean_text(text)
    return text, flags + more
