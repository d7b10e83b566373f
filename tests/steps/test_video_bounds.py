"""Per-video bounds (issue 12): a frame-size limit and a decode-time limit.

The reproduction: a tiny (tens of KB) 4096x4096 MP4 of a solid colour took 4.7 GiB to
decode. It is made here with PyAV; with the default ``video.max_frame_pixels`` it is a
``too_large`` error row naming the limit, refused from the stream header before any frame
is decoded (a child process's peak RSS shows no frame was held).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.columns import ERROR, ERROR_REASON, STATUS
from pipeline.errors import RecordError
from pipeline.spec import VideoSpec
from pipeline.steps.video import VideoDecodeStep
from pipeline.media.video import decode_video, decoded_frames_bytes

VIDEOS = Path(__file__).resolve().parents[2] / "data" / "videos"
SIDE = 4096


def solid_video(path: Path, side: int = SIDE, frames: int = 12) -> Path:
    """An MP4 of ``frames`` solid-colour ``side`` x ``side`` frames (libx264, else mpeg4)."""
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=10)
        s.width = s.height = side
        s.pix_fmt = "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.full((side, side, 3), (30, 120, 200), np.uint8),
                                           format="rgb24")
        for _ in range(frames):
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


@pytest.fixture(scope="module")
def huge_video(tmp_path_factory) -> Path:
    return solid_video(tmp_path_factory.mktemp("video") / "huge.mp4")


def test_huge_frames_are_a_too_large_row_naming_the_limit(huge_video):
    assert huge_video.stat().st_size < 600_000
    batch = {STATUS: ["ok", "ok"], ERROR: [None, None],
             "_source_path": [str(huge_video), str(VIDEOS / "chaplin.mp4")]}
    batch = VideoDecodeStep(VideoSpec())(batch)
    assert batch[STATUS] == ["error", "ok"]
    assert batch[ERROR_REASON][0] == "too_large"
    assert "4096x4096" in batch[ERROR][0] and "video.max_frame_pixels=8847360" in batch[ERROR][0]
    assert batch["_frames"][0] is None


def test_huge_video_is_refused_before_its_frames_are_decoded(huge_video):
    """In a fresh process: the refusal costs no frame memory (12 RGB frames of 4096x4096
    are 600 MB; the refusal stays within the interpreter's own footprint)."""
    code = ("import resource, sys\n"
            "from pipeline.errors import RecordError\n"
            "from pipeline.spec import VideoSpec\n"
            "from pipeline.steps.video import decode_video\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "try:\n"
            "    decode_video(sys.argv[1], VideoSpec(sampling='fps', fps=100))\n"
            "except RecordError as e:\n"
            "    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base\n"
            "    print(getattr(e.reason, 'value', e.reason), grown)\n")
    out = subprocess.run([sys.executable, "-c", code, str(huge_video)], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    reason, grown_kib = out.stdout.split()
    assert reason == "too_large", out.stderr
    assert int(grown_kib) < 100 * 1024          # KiB: far below one 4096x4096 frame set


def test_a_limit_above_the_frame_size_decodes_it(tmp_path):
    small = solid_video(tmp_path / "small.mp4", side=256, frames=3)
    with pytest.raises(RecordError, match=r"256x256 \(65536 pixels\) exceeds"):
        decode_video(str(small), VideoSpec(max_frame_pixels=256 * 255))
    info = decode_video(str(small), VideoSpec(max_frame_pixels=256 * 256))
    assert (info.width, info.height, info.frame_count) == (256, 256, 3)
    assert decoded_frames_bytes(str(small), VideoSpec(num_frames=2)) == 256 * 256 * 3 * 2


def test_decode_time_limit_is_a_decode_timeout_row():
    for sampling in ("uniform", "fps"):
        with pytest.raises(RecordError) as e:
            decode_video(str(VIDEOS / "chaplin.mp4"), VideoSpec(sampling=sampling,
                                                              max_decode_s=1e-6))
        assert e.value.reason == "decode_timeout"
        assert "video.max_decode_s=1e-06 s" in e.value.message
