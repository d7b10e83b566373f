"""Caption text signals (``signals.caption``): language, counts, repetition, flagged words.

Every value is computed from the normalised ``caption`` (``steps.caption``); a row
without one gets None in every column. Videos are no different (their caption is text).

* ``caption_language`` / ``caption_language_confidence``: lingua
  (``lingua-language-detector``, its n-gram models ship in the wheel, nothing is
  downloaded). The detector chooses among ``languages`` (default: all 75 lingua knows) and
  is built once per worker in ``setup()`` with its models preloaded: lingua's lazy loading
  saves nothing here, because the confidence of every candidate language is computed for
  each caption, which loads every candidate's models on the first caption (measured with
  all 75: 0.9 GB after the first captions lazily, 1.25 GB preloaded; the 5-9 s load moves
  from the first batch to setup). The language is the one of highest confidence, as its
  ISO 639-1 code in lower case; None (confidence None) when the caption has fewer than
  ``min_chars`` letters, and None (confidence 0.0) when lingua finds no language (every
  confidence 0, e.g. Cyrillic text when ``languages`` holds only Latin-script ones).
* ``caption_chars``: Unicode code points. ``caption_words``: ``words(text)``: runs of
  word characters (``\\w``, Unicode) joined by inner apostrophes, except that every Han
  ideograph, kana and other CJK character is one word on its own, since Chinese and
  Japanese put no spaces between words (so for them the count is the number of
  characters, not of dictionary words; Thai, Lao, Khmer and Burmese runs count as one word).
* ``caption_repetition``: ``repetition(words, n)``, the Gopher "duplicate n-gram character
  fraction" (Rae et al. 2021, "Scaling Language Models", appendix A, Table A1) with
  DataTrove's non-overlapping count (``GopherRepetitionFilter``, ``find_all_duplicate``).
* ``caption_flagged_words``: ``FlaggedWords`` over the terms of ``flagged_words_file``.

The flagged-words file is read when the step is made (``from_spec``, with the storage
reader that ``pipeline.assembly`` passes in: steps do no I/O of their own), so a missing
file fails before anything runs and the sha256 of its content goes into ``settings()``.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from pipeline.columns import (
    CAPTION,
    CAPTION_CHARS,
    CAPTION_FLAGGED_WORDS,
    CAPTION_LANGUAGE,
    CAPTION_LANGUAGE_CONFIDENCE,
    CAPTION_REPETITION,
    CAPTION_WORDS,
)
from pipeline.errors import SpecError
from pipeline.spec import CaptionSignalsSpec, JobSpec
from pipeline.steps.base import RowStep

FLAGGED_FIELD = "signals.caption.flagged_words_file"

# Scripts written without spaces between words, where each character counts as one word:
# CJK radicals/symbols/punctuation .. Hiragana, Katakana, Bopomofo, CJK strokes, Katakana
# extensions, enclosed CJK, CJK ext. A, unified ideographs, compatibility ideographs,
# half-width katakana, and the supplementary ideograph planes (ext. B onwards).
_CJK = ("\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u31c0-\u31ff\u3200-\u33ff"
        "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f")
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+(?:['\u2019][^\W{_CJK}]+)*")


def words(text: str) -> list[str]:
    """The words of ``text`` in order (the module docstring: ``\\w`` runs, apostrophes
    inside a word kept, one word per CJK character). ``"Don't stop-now 猫が"`` ->
    ``["Don't", "stop", "now", "猫", "が"]``."""
    return _WORD.findall(text)


def repetition(tokens: list[str], n: int) -> float:
    """Fraction (0..1) of the characters of ``tokens`` that lie in word n-grams repeating
    an earlier n-gram (Rae et al. 2021, Table A1, "duplicate n-gram character fraction").

    Scanned left to right as in DataTrove's ``find_all_duplicate``: at word ``i``, if the
    n-gram ``tokens[i:i+n]`` occurred before, its characters count and the scan jumps to
    ``i+n`` (repeats never overlap), else it is remembered and the scan moves one word.
    N-grams compare case-folded (``str.casefold``); characters are those of the words
    (no spaces), so the result stays in 0..1. Fewer than ``n`` words: 0.0.
    ``["a", "dog", "a", "dog", "a", "dog"]``, n=2 -> 8/12."""
    total = sum(len(t) for t in tokens)
    if total == 0 or len(tokens) < n:
        return 0.0
    folded = [t.casefold() for t in tokens]
    seen: set[tuple[str, ...]] = set()
    repeated, i = 0, 0
    while i <= len(tokens) - n:
        gram = tuple(folded[i:i + n])
        if gram in seen:
            repeated += sum(len(t) for t in tokens[i:i + n])
            i += n
        else:
            seen.add(gram)
            i += 1
    return repeated / total


def parse_terms(text: str) -> list[str]:
    """The terms of a flagged-words file: one per line, stripped, NFC-normalised; blank
    lines and lines whose first non-blank character is ``#`` skipped; repeats dropped
    (first kept)."""
    out: dict[str, None] = {}
    for line in text.splitlines():
        term = unicodedata.normalize("NFC", line.strip())
        if term and not term.startswith("#"):
            out.setdefault(term, None)
    return list(out)


class FlaggedWords:
    """Counts the matches of ``terms`` (words or phrases) in a text.

    A term and the text are compared as word sequences (``words`` of their
    ``str.casefold``-ed NFC form): matching is case-insensitive (``Straße`` matches
    ``STRASSE``) and by whole words (``bad`` never matches ``badly``), and whatever lies
    between words (spaces, punctuation) is ignored, so ``hot dog`` also matches
    ``Hot-dog``. A CJK character is a word of its own, so a Chinese/Japanese term matches
    inside a sentence written without spaces. Matches do not overlap: the text is scanned
    left to right and at each word the longest term starting there wins (``bad word``
    over ``bad``). A term with no word characters (``***``) never matches. Cost: one dict
    look-up per word and distinct term length, whatever the number of terms."""

    def __init__(self, terms: list[str]):
        self.terms = terms
        self.grams = {g for g in (tuple(words(unicodedata.normalize("NFC", t.casefold())))
                                  for t in terms) if g}
        self.lengths = sorted({len(g) for g in self.grams}, reverse=True)

    def count(self, text: str) -> int:
        """Non-overlapping matches of the terms in ``text`` (0 without terms)."""
        if not self.grams:
            return 0
        tokens = words(unicodedata.normalize("NFC", text.casefold()))
        found, i = 0, 0
        while i < len(tokens):
            n = next((n for n in self.lengths if tuple(tokens[i:i + n]) in self.grams), 0)
            found += n > 0
            i += max(n, 1)
        return found


def read_terms(uri: str, read_bytes: Callable[[str], bytes]) -> tuple[list[str], str]:
    """``(terms, sha256 hex of the file's bytes)`` of the flagged-words file ``uri``, read
    with ``read_bytes``. Raises ``SpecError`` naming ``signals.caption.flagged_words_file``
    and ``uri`` if it cannot be read (any ``OSError``, e.g. ``FileNotFoundError``, or a
    storage error) or is not UTF-8."""
    try:
        raw = read_bytes(uri)
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(f"{FLAGGED_FIELD}: {uri} is not UTF-8 text ({e})", FLAGGED_FIELD,
                        uri) from None
    except Exception as e:  # noqa: BLE001 - any storage failure is this field's error
        raise SpecError(f"{FLAGGED_FIELD}: cannot read {uri}: {type(e).__name__}: {e}",
                        FLAGGED_FIELD, uri) from None
    return parse_terms(text), hashlib.sha256(raw).hexdigest()


class CaptionSignalsStep(RowStep):
    """Writes the caption signal columns of each ``ok`` row (module docstring).

    ``terms``/``terms_sha256``: the flagged words and their file's digest (``read_terms``).
    ``setup()`` builds the lingua detector (seconds and up to ~1.2 GB per worker: the
    ``languages`` field); until then ``process_row`` builds it itself. Values:
    ``caption_language`` str | None, ``caption_language_confidence`` float | None (written
    as float32), the counts int | None (int32), ``caption_repetition`` float | None."""

    reads = (CAPTION,)
    writes = (CAPTION_LANGUAGE, CAPTION_LANGUAGE_CONFIDENCE, CAPTION_WORDS, CAPTION_CHARS,
              CAPTION_REPETITION, CAPTION_FLAGGED_WORDS)

    def __init__(self, spec: CaptionSignalsSpec, terms: list[str] | None = None,
                 terms_sha256: str | None = None):
        self.spec = spec
        self.flagged = FlaggedWords(terms or [])
        self.terms_sha256 = terms_sha256
        self.detector: Any = None

    def settings(self) -> dict[str, Any]:
        out = self.spec.model_dump(mode="json", exclude={"flagged_words_file"})
        out["flagged_words_sha256"] = self.terms_sha256
        return out

    def setup(self) -> None:
        from lingua import IsoCode639_1, LanguageDetectorBuilder

        if self.spec.languages is None:
            builder = LanguageDetectorBuilder.from_all_languages()
        else:
            builder = LanguageDetectorBuilder.from_iso_codes_639_1(
                *[getattr(IsoCode639_1, c.upper()) for c in self.spec.languages])
        if self.spec.low_accuracy:
            builder = builder.with_low_accuracy_mode()
        self.detector = builder.with_preloaded_language_models().build()

    def language(self, text: str) -> tuple[str | None, float | None]:
        """``(ISO 639-1 code, confidence 0..1)`` of ``text``; ``(None, None)`` below
        ``min_chars`` letters, ``(None, 0.0)`` when lingua finds no language."""
        if sum(1 for ch in text if ch.isalpha()) < self.spec.min_chars:
            return None, None
        if self.detector is None:
            self.setup()
        values = self.detector.compute_language_confidence_values(text)
        if not values or values[0].value <= 0:
            return None, 0.0
        return values[0].language.iso_code_639_1.name.lower(), min(1.0, float(values[0].value))

    def process_row(self, batch, i):
        text = batch[CAPTION][i]
        if text is None:
            return {}
        tokens = words(text)
        lang, confidence = self.language(text)
        return {CAPTION_LANGUAGE: lang, CAPTION_LANGUAGE_CONFIDENCE: confidence,
                CAPTION_WORDS: len(tokens), CAPTION_CHARS: len(text),
                CAPTION_REPETITION: repetition(tokens, self.spec.repetition_ngram),
                CAPTION_FLAGGED_WORDS: self.flagged.count(text)}


def from_spec(spec: JobSpec, read_bytes: Callable[[str], bytes]) -> CaptionSignalsStep | None:
    """The step for ``spec.signals.caption`` (None unless enabled), the flagged-words file
    read with ``read_bytes`` (``pipeline.storage.fs.read_bytes``). Raises ``SpecError``
    (``read_terms``)."""
    section = spec.signals.caption
    if not section.enabled:
        return None
    terms, digest = ([], None) if section.flagged_words_file is None else read_terms(
        section.flagged_words_file, read_bytes)
    return CaptionSignalsStep(section, terms, digest)
