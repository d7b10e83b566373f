"""Video steps: PyAV (FFmpeg) decode with frames sampled by presentation timestamp.

``decode_video(path, spec)`` opens a local file with PyAV, decodes every frame of the
best video stream (so the frame count, duration and rate are measured, never read from
the header) and keeps only the frames chosen by ``spec.sampling``:

- ``fps``: targets ``t0, t0 + 1/fps, ...`` (seconds of presentation time, ``t0`` = the
  first frame's pts); each target takes the first decoded frame whose pts >= target (one
  frame serves all the targets it covers, so a frame is never sampled twice).
- ``uniform``: ``num_frames`` targets evenly spaced over [first pts, last pts]. The span is
  read first by a demux-only pass over the packets (no decoding; packet pts sorted are
  the presentation order), then a decode pass takes for each target the frame nearest in
  pts (ties go to the earlier frame).
- ``keyframes``: the frames with ``frame.key_frame`` set.
- ``scene``: the first frame and every frame whose mean absolute difference (0..1) to
  the previous frame, both reformatted to 64x36 grey, exceeds ``scene_threshold``. This
  is the idea of PySceneDetect's ``ContentDetector`` (a per-frame difference score
  against a threshold) but simpler: grey level only, no HSV, no minimum scene length.

Any mode keeps at most ``spec.max_frames`` frames: more candidates are thinned evenly
(by candidate index; while streaming every other candidate is dropped whenever twice
``max_frames`` are held, so memory stays bounded by 2 * max_frames frames).

Frames are PTS-timed: ``frame.time`` (= pts * time_base). A frame without pts gets the
previous frame's time plus its duration. Only the chosen frames are converted to RGB.

Rotation: FFmpeg exports the container's display matrix (MP4/MOV ``tkhd`` matrix, the
old ``rotate`` tag) as frame side data; PyAV >= 13 reads it as ``frame.rotation`` =
``av_display_rotation_get()``, the angle in degrees by which the matrix turns the coded
picture COUNTER-clockwise, in [-180, 180]. ``np.rot90(a, k)`` also turns
counter-clockwise, so the upright picture is ``np.rot90(a, round(rotation / 90))``.
``rotation_deg`` reports the CLOCKWISE angle applied, ``(-rotation) % 360`` - the value
of ffprobe's legacy ``rotate`` tag and of the ``theta`` the ffmpeg CLI autorotates by
(``theta == 90`` -> ``transpose=clock``). A phone clip tagged ``rotate=90`` has
``frame.rotation == -90`` and is turned 90 degrees clockwise. Angles that are not a
multiple of 90 are rounded to the nearest one; mirrored matrices (a flip) are not
handled. The rotation of the first decoded frame is applied to every frame.

Video stream: FFmpeg's best video stream (``av_find_best_stream``) among the streams
that are not an attached picture. A stream with ``AV_DISPOSITION_ATTACHED_PIC``
(libavformat/avformat.h; PyAV ``stream.disposition & Disposition.attached_pic``) is the
cover art of an audio file (ID3 APIC in MP3, ``covr`` in M4A, METADATA_BLOCK_PICTURE in
FLAC, a Matroska attachment): one still image, never a one-frame video. A file with
real video plus cover art uses the real video.

Errors (``pipeline.errors.RecordError`` with a ``records.ErrorReason`` value):
``empty_file`` (0 bytes), ``read_failed`` (the file cannot be stat'ed),
``corrupt_container`` (FFmpeg cannot open it), ``no_video_stream`` (no video stream but
an attached picture: audio only, cover art only; the message lists the streams there
are), ``no_frames`` (not one frame decodes). A packet that fails to demux or decode is counted
in ``decode_errors`` and skipped; a result with errors and >= 1 frame has
``partial=True``. Decoding stops after ``MAX_PACKETS`` packets or ``DECODE_BUDGET_S``
seconds (counted as one decode error, so the result is partial), so a broken file can
never loop forever.

Bounds per video (``VideoSpec``): ``too_large`` when the stream's coded size or any decoded
frame has more than ``max_frame_pixels`` pixels (checked on the stream header before the
first packet is decoded, and on every frame); ``decode_timeout`` when decoding (all passes
together) takes more than ``max_decode_s`` seconds.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import io
import os
import time
from typing import Any

import numpy as np

from pipeline.columns import (DECODE_ERRORS, DURATION_S, FORMAT, FPS, FRAME_COUNT,
                              FRAME_TIMESTAMPS_S, FRAMES, FRAMES_ENCODED, HEIGHT, IMAGE,
                              IMAGE_HEIGHT, IMAGE_WIDTH, MIME, PARTIAL, PHASH, ROTATION_DEG,
                              SHA256, SOURCE_PATH, STATUS, VIDEO_CODEC, WIDTH, Batch)
from pipeline.errors import RecordError
from pipeline.records import ErrorReason
from pipeline.spec import ResizeSpec, VideoSpec
from pipeline.steps.base import RowStep
from pipeline.steps.image import phash64, resize_pixels


MAX_PACKETS = 10_000_000   # ~46 h at 60 fps: beyond this a file is treated as looping
DECODE_BUDGET_S = 600.0    # wall-clock seconds per decode pass
SCENE_SIZE = (64, 36)      # (width, height) of the grey thumbnails compared in `scene`

# Container short name -> (format, mime). FFmpeg names the MP4 family demuxer
# "mov,mp4,m4a,3gp,3g2,mj2" and Matroska "matroska,webm"; the brand / DocType decides.
_MIMES = {"mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm",
          "matroska": "video/x-matroska", "avi": "video/x-msvideo", "flv": "video/x-flv",
          "mpegts": "video/mp2t", "mpeg": "video/mpeg", "ogg": "video/ogg",
          "asf": "video/x-ms-asf", "3gp": "video/3gpp"}


def _av():
    """PyAV (FFmpeg), imported on first use: an image-only job never loads it (an image
    bundle may come without it)."""
    import av
    import av.error

    return av


@functools.cache
def _attached_pic_flag() -> int:
    """AV_DISPOSITION_ATTACHED_PIC (libavformat/avformat.h), via PyAV's enum where it has
    one."""
    return int(getattr(getattr(_av().stream, "Disposition", None), "attached_pic", 0x0400))


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    """The measured properties and sampled frames of one video.

    ``duration_s``: seconds from the first decoded frame's pts to the last decoded frame's
    pts plus that frame's duration (measured, not the header's). ``fps``: measured mean
    rate, ``frame_count / duration_s`` (0.0 if the duration is 0). ``frame_count``: frames
    actually decoded. ``width``/``height``: display size in pixels (after rotation) of the
    first decoded frame. ``rotation_deg``: clockwise rotation applied, 0/90/180/270.
    ``codec``: FFmpeg decoder name (e.g. ``h264``). ``container``: short container name
    (``mp4``, ``mov``, ``webm``, ``matroska``, ...), ``mime`` its MIME type.
    ``timestamps_s``: presentation times (seconds, ascending) of ``frames``, a list of
    upright (H, W, 3) uint8 RGB arrays. ``partial``: some packets failed but >= 1 frame
    decoded; ``decode_errors``: packets (or passes) that failed.
    """

    duration_s: float
    fps: float
    frame_count: int
    width: int
    height: int
    rotation_deg: int
    codec: str
    container: str
    mime: str
    timestamps_s: list[float]
    frames: list[np.ndarray]
    partial: bool
    decode_errors: int


class _Thinner:
    """Keeps an evenly thinned subsequence of at most ``cap`` candidates, streaming.

    Holds at most 2 * cap items: when full, every other item is dropped and the stride
    between kept candidates doubles. ``result()`` then thins to ``cap`` with linspace.
    """

    def __init__(self, cap: int):
        self.cap = cap
        self.stride = 1
        self.seen = 0
        self.items: list[Any] = []

    def add(self, item: Any) -> None:
        if self.seen % self.stride == 0:
            self.items.append(item)
            if len(self.items) > 2 * self.cap:
                self.items = self.items[::2]
                self.stride *= 2
        self.seen += 1

    def result(self) -> list[Any]:
        return thin_evenly(self.items, self.cap)


def thin_evenly(items: list[Any], cap: int) -> list[Any]:
    """``items`` if ``len(items) <= cap``, else ``cap`` of them at evenly spaced indices."""
    if len(items) <= cap:
        return list(items)
    idx = np.unique(np.round(np.linspace(0, len(items) - 1, cap)).astype(int))
    return [items[i] for i in idx]


@dataclasses.dataclass(frozen=True)
class _Limits:
    """Per-video bounds: ``max_frame_pixels`` (pixels) and ``deadline`` (``time.monotonic``
    seconds) after which decoding raises ``decode_timeout``; ``max_decode_s`` names it."""

    max_frame_pixels: int
    max_decode_s: float
    deadline: float

    @classmethod
    def of(cls, spec: VideoSpec) -> "_Limits":
        return cls(spec.max_frame_pixels, spec.max_decode_s,
                   time.monotonic() + spec.max_decode_s)

    def check_size(self, width: int, height: int, what: str) -> None:
        """Raise ``RecordError`` (``too_large``) if ``width * height`` exceeds the limit."""
        if width * height > self.max_frame_pixels:
            raise RecordError(ErrorReason.TOO_LARGE.value,
                              f"{what} {width}x{height} ({width * height} pixels) exceeds "
                              f"video.max_frame_pixels={self.max_frame_pixels}")

    def check_time(self) -> None:
        """Raise ``RecordError`` (``decode_timeout``) once the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise RecordError(ErrorReason.DECODE_TIMEOUT.value,
                              f"decoding took longer than video.max_decode_s="
                              f"{self.max_decode_s:g} s")


