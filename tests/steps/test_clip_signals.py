"""steps.clip_signals: frame signals and clip filters on the bundled real videos and a
generated still video (a real frame repeated), decoded by the real VideoDecodeStep."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from pipeline.assembly import assemble
from pipeline.columns import (
    BITRATE,
    FRAME_PHASHES,
    MOTION_SCORE,
    REJECT_REASON,
    SIGNAL_FLAGS,
    SOURCE_PATH,
    STATIC_FRACTION,
    STATUS,
)
from pipeline.media.transform import phash64
from pipeline.media.video import decode_video
from pipeline.spec import ClipFilterSpec, SpecError, VideoSpec, parse_spec
from pipeline.steps.clip_signals import ClipFilterStep, ClipSignalsStep
from pipeline.steps.video import VideoDecodeStep

VIDEOS = Path(__file__).resolve().parents[2] / "data" / "videos"
NASA, CHAPLIN, BUNNY = (VIDEOS / n for n in
                        ("nasa_13013.mp4", "chaplin.mp4", "big_buck_bunny_432_433.webm"))


def still_video(path: Path, seconds: float = 3.0, rate: int = 10) -> Path:
    """An H.264 MP4 of one real frame (Chaplin's first) held for ``seconds``."""
    frame = decode_video(str(CHAPLIN), VideoSpec(num_frames=1)).frames[0]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = frame.shape[1], frame.shape[0], "yuv420p"
        for _ in range(int(seconds * rate)):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return path


def run(paths: list[Path], clips: ClipFilterSpec) -> dict:
    """Decode ``paths`` (8 uniform frames) and run the signals and filter steps."""
    batch = {SOURCE_PATH: [str(p) for p in paths], STATUS: ["ok"] * len(paths)}
    batch = VideoDecodeStep(VideoSpec(num_frames=8))(batch)
    batch = ClipSignalsStep(clips.static_max_distance)(batch)
    return ClipFilterStep(clips)(batch)


def test_signals_of_real_videos_and_a_still_one(tmp_path):
    still = still_video(tmp_path / "still.mp4")
    batch = run([NASA, CHAPLIN, still], ClipFilterSpec(max_static_fraction=0.9))
    assert batch[STATIC_FRACTION][2] == 1.0
    assert batch[STATIC_FRACTION][0] < 0.9 and batch[STATIC_FRACTION][1] < 0.9
    assert batch[MOTION_SCORE][2] < 0.05 < min(batch[MOTION_SCORE][:2])
    assert batch[STATUS] == ["ok", "ok", "rejected"]
    assert batch[REJECT_REASON] == [None, None, "static"]
    frames = decode_video(str(NASA), VideoSpec(num_frames=8)).frames
    assert batch[FRAME_PHASHES][0] == [phash64(f) for f in frames]   # none flat
    assert batch[BITRATE][0] == round(8 * NASA.stat().st_size / batch["duration_s"][0])


def test_each_bound_rejects_with_its_reason_and_score_only_flags_instead(tmp_path):
    still = still_video(tmp_path / "still.mp4")
    paths = [NASA, CHAPLIN, BUNNY, still]
    # nasa 480x270 29.97 fps 13 s; chaplin 640x360 25 fps 9.6 s; bunny 1280x720 24 fps
    # 1 s; still 640x360 10 fps 3 s
    spec = ClipFilterSpec(min_duration_s=2.0, min_fps=12, min_resolution_px=300,
                          min_motion=0.05)
    batch = run(paths, spec)
    assert batch[REJECT_REASON] == ["low_resolution", None, "clip_duration", "low_fps"]
    assert SIGNAL_FLAGS not in batch
    batch = run(paths, spec.model_copy(update={"score_only": True}))
    assert batch[STATUS] == ["ok"] * 4
    assert batch[SIGNAL_FLAGS] == [["low_resolution"], None, ["clip_duration"],
                                   ["low_fps", "low_motion"]]
    rates = run(paths, ClipFilterSpec(min_bitrate=10**9))[REJECT_REASON]
    assert rates == ["low_bitrate"] * 4


def test_video_rows_keep_their_columns_unless_the_signals_are_asked_for(tmp_path):
    base = {"source": {"kind": "files", "uri": str(VIDEOS), "media": "video"},
            "sink": {"uri": str(tmp_path / "out")}}
    plain = assemble(parse_spec(base)).writes
    assert not {MOTION_SCORE, STATIC_FRACTION, FRAME_PHASHES, BITRATE} & plain
    asked = assemble(parse_spec({**base, "filters": {"clips": {"enabled": True}}}))
    assert {MOTION_SCORE, STATIC_FRACTION, FRAME_PHASHES, BITRATE} <= asked.writes
    assert [s.name for s in asked.steps].count("ClipFilterStep") == 0   # no bound set
    bounded = assemble(parse_spec({**base, "filters": {"clips": {"min_motion": 0.5}}}))
    names = [s.name for s in bounded.steps]
    assert names.index("ClipSignalsStep") < names.index("ClipFilterStep") \
        < names.index("VideoFramesStep")


def test_bad_settings_name_the_field(tmp_path):
    base = {"source": {"kind": "files", "uri": str(VIDEOS)},
            "sink": {"uri": str(tmp_path / "out")}}
    with pytest.raises(SpecError, match="filters.clips"):
        parse_spec({**base, "filters": {"clips": {"min_motion": 1.0}}})   # an image job
    with pytest.raises(SpecError, match="min_duration_s"):
        parse_spec({**base, "source": {**base["source"], "media": "video"},
                    "filters": {"clips": {"min_duration_s": 5, "max_duration_s": 2}}})
    with pytest.raises(SpecError, match="max_static_fraction"):
        parse_spec({**base, "source": {**base["source"], "media": "video"},
                    "filters": {"clips": {"max_static_fraction": 1.5}}})


def test_clip_rows_get_the_signals_of_their_own_span(tmp_path):
    from pipeline.spec import ClipsSpec
    from pipeline.steps.clips import ClipEncodeStep, ClipSplitStep, remove_clip_files

    clips = ClipsSpec(method="fixed", clip_s=3.0, min_clip_s=0.5)
    video = VideoSpec(num_frames=4, clips=clips)
    batch = {SOURCE_PATH: [str(CHAPLIN)], STATUS: ["ok"], "key": ["chaplin"]}
    batch = ClipSplitStep(clips)(batch)
    assert batch["key"] == ["chaplin/0", "chaplin/1", "chaplin/2", "chaplin/3"]  # 9.64 s
    batch = ClipEncodeStep(clips, str(tmp_path))(VideoDecodeStep(video)(batch))
    try:
        batch = ClipSignalsStep()(batch)
        spec = ClipFilterSpec(min_duration_s=1.5)
        batch = ClipFilterStep(spec)(batch)
    finally:
        remove_clip_files(batch)
    spans = [e - s for s, e in zip(batch["clip_start_s"], batch["clip_end_s"])]
    assert batch[BITRATE] == [round(8 * b / s) for b, s in zip(batch["clip_bytes"], spans)]
    assert all(len(h) == 4 for h in batch[FRAME_PHASHES])
    assert all(m is not None and 0 <= f <= 1 for m, f in
               zip(batch[MOTION_SCORE], batch[STATIC_FRACTION]))
    # the last clip is 0.64 s (9.64 - 9.0): shorter than min_duration_s
    assert spans[-1] < 1.5 <= min(spans[:-1])
    assert batch[REJECT_REASON] == [None, None, None, "clip_duration"]
