"""Clip spans of a video: shots found by PySceneDetect, or fixed-length windows.

Pure codec over a local file path, no batches and no output. Times are presentation
times (each frame's pts in seconds, as ``decode_video`` reports them), so a variable
frame rate is measured, not assumed; frame indices count frames in presentation order.

Shots: PySceneDetect's ``ContentDetector`` or ``AdaptiveDetector`` is fed frames that
``media.video``'s confined open decodes (FFmpeg reads the one file through a Python file
object, no playlists), downscaled by FFmpeg to ``DETECT_WIDTH_PX`` wide BGR arrays. Not
through ``scenedetect.open_video``/``SceneManager``: its PyAV backend opens the file with
no format or protocol whitelist, and SceneManager times cuts by frame number over the
header's frame rate, which is wrong for a variable frame rate.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math

import numpy as np

from pipeline.errors import RecordError
from pipeline.media.video import (_Decoder, _Limits, av_module, check_video_file, open_video,
                                  video_stream)
from pipeline.records import ErrorReason
from pipeline.spec import VideoSpec

DETECT_WIDTH_PX = 256  # frames are downscaled to this width for detection (PySceneDetect's)
METHODS = ("scenes", "fixed")
DETECTORS = ("content", "adaptive")
LENGTH_TOLERANCE_S = 1e-3  # min_clip_s compares within Matroska's 1 ms time base


@dataclasses.dataclass(frozen=True)
class ClipSpan:
    """One clip of a video: presentation times [start_s, end_s) in seconds and frame
    indices [start_frame, end_frame) in presentation order (end exclusive); ``index``:
    its position among the video's clips, from 0."""

    index: int
    start_s: float
    end_s: float
    start_frame: int
    end_frame: int

    @property
    def duration_s(self) -> float:
        """``end_s - start_s`` in seconds."""
        return self.end_s - self.start_s


@dataclasses.dataclass(frozen=True)
class Timeline:
    """A video's frames: ``times_s`` the presentation time (seconds, ascending) of every
    frame, ``end_s`` the end of the last one (its pts plus its duration), and ``cuts`` the
    frame indices where a detector saw a new shot start (empty for a plain listing)."""

    times_s: np.ndarray
    end_s: float
    cuts: tuple[int, ...] = ()

    def frame_at(self, t: float) -> int:
        """Index of the first frame whose time is at or after ``t`` seconds."""
        return bisect.bisect_left(self.times_s, t - 1e-6)

    def time_of(self, frame: int) -> float:
        """Presentation time of frame ``frame``; ``end_s`` for one past the last."""
        return float(self.times_s[frame]) if frame < len(self.times_s) else self.end_s


def _detector(name: str, threshold: float | None):
    """A fresh PySceneDetect detector (``content`` or ``adaptive``) at ``threshold``
    (its own scale; None: its default)."""
    from scenedetect.detectors import AdaptiveDetector, ContentDetector

    if name == "content":
        return ContentDetector() if threshold is None else ContentDetector(threshold=threshold)
    if name == "adaptive":
        return (AdaptiveDetector() if threshold is None
                else AdaptiveDetector(adaptive_threshold=threshold))
    raise ValueError(f"detector must be one of {DETECTORS}, got {name!r}")


def detect_cuts(path: str, *, detector: str = "content", threshold: float | None = None,
                allow_playlists: bool = False, video: VideoSpec | None = None) -> Timeline:
    """Decode every frame of ``path`` and run a PySceneDetect detector over them.

    Returns the ``Timeline`` with ``cuts``: the indices of the first frames of new shots
    (ascending, never 0). ``video``: its ``max_frame_pixels``/``max_decode_s`` bound the
    decode (default ``VideoSpec()``). Raises ``RecordError`` (``empty_file``,
    ``read_failed``, ``corrupt_container``, ``no_video_stream``, ``no_frames``,
    ``too_large``, ``decode_timeout``, ``unsupported_format``) and ``ValueError`` for an
    unknown ``detector``.
    """
    det = _detector(detector, threshold)
    check_video_file(path)
    limits = _Limits.of(video or VideoSpec())
    dec = _Decoder(path, 10_000_000, limits.max_decode_s, limits, allow_playlists)
    times: list[float] = []
    cuts: list[int] = []
    end_s = 0.0
    try:
        for frame, t in dec.frames():
            width = min(frame.width, DETECT_WIDTH_PX)
            height = max(2, round(frame.height * width / frame.width / 2) * 2)
            image = frame.reformat(width=width, height=height, format="bgr24").to_ndarray()
            cuts.extend(det.process_frame(len(times), image))
            times.append(t)
            end_s = t + _duration_s(frame)
        if times:
            cuts.extend(det.post_process(len(times) - 1) or [])
    finally:
        dec.close()
    if not times:
        raise RecordError(ErrorReason.NO_FRAMES.value,
                          f"no decodable video frame ({dec.errors} packets failed)")
    return _timeline(times, end_s, cuts)


def _duration_s(frame) -> float:
    d = getattr(frame, "duration", None)
    return float(d * frame.time_base) if d and frame.time_base is not None else 0.0


def _timeline(times: list[float], end_s: float, cuts: list[int]) -> Timeline:
    """The Timeline of frames at ``times`` (forced ascending); a last frame without a
    duration ends one mean frame interval after its pts."""
    arr = np.maximum.accumulate(np.asarray(times, dtype=np.float64))
    if end_s <= arr[-1]:
        step = (arr[-1] - arr[0]) / (len(arr) - 1) if len(arr) > 1 else 0.0
        end_s = float(arr[-1] + step)
    valid = sorted({c for c in cuts if 0 < c < len(arr)})
    return Timeline(arr, float(end_s), tuple(valid))