def _check_stream_size(stream, limits: _Limits) -> None:
    """Refuse a stream whose header declares frames over the limit (0x0: unknown yet)."""
    ctx = stream.codec_context
    limits.check_size(int(ctx.width or 0), int(ctx.height or 0), "video stream")


class _Decoder:
    """One decode pass over the video stream: yields (frame, time_s) in decode order."""

    def __init__(self, path: str, max_packets: int, budget_s: float, limits: _Limits):
        self.container = _open(path)
        self.stream = _video_stream(self.container, path)
        try:
            _check_stream_size(self.stream, limits)
        except RecordError:
            self.container.close()
            raise
        self.errors = 0
        self.max_packets = max_packets
        self.budget_s = budget_s
        self.limits = limits

    def frames(self):
        av = _av()
        deadline = time.monotonic() + self.budget_s
        demux = self.container.demux(self.stream)
        n_packets = 0
        prev_end: float | None = None
        while True:
            self.limits.check_time()
            if n_packets >= self.max_packets or time.monotonic() > deadline:
                self.errors += 1  # budget exhausted: stop, the result is partial
                return
            try:
                packet = next(demux)
            except StopIteration:
                break
            except (av.error.FFmpegError, OSError, ValueError, EOFError):
                self.errors += 1  # the demuxer gave up: flush what was sent so far
                packet = None
            n_packets += 1
            try:
                decoded = packet.decode() if packet is not None else \
                    self.stream.codec_context.decode(None)
                for frame in decoded:
                    self.limits.check_size(frame.width, frame.height, "video frame")
                    t = frame.time
                    if t is None:  # no pts: continue from the previous frame
                        t = prev_end if prev_end is not None else 0.0
                    prev_end = t + _frame_duration_s(frame)
                    yield frame, float(t)
            except (av.error.FFmpegError, ValueError, EOFError):
                self.errors += 1
            if packet is None:
                break

    def close(self) -> None:
        self.container.close()


