"""Filters and the signals they filter on: ``filters`` (size and aspect, ``filters.signals``
on any signal column, with presets and calibrated thresholds; ``filters.clips`` on the
frame signals of video rows) and ``signals`` (quality signals measured on the CPU workers:
image sharpness and exposure, text in the image, caption text signals).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.spec.base import FieldNotApplicable, _Strict


class CalibratedThreshold(_Strict):
    """A threshold read from a calibration (``mmpipe calibrate``'s `calibration.json`):
    the lowest threshold of the signal's column whose precision on the labelled rows is
    at least `precision` (``pipeline.calibration.threshold_for``), resolved when the
    pipeline is assembled on the driver, so a bad reference fails before anything runs."""

    calibration: str = Field(min_length=1, description="Path or URI (s3://, file://) of the "
                             "calibration.json that `mmpipe calibrate` wrote; read by the "
                             "driver and again by each worker, so it must be readable there "
                             "too (s3:// or a shared file system on a cluster).")
    precision: float = Field(gt=0, le=1, description="Precision wanted at the threshold, "
                             "in (0, 1].")


#: ``filters.signals`` presets: preset -> (column, reject reason, the bound its
#: ``threshold`` sets: ``min`` keeps rows at or above it, ``max`` rows at or below it,
#: ``allow`` rows whose value is listed). No preset has a default threshold: a published
#: one (e.g. LAION's) holds for LAION's own model only, so a preset always names it.
SIGNAL_PRESETS: dict[str, tuple[str, str, str]] = {
    "aesthetic": ("aesthetic_score", "low_aesthetic", "min"),
    "nsfw": ("nsfw_score", "nsfw", "max"),
    "watermark": ("watermark_score", "watermark", "max"),
    "text_heavy": ("text_area_fraction", "text_heavy", "max"),
    "blurry": ("sharpness", "blurry", "min"),
    "language": ("caption_language", "language", "allow"),
}
SignalPreset = Literal["aesthetic", "nsfw", "watermark", "text_heavy", "blurry", "language"]
SignalReason = Literal["low_aesthetic", "nsfw", "watermark", "text_heavy", "blurry", "language",
                       "flagged_words", "low_caption_quality", "signal"]
#: The reject reason of a signal filter that names none (and no preset): by its column,
#: else ``signal``.
SIGNAL_REASONS: dict[str, str] = {
    **{column: reason for column, reason, _ in SIGNAL_PRESETS.values()},
    "text_box_count": "text_heavy", "caption_language_confidence": "language",
    "caption_flagged_words": "flagged_words", "caption_words": "low_caption_quality",
    "caption_chars": "low_caption_quality", "caption_repetition": "low_caption_quality",
}


class SignalFilterSpec(_Strict):
    """One filter on a signal column (``steps.signal_filter``): a row is kept when its
    value is within [`min`, `max`] (inclusive) or, with `allow`, one of the listed
    strings; otherwise it is rejected with `reason`. A row whose value is null or NaN
    (not scored: no caption, undecodable frame) is kept unless `missing: reject`, and is
    flagged `unscored:<column>` in `signal_flags`."""

    preset: SignalPreset | None = Field(
        None, description="Fills `column` and `reason` and takes `threshold`: `aesthetic` "
        "(aesthetic_score >= threshold), `nsfw` (nsfw_score <= threshold), `watermark` "
        "(watermark_score <= threshold), `text_heavy` (text_area_fraction <= threshold), "
        "`blurry` (sharpness >= threshold), `language` (caption_language in threshold, a "
        "list of ISO 639-1 codes).")
    column: str | None = Field(None, description="The column filtered on: any numeric (or, "
                               "with `allow`, string) column the pipeline writes.")
    min: float | CalibratedThreshold | None = Field(
        None, description="Reject rows whose value is below this: a number or "
        "`{calibration, precision}`.")
    max: float | CalibratedThreshold | None = Field(
        None, description="Reject rows whose value is above this: a number or "
        "`{calibration, precision}`.")
    allow: tuple[str, ...] | None = Field(None, description="String columns: reject rows "
                                          "whose value is not one of these.")
    threshold: float | CalibratedThreshold | tuple[str, ...] | None = Field(
        None, description="With a preset: its bound (`min`, `max` or `allow`, see `preset`).")
    reason: SignalReason | None = Field(
        None, description="The reject_reason; default: the preset's, else by column "
        "(`spec.SIGNAL_REASONS`), else `signal`.")
    missing: Literal["keep", "reject"] = Field(
        "keep", description="A row whose value is null or NaN: `keep` it, or `reject` it "
        "with `reason`; either way it is flagged `unscored:<column>`.")

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        """A preset fills `column` and `reason` (unless given) and moves `threshold` to its
        bound; a filter without a `reason` gets its column's (`SIGNAL_REASONS`)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        preset = SIGNAL_PRESETS.get(data.get("preset")) if isinstance(
            data.get("preset"), str) else None
        if preset is not None:
            column, reason, bound = preset
            data["column"] = data.get("column") or column
            data["reason"] = data.get("reason") or reason
            if data.get("threshold") is not None and data.get(bound) is None:
                data[bound] = data.pop("threshold")
        if data.get("reason") is None and isinstance(data.get("column"), str):
            data["reason"] = SIGNAL_REASONS.get(data["column"], "signal")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "SignalFilterSpec":
        """A filter names a `column` (or a preset) and at least one of `min`, `max`,
        `allow` (a preset: its `threshold`); `allow` excludes `min`/`max`; `min` <= `max`;
        `threshold` needs a preset (and a list for `language`)."""
        problems = []
        if self.column is None:
            problems.append(("column", None, "required: a signal column (or a preset)"))
        if self.threshold is not None:
            problems.append(("threshold", self.threshold,
                             "needs a preset; without one use min, max or allow"
                             if self.preset is None else
                             f"preset {self.preset!r} takes "
                             f"{SIGNAL_PRESETS[self.preset][2]!r}; it is given twice"))
        if self.allow is not None and (self.min is not None or self.max is not None):
            problems.append(("allow", self.allow, "a filter has allow or min/max, not both"))
        if self.allow is not None and not self.allow:
            problems.append(("allow", self.allow, "an empty list rejects every row"))
        if self.min is None and self.max is None and self.allow is None:
            problems.append(("min", None, "a filter needs min, max or allow"
                             + (" (the preset's threshold)" if self.preset else "")))
        if isinstance(self.min, float) and isinstance(self.max, float) and self.min > self.max:
            problems.append(("min", self.min, f"is above max ({self.max}): every row is "
                             "rejected"))
        if problems:
            raise FieldNotApplicable(problems)
        return self


