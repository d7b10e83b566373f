"""Clip files (``media.clip_encode.encode_clip``) and window decode
(``decode_video(start_s=, end_s=)``): each clip decodes with PyAV to its span's duration
(within one frame) at the stated size, upright; ``copy`` starts at a key frame; a window
decodes only the frames of its span."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import RecordError
from pipeline.media.clip_encode import encode_clip, output_size
from pipeline.media.clips import ClipSpan, detect_spans
from pipeline.media.video import decode_video
from pipeline.spec import VideoSpec
from pipeline.testing.cut_videos import CutVideo, make_cut_video

REAL = Path("/work/shared/data/videos")
ALL = VideoSpec(sampling="fps", fps=1000, max_frames=100_000)  # every frame


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, CutVideo]:
    d = tmp_path_factory.mktemp("clipsrc")
    return {"fps30": make_cut_video(d / "fps30.mp4", fps=30, seed=20),
            "vfr": make_cut_video(d / "vfr.mp4", fps=25, vfr=True, seed=40),
            "rotated": make_cut_video(d / "rotated.mp4", fps=25, rotate_90=True, seed=50),
            "10bit": make_cut_video(d / "10bit.mp4", fps=30, ten_bit=True, seed=60)}


def shot(video: CutVideo, i: int) -> ClipSpan:
    """Shot ``i`` between the ground-truth cuts (hard cuts only)."""
    bounds = [0, *video.cut_frames, video.frames]
    a, b = bounds[i], bounds[i + 1]
    end = video.times_s[b] if b < video.frames else video.end_s
    return ClipSpan(i, video.times_s[a], end, a, b)


@pytest.mark.parametrize("name", ["fps30", "vfr", "10bit"])
def test_libx264_clip_decodes_to_the_span(videos, tmp_path, name):
    video = videos[name]
    span = shot(video, 2)
    out = tmp_path / "clip.mp4"
    clip = encode_clip(video.path, span, str(out))
    info = decode_video(str(out), ALL)
    frame = max(np.diff(video.times_s))
    assert info.frame_count == clip.frames == span.end_frame - span.start_frame
    assert abs(info.duration_s - span.duration_s) <= frame + 1e-6
    assert abs(clip.duration_s - span.duration_s) <= frame + 1e-6
    assert (info.width, info.height) == (clip.width, clip.height) == (160, 96)
    assert clip.codec == "libx264" and info.codec == "h264" and clip.bytes == out.stat().st_size
    # the clip's frames are the span's: its first frame is the source's frame at start_s
    src = decode_video(video.path, ALL, start_s=span.start_s, end_s=span.end_s)
    assert np.abs(info.frames[0].astype(int) - src.frames[0]).mean() < 6


def test_downscale_and_fps_resample(videos, tmp_path):
    video = videos["fps30"]
    span = shot(video, 0)  # 2.0 s
    out = tmp_path / "small.mp4"
    clip = encode_clip(video.path, span, str(out), max_size_px=101, fps=10, crf=30, threads=1)
    info = decode_video(str(out), ALL)
    assert (clip.width, clip.height) == (info.width, info.height) == (100, 60)
    assert clip.frames == info.frame_count == math.ceil(span.duration_s * 10) == 20
    assert abs(info.duration_s - span.duration_s) <= 0.1 + 1e-6
    assert info.timestamps_s[:3] == pytest.approx([0.0, 0.1, 0.2])
    assert output_size(1280, 720, 101) == (100, 56) and output_size(641, 361, None) == (640, 360)
    rate = encode_clip(video.path, span, str(tmp_path / "br.mp4"), bitrate=200_000)
    assert rate.frames == 60


def test_rotated_video_clips_are_upright(videos, tmp_path):
    video = videos["rotated"]  # coded 160x96, displayed 96x160
    span = shot(video, 1)
    out = tmp_path / "rot.mp4"
    clip = encode_clip(video.path, span, str(out), max_size_px=80)
    assert (clip.width, clip.height) == (48, 80)
    info = decode_video(str(out), ALL)
    assert (info.width, info.height, info.rotation_deg) == (48, 80, 0)
    src = decode_video(video.path, ALL, start_s=span.start_s, end_s=span.end_s)
    assert (src.width, src.height, src.rotation_deg) == (96, 160, 90)
    small = src.frames[0][::2, ::2].astype(int)
    assert np.abs(info.frames[0].astype(int) - small).mean() < 12
    assert np.abs(info.frames[0].astype(int) - small[::-1, ::-1]).mean() > 20
    copied = encode_clip(video.path, span, str(tmp_path / "rotcopy.mp4"), codec="copy")
    kept = decode_video(str(tmp_path / "rotcopy.mp4"), ALL)  # the display matrix is kept
    assert (copied.width, copied.height) == (kept.width, kept.height) == (96, 160)
    assert kept.rotation_deg == 90


def test_copy_starts_at_the_key_frame_and_keeps_the_packets(videos, tmp_path):
    video = videos["fps30"]
    out = tmp_path / "copy.mp4"
    span = shot(video, 0)  # starts on the first key frame
    clip = encode_clip(video.path, span, str(out), codec="copy")
    info = decode_video(str(out), ALL)
    n = span.end_frame - span.start_frame
    assert clip.codec == "copy" and (clip.width, clip.height) == (160, 96)
    # packets decoded before the end: with B-frames, a reference frame shown after it
    assert n <= info.frame_count == clip.frames <= n + 3
    assert span.duration_s - 1e-6 <= info.duration_s <= span.duration_s + 4 / 30 + 1e-6
    assert info.timestamps_s[0] == 0.0
    mid = ClipSpan(0, span.start_s + 1.0, span.end_s, span.start_frame + 30, span.end_frame)
    late = encode_clip(video.path, mid, str(tmp_path / "mid.mp4"), codec="copy")
    assert late.frames >= 30 and late.duration_s >= mid.duration_s


@pytest.mark.skipif(not REAL.is_dir(), reason="needs /work/shared/data/videos")
def test_real_videos_clip_in_both_codecs(tmp_path):
    path = str(REAL / "nasa_13013.mp4")
    spans = detect_spans(path, method="scenes")
    assert len(spans) >= 1
    for codec in ("libx264", "copy"):
        clip = encode_clip(path, spans[-1], str(tmp_path / f"{codec}.mp4"), codec=codec)
        info = decode_video(str(tmp_path / f"{codec}.mp4"), ALL)
        assert info.frame_count == clip.frames >= spans[-1].end_frame - spans[-1].start_frame
        assert info.duration_s >= spans[-1].duration_s - 1 / 29.97
    with pytest.raises(RecordError) as e:  # VP8 has no MP4 mapping: re-encode it instead
        encode_clip(str(REAL / "big_buck_bunny_432_433.webm"), ClipSpan(0, 0.0, 0.5, 0, 12),
                    str(tmp_path / "vp8.mp4"), codec="copy")
    assert e.value.reason == "unsupported_format" and "codec=libx264" in str(e.value)


def test_bad_arguments_and_empty_spans(videos, tmp_path):
    path, out = videos["fps30"].path, str(tmp_path / "x.mp4")
    with pytest.raises(ValueError, match="codec must be one of"):
        encode_clip(path, shot(videos["fps30"], 0), out, codec="h265")
    with pytest.raises(ValueError, match=r"crf must be in \[0, 51\], got 60"):
        encode_clip(path, shot(videos["fps30"], 0), out, crf=60)
    with pytest.raises(ValueError, match="start_s < end_s"):
        encode_clip(path, ClipSpan(0, 2.0, 1.0, 60, 30), out)
    with pytest.raises(RecordError) as e:
        encode_clip(path, ClipSpan(0, 100.0, 101.0, 0, 1), out)
    assert e.value.reason == "no_frames" and not Path(out).exists()


@pytest.mark.parametrize("name", ["fps30", "vfr"])
def test_window_decode_keeps_only_the_span(videos, name):
    video = videos[name]
    span = shot(video, 3)
    info = decode_video(video.path, ALL, start_s=span.start_s, end_s=span.end_s)
    assert info.frame_count == span.end_frame - span.start_frame
    assert info.timestamps_s == pytest.approx(list(video.times_s[span.start_frame:span.end_frame]))
    assert abs(info.duration_s - span.duration_s) <= max(np.diff(video.times_s)) + 1e-6
    uniform = decode_video(video.path, VideoSpec(num_frames=3), start_s=span.start_s,
                           end_s=span.end_s)
    assert uniform.timestamps_s[0] == pytest.approx(span.start_s)
    assert uniform.timestamps_s[-1] == pytest.approx(video.times_s[span.end_frame - 1])
    assert len(uniform.frames) == 3 and uniform.frame_count == info.frame_count
    fps = decode_video(video.path, VideoSpec(sampling="fps", fps=2), start_s=span.start_s,
                       end_s=span.end_s)
    assert all(span.start_s - 1e-6 <= t < span.end_s for t in fps.timestamps_s)
    assert len(fps.frames) == math.ceil(span.duration_s * 2 - 1e-6)


@pytest.mark.skipif(not REAL.is_dir(), reason="needs /work/shared/data/videos")
@pytest.mark.parametrize("name", ["chaplin.mp4", "big_buck_bunny_432_433.webm"])
def test_window_decode_of_real_videos_matches_the_whole_decode(name):
    path = str(REAL / name)
    whole = decode_video(path, ALL)
    t = whole.timestamps_s
    lo, hi = t[len(t) // 3], t[2 * len(t) // 3]
    part = decode_video(path, ALL, start_s=lo, end_s=hi)
    assert part.timestamps_s == [x for x in t if lo <= x < hi]
    assert part.frame_count == len(part.timestamps_s) == 2 * len(t) // 3 - len(t) // 3
    assert np.array_equal(part.frames[0], whole.frames[len(t) // 3])
    with pytest.raises(ValueError, match=r"end_s \(1.0\) must be greater than start_s \(2.0\)"):
        decode_video(path, ALL, start_s=2.0, end_s=1.0)
    with pytest.raises(RecordError) as e:
        decode_video(path, ALL, start_s=1000.0)
    assert e.value.reason == "no_frames" and "in [1000.0, None) s" in str(e.value)
