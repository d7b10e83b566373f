"""Video decode and frame sampling (pipeline.steps.video) on the bundled real files.

Expected values come from an independent plain PyAV loop over the same stream
(``container.streams.best("video")``, the stream FFmpeg itself would pick), never from
the headers.
"""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from pipeline.errors import RecordError
from pipeline.columns import ERROR, ERROR_REASON, STATUS
from pipeline.spec import ResizeSpec, VideoSpec
from pipeline.steps.video import VideoDecodeStep, VideoFramesStep
from pipeline.media.video import decode_video

DATA = Path(__file__).resolve().parents[2] / "data"
CASES = DATA / "cases"
VIDEOS = DATA / "videos"
V01 = CASES / "V01_vfr" / "var_fps_video.mp4"
V03 = CASES / "V03_vrot" / "video_rotation_90.mp4"
V04 = CASES / "V04_vrot" / "video_90.mov"
V06 = CASES / "V06_v0" / "zero_empty_stsc.mp4"
V08 = CASES / "V08_vcorrupt" / "result_0byte.webm"
V09 = CASES / "V09_vcorrupt" / "chunk_out_of_range.mp4"
V10 = CASES / "V10_vcorrupt" / "corrupted.mp4"
REAL = sorted(VIDEOS.iterdir())


def reference(path: Path) -> dict:
    """Plain PyAV full decode: pts times, key flags, last frame end, first raw frame."""
    times, keys, raw, rotation, end = [], [], None, None, 0.0
    with av.open(str(path)) as c:
        stream = c.streams.best("video")
        avg_rate, base_rate = stream.average_rate, stream.base_rate
        for f in c.decode(stream):
            times.append(float(f.pts * f.time_base))
            keys.append(bool(f.key_frame))
            end = times[-1] + float(f.duration * f.time_base)
            if raw is None:
                raw, rotation = f.to_ndarray(format="rgb24"), f.rotation
    return {"times": times, "keys": keys, "end": end, "raw": raw, "rotation": rotation,
            "avg_rate": avg_rate, "base_rate": base_rate}


def first_at_or_after(times: list[float], targets) -> list[float]:
    """For each target the first time >= target, de-duplicated, ascending."""
    out = []
    for t in targets:
        hit = next((x for x in times if x >= t - 1e-9), None)
        if hit is not None and hit not in out:
            out.append(hit)
    return out


@pytest.fixture(scope="module")
def refs() -> dict[str, dict]:
    return {p.name: reference(p) for p in [*REAL, V01]}


# --- V01: variable frame rate -------------------------------------------------------

def test_v01_vfr_fps_sampling_is_pts_based(refs):
    ref = refs[V01.name]
    times = ref["times"]
    info = decode_video(str(V01), VideoSpec(sampling="fps", fps=2, max_frames=1000))
    targets = np.arange(0, times[-1] + 1e-9, 0.5)
    expected = first_at_or_after(times, targets)
    assert info.timestamps_s == pytest.approx(expected, abs=1e-9)
    assert len(info.timestamps_s) == 30
    assert info.frame_count == len(times) == 300
    # The file is really VFR: frame gaps of 1/30 s and longer ones.
    gaps = np.diff(times)
    assert gaps.min() == pytest.approx(1 / 30, abs=1e-3) and gaps.max() > 0.06
    # Index sampling with the header's average rate (1125/56 ~ 20.09 fps) picks other
    # frames: at t=1.5 s index 30 is the frame at 1.0 s (30 fps for 1 s, then a 0.53 s
    # gap, then gaps alternating 1/30 s and 1/15 s).
    avg = float(ref["avg_rate"])
    by_index = [times[min(len(times) - 1, round(t * avg))] for t in targets]
    assert max(abs(a - t) for a, t in zip(by_index, targets)) == pytest.approx(0.5)
    assert by_index != expected
    # With the header's r_frame_rate (30 fps, the rate of the first second) the 300 frames
    # would last 10 s: every target after 10 s has no frame by index.
    base = float(ref["base_rate"])
    assert base == 30 and len(times) / base == 10.0 and times[-1] > 14.9
    assert sum(round(t * base) >= len(times) for t in targets) == 10
    # pts sampling never misses a target by more than one (the largest) frame gap.
    assert max(abs(a - t) for a, t in zip(info.timestamps_s, targets)) <= gaps.max() + 1e-9
    assert info.duration_s == pytest.approx(ref["end"] - times[0])
    assert info.fps == pytest.approx(300 / info.duration_s)
    assert info.partial is False and info.decode_errors == 0