class ClipFilterSpec(_Strict):
    """Frame signals and filters of video and clip rows (``steps.clip_signals``): every row
    gets `motion_score`, `static_fraction`, `frame_phashes` and `bitrate`; a row outside a
    bound set here is rejected with its reason (`low_motion`, `clip_duration`, `low_fps`,
    `low_resolution`, `low_bitrate`, `static`). A row whose value cannot be measured (one
    sampled frame: no motion; no duration) is kept. Video jobs only."""

    enabled: bool = Field(False, description="Write the frame signals even when no bound "
                          "is set. Setting a bound (or `score_only`) turns them on too; "
                          "`video.clips` always does.")
    min_motion: float | None = Field(None, ge=0, description="Reject rows whose "
                                     "`motion_score` (pixels at 160 px wide per sampled "
                                     "step) is below this.")
    min_duration_s: float | None = Field(None, ge=0, description="Reject rows shorter than "
                                         "this (seconds; clip rows: `clip_end_s - "
                                         "clip_start_s`, else `duration_s`).")
    max_duration_s: float | None = Field(None, gt=0, description="Reject rows longer than "
                                         "this (seconds, measured like `min_duration_s`).")
    min_fps: float | None = Field(None, gt=0, description="Reject rows whose measured `fps` "
                                  "is below this (Hz).")
    min_resolution_px: int | None = Field(None, ge=1, description="Reject rows whose shorter "
                                          "side (`min(width, height)`) is below this (pixels).")
    min_bitrate: int | None = Field(None, ge=1, description="Reject rows whose `bitrate` "
                                    "(bits/s) is below this.")
    max_static_fraction: float | None = Field(None, ge=0, le=1, description="Reject rows "
                                              "whose `static_fraction` is above this.")
    static_max_distance: int = Field(4, ge=0, le=64, description="`static_fraction`: two "
                                     "consecutive sampled frames whose pHashes are at most "
                                     "this many bits apart are near identical.")
    score_only: bool = Field(False, description="Keep every row and only flag the rows a "
                             "bound would reject, in `signal_flags` (counted by reason in "
                             "`rows_by_flag`); the signal columns are written either way.")

    @property
    def bounded(self) -> bool:
        """True when a bound (min_*/max_*) is set: the filter step runs."""
        return any(getattr(self, f) is not None for f in (
            "min_motion", "min_duration_s", "max_duration_s", "min_fps",
            "min_resolution_px", "min_bitrate", "max_static_fraction"))

    @property
    def on(self) -> bool:
        """True when the frame signals are asked for here (`enabled`, a bound, or
        `score_only`)."""
        return self.enabled or self.score_only or self.bounded

    @model_validator(mode="after")
    def _durations(self) -> "ClipFilterSpec":
        """min_duration_s <= max_duration_s."""
        if (self.min_duration_s is not None and self.max_duration_s is not None
                and self.min_duration_s > self.max_duration_s):
            raise FieldNotApplicable([("min_duration_s", self.min_duration_s,
                                       f"is above max_duration_s ({self.max_duration_s}): "
                                       "every row is rejected")])
        return self


