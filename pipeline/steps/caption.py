"""Caption normalisation: any raw value to ``caption`` (str or None) plus ``caption_flags``.

Raw values: ``bytes`` (a ``.txt`` sidecar, a CSV cell that is not UTF-8, a binary Parquet
column) are decoded by ``pipeline.text.decode_text``; ``str`` values are cleaned by
``pipeline.text.clean_text``; other JSON values become their JSON text. The caption is
stripped of surrounding whitespace, never holds NUL or another control character other
than tab/LF/CR, and always encodes as UTF-8.

Flags (list of str): ``missing_caption`` (null, blank or absent), ``non_string_caption``
(a number, bool, dict, ...; stored as its JSON text), ``from_list`` (a list: its first
non-blank string is used), ``long_caption`` (longer than ``long_caption_chars``
characters; the caption is stored in full), ``replacement_char`` (the text held U+FFFD
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

from pipeline.columns import CAPTION, CAPTION_FLAGS, RAW_CAPTION, Batch
from pipeline.spec import CaptionSpec
from pipeline.steps.base import Step
from pipeline.text import INVALID_UTF8, LONE_SURROGATE, clean_text, decode_text

_BYTES = (bytes, bytearray, memoryview)


def _is_text(value: Any) -> bool:
    """A non-blank str, or bytes that are not only whitespace (list captions)."""
    return isinstance(value, (str, *_BYTES)) and bool(bytes(value).strip()
                                                      if isinstance(value, _BYTES)
                                                      else value.strip())


def normalize_caption(raw: Any, spec: CaptionSpec) -> tuple[str | None, list[str]]:
    """Return ``(caption, flags)`` for a raw caption value of any type.

    ``raw``: None, str, bytes/bytearray/memoryview, a list/tuple (its first non-blank
    str or bytes is used, flag ``from_list``) or any other JSON value (its JSON text, flag
    ``non_string_caption``). ``caption`` is the stripped text, or None (flag
    ``missing_caption``) when nothing but whitespace or control characters is left.
    ``spec.fallback_encoding`` is the single-byte encoding tried for 8-bit bytes. Flags:
    the module docstring. Never raises.
    """
    flags: list[str] = []
    if isinstance(raw, (list, tuple)):
        flags.append("from_list")
        raw = next((r for r in raw if _is_text(r)), None)
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
    if "\ufffd" in text and INVALID_UTF8 not in flags and LONE_SURROGATE not in flags:
        flags.append("replacement_char")
    if len(text) > spec.long_caption_chars:
        flags.append("long_caption")
    return text, flags


class CaptionStep(Step):
    """Fills ``caption`` and ``caption_flags`` from ``_raw_caption`` for every row."""

    writes = (CAPTION, CAPTION_FLAGS)

    def __init__(self, spec: CaptionSpec):
        self.spec = spec

    def settings(self):
        return self.spec.model_dump(mode="json")

    def __call__(self, batch: Batch) -> Batch:
        pairs = [normalize_caption(raw, self.spec) for raw in batch[RAW_CAPTION]]
        batch[CAPTION] = [c for c, _ in pairs]
        batch[CAPTION_FLAGS] = [f for _, f in pairs]
        return batch
