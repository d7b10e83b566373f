"""A re-encoded copy of part of a real video, and a frame of one saved as a still image:
the test inputs of frame-level and cross-modal dedup."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av


def reencode_span(src: Path, dst: Path, start_s: float, end_s: float, width: int,
                  height: int, bitrate: int) -> Path:
    """Write the frames of ``src`` whose presentation time is in [start_s, end_s) to
    ``dst`` (H.264 MP4, PyAV) at ``width`` x ``height`` pixels and ``bitrate`` bits/s,
    at the source's frame rate, its time starting at 0; returns ``dst``."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream_in = inp.streams.video[0]
        rate = Fraction(stream_in.average_rate).limit_denominator(1001)
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.bit_rate = bitrate
        n = 0
        for frame in inp.decode(stream_in):
            if not start_s <= frame.time < end_s:
                continue
            img = frame.reformat(width=width, height=height, format="yuv420p")
            img.pts, img.time_base = n, 1 / rate
            out.mux(stream.encode(img))
            n += 1
        out.mux(stream.encode())
    return dst


def save_frame(src: Path, at_s: float, dst: Path, width: int | None = None,
               quality: int = 90) -> Path:
    """Save the frame of ``src`` shown at ``at_s`` seconds (the first decoded frame whose
    presentation time is >= ``at_s``, as ``fps`` sampling picks it) to ``dst`` as a JPEG
    (``quality``), resized to ``width`` pixels wide (aspect kept) when given; returns
    ``dst``. Raises ``ValueError`` when ``src`` ends before ``at_s``."""
    with av.open(str(src)) as inp:
        for frame in inp.decode(video=0):
            if frame.time is not None and frame.time >= at_s:
                img = frame.to_image()
                break
        else:
            raise ValueError(f"{src} has no frame at or after {at_s} s")
    if width is not None:
        img = img.resize((width, round(img.height * width / img.width)))
    img.save(dst, format="JPEG", quality=quality)
    return dst
