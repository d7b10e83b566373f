"""Frame signals and clip filters of video and clip rows (``filters.clips``).

``ClipSignalsStep`` reads a row's sampled ``_frames`` (a whole video's, or one clip span's
when ``video.clips`` splits videos) and writes:

* ``frame_phashes``: the pHash (``media.transform.phash64``) of each sampled frame in
  time order, null for a flat frame (``media.transform.low_detail``: its hash says
  nothing); the dataset-wide near index takes these (``dedup.index``, frame rows);
* ``static_fraction``: ``media.motion.static_fraction`` of the frames' hashes (flat ones
  included: a black screen held is static), ``static_max_distance`` bits;
* ``motion_score``: ``media.motion.motion_score`` (Farneback optical flow, pixels at
  ``media.motion.ANALYSIS_WIDTH_PX`` wide per sampled step);
* ``bitrate``: bits per second, ``8 * clip_bytes / (clip_end_s - clip_start_s)`` for a
  clip row with a clip file, else ``8 * (source file size) / duration_s`` for a whole
  video; null for a clip row without a file (its bytes are not its own).

A row with fewer than 2 sampled frames has no motion and no static fraction (null).

``ClipFilterStep`` rejects an ``ok`` row outside a bound of ``filters.clips``, checked in
this order: duration (``clip_end_s - clip_start_s`` for a clip row, else ``duration_s``;
reason ``clip_duration``), ``fps`` (``low_fps``), the shorter side of ``width`` /
``height`` (``low_resolution``), ``bitrate`` (``low_bitrate``), ``motion_score``
(``low_motion``), ``static_fraction`` (``static``). A null value passes its bound. With
``score_only`` no row is rejected: each bound that would reject it adds its reason to the
row's ``signal_flags`` (counted by the markers' ``rows_by_flag``), like
``filters.score_only`` does for ``filters.signals``.
"""

from __future__ import annotations

import os
from typing import Any

from pipeline.columns import (
    BITRATE,
    CLIP_BYTES,
    CLIP_END_S,
    CLIP_START_S,
    DURATION_S,
    FPS,
    FRAME_PHASHES,
    FRAMES,
    HEIGHT,
    MOTION_SCORE,
    REJECT_REASON,
    SIGNAL_FLAGS,
    SOURCE_PATH,
    STATIC_FRACTION,
    WIDTH,
    Batch,
)
from pipeline.media.motion import motion_score, static_fraction
from pipeline.media.transform import phash_and_low_detail
from pipeline.records import RejectReason
from pipeline.spec import ClipFilterSpec, JobSpec
from pipeline.steps.base import Filter, RowStep


def clip_span_s(batch: Batch, i: int) -> float | None:
    """Seconds of row ``i``: ``clip_end_s - clip_start_s`` for a clip row, else
    ``duration_s`` (None when unknown)."""
    start, end = batch.get(CLIP_START_S), batch.get(CLIP_END_S)
    if start is not None and end is not None and start[i] is not None and end[i] is not None:
        return float(end[i]) - float(start[i])
    duration = batch.get(DURATION_S)
    return None if duration is None or duration[i] is None else float(duration[i])