def _open(path: str):
    av = _av()
    try:
        return av.open(path, metadata_errors="ignore")
    except (av.error.FFmpegError, OSError, ValueError, UnicodeDecodeError) as e:
        raise RecordError(ErrorReason.CORRUPT_CONTAINER.value, f"{type(e).__name__}: {e}") from e


def _is_attached_picture(stream) -> bool:
    """True for a cover-art stream (disposition ``attached_pic``, FFmpeg's 0x0400)."""
    return bool(int(getattr(stream, "disposition", 0) or 0) & _attached_pic_flag())


def _video_stream(container, path: str):
    """The video stream to decode (module docstring); closes ``container`` and raises
    ``RecordError`` (``no_video_stream``) when there is none."""
    av = _av()
    videos = [s for s in container.streams.video if not _is_attached_picture(s)]
    if not videos:
        message = f"{_streams_summary(container)} in {path}"
        container.close()
        raise RecordError(ErrorReason.NO_VIDEO_STREAM.value, message)
    try:
        best = container.streams.best("video")
    except (av.error.FFmpegError, ValueError):
        best = None
    indexes = {s.index for s in videos}
    return best if best is not None and best.index in indexes else videos[0]


def _streams_summary(container) -> str:
    """What a container without a real video stream holds, e.g. "only an attached
    picture (cover art) and 1 audio stream", "only 1 audio stream"."""
    pictures = sum(1 for s in container.streams.video if _is_attached_picture(s))
    counts = collections.Counter(s.type for s in container.streams
                                 if not (s.type == "video" and _is_attached_picture(s)))
    others = " and ".join(f"{n} {kind} stream{'s' if n > 1 else ''}"
                          for kind, n in sorted(counts.items()))
    if pictures:
        what = "an attached picture" if pictures == 1 else f"{pictures} attached pictures"
        return f"only {what} (cover art)" + (f" and {others}" if others else "")
    return f"only {others}" if others else "no streams at all"


