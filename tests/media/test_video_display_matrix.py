"""The whole display matrix of a video, mirrors included (finding 11; data/README.md case
T3-16).

T3-16 holds one 64x48 clip three times: without a matrix (``a_identity``), with a
left-right mirror (``b_hflip``) and with a half turn (``d_rot180``). Only the rotation
used to be read, so the mirror was turned 180 degrees, a top-bottom mirror ignored and a
transpose turned 90 degrees, all ``ok``. More matrices are written here into the MP4
``tkhd`` box of a clip PyAV makes (FFmpeg exports that box as the frame's display matrix).

The expected pixels never come from ``orientation_of``: they are what FFmpeg itself shows,
by the rule of its CLI's autorotate (fftools/ffmpeg_filter.c: theta = -round(
av_display_rotation_get); 90 -> ``transpose=clock`` or ``cclock_flip`` by the sign of
matrix[3]; 180 -> ``hflip`` if matrix[0] < 0, then ``vflip`` if matrix[4] < 0; 270 ->
``transpose=cclock`` or ``clock_flip``; 0 -> ``vflip`` if matrix[4] < 0), run through
FFmpeg's own filters with a PyAV filter graph on the identity clip's first frame.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.columns import DECODE_FLAGS, FRAMES, HEIGHT, ROTATION_DEG, STATUS, WIDTH
from pipeline.media.video import decode_video, orientation_of
from pipeline.spec import VideoSpec
from pipeline.steps.video import VideoDecodeStep

T316 = Path(__file__).resolve().parents[2] / "data" / "cases" / "T3-16_video_flips" / "videos"
W, H = 64, 48


def rotation_get(m) -> float:
    """libavutil/display.c ``av_display_rotation_get``."""
    conv = [x / 65536 for x in m]
    s0, s1 = math.hypot(conv[0], conv[3]), math.hypot(conv[1], conv[4])
    return -math.degrees(math.atan2(conv[1] / s1, conv[0] / s0))


def ffmpeg_filters(m) -> list[tuple[str, str | None]]:
    """The filters ffmpeg's CLI autorotate inserts for display matrix ``m``
    (fftools/ffmpeg_filter.c, FFmpeg 7/8)."""
    theta = -round(rotation_get(m))
    theta -= 360 * math.floor(theta / 360 + 0.9 / 360)
    if abs(theta - 90) < 1:
        return [("transpose", "cclock_flip" if m[3] > 0 else "clock")]
    if abs(theta - 180) < 1:
        return ([("hflip", None)] if m[0] < 0 else []) + ([("vflip", None)] if m[4] < 0 else [])
    if abs(theta - 270) < 1:
        return [("transpose", "clock_flip" if m[3] < 0 else "cclock")]
    return [("vflip", None)] if m[4] < 0 else []


def ffmpeg_shown(path: Path, m) -> np.ndarray:
    """The first frame of ``path`` through FFmpeg's autorotate filters for ``m``."""
    with av.open(str(path)) as c:
        frame = next(c.decode(video=0)).reformat(format="rgb24")
    filters = ffmpeg_filters(m)
    if not filters:
        return frame.to_ndarray()
    graph = av.filter.Graph()
    node = graph.add_buffer(width=frame.width, height=frame.height, format="rgb24",
                            time_base=frame.time_base)
    src = node
    for name, arg in filters:
        nxt = graph.add(name, arg) if arg else graph.add(name)
        node.link_to(nxt)
        node = nxt
    sink = graph.add("buffersink")
    node.link_to(sink)
    graph.configure()
    src.push(frame)
    return sink.pull().to_ndarray()


