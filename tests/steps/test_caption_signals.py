"""Caption text signals (steps/caption_signals.py): lingua language id on captions in
several languages and on the bundled COCO captions, word/char counts, Gopher repetition on
strings with known values, flagged words, the flagged-words file's errors and digest, and
a one-partition real job over data/photos writing the typed columns."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from pipeline.assembly import assemble
from pipeline.columns import (
    CAPTION,
    CAPTION_CHARS,
    CAPTION_FLAGGED_WORDS,
    CAPTION_LANGUAGE,
    CAPTION_LANGUAGE_CONFIDENCE,
    CAPTION_REPETITION,
    CAPTION_WORDS,
    STATUS,
)
from pipeline.errors import SpecError
from pipeline.read import read_committed
from pipeline.spec import CaptionSignalsSpec, JobSpec, parse_spec
from pipeline.steps.caption_signals import (
    CaptionSignalsStep,
    FlaggedWords,
    from_spec,
    parse_terms,
    repetition,
    words,
)
from pipeline.storage import fs
from tests.conftest import PHOTOS, coco_captions
from tests.input.local_job import run_job

CAPTIONS = {
    "en": "A brown dog is running across the green grass in the park.",
    "de": "Ein brauner Hund läuft über das grüne Gras im Park.",
    "fr": "Un chien brun court sur l'herbe verte dans le parc.",
    "es": "Un perro marrón corre por la hierba verde del parque.",
    "it": "Un cane marrone corre sull'erba verde nel parco.",
    "ru": "Коричневая собака бежит по зелёной траве в парке.",
    "zh": "一只棕色的狗在公园的绿草地上奔跑。",
    "ja": "茶色の犬が公園の緑の芝生の上を走っている。",
}


@pytest.fixture(scope="module")
def step() -> CaptionSignalsStep:
    """The default detector (all 75 languages, preloaded), built once for the module."""
    s = CaptionSignalsStep(CaptionSignalsSpec(enabled=True))
    s.setup()
    return s


def _run(step: CaptionSignalsStep, captions: list) -> dict:
    return step({CAPTION: list(captions), STATUS: ["ok"] * len(captions)})


def _spec(tmp_path, **caption) -> JobSpec:
    return JobSpec.model_validate({"source": {"kind": "files", "uri": str(PHOTOS)},
                                   "sink": {"uri": str(tmp_path / "out")},
                                   "text_embedding": {"enabled": False},
                                   "signals": {"caption": {"enabled": True, **caption}}})


def test_language_of_captions_in_eight_languages(step):
    out = _run(step, list(CAPTIONS.values()))
    assert out[CAPTION_LANGUAGE] == list(CAPTIONS)
    conf = out[CAPTION_LANGUAGE_CONFIDENCE]
    assert all(0 < c <= 1 for c in conf), conf
    # CJK scripts are decided by their characters alone
    assert conf[-1] == pytest.approx(1.0) and conf[-2] == pytest.approx(1.0)


def test_coco_captions_are_english(step):
    """The 285 bundled COCO captions (all English): measured 284/285 as `en` (one `da`)."""
    caps = [c for row in coco_captions() for c in row["captions"]]
    assert len(caps) == 285
    got = collections.Counter(_run(step, caps)[CAPTION_LANGUAGE])
    assert got["en"] / len(caps) >= 0.99, got.most_common(5)


def test_restricted_languages_and_low_accuracy():
    """Only the listed languages can come out: German text among {en, fr} is one of them."""
    s = CaptionSignalsStep(CaptionSignalsSpec(enabled=True, languages=["FR", "en"],
                                              low_accuracy=True))
    s.setup()
    out = _run(s, [CAPTIONS["en"], CAPTIONS["fr"], CAPTIONS["de"]])
    assert out[CAPTION_LANGUAGE][:2] == ["en", "fr"]
    assert out[CAPTION_LANGUAGE][2] in ("en", "fr")
    # a script none of the languages uses: no language, confidence 0
    assert s.language(CAPTIONS["ru"]) == (None, 0.0)
    assert s.settings()["languages"] == ["en", "fr"] and s.settings()["low_accuracy"] is True


def test_unknown_language_code_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as e:
        parse_spec({"source": {"kind": "files", "uri": str(PHOTOS)},
                    "sink": {"uri": str(tmp_path / "out")},
                    "signals": {"caption": {"languages": ["en", "xx"]}}})
    assert "signals.caption.languages" in str(e.value) and "'xx'" in str(e.value)


def test_short_or_letterless_captions_get_no_language(step):
    out = _run(step, ["ab", "12345 678", "猫が", "dog", None])
    assert out[CAPTION_LANGUAGE][:3] == [None, None, None]
    assert out[CAPTION_LANGUAGE_CONFIDENCE][:3] == [None, None, None]
    assert out[CAPTION_LANGUAGE][3] is not None  # three letters: decided
    # no caption: every signal None
    assert [out[c][4] for c in step.writes] == [None] * 6


def test_rows_not_ok_are_left_alone(step):
    out = step({CAPTION: ["A dog.", "A cat."], STATUS: ["error", "ok"]})
    assert out[CAPTION_WORDS] == [None, 2] and out[CAPTION_CHARS] == [None, 6]


def test_word_and_char_counts(step):
    assert words("Don't stop-now, 猫が走る") == ["Don't", "stop", "now", "猫", "が", "走", "る"]
    assert words("  ...  ") == []
    caps = ["A man's hat, on a table.", "猫が走る", "café ☕ 2024"]
    out = _run(step, caps)
    assert out[CAPTION_WORDS] == [6, 4, 2]
    assert out[CAPTION_CHARS] == [24, 4, 11]


def test_repetition_known_values():
    assert repetition(words("a dog a dog a dog"), 2) == pytest.approx(8 / 12)
    assert repetition(words("one two three four"), 2) == 0.0
    assert repetition(words("the the the"), 1) == pytest.approx(6 / 9)
    assert repetition(words("Dog dog"), 1) == pytest.approx(3 / 6)  # case-folded
    assert repetition(words("solo"), 2) == 0.0                       # fewer words than n
    assert repetition([], 2) == 0.0
    # non-overlapping: "x x x x" bigrams: (x x) new at 0, repeat at 1 -> jump to 3: 2 of 4
    assert repetition(list("xxxx"), 2) == pytest.approx(2 / 4)
    # CJK: one word per character
    assert repetition(words("猫猫猫猫"), 2) == pytest.approx(2 / 4)


def test_repetition_column(step):
    out = _run(step, ["a dog a dog a dog", "A red car parked near a tree."])
    assert out[CAPTION_REPETITION] == [pytest.approx(8 / 12), 0.0]


def test_flagged_words_case_boundaries_phrases():
    fw = FlaggedWords(["bad", "bad word", "Straße", "hot dog", "猫", "***"])
    assert fw.count("BAD WORD and bad, but not badly or abad") == 2
    assert fw.count("STRASSE and strasse") == 2
    assert fw.count("a hot  dog, a Hot-Dog, a hotdog") == 2
    assert fw.count("黒猫です") == 1          # CJK: no spaces between words
    assert fw.count("*** nothing") == 0       # a term without word characters
    assert FlaggedWords([]).count("bad") == 0


def test_parse_terms_comments_blank_and_repeats():
    text = "# a comment\n\n  bad  \n  # indented comment\nbad\nhot dog\n"
    assert parse_terms(text) == ["bad", "hot dog"]


def test_flagged_words_file_read_and_digest_in_fingerprint(tmp_path):
    words_file = tmp_path / "flagged.txt"
    words_file.write_text("# test list\nDog\nteddy bear\n", encoding="utf-8")
    spec = _spec(tmp_path, flagged_words_file=str(words_file))
    s = from_spec(spec, fs.read_bytes)
    out = _run(s, ["A dog and a dog with a Teddy Bear.", None])
    assert out[CAPTION_FLAGGED_WORDS] == [3, None]
    first = assemble(spec).fingerprint
    assert assemble(spec).fingerprint == first
    words_file.write_text("# test list\nDog\n", encoding="utf-8")
    assert assemble(spec).fingerprint != first
    assert from_spec(_spec(tmp_path, enabled=False), fs.read_bytes) is None


def test_missing_or_bad_flagged_words_file_fails_assembly(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(SpecError) as e:
        assemble(_spec(tmp_path, flagged_words_file=str(missing)))
    assert e.value.field == "signals.caption.flagged_words_file"
    assert str(missing) in str(e.value) and "signals.caption.flagged_words_file" in str(e.value)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("straße\n".encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8"):
        assemble(_spec(tmp_path, flagged_words_file=str(latin1)))
    with pytest.raises(SpecError, match="cannot read"):
        assemble(_spec(tmp_path, flagged_words_file=str(tmp_path)))  # a directory


def test_photos_job_writes_typed_columns(tmp_path):
    """One partition over the 57 bundled photos: every row has English captions."""
    words_file = tmp_path / "flagged.txt"
    words_file.write_text("pizza\n", encoding="utf-8")
    rows, plan = run_job({"kind": "files", "uri": str(PHOTOS)}, tmp_path / "out",
                         signals={"caption": {"enabled": True,
                                              "flagged_words_file": str(words_file)}})
    assert len(plan.partition_ids) == 1 and len(rows) == 57
    schema = read_committed(str(tmp_path / "out")).schema
    assert schema.field(CAPTION_LANGUAGE).type == pa.string()
    assert schema.field(CAPTION_LANGUAGE_CONFIDENCE).type == pa.float32()
    for col in (CAPTION_WORDS, CAPTION_CHARS, CAPTION_FLAGGED_WORDS):
        assert schema.field(col).type == pa.int32()
    assert schema.field(CAPTION_REPETITION).type == pa.float32()
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 57
    assert sum(r[CAPTION_LANGUAGE] == "en" for r in ok) >= 56
    for r in ok:
        assert r[CAPTION_CHARS] == len(r["caption"])
        assert r[CAPTION_WORDS] == len(words(r["caption"]))
        assert 0.0 <= r[CAPTION_REPETITION] <= 1.0
        assert r[CAPTION_FLAGGED_WORDS] == FlaggedWords(["pizza"]).count(r["caption"])
    assert sum(r[CAPTION_FLAGGED_WORDS] for r in ok) >= 1


def test_flagged_words_file_on_s3(s3_env, s3_server, tmp_path):
    """The file is read through pipeline.storage: an s3:// URI works like a path; a missing
    key is the field's spec error."""
    s3_server.client().put_object(Bucket=s3_env, Key="lists/flagged.txt",
                                  Body=b"# s3 list\nbicycle\n")
    spec = _spec(tmp_path, flagged_words_file=f"s3://{s3_env}/lists/flagged.txt")
    s = from_spec(spec, fs.read_bytes)
    assert _run(s, ["A bicycle, a Bicycle and bicycles."])[CAPTION_FLAGGED_WORDS] == [2]
    with pytest.raises(SpecError) as e:
        assemble(_spec(tmp_path, flagged_words_file=f"s3://{s3_env}/lists/missing.txt"))
    assert e.value.field == "signals.caption.flagged_words_file"
    assert f"s3://{s3_env}/lists/missing.txt" in str(e.value)


def test_video_jobs_get_the_step_after_decode(tmp_path):
    """Videos: the same text signals of the caption, run among the added steps."""
    spec = JobSpec.model_validate({"source": {"kind": "files", "uri": str(PHOTOS),
                                              "media": "video"},
                                   "sink": {"uri": str(tmp_path / "out")},
                                   "text_embedding": {"enabled": False},
                                   "signals": {"caption": {"enabled": True}}})
    names = [s.name for s in assemble(spec).steps]
    assert names.index("CaptionSignalsStep") > names.index("VideoDecodeStep")
    assert {f.name for f in assemble(spec).fields()} >= set(CaptionSignalsStep.writes)