def list_frames(path: str, *, allow_playlists: bool = False) -> Timeline:
    """The ``Timeline`` of ``path`` from a demux-only pass (no decode): one frame per video
    packet with a pts, in presentation order. Raises ``RecordError`` as ``detect_cuts``."""
    av = av_module()
    check_video_file(path)
    opened = open_video(path, allow_playlists)
    try:
        stream = video_stream(opened.container, path)
        tb = stream.time_base
        frames: list[tuple[float, float]] = []
        try:
            for packet in opened.container.demux(stream):
                if packet.pts is not None and packet.size > 0:
                    frames.append((float(packet.pts * tb), float((packet.duration or 0) * tb)))
        except (av.error.FFmpegError, OSError, ValueError, EOFError):
            pass  # a damaged tail: the frames before it
    finally:
        opened.close()
    if not frames:
        raise RecordError(ErrorReason.NO_FRAMES.value, f"no video packet with a pts in {path}")
    frames.sort()
    return _timeline([t for t, _ in frames], frames[-1][0] + frames[-1][1], [])


def _split(tl: Timeline, start: int, end: int, max_clip_s: float) -> list[tuple[int, int]]:
    """[start, end) frames cut into the fewest equal pieces of at most ``max_clip_s``."""
    n = max(1, math.ceil((tl.time_of(end) - tl.time_of(start)) / max_clip_s - 1e-9))
    if n == 1:
        return [(start, end)]
    t0, t1 = tl.time_of(start), tl.time_of(end)
    bounds = [start] + [tl.frame_at(t0 + (t1 - t0) * k / n) for k in range(1, n)] + [end]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _fixed_ranges(tl: Timeline, clip_s: float, overlap_s: float) -> list[tuple[int, int]]:
    """Frame ranges of clips starting every ``clip_s - overlap_s`` seconds, ``clip_s`` long
    (the last one ends with the video)."""
    t0, ranges = float(tl.times_s[0]), []
    k = 0
    while True:
        start_t = t0 + k * (clip_s - overlap_s)
        start = tl.frame_at(start_t)
        if start >= len(tl.times_s):
            return ranges
        end = tl.frame_at(start_t + clip_s)
        if end > start:
            ranges.append((start, end))
        if end >= len(tl.times_s):
            return ranges
        k += 1


def detect_spans(path: str, *, method: str, detector: str = "content",
                 threshold: float | None = None, clip_s: float = 10.0, overlap_s: float = 0.0,
                 min_clip_s: float = 1.0, max_clip_s: float = 60.0, max_clips: int = 500,
                 allow_playlists: bool = False,
                 video: VideoSpec | None = None) -> list[ClipSpan]:
    """The clip spans of the video file ``path``, in time order.

    ``method``: ``scenes`` (shots between the cuts of ``detect_cuts`` with ``detector``
    and ``threshold``; they do not overlap) or ``fixed`` (a clip of ``clip_s`` seconds
    every ``clip_s - overlap_s`` seconds, from a demux-only pass). Spans start and end on
    frames (``start_s`` is its first frame's pts, ``end_s`` the next clip's first frame's
    pts, or the video's end). A span longer than ``max_clip_s`` is cut into equal pieces,
    a span shorter than ``min_clip_s`` is dropped, and only the first ``max_clips`` are
    kept; ``index`` numbers the kept spans from 0. ``video``: decode bounds (see
    ``detect_cuts``). Raises ``RecordError`` for an undecodable file (``detect_cuts``) and
    ``ValueError`` naming the argument for a bad ``method``, ``detector`` or length.
    """
    _check_lengths(method, clip_s, overlap_s, min_clip_s, max_clip_s, max_clips)
    if method == "scenes":
        tl = detect_cuts(path, detector=detector, threshold=threshold,
                         allow_playlists=allow_playlists, video=video)
        bounds = [0, *tl.cuts, len(tl.times_s)]
        ranges = [(a, b) for a, b in itertools.pairwise(bounds)]
    else:
        tl = list_frames(path, allow_playlists=allow_playlists)
        ranges = _fixed_ranges(tl, clip_s, overlap_s)
    spans: list[ClipSpan] = []
    for start, end in ranges:
        for a, b in _split(tl, start, end, max_clip_s):
            start_s, end_s = tl.time_of(a), tl.time_of(b)
            if end_s - start_s + LENGTH_TOLERANCE_S < min_clip_s:
                continue
            spans.append(ClipSpan(len(spans), start_s, end_s, a, b))
            if len(spans) == max_clips:
                return spans
    return spans


def _check_lengths(method: str, clip_s: float, overlap_s: float, min_clip_s: float,
                   max_clip_s: float, max_clips: int) -> None:
    """Raise ``ValueError`` naming the first argument out of range."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not clip_s > 0:
        raise ValueError(f"clip_s must be > 0 seconds, got {clip_s}")
    if not 0 <= overlap_s < clip_s:
        raise ValueError(f"overlap_s must be in [0, clip_s={clip_s}), got {overlap_s}")
    if not 0 <= min_clip_s <= max_clip_s:
        raise ValueError(f"min_clip_s ({min_clip_s}) must be in [0, max_clip_s={max_clip_s}]")
    if max_clips < 1:
        raise ValueError(f"max_clips must be >= 1, got {max_clips}")