def pattern() -> np.ndarray:
    """Four quadrants of different colours: every symmetry moves them differently."""
    a = np.zeros((H, W, 3), np.uint8)
    a[: H // 2, : W // 2] = (250, 0, 0)
    a[: H // 2, W // 2:] = (0, 250, 0)
    a[H // 2:, : W // 2] = (0, 0, 250)
    a[H // 2:, W // 2:] = (250, 250, 250)
    a[2:6, 2:10] = (250, 250, 0)  # a marker in the top-left corner
    return a


def write_clip(path: Path, frames: int = 4) -> Path:
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        f = av.VideoFrame.from_ndarray(pattern(), format="rgb24")
        for _ in range(frames):
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def set_matrix(path: Path, m: list[int]) -> Path:
    """Write the 9 int32 of ``m`` into the (only) ``tkhd`` box's matrix (ISO 14496-12
    8.3.2: after version/flags, times, track id, duration, layer, group, volume)."""
    data = bytearray(path.read_bytes())
    i = data.index(b"tkhd")
    off = i + 4 + 4 + (32 if data[i + 4] == 1 else 20) + 16
    data[off:off + 36] = struct.pack(">9i", *m)
    path.write_bytes(bytes(data))
    return path


def matrix(a: float, b: float, c: float, d: float) -> list[int]:
    return [round(a * 65536), round(b * 65536), 0, round(c * 65536), round(d * 65536), 0,
            0, 0, 1 << 30]


def side_matrix(path: Path) -> list[int] | None:
    with av.open(str(path)) as c:
        f = next(c.decode(video=0))
        sd = f.side_data.get(av.sidedata.sidedata.Type.DISPLAYMATRIX)
    return None if sd is None else np.frombuffer(bytes(sd), "<i4").tolist()


# (name, 2x2 part a, b, c, d; rotation_deg, mirrored)
CASES = [
    ("vflip", (1, 0, 0, -1), 180, True),
    ("transpose", (0, 1, 1, 0), 270, True),
    ("antitranspose", (0, -1, -1, 0), 90, True),
    ("cw90", (0, 1, -1, 0), 90, False),
    ("cw270", (0, -1, 1, 0), 270, False),
    ("rot180", (-1, 0, 0, -1), 180, False),
    ("hflip", (-1, 0, 0, 1), 0, True),
]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("matrix")
    out = {"identity": write_clip(d / "identity.mp4")}
    for name, abcd, _, _ in CASES:
        out[name] = set_matrix(write_clip(d / f"{name}.mp4"), matrix(*abcd))
    return out


def test_t3_16_frames_are_as_ffmpeg_shows_them():
    ident = decode_video(str(T316 / "a_identity.mp4"), VideoSpec())
    assert ident.flags == () and ident.rotation_deg == 0
    for name, rot, flags in [("b_hflip.mp4", 0, ("mirrored",)), ("d_rot180.mp4", 180, ())]:
        path = T316 / name
        m = side_matrix(path)
        info = decode_video(str(path), VideoSpec())
        assert (info.rotation_deg, info.flags, info.width, info.height) == (rot, flags, 64, 48)
        shown = ffmpeg_shown(path, m)
        np.testing.assert_array_equal(info.frames[0], shown)
        # and against the identity clip: the same coded pixels mirrored / turned
        want = ident.frames[0][:, ::-1] if "hflip" in name else ident.frames[0][::-1, ::-1]
        np.testing.assert_array_equal(info.frames[0], want)
        assert not np.array_equal(info.frames[0], np.rot90(ident.frames[0], 2)) or \
            "rot180" in name  # the old result for the mirror was the half turn


@pytest.mark.parametrize("name, abcd, rotation, mirrored", CASES)
def test_generated_matrices_match_ffmpeg_autorotate(clips, name, abcd, rotation, mirrored):
    path = clips[name]
    m = side_matrix(path)
    assert m[:2] + m[3:5] == [x * 65536 for x in abcd]  # FFmpeg read what was written
    shown = ffmpeg_shown(path, m)
    info = decode_video(str(path), VideoSpec(sampling="uniform", num_frames=3))
    assert info.rotation_deg == rotation
    assert info.flags == (("mirrored",) if mirrored else ())
    assert (info.height, info.width, 3) == shown.shape
    for f in info.frames:
        np.testing.assert_array_equal(f, shown)
    # the same as the identity clip through the symmetry (no codec difference)
    ident = decode_video(str(clips["identity"]), VideoSpec(num_frames=1)).frames[0]
    o = orientation_of(m)
    np.testing.assert_array_equal(o.apply(ident), shown)


def test_decode_step_columns_for_a_mirror(clips):
    step = VideoDecodeStep(VideoSpec(num_frames=2))
    batch = step({STATUS: ["ok", "ok"], "_source_path": [str(clips["transpose"]),
                                                          str(clips["identity"])]})
    assert batch[STATUS] == ["ok", "ok"]
    assert batch[DECODE_FLAGS] == [["mirrored"], []]
    assert batch[ROTATION_DEG] == [270, 0]
    assert (batch[WIDTH], batch[HEIGHT]) == ([48, 64], [48, 64][::-1])
    np.testing.assert_array_equal(batch[FRAMES][0][0], batch[FRAMES][1][0].swapaxes(0, 1))


@pytest.mark.parametrize("abcd", [
    (math.cos(math.pi / 4), math.sin(math.pi / 4), -math.sin(math.pi / 4),
     math.cos(math.pi / 4)),                              # 45 degrees
    (1, 0.5, 0, 1),                                       # a shear
])
def test_a_matrix_that_cannot_be_applied_is_flagged_and_left_as_coded(tmp_path, abcd):
    path = set_matrix(write_clip(tmp_path / "odd.mp4"), matrix(*abcd))
    coded = decode_video(str(write_clip(tmp_path / "plain.mp4")), VideoSpec()).frames[0]
    info = decode_video(str(path), VideoSpec())
    assert info.flags == ("display_matrix_unsupported",)
    assert info.rotation_deg == 0 and (info.width, info.height) == (W, H)
    np.testing.assert_array_equal(info.frames[0], coded)


def test_orientation_of_tolerates_a_rounded_quarter_turn():
    """A matrix written from floating point (89.9 degrees) is the quarter turn."""
    r = math.radians(89.9)
    o = orientation_of(matrix(math.cos(r), math.sin(r), -math.sin(r), math.cos(r)))
    assert o is not None and (o.rotation_deg, o.mirrored, o.swap) == (90, False, True)
    assert orientation_of(None).rotation_deg == 0
    assert orientation_of([0] * 9) is None