class FilterSpec(_Strict):
    """Filters: a rejected row keeps its place with `status="rejected"` and a reason."""

    min_width_px: int = Field(0, ge=0, description="Reject images narrower than this (pixels).")
    min_height_px: int = Field(0, ge=0, description="Reject images shorter than this (pixels).")
    max_aspect_ratio: float | None = Field(
        None, gt=1.0, description="Reject if max(w,h)/min(w,h) exceeds this; null disables.")
    signals: tuple[SignalFilterSpec, ...] = Field(
        (), description="Filters on any signal column (`SignalFilterSpec`: `preset` or "
        "`column`, `min`/`max` (a number or `{calibration, precision}`), `allow`, `reason`, "
        "`missing`), in order. One on a CPU-computed column runs after the CPU signal steps, "
        "before any model sees the row; one on a model column right after the model stage "
        "that writes it (a rejected row is never captioned). A column the pipeline does not "
        "write fails the spec.")
    score_only: bool = Field(False, description="The signal filters keep every row (status "
                             "stays ok) and only flag the rows they would reject, in "
                             "`signal_flags`; the marker, report and metrics count them by "
                             "reason (`rows_by_flag`). The size, aspect, dedup and "
                             "min_clip_score filters still reject.")
    clips: ClipFilterSpec = Field(
        ClipFilterSpec(), description="Video jobs: frame signals (`motion_score`, "
        "`static_fraction`, `frame_phashes`, `bitrate`) of each video or clip row and "
        "filters on them and on duration, fps, resolution and bitrate. Off by default "
        "(video rows keep their columns) unless `video.clips` splits videos.")


class ImageSignalsSpec(_Strict):
    """Measured image signals on the CPU workers (no model): sharpness (variance of the
    Laplacian, Pech-Pacheco et al. 2000), brightness, contrast and clipped fraction of the
    luma. Videos: the mean over the sampled frames."""

    enabled: bool = Field(False, description="Write `sharpness`, `brightness`, `contrast` "
                          "and `clipped_fraction`.")
    analysis_px: int = Field(
        256, ge=16, le=4096, description="Shorter side (pixels) the greyscale is shrunk to "
        "(Pillow Lanczos, never enlarged) before measuring, so that sharpness compares "
        "across resolutions; JPEG drafts are then decoded with a shorter side of at least "
        "twice this (a draft nearer the analysis scale reads ~25% less sharp).")


