"""Caption normalisation: any raw value to ``caption`` (str or None) plus ``caption_flags``.

Flags (list of str): ``missing_caption`` (null, blank or absent), ``non_string_caption``
(a number, dict, ...; stored as its JSON text), ``from_list`` (a list: its first non-blank
string is used), ``encoding_fixed`` (bytes were not UTF-8 and were decoded with the
fallback encoding, cp1252 by default), ``invalid_utf8`` (undecodable bytes replaced by
U+FFFD), ``replacement_char`` (the text holds U+FFFD), ``long_caption`` (longer than
``long_caption_chars`` characters; the caption is stored in full).
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.columns import CAPTION, CAPTION_FLAGS, RAW_CAPTION, Batch
from pipeline.spec import CaptionSpec
from pipeline.steps.base import Step


def decode_text(raw: bytes, fallback_encoding: str) -> tuple[str, list[str]]:
    """Decode caption bytes: UTF-8 (BOM stripped), else ``fallback_encoding``, else U+FFFD."""
    try:
        return raw.decode("utf-8-sig"), []
    except UnicodeDecodeError:
        pass
    try:
        return raw.decode(fallback_encoding), ["encoding_fixed"]
    except (UnicodeDecodeError, LookupError):
        return raw.decode("utf-8", errors="replace"), ["invalid_utf8"]


def normalize_caption(raw: Any, spec: CaptionSpec) -> tuple[str | None, list[str]]:
    """Return ``(caption, flags)`` for a raw caption value of any type."""
    flags: list[str] = []
    if isinstance(raw, (list, tuple)):
        flags.append("from_list")
        raw = next((r for r in raw if isinstance(r, (str, bytes)) and r.strip()), None)
    if isinstance(raw, (bytes, bytearray)):
        raw, more = decode_text(bytes(raw), spec.fallback_encoding)
        flags += more
    if raw is not None and not isinstance(raw, str):
        flags.append("non_string_caption")
        raw = json.dumps(raw, ensure_ascii=False, default=str)
    if raw is None or not raw.strip():
        return None, flags + ["missing_caption"]
    text = raw.strip()
    if "\ufffd" in text and "invalid_utf8" not in flags:
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