# --- V03/V04: rotation ----------------------------------------------------------------

@pytest.mark.parametrize("path, coded, shown", [
    (V03, (100, 60), (60, 100)),     # (width, height): coded vs displayed
    (V04, (568, 320), (320, 568)),
])
def test_rotation_applied(path, coded, shown, refs):
    ref = reference(path)
    assert ref["raw"].shape == (coded[1], coded[0], 3)
    assert ref["rotation"] == -90  # display matrix: 90 deg clockwise (rotate tag 90)
    info = decode_video(str(path), VideoSpec(sampling="uniform", num_frames=8))
    assert (info.width, info.height) == shown
    assert info.rotation_deg == 90
    assert info.frames[0].shape == (shown[1], shown[0], 3)
    assert info.frames[0].dtype == np.uint8
    # Upright = the coded picture turned 90 deg clockwise (ffmpeg autorotate
    # transpose=clock): pixel (r, c) of the result is coded pixel (H-1-c, r).
    raw = ref["raw"]
    np.testing.assert_array_equal(info.frames[0], np.rot90(raw, k=-1))
    h = raw.shape[0]
    assert (info.frames[0][0, 0] == raw[h - 1, 0]).all()


def test_v04_all_frames_sampled_upright():
    info = decode_video(str(V04), VideoSpec(sampling="uniform", num_frames=8))
    assert info.frame_count == 3 and len(info.frames) == 3  # only 3 frames exist
    assert all(f.shape == (568, 320, 3) for f in info.frames)
    assert info.container == "mov" and info.mime == "video/quicktime"


# --- V06/V08/V09/V10: broken containers -------------------------------------------------

def test_v06_zero_decodable_frames_is_no_frames():
    # The header promises 1040 frames, the two h264 packets FFmpeg reads are broken
    # ("Invalid NAL unit size") and the demuxer stops ("partial file").
    with pytest.raises(RecordError) as e:
        decode_video(str(V06), VideoSpec())
    assert e.value.reason == "no_frames"
    assert "2 packets failed" in e.value.message


def test_v08_zero_bytes_is_empty_file():
    with pytest.raises(RecordError) as e:
        decode_video(str(V08), VideoSpec())
    assert e.value.reason == "empty_file"


def test_v09_unopenable_is_corrupt_container():
    # FFmpeg: "contradictionary STSC and STCO", "error reading header".
    with pytest.raises(RecordError) as e:
        decode_video(str(V09), VideoSpec())
    assert e.value.reason == "corrupt_container"
    # FFmpeg's message, named by its type; not PyAV's "[Errno 1094995529]" (an AVERROR code
    # that no errno table holds) nor the temporary name the file was opened under
    assert e.value.message == "InvalidDataError: Invalid data found when processing input"


def test_v10_corrupt_packet_gives_partial():
    info = decode_video(str(V10), VideoSpec(sampling="uniform", num_frames=8))
    assert info.partial is True
    assert info.decode_errors == 1
    assert info.frame_count == 49  # header says 50; one packet does not decode
    assert len(info.frames) == 8 and info.frames[0].shape == (720, 1280, 3)
    assert info.timestamps_s == pytest.approx([0.0, 0.7, 1.4, 2.1, 2.8, 3.5, 4.2, 4.9])


def test_missing_file_is_read_failed(tmp_path):
    with pytest.raises(RecordError) as e:
        decode_video(str(tmp_path / "nope.mp4"), VideoSpec())
    assert e.value.reason == "read_failed"


def test_not_a_video_is_corrupt_container(tmp_path):
    p = tmp_path / "page.mp4"
    p.write_bytes(b"<html><body>moved</body></html>\n" * 20)
    with pytest.raises(RecordError) as e:
        decode_video(str(p), VideoSpec())
    assert e.value.reason == "corrupt_container"
    assert "[Errno" not in e.value.message and e.value.message.startswith("InvalidDataError: ")


