"""Caption normalisation: any raw value to ``caption`` (str or None), ``captions`` (every
caption, normalised alike: a list keeps all of them) plus ``caption_flags``.

Raw values: ``bytes`` (a ``.txt`` sidecar, a CSV cell that is not UTF-8, a binary Parquet
column) are decoded by ``pipeline.text.decode_text``; ``str`` values are cleaned by
``pipeline.text.clean_text``; other JSON values become their JSON text. The caption is
stripped of surrounding whitespace, never holds NUL or another control character other
than tab/LF/CR, and always encodes as UTF-8.

Flags (list of str): ``missing_caption`` (null, blank or absent), ``caption_key_missing``
(with ``missing_caption``: a `.json` sidecar/member object without the
``source.caption_column`` key, ``records.CaptionKeyMissing``), ``non_string_caption``
(a number, bool, dict, ...; stored as its JSON text), ``from_list`` (a list: its first
non-blank string is ``caption``, all of them are ``captions``), ``long_caption`` (longer
than ``long_caption_chars`` characters; the caption is stored in full), ``caption_truncated``
(longer than ``max_caption_chars`` characters: cut to that many; bytes are cut to
``4 * max_caption_chars + 4`` before decoding, so a huge caption costs no more than a
long one), ``replacement_char`` (the text held U+FFFD
before any decoding here, i.e. neither ``invalid_utf8`` nor ``lone_surrogate`` made it),
and the decoding flags of ``pipeline.text``: ``encoding_fixed`` (bytes were not UTF-8 and
were decoded with the fallback encoding, cp1252 by default), ``invalid_utf8``
(undecodable bytes replaced by U+FFFD), ``utf16`` / ``utf32`` (bytes were UTF-16/32),
``lone_surrogate`` (a lone UTF-16 surrogate, e.g. a cut emoji, replaced by U+FFFD),
``control_chars_removed`` (NUL or other control characters removed).
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.columns import CAPTION, CAPTION_FLAGS, CAPTIONS, RAW_CAPTION, Batch
from pipeline.records import CaptionKeyMissing
from pipeline.spec import CaptionSpec
from pipeline.steps.base import Step
from pipeline.text import INVALID_UTF8, LONE_SURROGATE, clean_text, decode_text

_BYTES = (bytes, bytearray, memoryview)
CAPTION_KEY_MISSING = "caption_key_missing"
CAPTION_TRUNCATED = "caption_truncated"


def _is_text(value: Any) -> bool:
    """A non-blank str, or bytes that are not only whitespace (list captions)."""
    return isinstance(value, (str, *_BYTES)) and bool(bytes(value).strip()
                                                      if isinstance(value, _BYTES)
                                                      else value.strip())


def normalize_caption(raw: Any, spec: CaptionSpec) -> tuple[str | None, list[str]]:
    """Return ``(caption, flags)`` for a raw caption value of any type: the first two
    items of ``normalize_captions`` (see there). Never raises."""
    caption, _, flags = normalize_captions(raw, spec)
    return caption, flags


def normalize_captions(raw: Any, spec: CaptionSpec) -> tuple[str | None, list[str], list[str]]:
    """Return ``(caption, captions, flags)`` for a raw caption value of any type.

    ``raw``: None, str, bytes/bytearray/memoryview, a list/tuple of captions, or any other
    JSON value (its JSON text, flag ``non_string_caption``). Each str or bytes is
    normalised alike: decoded (``spec.fallback_encoding`` is the single-byte encoding
    tried for 8-bit bytes), cleaned and stripped; one left blank (or only control
    characters) is no caption. ``captions``: every caption in input order - for a list,
    each of its str/bytes items that is not blank after normalisation (other items, e.g.
    numbers or nested lists, are skipped); for a single value, a one-element list; ``[]``
    when there is none. ``caption``: the first of ``captions``, or None (flag
    ``missing_caption``). ``flags`` describe ``caption`` (for a list: ``from_list`` first;
    with no caption, the flags of the list's first str/bytes item). Flags: the module
    docstring. Never raises.
    """
    if not isinstance(raw, (list, tuple)):
        text, flags = _normalize_one(raw, spec)
        return text, [] if text is None else [text], flags
    tried = [_normalize_one(r, spec) for r in raw if _is_text(r)]
    captions = [text for text, _ in tried if text is not None]
    chosen = next((t for t in tried if t[0] is not None),
                  tried[0] if tried else (None, ["missing_caption"]))
    return chosen[0], captions, ["from_list"] + chosen[1]


def _normalize_one(raw: Any, spec: CaptionSpec) -> tuple[str | None, list[str]]:
    """``(text, flags)`` of one caption value that is not a list (``normalize_captions``)."""
    if isinstance(raw, CaptionKeyMissing):
        return None, [CAPTION_KEY_MISSING, "missing_caption"]
    flags: list[str] = []
    limit = spec.max_caption_chars
    if isinstance(raw, _BYTES) and len(raw) > 4 * limit + 4:  # UTF-8/16/32: <= 4 bytes/char
        raw, flags = bytes(raw[:4 * limit + 4]), [CAPTION_TRUNCATED]
    elif isinstance(raw, str) and len(raw) > 2 * limit + 2:   # cleaning only removes chars
        raw, flags = raw[:2 * limit + 2], [CAPTION_TRUNCATED]
    if isinstance(raw, _BYTES):
        raw, more = decode_text(bytes(raw), spec.fallback_encoding)
        flags += more
    elif raw is not None:
        if not isinstance(raw, str):
            flags.append("non_string_caption")
            raw = json.dumps(raw, ensure_ascii=False, default=str)
        raw, more = clean_text(raw)
        flags += more
    if raw is None or not raw.strip():
        return None, flags + ["missing_caption"]
    text = raw.strip()
    if len(text) > limit:
        text = text[:limit].rstrip()
        flags += [] if CAPTION_TRUNCATED in flags else [CAPTION_TRUNCATED]
    if "\ufffd" in text and INVALID_UTF8 not in flags and LONE_SURROGATE not in flags:
        flags.append("replacement_char")
    if len(text) > spec.long_caption_chars:
        flags.append("long_caption")
    return text, flags


class CaptionStep(Step):
    """Fills ``caption``, ``captions`` and ``caption_flags`` from ``_raw_caption`` for
    every row (``normalize_captions``)."""

    reads = (RAW_CAPTION,)
    writes = (CAPTION, CAPTIONS, CAPTION_FLAGS)

    def __init__(self, spec: CaptionSpec):
        self.spec = spec

    def settings(self):
        return self.spec.model_dump(mode="json")

    def __call__(self, batch: Batch) -> Batch:
        out = [normalize_captions(raw, self.spec) for raw in batch[RAW_CAPTION]]
        batch[CAPTION] = [c for c, _, _ in out]
        batch[CAPTIONS] = [cs for _, cs, _ in out]
        batch[CAPTION_FLAGS] = [f for _, _, f in out]
        return batch
