"""Video clips (pipeline.steps.clips, output.sinks.clips): fan-out of video rows into clip
rows, clip decode windows, clip files, on the bundled real videos."""

from __future__ import annotations

from pathlib import Path

import av
import pyarrow as pa
import pytest

from pipeline.columns import (
    CLIP_BYTES,
    CLIP_END_S,
    CLIP_FILE,
    CLIP_FRAMES,
    CLIP_INDEX,
    CLIP_PATH,
    CLIP_SPAN,
    CLIP_START_S,
    ERROR,
    ERROR_REASON,
    FRAME_TIMESTAMPS_S,
    FRAMES,
    KEY,
    PARENT_KEY,
    READ_ERROR,
    REJECT_REASON,
    SHA256,
    SOURCE_PATH,
    STATUS,
)
from pipeline.errors import SpecError
from pipeline.media.clips import detect_spans
from pipeline.output.sinks.clips import ClipDatasink
from pipeline.records import ErrorReason, RowError
from pipeline.spec import ClipsSpec, VideoSpec, parse_spec
from pipeline.steps.clips import ClipEncodeStep, ClipSplitStep, remove_clip_files
from pipeline.steps.video import VideoDecodeStep

DATA = Path(__file__).resolve().parents[2] / "data"
VIDEOS = DATA / "videos"
CHAPLIN = VIDEOS / "chaplin.mp4"          # 9.64 s, 25 fps, 640x360
NASA = VIDEOS / "nasa_13013.mp4"          # 13.06 s, 25 fps, 320x180
BUNNY = VIDEOS / "big_buck_bunny_432_433.webm"   # 1.0 s, vp8 1280x720
EMPTY = DATA / "cases" / "V08_vcorrupt" / "result_0byte.webm"
FIXED = ClipsSpec(method="fixed", clip_s=4.0, min_clip_s=1.5)


def video_batch(paths: list[Path | None]) -> dict:
    """A read batch as the runner hands it on: ok rows with staged paths; None: a read error."""
    n = len(paths)
    return {KEY: [p.stem if p else "missing" for p in paths],
            SOURCE_PATH: [str(p) if p else None for p in paths],
            READ_ERROR: [None if p else RowError(ErrorReason.READ_FAILED, "gone") for p in paths],
            STATUS: ["ok" if p else "error" for p in paths],
            REJECT_REASON: [None] * n,
            ERROR_REASON: [None if p else "read_failed" for p in paths],
            ERROR: [None if p else "read_failed: gone" for p in paths]}


def test_one_row_per_clip_with_keys_spans_and_counts_in_bounded_batches():
    step = ClipSplitStep(FIXED, max_rows=2)
    counts: list[int] = []
    parts = list(step.split(video_batch([CHAPLIN, None, NASA, BUNNY]), counts))
    assert all(1 <= len(p[STATUS]) <= 2 for p in parts)
    rows = [{c: p[c][i] for c in p} for p in parts for i in range(len(p[STATUS]))]
    chaplin = detect_spans(str(CHAPLIN), method="fixed", clip_s=4.0, min_clip_s=1.5)
    nasa = detect_spans(str(NASA), method="fixed", clip_s=4.0, min_clip_s=1.5)
    assert len(chaplin) >= 2 and len(nasa) >= 3
    assert counts == [len(chaplin), 1, len(nasa), 1]
    assert len(rows) == sum(counts)
    clips = [r for r in rows if r[PARENT_KEY] is not None]
    assert [r[KEY] for r in clips] == ([f"chaplin/{i}" for i in range(len(chaplin))]
                                       + [f"nasa_13013/{i}" for i in range(len(nasa))])
    for r in clips:
        span = r[CLIP_SPAN]
        assert (r[CLIP_INDEX], r[CLIP_START_S], r[CLIP_END_S]) == (span.index, span.start_s,
                                                                    span.end_s)
        assert r[CLIP_FRAMES] == span.end_frame - span.start_frame > 0
        assert r[STATUS] == "ok" and r[SOURCE_PATH].endswith(r[PARENT_KEY] + ".mp4")
        assert 0 <= r[CLIP_START_S] < r[CLIP_END_S] <= (9.64 if "chaplin" in r[KEY] else 13.06)
        assert r[CLIP_END_S] - r[CLIP_START_S] >= 1.5
    missing = next(r for r in rows if r[KEY] == "missing")    # a read error passes through
    assert (missing[STATUS], missing[ERROR_REASON], missing[PARENT_KEY]) == ("error",
                                                                              "read_failed", None)
    bunny = next(r for r in rows if r[KEY] == BUNNY.stem)     # 1 s < min_clip_s: no clip
    assert (bunny[STATUS], bunny[REJECT_REASON], bunny[CLIP_INDEX]) == ("rejected", "no_clips",
                                                                       None)