class ClipSignalsStep(RowStep):
    """``_frames`` -> ``frame_phashes``, ``static_fraction``, ``motion_score``, ``bitrate``
    (module docstring). ``static_max_distance``: bits (``filters.clips``)."""

    reads = (FRAMES, DURATION_S, SOURCE_PATH)
    writes = (MOTION_SCORE, STATIC_FRACTION, FRAME_PHASHES, BITRATE)

    def __init__(self, static_max_distance: int = ClipFilterSpec().static_max_distance):
        if not 0 <= static_max_distance <= 64:
            raise ValueError("static_max_distance must be 0..64 bits, got "
                             f"{static_max_distance}")
        self.static_max_distance = static_max_distance

    def settings(self) -> dict[str, Any]:
        return {"static_max_distance": self.static_max_distance}

    def process_row(self, batch: Batch, i: int) -> dict[str, Any]:
        frames = batch[FRAMES][i] or []
        hashed = [phash_and_low_detail(f) for f in frames]
        hashes = [h for h, _ in hashed]
        several = len(frames) >= 2
        return {FRAME_PHASHES: [None if flat else h for h, flat in hashed],
                STATIC_FRACTION: static_fraction(hashes, self.static_max_distance)
                if several else None,
                MOTION_SCORE: motion_score(frames) if several else None,
                BITRATE: self._bitrate(batch, i)}

    @staticmethod
    def _bitrate(batch: Batch, i: int) -> int | None:
        seconds = clip_span_s(batch, i)
        if not seconds or seconds <= 0:
            return None
        clip_bytes = batch.get(CLIP_BYTES)
        if clip_bytes is not None and clip_bytes[i] is not None:
            return round(8 * clip_bytes[i] / seconds)
        start = batch.get(CLIP_START_S)
        if start is not None and start[i] is not None:
            return None            # a clip row without a clip file
        path = batch[SOURCE_PATH][i]
        return round(8 * os.path.getsize(path) / seconds) if path else None


class ClipFilterStep(Filter):
    """Rejects (or, ``score_only``, flags) rows outside ``spec``'s bounds (module
    docstring)."""

    def __init__(self, spec: ClipFilterSpec):
        super().__init__()
        self.spec = spec
        self.reads = (DURATION_S, FPS, WIDTH, HEIGHT, BITRATE, MOTION_SCORE, STATIC_FRACTION)
        self.writes = (REJECT_REASON, SIGNAL_FLAGS) if spec.score_only else (REJECT_REASON,)

    def settings(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json", exclude={"static_max_distance", "enabled"})

    def _failed(self, batch: Batch, i: int) -> list[RejectReason]:
        s = self.spec
        duration = clip_span_s(batch, i)
        w, h = batch[WIDTH][i], batch[HEIGHT][i]
        checks = [
            (RejectReason.CLIP_DURATION, duration is not None and (
                (s.min_duration_s is not None and duration < s.min_duration_s)
                or (s.max_duration_s is not None and duration > s.max_duration_s))),
            (RejectReason.LOW_FPS, _below(batch[FPS][i], s.min_fps)),
            (RejectReason.LOW_RESOLUTION, w is not None and h is not None
             and _below(min(w, h), s.min_resolution_px)),
            (RejectReason.LOW_BITRATE, _below(batch[BITRATE][i], s.min_bitrate)),
            (RejectReason.LOW_MOTION, _below(batch[MOTION_SCORE][i], s.min_motion)),
            (RejectReason.STATIC, s.max_static_fraction is not None
             and batch[STATIC_FRACTION][i] is not None
             and batch[STATIC_FRACTION][i] > s.max_static_fraction),
        ]
        return [reason for reason, failed in checks if failed]

    def reject_reason(self, batch: Batch, i: int) -> RejectReason | None:
        failed = self._failed(batch, i)
        if not failed:
            return None
        if not self.spec.score_only:
            return failed[0]
        flags = list(batch[SIGNAL_FLAGS][i] or []) + [r.value for r in failed]
        batch[SIGNAL_FLAGS][i] = list(dict.fromkeys(flags))
        return None


def _below(value: float | None, bound: float | None) -> bool:
    return value is not None and bound is not None and value < bound


def signals_step(spec: JobSpec) -> ClipSignalsStep | None:
    """``STEP_FACTORIES`` entry: the signals step when ``spec.frame_signals``."""
    if not spec.frame_signals:
        return None
    return ClipSignalsStep(spec.filters.clips.static_max_distance)


def filter_step(spec: JobSpec) -> ClipFilterStep | None:
    """``STEP_FACTORIES`` entry: the filter step of a video job whose ``filters.clips``
    sets a bound."""
    if spec.source.media != "video" or not spec.filters.clips.bounded:
        return None
    return ClipFilterStep(spec.filters.clips)
