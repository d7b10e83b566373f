"""FFmpeg reads the one video file and nothing else (finding 3 of "trust at the edges,
round 3").

The attack: an HLS playlist (``.m3u8``) or an ffconcat list inside the input root that
names a video outside it. Plain FFmpeg (``av.open(path)``) follows the entry and decodes
the outside video's frames, so the row was ``ok`` with someone else's pixels. Confined
(``media.video._Input``), FFmpeg refuses every demuxer that opens other files before
anything is read (an ``unsupported_format`` error row) and may open no second file at all;
``video.allow_playlists: true`` is the documented way back. Every file is made here with
PyAV; the outside video is a solid red no input-root video is.
"""

from __future__ import annotations

import os
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.columns import ERROR, ERROR_REASON, FRAMES, STATUS
from pipeline.errors import RecordError
from pipeline.media.video import decode_video, decoded_frames_bytes
from pipeline.spec import VideoSpec
from pipeline.steps.video import VideoDecodeStep

RED = (200, 10, 10)
BLUE = (10, 10, 200)


def solid(path: Path, color, fmt: str | None = None, frames: int = 6) -> Path:
    """A 64x48 video of ``frames`` solid ``color`` frames (mpeg4 in MP4, or MPEG-2 in a
    transport stream for an HLS segment)."""
    codec = "mpeg2video" if fmt == "mpegts" else "mpeg4"
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), color, np.uint8),
                                           format="rgb24")
        for _ in range(frames):
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


@pytest.fixture
def tree(tmp_path) -> dict[str, Path]:
    """``root/`` (the input root: a real video, two playlists, two concat lists, a symlink
    to the outside) and ``outside/`` (the secret videos)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    solid(outside / "secret.ts", RED, fmt="mpegts")
    solid(outside / "secret.mp4", RED)
    solid(root / "own.mp4", BLUE)
    (root / "relative.m3u8").write_text(
        "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:1.0,\n../outside/secret.ts\n"
        "#EXT-X-ENDLIST\n")
    (root / "absolute.m3u8").write_text(
        "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:1.0,\n"
        f"{outside / 'secret.ts'}\n#EXT-X-ENDLIST\n")
    # ffconcat's own "safe" mode refuses absolute and ../ entries, but not a symlink in
    # the root that points outside; the .mp4 name shows FFmpeg sniffs the content.
    os.symlink(outside / "secret.mp4", root / "innocent_link.mp4")
    concat = "ffconcat version 1.0\nfile innocent_link.mp4\n"
    (root / "list.ffconcat").write_text(concat)
    (root / "list_named.mp4").write_text(concat)
    return {"root": root, "outside": outside}


def first_pixel(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return next(c.decode(video=0)).to_ndarray(format="rgb24")[0, 0]


ATTACKS = ["relative.m3u8", "absolute.m3u8", "list.ffconcat", "list_named.mp4"]


@pytest.mark.parametrize("name", ATTACKS)
def test_plain_ffmpeg_follows_the_entry_outside_the_root(tree, name):
    """The attack is real: FFmpeg as it was opened (a path, no whitelist) decodes the
    outside video's red frames from a file inside the root."""
    assert np.abs(first_pixel(tree["root"] / name).astype(int) - RED).max() <= 6


@pytest.mark.parametrize("name", ATTACKS)
def test_playlist_naming_an_outside_video_is_an_error_row_without_its_frames(tree, name):
    step = VideoDecodeStep(VideoSpec(sampling="fps", fps=10))
    batch = step({STATUS: ["ok", "ok"], "_source_path": [str(tree["root"] / name),
                                                          str(tree["root"] / "own.mp4")]})
    assert batch[STATUS] == ["error", "ok"]
    assert batch[ERROR_REASON][0] == "unsupported_format"
    assert "video.allow_playlists" in batch[ERROR][0]
    assert batch[FRAMES][0] is None
    own = batch[FRAMES][1]
    assert len(own) == 6 and np.abs(own[0][0, 0].astype(int) - BLUE).max() <= 6
    # the batch-budget estimate opens the file too, confined the same way
    assert decoded_frames_bytes(str(tree["root"] / name), VideoSpec()) == 0


@pytest.mark.parametrize("name", ["relative.m3u8", "list.ffconcat"])
def test_allow_playlists_opens_local_entries(tree, name):
    """The setting is the documented way back (trusted input): the same files decode."""
    info = decode_video(str(tree["root"] / name), VideoSpec(allow_playlists=True))
    assert np.abs(info.frames[0][0, 0].astype(int) - RED).max() <= 6
    with pytest.raises(RecordError) as e:
        decode_video(str(tree["root"] / name), VideoSpec())
    assert e.value.reason == "unsupported_format"


def test_confined_open_still_reads_ordinary_containers(tmp_path):
    """MP4, Matroska, WebM, MPEG-TS and AVI open through the confined reader."""
    for name, fmt in [("a.mp4", None), ("b.mkv", None), ("c.ts", "mpegts"), ("d.avi", None)]:
        info = decode_video(str(solid(tmp_path / name, BLUE, fmt=fmt)),
                            VideoSpec(sampling="fps", fps=10))
        assert info.frame_count == 6, name
        assert np.abs(info.frames[0][0, 0].astype(int) - BLUE).max() <= 6, name


def test_a_job_over_the_root_gives_the_playlists_error_rows(ray_local, tree, tmp_path):
    """The finding as reported, through a real job on a local Ray: the files datasource
    lists the playlists (``.m3u8`` and ``.ffconcat`` added to ``source.extensions``) and
    the committed rows are errors with no frames, while the root's own video is ``ok``.
    The symlink to the outside is refused by the input roots (``outside_input_root``)."""
    from pipeline.runtime.driver import run_job
    from pipeline.spec import JobSpec
    from tests.e2e.jobs import rows_by_key

    out = tmp_path / "out"
    spec = JobSpec.model_validate({
        "name": "confine", "text_embedding": {"enabled": False},
        "source": {"kind": "files", "media": "video", "uri": str(tree["root"]),
                   "extensions": [".mp4", ".m3u8", ".ffconcat"]},
        "sink": {"uri": str(out)}, "video": {"sampling": "fps", "fps": 10},
        "runtime": {"num_workers": 1, "batch_size": 8}})
    report = run_job(spec)
    assert report.complete
    rows = rows_by_key(str(out))
    for key in ("relative", "absolute", "list", "list_named"):
        r = rows[key]
        assert (r["status"], r["error_reason"]) == ("error", "unsupported_format"), key
        assert r["frames"] is None and r["image"] is None, key
    own = rows["own"]
    assert own["status"] == "ok" and len(own["frames"]) == 6
    link = rows["innocent_link"]
    assert (link["status"], link["error_reason"]) == ("error", "outside_input_root")
    assert link["frames"] is None
