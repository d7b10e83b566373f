"""A video's sampled frames count against ``runtime.max_batch_bytes`` (finding 14, the
video part).

The reproduction: a small 4096x2160 video with ``sampling: fps`` held every candidate
frame (YUV) and then every sampled frame in RGB (26.5 MiB each): GiBs for one row against a
256 MiB batch budget. Now frames are converted as they are sampled and halved in width and
height whenever the frames held would pass the budget (``media.video._FrameStore``): the
row is ``ok``, flagged ``frames_downscaled``, and its frames fit. The video is made here
with PyAV; peak memory is measured in child processes as peak RSS (``ru_maxrss``) against
a child that keeps one frame (tracemalloc does not see the arrays PyAV allocates). Before
the fix the 30-frame row peaked at 1247 MiB RSS (a one-frame child: 208 MiB); after it,
503 MiB (one-frame child: 230 MiB).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.assembly import assemble
from pipeline.columns import (
    DECODE_FLAGS,
    ERROR,
    ERROR_REASON,
    FRAMES,
    HEIGHT,
    STATUS,
    WIDTH,
)
from pipeline.spec import JobSpec, VideoSpec
from pipeline.steps.video import VideoDecodeStep

REPO = Path(__file__).resolve().parents[2]
W4K, H4K, N = 4096, 2160, 30
BUDGET = 256 * 2**20
FULL = W4K * H4K * 3                   # bytes of one full-size RGB frame (26.5 MiB)
SPEC = VideoSpec(sampling="fps", fps=10)  # every one of the 30 frames is sampled


@pytest.fixture(scope="module")
def video_4k(tmp_path_factory) -> Path:
    """30 frames of 4096x2160 at 10 fps, one solid colour each (libx264 if PyAV has it)."""
    path = tmp_path_factory.mktemp("budget") / "dci4k.mp4"
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=10)
        s.width, s.height, s.pix_fmt = W4K, H4K, "yuv420p"
        for i in range(N):
            a = np.full((H4K, W4K, 3), (i * 8, 100, 200 - i * 4), np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def test_4k_fps_frames_stay_within_the_budget(video_4k):
    assert N * FULL > 2.9 * BUDGET  # what the row held before: every frame at full size
    step = VideoDecodeStep(SPEC, BUDGET)
    batch = step({STATUS: ["ok"], "_source_path": [str(video_4k)]})
    assert batch[STATUS] == ["ok"]
    frames = batch[FRAMES][0]
    assert len(frames) == N
    assert {f.shape for f in frames} == {(H4K // 2, W4K // 2, 3)}  # halved once
    assert sum(f.nbytes for f in frames) <= BUDGET
    assert (batch[WIDTH], batch[HEIGHT]) == ([W4K], [H4K])  # the video's own size
    assert batch[DECODE_FLAGS] == [["frames_downscaled"]]
    # the pixels are the video's, halved: frame i's colour
    for i in (0, N // 2, N - 1):
        want = np.array((i * 8, 100, 200 - i * 4))
        assert np.abs(frames[i][H4K // 4, W4K // 4].astype(int) - want).max() <= 6
    # the batch-budget estimate is capped too: this row alone fills one batch
    assert step.decoded_bytes({"_source_path": [str(video_4k)]}, 0) == BUDGET


CHILD = """
import json, resource, sys
from pipeline.spec import VideoSpec
from pipeline.steps.video import VideoDecodeStep
spec = VideoSpec.model_validate_json(sys.argv[2])
step = VideoDecodeStep(spec, int(sys.argv[3]))
batch = step({"status": ["ok"], "_source_path": [sys.argv[1]]})
print(json.dumps({"status": batch["status"][0], "frames": len(batch["_frames"][0] or []),
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def child_peak(path: Path, spec: VideoSpec, budget: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), spec.model_dump_json(),
                          str(budget)], capture_output=True, text=True, cwd=REPO,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_4k_fps_peak_rss_is_bounded_by_the_budget(video_4k):
    """Peak RSS of a child decoding all 30 frames stays within the budget (plus 96 MiB
    of decoder and allocator slack) of a child that keeps one frame."""
    one = child_peak(video_4k, VideoSpec(sampling="uniform", num_frames=1), BUDGET)
    allf = child_peak(video_4k, SPEC, BUDGET)
    assert (one["status"], one["frames"], allf["status"], allf["frames"]) == ("ok", 1, "ok", N)
    assert allf["peak"] - one["peak"] <= BUDGET + 96 * 2**20, (one, allf)


def test_a_budget_too_small_for_any_frame_is_a_too_large_row(video_4k):
    step = VideoDecodeStep(SPEC, 20_000)
    batch = step({STATUS: ["ok"], "_source_path": [str(video_4k)]})
    assert batch[STATUS] == ["error"] and batch[ERROR_REASON] == ["too_large"]
    assert "runtime.max_batch_bytes=20000" in batch[ERROR][0]


def test_small_videos_are_not_downscaled():
    """The bundled videos under the default budget keep their full-size frames."""
    path = REPO / "data" / "videos" / "big_buck_bunny_432_433.webm"
    batch = VideoDecodeStep(VideoSpec(sampling="fps", fps=10), BUDGET)(
        {STATUS: ["ok"], "_source_path": [str(path)]})
    assert batch[DECODE_FLAGS] == [[]]
    assert batch[FRAMES][0][0].shape == (720, 1280, 3)


def test_assembly_gives_the_video_step_the_batch_budget(tmp_path):
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "media": "video", "uri": str(REPO / "data/videos")},
        "sink": {"uri": str(tmp_path / "v")}, "text_embedding": {"enabled": False},
        "runtime": {"max_batch_bytes": 12345678}})
    pipeline = assemble(spec)
    (step,) = [s for s in pipeline.steps if isinstance(s, VideoDecodeStep)]
    assert step.frame_budget_bytes == 12345678
    names = [f.name for f in pipeline.fields()]
    assert {"decode_flags", "low_detail"} <= set(names)
