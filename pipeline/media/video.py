"""Video decoding and frame sampling with PyAV (FFmpeg): probe, decode, thin to the
sampling policy, rotate upright, thumbnails for scene sampling, and the decode bounds.

Pure codec over a local file path (the datasource stages remote videos to a temporary
file): no batches, no output. ``steps.video`` turns the result into row columns.
"""

from __future__ import annotations
import collections
import dataclasses
import functools
import hashlib
import os
import time
from typing import Any
import numpy as np
from pipeline.errors import RecordError
from pipeline.records import ErrorReason
from pipeline.spec import VideoSpec


MAX_PACKETS = 10_000_000   # ~46 h at 60 fps: beyond this a file is treated as looping


DECODE_BUDGET_S = 600.0    # wall-clock seconds per decode pass


SCENE_SIZE = (64, 36)      # (width, height) of the grey thumbnails compared in `scene`


# Container short name -> (format, mime). FFmpeg names the MP4 family demuxer
# "mov,mp4,m4a,3gp,3g2,mj2" and Matroska "matroska,webm"; the brand / DocType decides.
_MIMES = {"mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm",
          "matroska": "video/x-matroska", "avi": "video/x-msvideo", "flv": "video/x-flv",
          "mpegts": "video/mp2t", "mpeg": "video/mpeg", "ogg": "video/ogg",
          "asf": "video/x-ms-asf", "3gp": "video/3gpp"}


def av_module():
    """PyAV (FFmpeg), imported on first use: an image-only job never loads it (an image
    bundle may come without it)."""
    import av
    import av.error

    return av


@functools.cache
def _attached_pic_flag() -> int:
    """AV_DISPOSITION_ATTACHED_PIC (libavformat/avformat.h), via PyAV's enum where it has
    one."""
    return int(getattr(getattr(av_module().stream, "Disposition", None), "attached_pic", 0x0400))


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
        av = av_module()
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
    av = av_module()
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
    av = av_module()
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
    av = av_module()
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
        with av_module().open(path, metadata_errors="ignore") as container:
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