class OcrSpec(_Strict):
    """Text in the image: RapidOCR (PaddleOCR's ONNX models, `rapidocr-onnxruntime`) on the
    CPU workers. Videos: the middle sampled frame."""

    enabled: bool = Field(False, description="Write `text_area_fraction` and "
                          "`text_box_count` (text detection).")
    max_side_px: int = Field(
        640, ge=32, le=8192, description="Longer side (pixels) the image is shrunk to "
        "(never enlarged) before detection. 640 finds text lines ~1.5% of the longer side "
        "tall (~100 ms CPU per image, one core); 480 halves the cost but misses a quarter "
        "of those; 960 also finds ~1% for 2.4x the cost (bench/quality_signals.py).")
    text: bool = Field(False, description="Also recognise the detected text into `ocr_text`; "
                       "then only boxes whose text is read count in `text_box_count` and "
                       "`text_area_fraction` (fewer false boxes on texture: best F1 0.92 vs "
                       "0.76 on the bundled photos; about 3x the CPU of detection alone).")


class CaptionSignalsSpec(_Strict):
    """Caption text signals on the CPU workers (``pipeline.steps.caption_signals``): language
    (lingua), word/character counts, Gopher-style repetition and flagged-word matches of
    the normalised `caption`; a row without a caption gets None in each."""

    enabled: bool = Field(False, description="Write `caption_language`, "
                          "`caption_language_confidence`, `caption_words`, `caption_chars`, "
                          "`caption_repetition` and `caption_flagged_words`.")
    languages: tuple[str, ...] | None = Field(
        None, description="ISO 639-1 codes of the languages the detector chooses among "
        "(e.g. `[en, de, fr]`); default: all 75 that lingua knows. Each worker loads the "
        "chosen languages' models at setup: all 75 take ~1.25 GB and ~5 s (~1.4 ms per "
        "COCO caption), ten ~0.28 GB and ~1 s (~0.2 ms); a caption in a language left out "
        "is given the nearest one listed.")
    low_accuracy: bool = Field(False, description="lingua's low-accuracy mode (trigrams "
                               "only: ~15x less memory, ~4x faster, less accurate on short "
                               "captions).")
    min_chars: int = Field(3, ge=1, le=10_000, description="Captions with fewer letters "
                           "(Unicode alphabetic characters) get no language (None).")
    repetition_ngram: int = Field(2, ge=1, le=10, description="n of the word n-grams of "
                                  "`caption_repetition`.")
    flagged_words_file: str | None = Field(
        None, description="A UTF-8 text file (local path or s3:// URI), one word or phrase "
        "per line, `#` starting a comment line; matched case-insensitively as whole words "
        "into `caption_flagged_words`. Read when the pipeline is assembled (a missing or "
        "unreadable file is a spec error); its content's sha256 is in the fingerprint. "
        "None bundled; default: none (the column is 0).")

    @field_validator("languages")
    @classmethod
    def _iso_codes(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """`languages`: lower-cased, sorted, unique; each a code lingua knows."""
        if value is None:
            return None
        from lingua import Language

        codes = sorted({c.strip().lower() for c in value})
        known = {lang.iso_code_639_1.name.lower() for lang in Language.all()}
        unknown = [c for c in codes if c not in known]
        if not codes or unknown:
            raise ValueError(f"languages must be ISO 639-1 codes lingua knows; unknown: "
                             f"{unknown or 'none given'} (known: {' '.join(sorted(known))})")
        return tuple(codes)


class SignalsSpec(_Strict):
    """Quality signals computed on the CPU workers, before any model sees the row."""

    image: ImageSignalsSpec = Field(ImageSignalsSpec(), description="Sharpness and exposure "
                                    "of the decoded image.")
    ocr: OcrSpec = Field(OcrSpec(), description="Text-in-image detection (and optional "
                         "recognition).")
    caption: CaptionSignalsSpec = Field(CaptionSignalsSpec(), description="Caption "
                                        "language, counts, repetition and flagged words.")