def _frame_duration_s(frame) -> float:
    """Duration of ``frame`` in seconds from its own ``duration`` (0.0 if unknown)."""
    d = getattr(frame, "duration", None)
    if not d or frame.time_base is None:
        return 0.0
    return float(d * frame.time_base)


def _packet_times(path: str, max_packets: int, budget_s: float,
                  limits: _Limits) -> tuple[list[float], int]:
    """Demux-only pass: sorted pts (seconds) of the video packets, and demux errors.
    Raises ``RecordError`` (``too_large``, ``decode_timeout``: ``_Limits``)."""
    av = _av()
    container = _open(path)
    try:
        stream = _video_stream(container, path)
        _check_stream_size(stream, limits)
        tb = stream.time_base
        times: list[float] = []
        errors = 0
        deadline = time.monotonic() + budget_s
        demux = container.demux(stream)
        for _ in range(max_packets):
            limits.check_time()
            if time.monotonic() > deadline:
                break
            try:
                packet = next(demux)
            except StopIteration:
                break
            except (av.error.FFmpegError, OSError, ValueError, EOFError):
                errors += 1
                break
            if packet.pts is not None and packet.size > 0:
                times.append(float(packet.pts * tb))
        return sorted(times), errors
    finally:
        container.close()


def _rotation_k(frame) -> int:
    """np.rot90 ``k`` (counter-clockwise quarter turns) that makes ``frame`` upright."""
    rot = getattr(frame, "rotation", 0) or 0
    return int(round(rot / 90.0)) % 4


def _to_rgb(frame, k: int) -> np.ndarray:
    """(H, W, 3) uint8 RGB, upright, C-contiguous."""
    a = frame.to_ndarray(format="rgb24")
    return np.ascontiguousarray(np.rot90(a, k)) if k else a


def _scene_gray(frame) -> np.ndarray:
    w, h = SCENE_SIZE
    return frame.reformat(width=w, height=h, format="gray").to_ndarray().astype(np.int16)


def _container_name(container, path: str) -> str:
    names = container.format.name.split(",")
    if "mov" in names:
        brand = (container.metadata or {}).get("major_brand", "").strip().lower()
        return "mov" if brand == "qt" else "mp4"
    if "matroska" in names or "webm" in names:
        with open(path, "rb") as f:
            head = f.read(64)
        return "webm" if b"webm" in head else "matroska"
    return names[0]