def test_an_undecodable_video_is_one_error_row_with_its_reason():
    counts: list[int] = []
    rows = list(ClipSplitStep(FIXED).split(video_batch([EMPTY]), counts))
    assert counts == [1]
    assert rows[0][STATUS] == ["error"] and rows[0][ERROR_REASON] == ["empty_file"]
    assert rows[0][KEY] == [EMPTY.stem] and rows[0][PARENT_KEY] == [None]


def test_clip_rows_decode_only_their_span_and_encode_to_their_span(tmp_path):
    video = VideoSpec(sampling="fps", fps=2.0, clips=FIXED)
    batch = ClipSplitStep(FIXED)(video_batch([CHAPLIN]))
    batch = VideoDecodeStep(video)(batch)
    batch = ClipEncodeStep(FIXED, str(tmp_path))(batch)
    assert set(batch[STATUS]) == {"ok"}
    for i, (start, end) in enumerate(zip(batch[CLIP_START_S], batch[CLIP_END_S])):
        times = batch[FRAME_TIMESTAMPS_S][i]
        assert times and all(start - 1e-6 <= t < end for t in times), (start, end, times)
        assert len(batch[FRAMES][i]) == len(times)
        with av.open(batch[CLIP_FILE][i]) as c:
            s = c.streams.video[0]
            frames = sum(1 for _ in c.decode(s))
            assert (s.codec_context.name, s.width, s.height) == ("h264", 640, 360)
        assert abs(frames - batch[CLIP_FRAMES][i]) <= 1
        assert batch[CLIP_BYTES][i] == Path(batch[CLIP_FILE][i]).stat().st_size
    assert len(set(batch[SHA256])) == len(batch[SHA256])     # each clip's own file hash
    files = list(batch[CLIP_FILE])
    remove_clip_files(batch)
    assert batch[CLIP_FILE] == [None] * len(files) and not any(Path(f).exists() for f in files)


def test_the_clip_datasink_writes_ok_clips_under_the_attempt_and_sets_clip_path(tmp_path):
    batch = ClipEncodeStep(FIXED, str(tmp_path))(ClipSplitStep(FIXED)(video_batch([CHAPLIN])))
    batch[STATUS][1] = "rejected"
    sink = ClipDatasink(str(tmp_path / "out"))
    sink.on_write_start("p-000000", "abc", pa.schema([]))
    sink.write(batch)
    result = sink.on_write_complete()
    n = len(batch[STATUS])
    expected = [f"clips/p-000000/a-abc/{k:06d}.mp4" for k in range(n - 1)]
    assert list(result.files) == expected
    assert batch[CLIP_PATH] == [expected[0], None] + expected[1:]
    for i, rel in enumerate(batch[CLIP_PATH]):
        if rel is not None:
            assert (tmp_path / "out" / rel).read_bytes() == Path(batch[CLIP_FILE][i]).read_bytes()
    sink.on_write_failed(None)
    assert not (tmp_path / "out" / "clips" / "p-000000" / "a-abc").exists()


def test_clips_spec_refuses_bad_lengths_and_an_image_job():
    with pytest.raises(ValueError, match="overlap_s"):
        ClipsSpec(method="fixed", clip_s=2.0, overlap_s=2.0)
    with pytest.raises(ValueError, match="min_clip_s"):
        ClipsSpec(min_clip_s=5.0, max_clip_s=4.0)
    assert ClipsSpec(method="scenes").writes_files and not ClipsSpec().writes_files
    assert not ClipsSpec(method="scenes", transcode={"enabled": False}).writes_files
    with pytest.raises(SpecError, match="video.clips.method: 'fixed' needs source.media: video"):
        parse_spec({"source": {"kind": "files", "uri": "in"}, "sink": {"uri": "out"},
                    "video": {"clips": {"method": "fixed"}}})
    with pytest.raises(SpecError, match="video.clips.transcode.enabled: needs"):
        parse_spec({"source": {"kind": "files", "uri": "in", "media": "video"},
                    "sink": {"uri": "out"}, "video": {"clips": {"transcode": {"enabled": True}}}})


def test_the_split_streams_a_video_at_a_time(monkeypatch):
    """Spans of the next video are found only once the rows before it are taken, and a
    sub-batch never holds more than max_rows rows (issue 25 item 7: streaming)."""
    step = ClipSplitStep(FIXED, max_rows=2)
    asked: list[str] = []
    spans = ClipSplitStep.spans
    monkeypatch.setattr(ClipSplitStep, "spans",
                        lambda self, path: asked.append(Path(path).stem) or spans(self, path))
    parts = step.split(video_batch([CHAPLIN, NASA]), [])
    first = next(parts)
    assert asked == ["chaplin"] and first[KEY] == ["chaplin/0", "chaplin/1"]
    rest = list(parts)
    assert asked == ["chaplin", "nasa_13013"] and all(len(p[KEY]) <= 2 for p in rest)