def test_audio_only_is_no_video_stream(tmp_path):
    p = tmp_path / "tone.wav"
    with av.open(str(p), "w") as c:
        s = c.add_stream("pcm_s16le", rate=8000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16",
                                           layout="mono")
        frame.rate = 8000
        for pkt in s.encode(frame):
            c.mux(pkt)
        for pkt in s.encode(None):
            c.mux(pkt)
    with pytest.raises(RecordError) as e:
        decode_video(str(p), VideoSpec())
    assert e.value.reason == "no_video_stream"
    assert e.value.message == f"only 1 audio stream in {p}"


# --- cover art: an attached picture is not a video -------------------------------------------

ATTACHED_PIC = av.stream.Disposition.attached_pic


def cover_image(codec: str) -> bytes:
    """A 16x16 red PNG or JPEG, the payload of one attached-picture packet."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buf, "PNG" if codec == "png" else "JPEG")
    return buf.getvalue()


def write_media(path: Path, fmt: str, audio_codec: str, cover_codec: str | None,
                video_frames: int = 0) -> Path:
    """Mux with PyAV: 0.6 s of silence, optionally a 32x32 mpeg4 video of ``video_frames``
    frames at 10 fps, and optionally cover art - one PNG/JPEG packet on a video stream
    whose disposition is ``attached_pic`` (what FFmpeg's mp3, mp4 and flac muxers write
    as ID3 APIC, ``covr`` and METADATA_BLOCK_PICTURE)."""
    with av.open(str(path), "w", format=fmt) as c:
        audio = c.add_stream(audio_codec, rate=8000, layout="mono")
        video = None
        if video_frames:
            video = c.add_stream("mpeg4", rate=10)
            video.width = video.height = 32
            video.pix_fmt = "yuv420p"
        if cover_codec:
            pic = c.add_stream(cover_codec)
            pic.width = pic.height = 16
            pic.pix_fmt = "rgb24" if cover_codec == "png" else "yuvj420p"
            pic.disposition = ATTACHED_PIC
            pkt = av.Packet(cover_image(cover_codec))
            pkt.stream, pkt.pts, pkt.dts, pkt.is_keyframe = pic, 0, 0, True
            c.mux(pkt)
        for i in range(4):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1152), np.int16), format="s16",
                                               layout="mono")
            frame.rate, frame.pts = 8000, i * 1152
            c.mux(audio.encode(frame))
        c.mux(audio.encode(None))
        for i in range(video_frames):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 20 * i, np.uint8),
                                               format="rgb24")
            frame.pts = i
            c.mux(video.encode(frame))
        if video is not None:
            c.mux(video.encode(None))
    return path


def stream_kinds(path: Path) -> list[tuple[str, str, bool]]:
    """(type, codec, is attached picture) of every stream, as plain PyAV reports them."""
    with av.open(str(path)) as c:
        return [(s.type, s.codec_context.name, bool(s.disposition & ATTACHED_PIC))
                for s in c.streams]


COVER_FILES = [  # (file name, muxer, audio codec, cover codec)
    ("song.mp3", "mp3", "libmp3lame", "mjpeg"),
    ("song_png.mp3", "mp3", "libmp3lame", "png"),
    ("song.m4a", "mp4", "aac", "mjpeg"),
    ("song.flac", "flac", "flac", "png"),
]


@pytest.mark.parametrize("name, fmt, audio_codec, cover_codec", COVER_FILES,
                         ids=[f[0] for f in COVER_FILES])
def test_cover_art_only_is_no_video_stream(tmp_path, name, fmt, audio_codec, cover_codec):
    if audio_codec not in av.codecs_available:
        pytest.skip(f"this FFmpeg build has no {audio_codec} encoder")
    path = write_media(tmp_path / name, fmt, audio_codec, cover_codec)
    kinds = stream_kinds(path)
    # FFmpeg itself offers the cover as a video stream (a naive decoder gets one frame).
    assert [(t, pic) for t, _, pic in kinds] == [("audio", False), ("video", True)]
    with av.open(str(path)) as c:
        assert c.streams.best("video") is not None
    with pytest.raises(RecordError) as e:
        decode_video(str(path), VideoSpec())
    assert e.value.reason == "no_video_stream"
    assert e.value.message == f"only an attached picture (cover art) and 1 audio stream in {path}"


def test_real_video_with_cover_art_decodes_the_real_video(tmp_path):
    path = write_media(tmp_path / "clip.mp4", "mp4", "aac", "mjpeg", video_frames=10)
    assert [(t, c, pic) for t, c, pic in stream_kinds(path)] == [
        ("audio", "aac", False), ("video", "mpeg4", False), ("video", "mjpeg", True)]
    info = decode_video(str(path), VideoSpec(sampling="keyframes"))
    assert (info.codec, info.width, info.height, info.frame_count) == ("mpeg4", 32, 32, 10)
    assert info.duration_s == pytest.approx(1.0)


def test_decode_step_marks_cover_art_and_audio_rows_no_video_stream(tmp_path):
    cover = write_media(tmp_path / "song.flac", "flac", "flac", "png")
    audio = write_media(tmp_path / "tone.flac", "flac", "flac", None)
    paths = [cover, audio, VIDEOS / "chaplin.mp4"]
    batch = {STATUS: ["ok"] * 3, ERROR: [None] * 3, "_source_path": [str(p) for p in paths]}
    batch = VideoDecodeStep(VideoSpec(sampling="keyframes"))(batch)
    assert batch[STATUS] == ["error", "error", "ok"]
    assert batch[ERROR_REASON] == ["no_video_stream", "no_video_stream", None]
    assert "attached picture (cover art)" in batch[ERROR][0]
    assert batch[ERROR][1] == f"no_video_stream: only 1 audio stream in {audio}"
    assert batch["frame_count"][:2] == [None, None] and batch["_frames"][:2] == [None, None]


def test_packet_budget_stops_decoding_as_partial():
    info = decode_video(str(VIDEOS / "chaplin.mp4"), VideoSpec(), max_packets=20)
    assert info.partial is True and info.decode_errors == 1
    assert 0 < info.frame_count < 241


# --- the three real videos ---------------------------------------------------------------

@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_measured_properties_match_full_decode(path, refs):
    ref = refs[path.name]
    info = decode_video(str(path), VideoSpec(sampling="uniform", num_frames=8))
    n = len(ref["times"])
    assert info.frame_count == n
    assert info.duration_s == pytest.approx(ref["end"] - ref["times"][0])
    assert info.fps == pytest.approx(n / info.duration_s)
    assert info.partial is False and info.decode_errors == 0
    # uniform: 8 ascending pts inside [0, duration], each a real frame time, first and last
    ts = info.timestamps_s
    assert len(ts) == 8 and ts == sorted(ts) and len(set(ts)) == 8
    assert 0 <= ts[0] and ts[-1] <= info.duration_s
    assert set(ts) <= set(ref["times"])
    assert ts[0] == ref["times"][0] and ts[-1] == max(ref["times"])
    targets = np.linspace(ref["times"][0], max(ref["times"]), 8)
    nearest = [min(ref["times"], key=lambda x, t=t: (abs(x - t), x)) for t in targets]
    assert ts == pytest.approx(nearest)
    assert len(info.frames) == 8
    assert all(f.shape == (info.height, info.width, 3) and f.dtype == np.uint8
               for f in info.frames)


def test_real_video_metadata():
    expected = {  # name: (frames, w, h, codec, container, mime)
        "big_buck_bunny_432_433.webm": (24, 1280, 720, "vp8", "webm", "video/webm"),
        "chaplin.mp4": (241, 640, 360, "h264", "mp4", "video/mp4"),
        # two video tracks: 320x180 25 fps and 480x270 29.97 fps; FFmpeg's best is 480x270
        "nasa_13013.mp4": (390, 480, 270, "h264", "mp4", "video/mp4"),
    }
    for name, (n, w, h, codec, cont, mime) in expected.items():
        info = decode_video(str(VIDEOS / name), VideoSpec(sampling="keyframes"))
        assert (info.frame_count, info.width, info.height, info.codec, info.container,
                info.mime, info.rotation_deg) == (n, w, h, codec, cont, mime, 0), name


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_keyframes_mode_gives_only_keyframes(path, refs):
    ref = refs[path.name]
    key_times = [t for t, k in zip(ref["times"], ref["keys"]) if k]
    info = decode_video(str(path), VideoSpec(sampling="keyframes"))
    assert info.timestamps_s == key_times
    assert len(info.frames) == len(key_times) >= 1


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_fps_mode_two_per_second(path, refs):
    times = refs[path.name]["times"]
    expected = first_at_or_after(times, np.arange(times[0], times[-1] + 1e-9, 0.5))
    info = decode_video(str(path), VideoSpec(sampling="fps", fps=2, max_frames=1000))
    assert info.timestamps_s == pytest.approx(expected)
    # about 2 per second of the decoded span
    assert abs(len(info.timestamps_s) - 2 * info.duration_s) <= 1
    assert {"big_buck_bunny_432_433.webm": 2, "chaplin.mp4": 20,
            "nasa_13013.mp4": 26}[path.name] == len(info.timestamps_s)


def test_max_frames_thins_evenly(refs):
    info = decode_video(str(VIDEOS / "chaplin.mp4"),
                        VideoSpec(sampling="fps", fps=25, max_frames=10))
    ts = info.timestamps_s
    assert len(ts) == len(info.frames) == 10
    assert ts == sorted(ts) and ts[0] == 0.0 and ts[-1] >= 0.8 * info.duration_s
    steps = np.diff(ts)
    assert steps.max() <= 2.5 * steps.min()


def test_scene_mode():
    chaplin = decode_video(str(VIDEOS / "chaplin.mp4"), VideoSpec(sampling="scene"))
    assert chaplin.timestamps_s == [0.0]  # no cut: consecutive grey MAD <= 0.027
    # nasa has one hard cut (grey MAD 0.288 at 8.008 s, the second key frame)
    nasa = decode_video(str(VIDEOS / "nasa_13013.mp4"),
                        VideoSpec(sampling="scene", scene_threshold=0.2))
    assert nasa.timestamps_s == pytest.approx([0.0, 8.008], abs=1e-3)


# --- the steps -------------------------------------------------------------------------------

def test_decode_and_frames_steps_over_a_batch():
    paths = [VIDEOS / "chaplin.mp4", VIDEOS / "big_buck_bunny_432_433.webm", V09, V08, V06,
             V10, V04]
    n = len(paths)
    batch = {"key": [p.stem for p in paths], STATUS: ["ok"] * n, ERROR: [None] * n,
             "_source_path": [str(p) for p in paths]}
    resize = ResizeSpec()  # shorter side 256, JPEG q90, no upscale
    batch = VideoDecodeStep(VideoSpec(sampling="uniform", num_frames=4))(batch)
    assert batch[STATUS] == ["ok", "ok", "error", "error", "error", "ok", "ok"]
    assert [e.split(":")[0] if e else None for e in batch[ERROR]] == [
        None, None, "corrupt_container", "empty_file", "no_frames", None, None]
    assert batch["partial"] == [False, False, None, None, None, True, False]
    assert batch["frame_count"] == [241, 24, None, None, None, 49, 3]
    assert batch["mime"][:2] == ["video/mp4", "video/webm"]
    assert batch["format"][6] == "mov" and batch["rotation_deg"][6] == 90
    assert batch["video_codec"][:2] == ["h264", "vp8"]
    assert len(batch["sha256"][0]) == 64 and isinstance(batch["phash"][0], int)
    assert [len(f) if f else None for f in batch["_frames"]] == [4, 4, None, None, None, 4, 3]

    batch = VideoFramesStep(resize)(batch)
    assert batch["_frames"] == [None] * n
    expect_size = {0: (455, 256), 1: (455, 256), 5: (455, 256), 6: (256, 454)}
    for i, (w, h) in expect_size.items():
        frames = batch["frames"][i]
        assert len(frames) == batch["frame_count"][i] if i == 6 else len(frames) == 4
        for b in frames:
            img = Image.open(io.BytesIO(b))
            assert img.format == "JPEG" and img.size == (w, h)
        assert batch["image"][i] == frames[len(frames) // 2]
        assert (batch["image_width"][i], batch["image_height"][i]) == (w, h)
    assert batch["frames"][2] is None and batch["image"][3] is None


def test_frames_step_webp_and_keep_frames():
    n = 1
    batch = {STATUS: ["ok"], ERROR: [None], "_source_path": [str(V03)]}
    resize = ResizeSpec(encode_format="webp", mode="none", quality=80)
    batch = VideoDecodeStep(VideoSpec())(batch)
    batch = VideoFramesStep(resize, keep_frames=True)(batch)
    img = Image.open(io.BytesIO(batch["image"][0]))
    assert img.format == "WEBP" and img.size == (60, 100)
    assert batch["_frames"][0][0].shape == (100, 60, 3) and len(batch["_frames"]) == n
