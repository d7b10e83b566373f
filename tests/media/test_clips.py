"""Clip spans (``media.clips``): shots found by PySceneDetect on generated videos with known
cut points (``pipeline.testing.cut_videos``: 24/25/30/60 fps, a variable frame rate, a
display matrix, 10-bit), fixed-length spans, the bounds, and the three real videos."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pipeline.errors import RecordError
from pipeline.media.clips import ClipSpan, detect_cuts, detect_spans
from pipeline.media.video import decode_video
from pipeline.spec import VideoSpec
from pipeline.testing import cut_videos
from pipeline.testing.cut_videos import CutVideo, long_video, match_cuts, suite

REAL = Path("/work/shared/data/videos")
REAL_VIDEOS = sorted(REAL.glob("*")) if REAL.is_dir() else []


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, CutVideo]:
    return suite(tmp_path_factory.mktemp("cuts"))


def frame_s(video: CutVideo) -> float:
    """The longest frame interval of ``video`` in seconds."""
    t = video.times_s
    return max(b - a for a, b in itertools.pairwise(t))


@pytest.mark.parametrize("name", ["fps24", "fps25", "fps30", "fps60", "vfr", "rotated",
                                  "10bit"])
@pytest.mark.parametrize("detector", ["content", "adaptive"])
def test_every_hard_cut_is_found_within_two_frames(videos, name, detector):
    video = videos[name]
    tl = detect_cuts(video.path, detector=detector)
    assert len(tl.times_s) == video.frames
    score = match_cuts(list(tl.cuts), video)
    assert score["fn"] == 0, (tl.cuts, video.cut_frames)
    assert score["tp"] == len(video.cut_frames) == 4
    assert score["precision"] == 1.0, (tl.cuts, video.cut_frames, video.dissolves)


@pytest.mark.parametrize("name", ["fps30", "vfr"])
def test_scene_spans_start_at_the_cut_times_and_tile_the_video(videos, name):
    video = videos[name]
    spans = detect_spans(video.path, method="scenes", min_clip_s=0.0)
    assert [s.index for s in spans] == list(range(len(spans)))
    assert spans[0].start_s == 0.0 and spans[0].start_frame == 0
    for a, b in itertools.pairwise(spans):
        assert a.end_s == b.start_s and a.end_frame == b.start_frame  # no gap, no overlap
    assert spans[-1].end_frame == video.frames
    assert abs(spans[-1].end_s - video.end_s) <= frame_s(video)
    for s in spans:  # times are the frames' presentation times, also at a variable rate
        assert s.start_s == pytest.approx(video.times_s[s.start_frame], abs=1e-6)
    starts = {s.start_frame for s in spans}
    for cut, t in zip(video.cut_frames, video.cut_times_s):
        near = [s for s in spans if abs(s.start_frame - cut) <= 2]
        assert near, (cut, starts)
        assert abs(near[0].start_s - t) <= 2 * frame_s(video)


def test_dissolves_are_reported_not_counted_as_false_cuts(videos):
    video = videos["fps25"]
    assert video.cut_frames == (50, 88, 180, 230)
    assert video.dissolves == ((150, 162),)  # (2 + 1.5 + 2.5) s at 25 fps: scene 3's start
    inside = match_cuts([10, 50, 155, 200], video)
    assert inside["dissolves_found"] == 1 and inside["fp"] == 2 and inside["tp"] == 1
    assert match_cuts([], video) == {"tp": 0, "fp": 0, "fn": 4, "precision": 1.0,
                                     "recall": 0.0, "dissolves_found": 0}


def test_min_and_max_clip_length_and_the_cap(videos):
    video = videos["fps25"]  # shots of 2, 1.5, 2.5 (+ dissolve), 1.2, 2, 1.8 s
    shots = detect_spans(video.path, method="scenes", min_clip_s=0.0)
    long_ones = detect_spans(video.path, method="scenes", min_clip_s=1.6)
    assert len(long_ones) == len([s for s in shots if s.duration_s >= 1.6]) < len(shots)
    assert all(s.duration_s >= 1.6 for s in long_ones)
    pieces = detect_spans(video.path, method="scenes", min_clip_s=0.0, max_clip_s=1.0)
    assert all(s.duration_s <= 1.0 + 1e-6 for s in pieces)
    assert pieces[0].end_s == pytest.approx(1.0) and pieces[1].start_s == pytest.approx(1.0)
    assert pieces[-1].end_frame == video.frames and len(pieces) > len(shots)
    capped = detect_spans(video.path, method="scenes", min_clip_s=0.0, max_clips=2)
    assert capped == shots[:2]


def test_fixed_spans_with_overlap(videos):
    video = videos["fps25"]  # 11.0 s, 275 frames
    spans = detect_spans(video.path, method="fixed", clip_s=3.0, overlap_s=1.0)
    assert [(s.start_s, s.end_s) for s in spans] == [
        (0.0, 3.0), (2.0, 5.0), (4.0, 7.0), (6.0, 9.0), (8.0, 11.0)]
    assert [(s.start_frame, s.end_frame) for s in spans] == [
        (0, 75), (50, 125), (100, 175), (150, 225), (200, 275)]
    tail = detect_spans(video.path, method="fixed", clip_s=4.0, min_clip_s=3.5)
    assert [(s.start_s, s.end_s) for s in tail] == [(0.0, 4.0), (4.0, 8.0)]  # 8-11 s dropped
    split = detect_spans(video.path, method="fixed", clip_s=4.0, max_clip_s=2.0)
    assert [(s.start_s, s.end_s) for s in split][:3] == [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)]
    assert len(detect_spans(video.path, method="fixed", clip_s=1.0, max_clips=3)) == 3


@pytest.mark.skipif(not REAL_VIDEOS, reason="needs /work/shared/data/videos")
@pytest.mark.parametrize("path", REAL_VIDEOS, ids=lambda p: p.name)
@pytest.mark.parametrize("method", ["scenes", "fixed"])
def test_real_videos_give_sensible_spans(path, method):
    info = decode_video(str(path), VideoSpec(num_frames=1))
    spans = detect_spans(str(path), method=method, clip_s=2.0)
    assert len(spans) >= 1
    assert spans[0].start_s >= 0 and spans[-1].end_s <= info.duration_s + 1e-3
    assert all(s.end_s > s.start_s and s.end_frame > s.start_frame for s in spans)
    assert [s.start_s for s in spans] == sorted(s.start_s for s in spans)
    if method == "scenes":
        assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(spans))
        assert sum(s.end_frame - s.start_frame for s in spans) <= info.frame_count


def test_undecodable_files_are_record_errors(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    text = tmp_path / "text.mp4"
    text.write_text("<html>not a video</html>" * 20)
    with pytest.raises(RecordError) as e:
        detect_spans(str(empty), method="scenes")
    assert e.value.reason == "empty_file"
    for method in ("scenes", "fixed"):
        with pytest.raises(RecordError) as e:
            detect_spans(str(text), method=method)
        assert e.value.reason == "corrupt_container"


def test_bad_arguments_name_the_field(videos):
    path = videos["fps25"].path
    with pytest.raises(ValueError, match="method must be one of"):
        detect_spans(path, method="shots")
    with pytest.raises(ValueError, match="detector must be one of .*'histogram'"):
        detect_spans(path, method="scenes", detector="histogram")
    with pytest.raises(ValueError, match=r"overlap_s must be in \[0, clip_s=2.0\), got 2.0"):
        detect_spans(path, method="fixed", clip_s=2.0, overlap_s=2.0)
    assert ClipSpan(0, 1.0, 2.5, 25, 62).duration_s == 1.5


def test_the_report_prints_precision_and_recall(capsys):
    assert cut_videos.main(["--report"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["video", "detector", "cuts"]
    rows = [line.split() for line in lines[1:]]
    assert len(rows) == 14 and all(float(r[7]) == 1.0 for r in rows)  # recall


@pytest.mark.slow
@pytest.mark.parametrize("minutes", [10, 60])
def test_long_videos_find_every_cut(tmp_path, minutes):
    video = long_video(tmp_path / "long.mp4", minutes=minutes)
    tl = detect_cuts(video.path)
    score = match_cuts(list(tl.cuts), video)
    assert score["recall"] == 1.0 and score["precision"] >= 0.99
    spans = detect_spans(video.path, method="scenes", max_clips=100_000)
    assert len(spans) == len(video.cut_frames) + 1