def decode_video(path: str, spec: VideoSpec, *, max_packets: int = MAX_PACKETS,
                 budget_s: float = DECODE_BUDGET_S) -> VideoInfo:
    """Decode the local video file ``path`` and sample frames per ``spec`` (see module doc).

    Raises ``RecordError`` with reason ``empty_file``, ``read_failed``,
    ``corrupt_container``, ``no_video_stream`` (audio only, or only an attached picture),
    ``no_frames``, ``too_large`` (a frame over ``spec.max_frame_pixels`` pixels) or
    ``decode_timeout`` (over ``spec.max_decode_s`` seconds in all). ``max_packets`` and
    ``budget_s`` (seconds) bound each pass over the file (the result is then partial).
    """
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise RecordError(ErrorReason.READ_FAILED.value, f"{type(e).__name__}: {e}") from e
    if size == 0:
        raise RecordError(ErrorReason.EMPTY_FILE.value, f"{path} has 0 bytes")

    cap = spec.max_frames
    limits = _Limits.of(spec)
    targets: list[float] | None = None
    pre_errors = 0
    if spec.sampling == "uniform":
        times, pre_errors = _packet_times(path, max_packets, budget_s, limits)
        if times:
            n = min(spec.num_frames, cap)
            targets = np.linspace(times[0], times[-1], n).tolist() if n > 1 else [times[0]]

    dec = _Decoder(path, max_packets, budget_s, limits)
    try:
        codec = dec.stream.codec_context.name
        container = _container_name(dec.container, path)
        count = 0
        first_t = last_t = None
        last_end = 0.0
        first_frame = None
        thinner = _Thinner(cap)
        # uniform: [frame_index, time, frame] chosen per target; resolved lazily
        chosen: dict[int, tuple[float, Any]] = {}
        all_uniform_fallback = _Thinner(min(spec.num_frames, cap))
        j = 0  # next target (fps / uniform)
        next_fps_t: float | None = None
        prev: tuple[int, float, Any] | None = None
        prev_gray = None
        for frame, t in dec.frames():
            idx = count
            count += 1
            if first_frame is None:
                first_frame, first_t = frame, t
                next_fps_t = t
            last_t = t
            last_end = t + _frame_duration_s(frame)
            if spec.sampling == "fps":
                if t >= next_fps_t:
                    thinner.add((t, frame))
                    while next_fps_t <= t:  # all targets this frame covers
                        j += 1
                        next_fps_t = first_t + j / spec.fps
            elif spec.sampling == "uniform":
                if targets is None:
                    all_uniform_fallback.add((t, frame))
                else:
                    while j < len(targets) and targets[j] <= t:
                        target = targets[j]
                        if prev is not None and target - prev[1] <= t - target:
                            chosen.setdefault(prev[0], (prev[1], prev[2]))
                        else:
                            chosen.setdefault(idx, (t, frame))
                        j += 1
                    prev = (idx, t, frame)
            elif spec.sampling == "keyframes":
                if frame.key_frame:
                    thinner.add((t, frame))
            else:  # scene
                gray = _scene_gray(frame)
                if prev_gray is None:
                    thinner.add((t, frame))
                elif float(np.abs(gray - prev_gray).mean()) / 255.0 > spec.scene_threshold:
                    thinner.add((t, frame))
                prev_gray = gray
        errors = dec.errors + pre_errors
    finally:
        dec.close()

    if count == 0:
        raise RecordError(ErrorReason.NO_FRAMES.value,
                          f"no decodable video frame ({errors} packets failed)")
    if spec.sampling == "uniform":
        if targets is None:  # no packet pts: evenly spaced among decoded frames
            picked = all_uniform_fallback.result()
        else:
            if j < len(targets) and prev is not None:  # targets after the last frame
                chosen.setdefault(prev[0], (prev[1], prev[2]))
            picked = [chosen[i] for i in sorted(chosen)]
    else:
        picked = thinner.result()
    picked.sort(key=lambda p: p[0])

    k = _rotation_k(first_frame)
    frames = [_to_rgb(f, k) for _, f in picked]
    w, h = first_frame.width, first_frame.height
    if k % 2:
        w, h = h, w
    duration = max(0.0, last_end - first_t)
    if duration == 0.0 and count > 1:
        duration = last_t - first_t
    return VideoInfo(
        duration_s=round(duration, 6), fps=round(count / duration, 6) if duration > 0 else 0.0,
        frame_count=count, width=w, height=h, rotation_deg=(-90 * k) % 360, codec=codec,
        container=container, mime=_MIMES.get(container, f"video/{container}"),
        timestamps_s=[t for t, _ in picked], frames=frames,
        partial=errors > 0, decode_errors=errors)


def decoded_frames_bytes(path: str, spec: VideoSpec) -> int:
    """Bytes of the RGB frames ``decode_video`` would keep for ``path``, estimated from
    the stream header: coded width * height * 3 times the frames sampled at most
    (``uniform``: min(num_frames, max_frames); other modes: max_frames). 0 when the
    header cannot be read or the size is over ``max_frame_pixels`` (the row then fails
    before decoding). Never raises."""
    try:
        with _av().open(path, metadata_errors="ignore") as container:
            streams = [s for s in container.streams.video if not _is_attached_picture(s)]
            if not streams:
                return 0
            pixels = int(streams[0].codec_context.width or 0) * int(
                streams[0].codec_context.height or 0)
    except Exception:  # noqa: BLE001 - an estimate: decode_video reports the real error
        return 0
    if pixels > spec.max_frame_pixels:
        return 0
    n = min(spec.num_frames, spec.max_frames) if spec.sampling == "uniform" else spec.max_frames
    return pixels * 3 * n


