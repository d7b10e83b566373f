"""Video decoding and frame sampling with PyAV (FFmpeg): probe, decode, thin to the
sampling policy, apply the display matrix, thumbnails for scene sampling, the decode
bounds, the frame budget, FFmpeg's confinement to the one file, and the near hash.

Pure codec over a local file path (the datasource stages remote videos to a temporary
file): no batches, no output. ``steps.video`` turns the result into row columns.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import functools
import hashlib
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from pipeline.errors import RecordError, error_text
from pipeline.media.imageio_util import still_image_format
from pipeline.media.transform import low_detail, phash64
from pipeline.records import ErrorReason
from pipeline.spec import VideoSpec

MAX_PACKETS = 10_000_000   # ~46 h at 60 fps: beyond this a file is treated as looping


DECODE_BUDGET_S = 600.0    # wall-clock seconds per decode pass


SCENE_SIZE = (64, 36)      # (width, height) of the grey thumbnails compared in `scene`


SEEK_MARGIN_S = 1.0        # a window's seek goes this far before its start (frame reorder)
WINDOW_EPS_S = 1e-6        # presentation times this close count as equal (float rounding)


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
    actually decoded. ``width``/``height``: display size in pixels (after the display
    matrix) of the first decoded frame, at full resolution (``frames`` are smaller when
    flagged ``frames_downscaled``). ``rotation_deg``: clockwise rotation applied,
    0/90/180/270, after a left-right mirror when flagged ``mirrored`` (``Orientation``).
    ``codec``: FFmpeg decoder name (e.g. ``h264``). ``container``: short container name
    (``mp4``, ``mov``, ``webm``, ``matroska``, ...), ``mime`` its MIME type.
    ``timestamps_s``: presentation times (seconds, ascending) of ``frames``, a list of
    upright (H, W, 3) uint8 RGB arrays. ``partial``: some packets failed but >= 1 frame
    decoded; ``decode_errors``: packets (or passes) that failed. ``flags``: ``mirrored``
    (the display matrix mirrors; applied), ``display_matrix_unsupported`` (a matrix that
    is no quarter turn or mirror, e.g. 45 degrees or a shear: frames are as coded, not as
    a player shows them), ``frames_downscaled`` (halved to fit the frame budget).
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
    flags: tuple[str, ...] = ()


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

    def offer(self, make: Callable[..., Any], *args: Any) -> None:
        """``add(make(*args))``, but ``make`` is called only when the item would be kept."""
        if self.seen % self.stride == 0:
            self.add(make(*args))
        else:
            self.seen += 1

    def result(self) -> list[Any]:
        return thin_evenly(self.items, self.cap)


def thin_evenly(items: list[Any], cap: int) -> list[Any]:
    """``items`` if ``len(items) <= cap``, else ``cap`` of them at evenly spaced indices."""
    if len(items) <= cap:
        return list(items)
    idx = np.unique(np.round(np.linspace(0, len(items) - 1, cap)).astype(int))
    return [items[i] for i in idx]


#: Flags (``VideoInfo.flags``, the ``decode_flags`` column).
FLAG_MIRRORED = "mirrored"                # the display matrix mirrors: applied
FLAG_MATRIX_UNSUPPORTED = "display_matrix_unsupported"  # not applied: coded pixels
FLAG_DOWNSCALED = "frames_downscaled"     # frames halved to fit the frame budget

#: Shortest side (pixels) the frame budget may halve a sampled frame to; a video that
#: would need smaller frames is a ``too_large`` error row naming the budget.
MIN_BUDGET_SIDE = 16


class _Held:
    """One sampled frame: presentation time ``t`` (seconds) and its RGB ``array``."""

    __slots__ = ("__weakref__", "array", "t")

    def __init__(self, t: float, array: np.ndarray):
        self.t = t
        self.array = array


def _halved(n: int, shift: int) -> int:
    """``n`` pixels halved ``shift`` times, rounding up (as Pillow's ``reduce(2)``)."""
    return -(-n // (1 << shift))


class _FrameStore:
    """The sampled frames of one video as RGB arrays, converted as they are sampled and
    held within ``budget`` bytes (None: unbounded).

    The rule (``runtime.max_batch_bytes`` is the budget of one row): a sampled frame is
    converted at full size while it and every frame still held (the sampler's candidates:
    up to 2 * ``max_frames`` + 1) fit in the budget. When they would not, every held
    frame, and every frame converted after, is halved in width and height (rounding up:
    Pillow ``Image.reduce(2)``, a 2x2 box filter, for held frames; swscale ``area`` for new
    ones), as often as needed; the result is flagged ``frames_downscaled``. A frame would
    have to fall below ``MIN_BUDGET_SIDE`` pixels: ``RecordError`` (``too_large``). So
    the frames one video holds never pass the budget, and the decoder's own YUV frames are
    released as soon as they are converted (only the previous one is kept, by ``uniform``).
    """

    def __init__(self, budget: int | None):
        self.budget = budget
        self.shift = 0
        self.live: weakref.WeakSet[_Held] = weakref.WeakSet()

    def held_bytes(self) -> int:
        """Bytes of the frames still held (a frame the sampler dropped is gone)."""
        return sum(h.array.nbytes for h in list(self.live) if h.array is not None)

    def add(self, frame, t: float) -> _Held:
        """``frame`` (a PyAV VideoFrame) as RGB within the budget (class doc)."""
        w, h = frame.width, frame.height
        if self.budget is not None:
            held = self.held_bytes()
            while held + _halved(w, self.shift) * _halved(h, self.shift) * 3 > self.budget:
                if min(_halved(w, self.shift + 1), _halved(h, self.shift + 1)) < MIN_BUDGET_SIDE:
                    raise RecordError(
                        ErrorReason.TOO_LARGE.value,
                        f"{w}x{h} frames: the sampled frames do not fit in "
                        f"runtime.max_batch_bytes={self.budget} even at "
                        f"{_halved(w, self.shift)}x{_halved(h, self.shift)} pixels")
                self.shift += 1
                for other in list(self.live):
                    if other.array is not None:
                        other.array = np.asarray(Image.fromarray(other.array).reduce(2))
                held = self.held_bytes()
        if self.shift:
            array = frame.reformat(width=_halved(w, self.shift), height=_halved(h, self.shift),
                                   format="rgb24", interpolation="AREA").to_ndarray()
        else:
            array = frame.to_ndarray(format="rgb24")
        held_frame = _Held(t, array)
        self.live.add(held_frame)
        return held_frame


@dataclasses.dataclass(frozen=True)
class _Limits:
    """Per-video bounds: ``max_frame_pixels`` (pixels) and ``deadline`` (``time.monotonic``
    seconds) after which decoding raises ``decode_timeout``; ``max_decode_s`` names it."""

    max_frame_pixels: int
    max_decode_s: float
    deadline: float

    @classmethod
    def of(cls, spec: VideoSpec) -> _Limits:
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

    def __init__(self, path: str, max_packets: int, budget_s: float, limits: _Limits,
                 allow_playlists: bool = False, start_s: float | None = None):
        self.input = _open(path, allow_playlists)
        self.container = self.input.container
        try:
            self.stream = _video_stream(self.container, path)
            _check_stream_size(self.stream, limits)
        except RecordError:
            self.input.close()
            raise
        if start_s is not None:
            seek_before(self.container, self.stream, start_s)
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
        self.input.close()


#: FFmpeg demuxers that open other files or URLs named inside the file (playlists,
#: manifests, concatenation lists, image sequences, sessions, reference files): refused
#: unless ``video.allow_playlists``. From FFmpeg's libavformat (hls.c, dashdec.c,
#: concatdec.c, imfdec.c, img2dec.c, vobsub in mpeg.c, sdp/rtsp in rtsp.c, movie/amovie
#: through lavfi, script demuxers avisynth/vapoursynth).
REFERENCING_DEMUXERS = frozenset({
    "hls", "applehttp", "dash", "concat", "imf", "image2", "vobsub", "sdp", "rtsp", "rtp",
    "lavfi", "avisynth", "vapoursynth", "webm_dash_manifest"})

#: ``protocol_whitelist`` for the URLs a demuxer opens besides the file itself when the
#: file is read through a Python file object: a name no FFmpeg protocol has, so every
#: nested open fails (FFmpeg: "Protocol '...' not on whitelist").
_NO_PROTOCOL = "none"


@functools.cache
def _format_whitelist() -> str:
    """FFmpeg's ``format_whitelist``: every demuxer name this FFmpeg build knows
    (``av.formats_available``, each comma-separated alias on its own) but
    ``REFERENCING_DEMUXERS``."""
    names = {part for name in av_module().formats_available for part in name.split(",")}
    return ",".join(sorted(names - REFERENCING_DEMUXERS))


class _Input:
    """One opened video: the PyAV container and the Python file object it reads.

    Confined (``allow_playlists`` false, the default): FFmpeg reads ``path`` only through
    a Python file object (custom I/O, so no FFmpeg protocol opens the file itself), with
    ``format_whitelist`` = every demuxer but ``REFERENCING_DEMUXERS`` and
    ``protocol_whitelist`` = ``_NO_PROTOCOL``, so a demuxer can open nothing else: an HLS
    playlist or ffconcat list inside the input root naming a file outside it is refused
    before any entry is read, and any other nested open (an MP4 data reference, a VobSub
    ``.sub``) fails. ``allow_playlists``: FFmpeg opens ``path`` itself with
    ``protocol_whitelist=file``: playlists may name other local files (not checked against
    the input roots) and nothing on the network.

    Raises ``RecordError``: ``unsupported_format`` when FFmpeg refuses the container by the
    whitelist (EINVAL on open), ``corrupt_container`` when it cannot open it otherwise.
    """

    def __init__(self, path: str, allow_playlists: bool = False):
        av = av_module()
        self.file = None
        try:
            if allow_playlists:
                self.container = av.open(path, metadata_errors="ignore",
                                         container_options={"protocol_whitelist": "file"})
            else:
                self.file = open(path, "rb")  # noqa: SIM115 - closed by close()
                self.container = av.open(
                    self.file, metadata_errors="ignore",
                    container_options={"protocol_whitelist": _NO_PROTOCOL,
                                       "format_whitelist": _format_whitelist()})
        except (av.error.FFmpegError, OSError, ValueError, UnicodeDecodeError) as e:
            self._close_file()
            if not allow_playlists and getattr(e, "errno", None) == errno.EINVAL:
                raise RecordError(
                    ErrorReason.UNSUPPORTED_FORMAT.value,
                    f"FFmpeg refused the container ({error_text(e)}): a format that "
                    f"opens other files or URLs ({', '.join(sorted(REFERENCING_DEMUXERS))}) "
                    f"is read only with video.allow_playlists=true") from e
            raise RecordError(ErrorReason.CORRUPT_CONTAINER.value, error_text(e)) from e

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def close(self) -> None:
        """Close the container, then the file it reads."""
        try:
            self.container.close()
        finally:
            self._close_file()


def _open(path: str, allow_playlists: bool = False) -> _Input:
    """``_Input(path, allow_playlists)``: the one way this module opens a video."""
    return _Input(path, allow_playlists)


def open_video(path: str, allow_playlists: bool = False) -> _Input:
    """The confined open (``_Input``) for the other codecs of ``media/`` (clips, clip
    encode): ``.container`` is the PyAV container; call ``.close()``. Raises
    ``RecordError`` as ``_Input``."""
    return _open(path, allow_playlists)


def video_stream(container, path: str):
    """The video stream ``decode_video`` decodes (no cover art); raises ``RecordError``
    (``no_video_stream``) when there is none."""
    return _video_stream(container, path)


def seek_before(container, stream, start_s: float) -> None:
    """Seek ``container`` to a key frame at least ``SEEK_MARGIN_S`` seconds of presentation
    time before ``start_s`` (reordered frames of the one at ``start_s`` are then decoded
    too). Nothing when that is before the stream's start; a container that cannot seek
    stays where it is (at its start: the caller skips frames before ``start_s``)."""
    av = av_module()
    target_s = start_s - SEEK_MARGIN_S
    if target_s <= 0 or stream.time_base is None:
        return
    try:
        container.seek(int(target_s / stream.time_base), stream=stream, backward=True)
    except (av.error.FFmpegError, OSError, ValueError):
        pass  # read from the start; the window skips what precedes it


def _is_attached_picture(stream) -> bool:
    """True for a cover-art stream (disposition ``attached_pic``, FFmpeg's 0x0400)."""
    return bool(int(getattr(stream, "disposition", 0) or 0) & _attached_pic_flag())


def _video_stream(container, path: str):
    """The video stream to decode (module docstring); raises ``RecordError``
    (``no_video_stream``) when there is none (the caller closes ``container``)."""
    av = av_module()
    videos = [s for s in container.streams.video if not _is_attached_picture(s)]
    if not videos:
        message = f"{_streams_summary(container)} in {path}"
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
                  limits: _Limits, allow_playlists: bool = False,
                  start_s: float | None = None,
                  end_s: float | None = None) -> tuple[list[float], int]:
    """Demux-only pass: sorted pts (seconds) of the video packets in [start_s, end_s)
    (None: unbounded), and demux errors. Raises ``RecordError`` (``too_large``,
    ``decode_timeout``: ``_Limits``)."""
    av = av_module()
    opened = _open(path, allow_playlists)
    container = opened.container
    lo = -np.inf if start_s is None else start_s - WINDOW_EPS_S
    hi = np.inf if end_s is None else end_s - WINDOW_EPS_S
    try:
        stream = _video_stream(container, path)
        _check_stream_size(stream, limits)
        if start_s is not None:
            seek_before(container, stream, start_s)
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
            if packet.dts is not None and float(packet.dts * tb) >= hi:
                break  # pts >= dts: this and every later packet is past the window
            if packet.pts is not None and packet.size > 0 and lo <= float(packet.pts * tb) < hi:
                times.append(float(packet.pts * tb))
        return sorted(times), errors
    finally:
        opened.close()


#: Largest distance of a unit-scaled display-matrix entry from -1, 0 or 1 that still
#: counts as that value: 0.02 ~ sin(1.1 deg), the 1-degree tolerance FFmpeg's CLI
#: autorotate uses (fftools/ffmpeg_filter.c) to call a matrix a quarter turn.
MATRIX_TOLERANCE = 0.02


@dataclasses.dataclass(frozen=True)
class Orientation:
    """The exact pixel transform of a display matrix: one of the 8 symmetries of the
    rectangle (turns by quarter turns, with or without a mirror).

    ``swap``: rows and columns exchange (a quarter turn or a transpose); then ``flip_x``
    mirrors left-right and ``flip_y`` top-bottom. Equivalently, the displayed picture is the
    coded one mirrored left-right if ``mirrored``, then turned ``rotation_deg`` (0, 90,
    180, 270) clockwise. ``IDENTITY`` changes nothing.
    """

    swap: bool = False
    flip_x: bool = False
    flip_y: bool = False
    rotation_deg: int = 0
    mirrored: bool = False

    def apply(self, a: np.ndarray) -> np.ndarray:
        """``a`` ((H, W, ...) array) as displayed, C-contiguous (``a`` itself if IDENTITY)."""
        if self == IDENTITY:
            return a
        if self.swap:
            a = a.swapaxes(0, 1)
        if self.flip_x:
            a = a[:, ::-1]
        if self.flip_y:
            a = a[::-1]
        return np.ascontiguousarray(a)


IDENTITY = Orientation()


def orientation_of(matrix) -> Orientation | None:
    """The ``Orientation`` of an FFmpeg display matrix, None if it is not one of the 8.

    ``matrix``: the 9 int32 of ``AV_FRAME_DATA_DISPLAYMATRIX`` (libavutil/display.h; the
    MP4/MOV ``tkhd`` matrix ``a b u c d v x y w``, a b c d x y in 16.16 and u v w in 2.30
    fixed point), or None (no matrix: ``IDENTITY``). display.h: a coded pixel (p, q)
    (column, row) is shown at p' = a*p + c*q + x, q' = b*p + d*q + y, so (a, b) is where
    the coded x axis goes and (c, d) the y axis. Each of the two is scaled to unit length
    (a scale changes the display size, never the orientation; it is not applied); if every
    entry is then within ``MATRIX_TOLERANCE`` of -1, 0 or 1, u = v = 0 and the two axes
    stay perpendicular, the matrix is that symmetry; otherwise (a turn by other than a
    quarter turn, a shear, a perspective) it is None: the caller keeps the coded picture
    and flags it. The translation (x, y) only places the picture and is ignored.
    """
    if matrix is None:
        return IDENTITY
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (9,):
        return None
    a, b, u, c, d, v = m[0] / 65536, m[1] / 65536, m[2], m[3] / 65536, m[4] / 65536, m[5]
    sx, sy = float(np.hypot(a, b)), float(np.hypot(c, d))
    if sx == 0 or sy == 0 or u != 0 or v != 0:
        return None
    unit = np.array([a / sx, b / sx, c / sy, d / sy])
    near = np.round(unit)
    if float(np.abs(unit - near).max()) > MATRIX_TOLERANCE:
        return None
    a, b, c, d = (int(x) for x in near)
    if a * d - b * c not in (1, -1) or (a != 0) == (b != 0):
        return None
    swap = a == 0
    flip_x = (c < 0) if swap else (a < 0)
    flip_y = (b < 0) if swap else (d < 0)
    mirrored = a * d - b * c < 0
    # rotation after an optional left-right mirror: R = M @ H (H = diag(-1, 1)), then the
    # clockwise angle of R in y-down pixel coordinates (x axis (1, 0) goes to (ra, rb)).
    ra, rb = (-a, -b) if mirrored else (a, b)
    rotation = {(1, 0): 0, (0, 1): 90, (-1, 0): 180, (0, -1): 270}[(ra, rb)]
    return Orientation(swap, flip_x, flip_y, rotation, mirrored)


def _display_matrix(frame):
    """The 9 int32 of ``frame``'s display matrix side data, or None if it has none."""
    try:
        from av.sidedata.sidedata import Type
        sd = frame.side_data.get(Type.DISPLAYMATRIX)
    except (ImportError, AttributeError):  # an old PyAV: only frame.rotation (no mirror)
        # frame.rotation: counter-clockwise degrees (av_display_rotation_get); the matrix
        # of the clockwise quarter turn it names (a, b = where the x axis goes)
        cw = (-round((getattr(frame, "rotation", 0) or 0) / 90.0) * 90) % 360
        a, b = {0: (1, 0), 90: (0, 1), 180: (-1, 0), 270: (0, -1)}[cw]
        return [a << 16, b << 16, 0, -b << 16, a << 16, 0, 0, 0, 1 << 30]
    if sd is None:
        return None
    return np.frombuffer(bytes(sd), dtype="<i4").tolist()


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


def check_video_file(path: str) -> None:
    """Raise ``RecordError`` ``read_failed`` when ``path`` cannot be stat'ed, ``empty_file``
    when it has 0 bytes; the first check of every pass over a video file."""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise RecordError(ErrorReason.READ_FAILED.value, f"{type(e).__name__}: {e}") from e
    if size == 0:
        raise RecordError(ErrorReason.EMPTY_FILE.value, f"{path} has 0 bytes")


def decode_video(path: str, spec: VideoSpec, *, max_packets: int = MAX_PACKETS,
                 budget_s: float = DECODE_BUDGET_S,
                 frame_budget_bytes: int | None = None,
                 start_s: float | None = None, end_s: float | None = None,
                 frame_sink: Any = None) -> VideoInfo:
    """Decode the local video file ``path`` and sample frames per ``spec`` (see module doc).

    ``start_s``/``end_s`` (seconds of presentation time, None: unbounded): a window
    [start_s, end_s), e.g. one clip's span. The file is sought to a key frame before
    ``start_s`` and only frames whose presentation time is in the window count: the
    sampling modes apply within it, and ``duration_s``, ``fps`` and ``frame_count`` are the
    window's. Raises ``ValueError`` for a negative ``start_s`` or ``end_s <= start_s``.

    Raises ``RecordError`` with reason ``empty_file``, ``read_failed``,
    ``corrupt_container``, ``no_video_stream`` (audio only, or only an attached picture),
    ``no_frames``, ``too_large`` (a frame over ``spec.max_frame_pixels`` pixels) or
    ``decode_timeout`` (over ``spec.max_decode_s`` seconds in all), ``too_large`` also
    when the sampled frames cannot fit in ``frame_budget_bytes`` (``_FrameStore``), and
    ``unsupported_format`` for a container that opens other files (``_Input``: an HLS
    playlist, an ffconcat list, ...) unless ``spec.allow_playlists``. ``max_packets`` and
    ``budget_s`` (seconds) bound each pass over the file (the result is then partial).
    ``frame_budget_bytes``: the most bytes the sampled RGB frames may hold at once (None:
    unbounded); frames are halved to fit, flagged ``frames_downscaled``.
    ``frame_sink``: gets every decoded frame of the window as well, in the same pass
    (``start(stream)`` with the PyAV video stream before the first frame, then
    ``feed(frame, t)`` per frame in presentation order, ``t`` in seconds; e.g.
    ``media.clip_encode.ClipEncoder``); its errors propagate, and its time counts
    towards ``spec.max_decode_s``.
    """
    check_video_file(path)
    _check_window(start_s, end_s)
    lo = -np.inf if start_s is None else start_s - WINDOW_EPS_S
    hi = np.inf if end_s is None else end_s - WINDOW_EPS_S

    cap = spec.max_frames
    limits = _Limits.of(spec)
    targets: list[float] | None = None
    pre_errors = 0
    if spec.sampling == "uniform":
        times, pre_errors = _packet_times(path, max_packets, budget_s, limits,
                                          spec.allow_playlists, start_s, end_s)
        if times:
            n = min(spec.num_frames, cap)
            targets = np.linspace(times[0], times[-1], n).tolist() if n > 1 else [times[0]]

    dec = _Decoder(path, max_packets, budget_s, limits, spec.allow_playlists, start_s)
    store = _FrameStore(frame_budget_bytes)
    try:
        codec = dec.stream.codec_context.name
        container = _container_name(dec.container, path)
        count = 0
        first_t = last_t = None
        last_end = 0.0
        coded = matrix = None  # the first frame's (width, height) and display matrix
        if frame_sink is not None:
            frame_sink.start(dec.stream)
        thinner = _Thinner(cap)
        # uniform: frame index -> its _Held frame, chosen per target
        chosen: dict[int, _Held] = {}
        all_uniform_fallback = _Thinner(min(spec.num_frames, cap))
        j = 0  # next target (fps / uniform)
        next_fps_t: float | None = None
        prev: tuple[int, float, Any] | None = None
        prev_gray = None
        for frame, t in dec.frames():
            if t < lo:
                continue
            if t >= hi:
                break  # frames come in presentation order: the rest is past the window
            idx = count
            count += 1
            if coded is None:
                coded, matrix, first_t = (frame.width, frame.height), _display_matrix(frame), t
                next_fps_t = t
            last_t = t
            last_end = t + _frame_duration_s(frame)
            if spec.sampling == "fps":
                if t >= next_fps_t:
                    thinner.offer(store.add, frame, t)
                    while next_fps_t <= t:  # all targets this frame covers
                        j += 1
                        next_fps_t = first_t + j / spec.fps
            elif spec.sampling == "uniform":
                if targets is None:
                    all_uniform_fallback.offer(store.add, frame, t)
                else:
                    while j < len(targets) and targets[j] <= t:
                        target = targets[j]
                        if prev is not None and target - prev[1] <= t - target:
                            if prev[0] not in chosen:
                                chosen[prev[0]] = store.add(prev[2], prev[1])
                        elif idx not in chosen:
                            chosen[idx] = store.add(frame, t)
                        j += 1
                    prev = (idx, t, frame)
            elif spec.sampling == "keyframes":
                if frame.key_frame:
                    thinner.offer(store.add, frame, t)
            else:  # scene
                gray = _scene_gray(frame)
                if prev_gray is None or (float(np.abs(gray - prev_gray).mean()) / 255.0
                                         > spec.scene_threshold):
                    thinner.offer(store.add, frame, t)
                prev_gray = gray
            if frame_sink is not None:  # last: the sink may retime the frame it holds
                frame_sink.feed(frame, t)
        if (spec.sampling == "uniform" and targets is not None and j < len(targets)
                and prev is not None and prev[0] not in chosen):  # targets after the last frame
            chosen[prev[0]] = store.add(prev[2], prev[1])
        prev = None
        errors = dec.errors + pre_errors
    finally:
        dec.close()

    if count == 0:
        window = "" if start_s is None and end_s is None else f" in [{start_s}, {end_s}) s"
        raise RecordError(ErrorReason.NO_FRAMES.value,
                          f"no decodable video frame{window} ({errors} packets failed)")
    if spec.sampling == "uniform":
        if targets is None:  # no packet pts: evenly spaced among decoded frames
            picked = all_uniform_fallback.result()
        else:
            picked = [chosen[i] for i in sorted(chosen)]
    else:
        picked = thinner.result()
    picked.sort(key=lambda h: h.t)

    flags: list[str] = []
    orientation = orientation_of(matrix)
    if orientation is None:  # not a symmetry of the rectangle: coded pixels, flagged
        flags.append(FLAG_MATRIX_UNSUPPORTED)
        orientation = IDENTITY
    elif orientation.mirrored:
        flags.append(FLAG_MIRRORED)
    if store.shift:
        flags.append(FLAG_DOWNSCALED)
    frames = []
    for held in picked:  # each frame's buffer is released as its upright copy is made
        frames.append(orientation.apply(held.array))
        held.array = None
    w, h = coded
    if orientation.swap:
        w, h = h, w
    duration = max(0.0, last_end - first_t)
    if duration == 0.0 and count > 1:
        duration = last_t - first_t
    return VideoInfo(
        duration_s=round(duration, 6), fps=round(count / duration, 6) if duration > 0 else 0.0,
        frame_count=count, width=w, height=h, rotation_deg=orientation.rotation_deg,
        codec=codec, container=container, mime=_MIMES.get(container, f"video/{container}"),
        timestamps_s=[held.t for held in picked], frames=frames,
        partial=errors > 0, decode_errors=errors, flags=tuple(flags))


def _check_window(start_s: float | None, end_s: float | None) -> None:
    """Raise ``ValueError`` naming ``start_s``/``end_s`` unless they make a window."""
    if start_s is not None and not start_s >= 0:
        raise ValueError(f"start_s must be >= 0 seconds, got {start_s}")
    if end_s is not None and start_s is not None and not end_s > start_s:
        raise ValueError(f"end_s ({end_s}) must be greater than start_s ({start_s})")
    if end_s is not None and not end_s > 0:
        raise ValueError(f"end_s must be > 0 seconds, got {end_s}")


#: A video's near hash: the pHash of a 2 x 2 mosaic of this many sampled frames, each
#: resized to a ``MOSAIC_TILE_PX`` square.
MOSAIC_FRAMES = 4
MOSAIC_TILE_PX = 64


def near_hash(frames: list[np.ndarray]) -> tuple[int, bool]:
    """A video's near-duplicate hash and its ``low_detail`` flag, from several frames.

    ``frames``: the sampled (H, W, 3) uint8 frames in time order (at least one). One
    frame: its own ``phash64`` (as an image's). More: ``MOSAIC_FRAMES`` frames at evenly
    spaced indices over the whole sample (first and last included; repeats when fewer
    are sampled), each resized to ``MOSAIC_TILE_PX`` x ``MOSAIC_TILE_PX`` (Pillow box
    filter), tiled in time order left to right, top to bottom into a 2 x 2 mosaic, and the
    ``phash64`` of that mosaic: its low-frequency DCT sees the layout of every tile, so two
    videos that share one frame (a black title card in the middle) but not the others do
    not hash alike, while a re-encode of the same video (the same frames at the same
    times) does. ``low_detail`` (``media.transform.low_detail``): every tiled frame is
    flat (solid colour or plain gradient): the hash says nothing and near dedup skips the
    row. Raises ``ValueError`` on an empty list.
    """
    if not frames:
        raise ValueError("near_hash needs at least one frame")
    if len(frames) == 1:
        return phash64(frames[0]), low_detail(frames[0])
    idx = np.round(np.linspace(0, len(frames) - 1, MOSAIC_FRAMES)).astype(int)
    side = MOSAIC_TILE_PX
    tiles = [np.asarray(Image.fromarray(frames[i]).resize((side, side), Image.Resampling.BOX))
             for i in idx]
    mosaic = np.concatenate([np.concatenate(tiles[r * 2:r * 2 + 2], axis=1)
                             for r in range(2)], axis=0)
    return phash64(mosaic), all(low_detail(t) for t in tiles)


def decoded_frames_bytes(path: str, spec: VideoSpec, budget: int | None = None) -> int:
    """Bytes of the RGB frames ``decode_video`` would keep for ``path``, estimated from
    the stream header: coded width * height * 3 times the frames sampled at most
    (``uniform``: min(num_frames, max_frames); other modes: max_frames), and at most
    ``budget`` (bytes; ``decode_video``'s ``frame_budget_bytes``, which the frames never
    pass). 0 when the header cannot be read or the size is over ``max_frame_pixels`` (the
    row then fails before decoding). Never raises."""
    try:
        opened = _open(path, spec.allow_playlists)
        try:
            streams = [s for s in opened.container.streams.video
                       if not _is_attached_picture(s)]
            if not streams:
                return 0
            pixels = int(streams[0].codec_context.width or 0) * int(
                streams[0].codec_context.height or 0)
        finally:
            opened.close()
    except Exception:  # noqa: BLE001 - an estimate: decode_video reports the real error
        return 0
    if pixels > spec.max_frame_pixels:
        return 0
    n = min(spec.num_frames, spec.max_frames) if spec.sampling == "uniform" else spec.max_frames
    return pixels * 3 * n if budget is None else min(pixels * 3 * n, budget)


def file_sha256(path: str) -> str:
    """Hex sha256 of the file at ``path``, streamed."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def still_image(path: str) -> bool:
    """Whether the local file ``path`` is a still image, not a video: its first 4 KiB sniff
    as a raster image (``imageio_util.still_image_format``; a video job that lists image
    extensions decodes it as one frame, ``steps.video``). Raises ``OSError``."""
    with open(path, "rb") as f:
        head = f.read(4096)
    return still_image_format(head, os.path.splitext(path)[1]) is not None
