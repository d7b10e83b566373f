"""One clip of a video written as its own MP4 file (H.264 through PyAV/FFmpeg).

Pure codec from a local file path to a local file path: no batches, no output store (the
clip datasink uploads the file). The source is opened the confined way
(``media.video.open_video``). Re-encoding (``libx264``) decodes the span, turns each
frame upright by its display matrix as ``decode_video`` does (frames as a player shows
them), optionally downscales and resamples the frame rate, and encodes yuv420p. ``copy``
remuxes the packets without decoding: from the key frame at or before the span's start.
``ClipEncoder`` is the re-encoder fed frame by frame, so a caller that decodes the span
anyway (``VideoDecodeStep`` sampling a clip's frames) encodes it in the same pass.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from fractions import Fraction

from pipeline.errors import RecordError
from pipeline.media.clips import ClipSpan
from pipeline.media.video import (
    IDENTITY,
    WINDOW_EPS_S,
    _Decoder,
    _display_matrix,
    _Limits,
    av_module,
    open_video,
    orientation_of,
    seek_before,
    video_stream,
)
from pipeline.records import ErrorReason
from pipeline.spec import VideoSpec

CODECS = ("libx264", "copy")
OUT_TIME_BASE = Fraction(1, 90_000)  # of the re-encoded stream when the frame rate is kept

#: Held around every libx264 call of this process (open on the first frame, encode, flush,
#: close), so a step's row threads encode one frame at a time. It makes the bytes of a clip
#: likelier, not certain, to repeat: with another thread encoding, 35 of 81 encodes of one
#: 4 s span differed without it and 15 of 15 were equal with it, but with the lock and any
#: other busy thread in the process (even a numpy matmul) 1-18 of 120 encodes with the
#: same input frames (threads=1) still differed, in the last 3 bytes of a slice (measured
#: on PyAV's bundled libx264). Clip files are therefore not compared by bytes across runs;
#: the frames fed to libx264 are deterministic.
_X264_LOCK = threading.RLock()


@dataclasses.dataclass(frozen=True)
class ClipFile:
    """A written clip, measured from the file itself: ``duration_s`` (seconds from the
    first frame's pts to the end of the last), ``frames`` (video packets), ``width`` x
    ``height`` (displayed pixels: after the display matrix a ``copy`` keeps; ``libx264``
    clips are coded upright), ``bytes`` (file size), ``codec`` (``libx264`` or
    ``copy``)."""

    duration_s: float
    frames: int
    width: int
    height: int
    bytes: int
    codec: str


def _check_args(span: ClipSpan, codec: str, crf: int, bitrate: int | None,
                max_size_px: int | None, fps: float | None, threads: int) -> None:
    """Raise ``ValueError`` naming the first argument out of range."""
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    if not span.end_s > span.start_s >= 0:
        raise ValueError(f"span must have 0 <= start_s < end_s, got [{span.start_s}, "
                         f"{span.end_s})")
    if not 0 <= crf <= 51:
        raise ValueError(f"crf must be in [0, 51], got {crf}")
    if bitrate is not None and bitrate <= 0:
        raise ValueError(f"bitrate must be > 0 bits/s, got {bitrate}")
    if max_size_px is not None and max_size_px < 2:
        raise ValueError(f"max_size_px must be >= 2 pixels, got {max_size_px}")
    if fps is not None and not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    if threads < 0:
        raise ValueError(f"threads must be >= 0 (0: FFmpeg's choice), got {threads}")


def output_size(width: int, height: int, max_size_px: int | None) -> tuple[int, int]:
    """(width, height) in pixels: the longest side at most ``max_size_px`` (aspect ratio
    kept), both rounded down to even numbers (yuv420p), at least 2."""
    scale = 1.0 if max_size_px is None else min(1.0, max_size_px / max(width, height))
    return (max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2))


def encode_clip(path: str, span: ClipSpan, out_path: str, *, codec: str = "libx264",
                crf: int = 23, bitrate: int | None = None, max_size_px: int | None = None,
                fps: float | None = None, threads: int = 0,
                allow_playlists: bool = False) -> ClipFile:
    """Write ``span`` of the video file ``path`` to the MP4 file ``out_path``.

    ``libx264``: frames with presentation time in [span.start_s, span.end_s), upright,
    scaled so the longest side is at most ``max_size_px`` (even sides), at ``fps`` frames
    per second (each output time shows the latest source frame at or before it; None:
    the source's own times), yuv420p, quality ``crf`` (0-51) or ``bitrate`` (bits/s, then
    crf is unused), ``threads`` encoder threads (0: FFmpeg's choice). ``copy``: the
    packets from the key frame at or before ``span.start_s`` up to ``span.end_s``
    (packets decoded before the end, so a stream with B-frames may run a few reordered
    frames past it), unchanged; ``max_size_px``, ``fps``, ``crf``, ``bitrate`` do not
    apply. Returns the ``ClipFile`` measured from ``out_path``. Raises ``ValueError``
    naming a bad argument and ``RecordError`` (``libx264``: ``out_path`` removed) (``corrupt_container``,
    ``no_video_stream``, ``no_frames``: nothing in the span, ``unsupported_format``: a
    playlist, or ``copy`` of a codec MP4 cannot hold, e.g. VP8).
    """
    _check_args(span, codec, crf, bitrate, max_size_px, fps, threads)
    if codec == "copy":
        opened = open_video(path, allow_playlists)
        try:
            stream = video_stream(opened.container, path)
            seek_before(opened.container, stream, span.start_s)
            n = _remux(opened.container, stream, span, out_path)
        finally:
            opened.close()
        if n == 0:
            if os.path.exists(out_path):
                os.remove(out_path)
            raise _no_frames(span, path)
        return probe_clip(out_path, codec)
    encoder = ClipEncoder(out_path, span, crf=crf, bitrate=bitrate, max_size_px=max_size_px,
                          fps=fps, threads=threads)
    limits = _Limits.of(VideoSpec())
    lo, hi = span.start_s - WINDOW_EPS_S, span.end_s - WINDOW_EPS_S
    try:
        dec = _Decoder(path, 10_000_000, limits.max_decode_s, limits, allow_playlists,
                       span.start_s)
        try:
            encoder.start(dec.stream)
            for frame, t in dec.frames():
                if t < lo:
                    continue
                if t >= hi:
                    break
                encoder.feed(frame, t)
        finally:
            dec.close()
        return encoder.finish()
    except BaseException:
        encoder.discard()
        raise


def _no_frames(span: ClipSpan, source: str = "the source") -> RecordError:
    return RecordError(ErrorReason.NO_FRAMES.value,
                       f"no frame of {source} in [{span.start_s}, {span.end_s}) s")


@dataclasses.dataclass(frozen=True)
class _Encoding:
    crf: int
    bitrate: int | None
    max_size_px: int | None
    fps: float | None
    threads: int


def _clip_packets(packets, tb, start_s: float, end_s: float):
    """The packets of a copied clip in decode order: from the last key frame whose pts
    is at or before ``start_s`` (the first key frame after it if there is none) until
    the first packet decoded (dts) at or after ``end_s``."""
    lo, hi = start_s + WINDOW_EPS_S, end_s - WINDOW_EPS_S
    gop: list = []  # the key frame at or before the start and the packets after it
    started = False
    for p in packets:
        if p.dts is None and p.pts is None:
            continue  # the demuxer's flush packet
        dts_s = float((p.dts if p.dts is not None else p.pts) * tb)
        if dts_s >= hi:
            break
        if started:
            yield p
            continue
        pts_s = float((p.pts if p.pts is not None else p.dts) * tb)
        if p.is_keyframe and pts_s <= lo:
            gop = [p]
        elif gop and dts_s <= lo:
            gop.append(p)
        elif gop or p.is_keyframe:
            started = True
            yield from gop
            yield p
    if not started:
        yield from gop


def _remux(container, stream, span: ClipSpan, out_path: str) -> int:
    """Copy the packets of ``_clip_packets`` to ``out_path``, timestamps shifted so the
    first packet is decoded at 0; returns the number of packets written."""
    written, offset = 0, None
    with av_module().open(out_path, "w", format="mp4") as out:
        try:
            ostream = out.add_stream_from_template(stream)
        except ValueError as e:  # e.g. VP8: MP4 has no mapping for it
            raise RecordError(ErrorReason.UNSUPPORTED_FORMAT.value,
                              f"codec=copy: {e}; codec=libx264 re-encodes it") from e
        for packet in _clip_packets(container.demux(stream), stream.time_base,
                                    span.start_s, span.end_s):
            if offset is None:
                offset = packet.pts if packet.pts is not None else packet.dts
            if packet.pts is not None:
                packet.pts -= offset
            if packet.dts is not None:
                packet.dts -= offset
            packet.stream = ostream
            out.mux(packet)
            written += 1
    return written


class ClipEncoder:
    """Decoded frames of one span, pushed in presentation order -> an H.264 MP4 at
    ``out_path``: upright (the first frame's display matrix), longest side at most
    ``max_size_px`` (even sides), at ``fps`` frames per second (each output time shows the
    latest frame at or before it; None: the frames' own times), yuv420p, quality ``crf``
    or ``bitrate`` (bits/s), ``threads`` encoder threads (0: FFmpeg's choice).

    The caller decodes (``encode_clip``, or ``decode_video``'s ``frame_sink``: one decode
    pass that also samples the frames): ``start(stream)`` with the source video stream
    (its frame rate is the output's when ``fps`` is None), ``feed(frame, t)`` for each
    frame whose time ``t`` (seconds) is in the span, then ``finish()`` for the
    ``ClipFile``, or ``discard()`` on an error. Each frame is held until the next one
    arrives, so it is written with its duration (the gap to the next frame; the last one
    lasts until ``span.end_s``). Raises ``ValueError`` naming a bad argument.
    """

    def __init__(self, out_path: str, span: ClipSpan, *, crf: int = 23,
                 bitrate: int | None = None, max_size_px: int | None = None,
                 fps: float | None = None, threads: int = 0):
        _check_args(span, "libx264", crf, bitrate, max_size_px, fps, threads)
        self.out_path, self.span = out_path, span
        self.enc = _Encoding(crf, bitrate, max_size_px, fps, threads)
        self.source = None
        self.out = self.stream = None
        self.orientation = IDENTITY
        self.size = (0, 0)
        self.tb = OUT_TIME_BASE
        self.pending = None  # (converted frame, pts) not yet written
        self.last_pts = -1
        self.written = 0
        self.held = None     # fps: [the latest source frame, its converted copy or None]
        self.k = 0           # fps: the next output frame

    def start(self, stream) -> None:
        """Take the source video ``stream`` (PyAV), before the first ``feed``."""
        self.source = stream

    def feed(self, frame, t: float) -> None:
        """Encode the decoded ``frame`` (PyAV ``VideoFrame``) shown at ``t`` seconds, in
        [span.start_s, span.end_s), after the frames fed before it."""
        if self.stream is None:
            self._open(frame)
        if self.enc.fps is None:
            self._put(self._convert(frame), t)
            return
        self._repeat_held(t - WINDOW_EPS_S)
        self.held = [frame, None]

    def finish(self) -> ClipFile:
        """Flush and close the file; the ``ClipFile`` measured from it. Raises
        ``RecordError`` (``no_frames``, the file removed) when no frame was fed."""
        try:
            self._repeat_held(self.span.end_s - WINDOW_EPS_S)
            self._finish()
        finally:
            self._close()
        if self.written == 0:
            self.discard()
            raise _no_frames(self.span)
        return probe_clip(self.out_path, "libx264")

    def discard(self) -> None:
        """Close and remove the file (an error while decoding or encoding)."""
        self._close()
        if os.path.exists(self.out_path):
            os.remove(self.out_path)

    def _close(self) -> None:
        if self.out is not None:
            with _X264_LOCK:
                self.out.close()
            self.out = None

    def _repeat_held(self, until: float) -> None:
        """fps: write the held frame at every output time before ``until`` seconds."""
        while self.held is not None and self._target(self.k) < until:
            if self.held[1] is None:
                self.held[1] = self._convert(self.held[0])
            self._put(self.held[1], self._target(self.k))
            self.k += 1

    def _target(self, k: int) -> float:
        return self.span.start_s + k / self.enc.fps

    def _open(self, frame) -> None:
        av = av_module()
        self.orientation = orientation_of(_display_matrix(frame)) or IDENTITY
        w, h = frame.width, frame.height
        if self.orientation.swap:
            w, h = h, w
        self.size = output_size(w, h, self.enc.max_size_px)
        if self.enc.fps is not None:
            rate = Fraction(self.enc.fps).limit_denominator(1001)
            tb = 1 / rate
        else:
            rate = self.source.average_rate or self.source.guessed_rate or Fraction(25)
            tb = OUT_TIME_BASE
        self.out = av.open(self.out_path, "w", format="mp4",
                           options={"movflags": "+faststart"})
        s = self.out.add_stream("libx264", rate=rate)
        s.width, s.height = self.size
        s.pix_fmt = "yuv420p"
        s.time_base = s.codec_context.time_base = tb
        self.tb = tb  # the muxer may change s.time_base once it writes the header
        s.codec_context.thread_count = self.enc.threads
        if self.enc.bitrate is not None:
            s.bit_rate = self.enc.bitrate
        else:
            s.options = {"crf": str(self.enc.crf)}
        self.stream = s

    def _convert(self, frame):
        """``frame`` upright at the output size, as a new VideoFrame (no pts yet)."""
        av = av_module()
        w, h = self.size
        if self.orientation == IDENTITY:
            return frame.reformat(width=w, height=h, format="yuv420p", interpolation="AREA")
        cw, ch = (h, w) if self.orientation.swap else (w, h)
        rgb = frame.reformat(width=cw, height=ch, format="rgb24", interpolation="AREA")
        return av.VideoFrame.from_ndarray(self.orientation.apply(rgb.to_ndarray()),
                                          format="rgb24")

    def _put(self, frame, t: float) -> None:
        """Queue ``frame`` shown at ``t`` seconds; write the one queued before it."""
        tb = self.tb
        pts = max(self.last_pts + 1, round((t - self.span.start_s) / tb))
        if self.pending is not None:
            self._write(pts - self.pending[1])
        self.pending = (frame, pts)
        self.last_pts = pts

    def _write(self, duration: int) -> None:
        frame, pts = self.pending
        if frame.pts is not None and frame.pts != pts:
            frame = frame.reformat()  # a repeated frame: a copy for its own pts
        frame.pts, frame.time_base, frame.duration = pts, self.tb, duration
        with _X264_LOCK:
            for packet in self.stream.encode(frame):
                self.out.mux(packet)
        self.written += 1

    def _finish(self) -> None:
        if self.pending is None:
            return
        tb = self.tb
        end = round((self.span.end_s - self.span.start_s) / tb)
        self._write(max(1, end - self.pending[1]))
        with _X264_LOCK:
            for packet in self.stream.encode(None):
                self.out.mux(packet)


def probe_clip(path: str, codec: str) -> ClipFile:
    """The ``ClipFile`` of the MP4 at ``path`` from a demux-only pass and its first
    decoded frame (its display matrix; ``codec`` is recorded as given). Raises
    ``RecordError`` as ``media.video.open_video``."""
    opened = open_video(path)
    try:
        stream = video_stream(opened.container, path)
        tb = stream.time_base
        spans = sorted((p.pts, p.duration or 0) for p in opened.container.demux(stream)
                       if p.pts is not None and p.size > 0)
        width, height = stream.codec_context.width, stream.codec_context.height
        opened.container.seek(0)
        first = next(opened.container.decode(stream), None)
        if first is not None and (orientation_of(_display_matrix(first)) or IDENTITY).swap:
            width, height = height, width
    finally:
        opened.close()
    duration = float((spans[-1][0] + spans[-1][1] - spans[0][0]) * tb) if spans else 0.0
    return ClipFile(round(duration, 6), len(spans), int(width), int(height),
                    os.path.getsize(path), codec)