def file_sha256(path: str) -> str:
    """Hex sha256 of the file at ``path``, streamed."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class VideoDecodeStep(RowStep):
    """``_source_path`` (a local file path) -> ``_frames`` and the video's metadata.

    Columns: ``_frames`` (list of (H, W, 3) uint8 RGB, internal), ``width``/``height``
    (display pixels), ``mime``, ``format`` (container), ``duration_s``, ``fps`` (measured),
    ``frame_count`` (decoded), ``frame_timestamps_s`` (seconds), ``partial``,
    ``rotation_deg``, ``video_codec``, ``sha256`` (hex, of the file), ``phash`` (64-bit
    pHash of the middle sampled frame, as in ``HashStep``), ``decode_errors``.
    """

    writes = (FRAMES, WIDTH, HEIGHT, MIME, FORMAT, DURATION_S, FPS, FRAME_COUNT,
              FRAME_TIMESTAMPS_S, PARTIAL, ROTATION_DEG, VIDEO_CODEC, SHA256, PHASH,
              DECODE_ERRORS)

    def __init__(self, spec: VideoSpec):
        self.spec = spec

    def setup(self) -> None:
        """Import PyAV (FFmpeg) now, once: without it a video job fails at assembly, not
        row by row; image jobs never construct this step, so never load it."""
        _av()

    def settings(self):
        return self.spec.model_dump(mode="json", exclude={"temp_dir"})  # where, not what

    def decoded_bytes(self, batch, i):
        """Header estimate of row ``i``'s ``_frames`` (bytes; ``decoded_frames_bytes``)."""
        path = batch[SOURCE_PATH][i]
        return decoded_frames_bytes(path, self.spec) if path else 0

    def process_row(self, batch, i):
        path = batch[SOURCE_PATH][i]
        if not path:
            raise RecordError(ErrorReason.READ_FAILED.value, "no local video file")
        info = decode_video(path, self.spec)
        return {FRAMES: info.frames, WIDTH: info.width, HEIGHT: info.height, MIME: info.mime,
                FORMAT: info.container, DURATION_S: info.duration_s, FPS: info.fps,
                FRAME_COUNT: info.frame_count, FRAME_TIMESTAMPS_S: info.timestamps_s,
                PARTIAL: info.partial, ROTATION_DEG: info.rotation_deg,
                VIDEO_CODEC: info.codec, SHA256: file_sha256(path),
                PHASH: phash64(info.frames[len(info.frames) // 2]),
                DECODE_ERRORS: info.decode_errors}


class VideoFramesStep(RowStep):
    """``_frames`` -> ``frames`` (list of JPEG/WebP bytes), ``image`` (the middle frame,
    the row's thumbnail), ``image_width``/``image_height`` (pixels, of the encoded frames).

    Frames are resized with ``resize_pixels`` and encoded per ``resize.encode_format``
    and ``resize.quality``. ``_frames`` is then set to None on every row unless
    ``keep_frames`` (steps that need the frames, e.g. model inputs, run before this one).
    """

    writes = (FRAMES_ENCODED, IMAGE, IMAGE_WIDTH, IMAGE_HEIGHT)

    def __init__(self, resize: ResizeSpec, keep_frames: bool = False):
        self.resize = resize
        self.keep_frames = keep_frames

    def settings(self):
        return self.resize.model_dump(mode="json")

    def process_row(self, batch, i):
        fmt = "JPEG" if self.resize.encode_format == "jpeg" else "WEBP"
        encoded, sizes = [], []
        for frame in batch[FRAMES][i]:
            img = resize_pixels(frame, self.resize)
            buf = io.BytesIO()
            img.save(buf, format=fmt, quality=self.resize.quality)
            encoded.append(buf.getvalue())
            sizes.append(img.size)
        if not encoded:
            raise RecordError(ErrorReason.NO_FRAMES.value, "no sampled frames to encode")
        mid = len(encoded) // 2
        return {FRAMES_ENCODED: encoded, IMAGE: encoded[mid],
                IMAGE_WIDTH: sizes[mid][0], IMAGE_HEIGHT: sizes[mid][1]}

    def __call__(self, batch: Batch) -> Batch:
        batch = super().__call__(batch)
        if not self.keep_frames:
            batch[FRAMES] = [None] * len(batch[STATUS])
        return batch
