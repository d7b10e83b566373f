"""run_partition without Ray on video.clips: fan-out accounting in the marker, clip rows
through the steps in bounded batches, temporary clip files removed, and an attempt whose
fan-out loses an input refused."""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.assembly import assemble
from pipeline.columns import FRAMES, STATUS
from pipeline.errors import PartitionError
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from pipeline.steps.video import VideoDecodeStep
from pipeline.testing.cut_videos import long_video
from tests.conftest import REPO


def clips_spec(out: Path, temp: Path) -> JobSpec:
    return JobSpec.model_validate({
        "source": {"kind": "files", "media": "video", "uri": str(REPO / "data/videos"),
                   "partition_size": 3},
        "sink": {"uri": str(out)},
        "video": {"sampling": "uniform", "num_frames": 2, "temp_dir": str(temp),
                  "clips": {"method": "fixed", "clip_s": 3.0, "min_clip_s": 1.5}},
        "runtime": {"batch_size": 2}, "text_embedding": {"enabled": False}})


def test_a_clip_partition_records_inputs_clips_and_rows_and_streams_clip_rows(tmp_path,
                                                                            monkeypatch):
    spec = clips_spec(tmp_path / "out", tmp_path / "temp")
    (tmp_path / "temp").mkdir()
    seen: list[int] = []
    decode = VideoDecodeStep.__call__

    def counting(self, batch):
        seen.append(len(batch[STATUS]))
        return decode(self, batch)

    monkeypatch.setattr(VideoDecodeStep, "__call__", counting)
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, {}, pool, setup=True)
    part = next(planning.pack(pipeline.datasource.list_inputs(), 3))
    out = run_partition(pipeline, part, "cafe", pool)
    m = out.marker
    assert out.committed and CheckpointStore(spec.sink.uri).marker(m.partition_id) == m
    # files sorted by name: big_buck_bunny (1 s: no clip), chaplin (9.64 s), nasa (13.06 s)
    assert m.rows_per_input == [1, 3, 4] and m.inputs == m.rows_planned == 3
    assert m.clips == 7 and m.rows_in == 8 and m.rows_by_status["rejected"] >= 1
    assert m.rows_by_reason.get("rejected:no_clips") == 1
    assert len([f for f in m.files if f.startswith("clips/")]) == m.rows_by_status["ok"]
    assert max(seen) <= spec.runtime.batch_size and sum(seen) == 8   # clip rows, 2 at a time
    assert not list(Path(tempfile.gettempdir()).glob("mmpipe-clip-*"))
    assert not list((tmp_path / "temp").glob("mmpipe-clip-*"))


def test_an_attempt_whose_fan_out_loses_an_input_is_refused(tmp_path):
    spec = clips_spec(tmp_path / "out", tmp_path / "temp")
    (tmp_path / "temp").mkdir()
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, {}, pool, setup=True)
    split = pipeline.splitter.split

    def losing(batch, counts, keys):   # a splitter that counts no row for an input
        first = len(counts)
        yield from split(batch, counts, keys)
        counts[first] = 0

    pipeline.splitter.split = losing
    part = next(planning.pack(pipeline.datasource.list_inputs(), 3))
    # each read batch's first input (bunny, then nasa) counted with no row
    with pytest.raises(PartitionError, match=r"3 inputs planned, 3 read \(3 counted, 2 with "
                                             r"no row\), 3 rows made, 8 written"):
        run_partition(pipeline, part, "cafe", pool)
    assert CheckpointStore(spec.sink.uri).marker(part.partition_id) is None


_DECODE = VideoDecodeStep.__call__


def streamed(video: str, out: str) -> None:
    """Run one partition of ``video`` in 10-second clips (frames at 2 fps, no clip files)
    and print ``rows``, the most frames any batch held and this process's peak RSS (KiB):
    run in a process of its own, so the peak is this job's."""
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "media": "video", "uri": str(Path(video).parent)},
        "sink": {"uri": out, "rows_per_row_group": 8},     # the Parquet buffer: 8 rows
        "video": {"sampling": "fps", "fps": 2.0, "max_frames": 64,
                  "clips": {"method": "fixed", "clip_s": 10.0, "max_clips": 1000,
                            "transcode": {"enabled": False}}},
        "runtime": {"batch_size": 4}, "text_embedding": {"enabled": False}})
    held: list[int] = []

    def counting(self, batch):
        batch = _DECODE(self, batch)
        held.append(sum(len(f or ()) for f in batch[FRAMES]))
        return batch

    VideoDecodeStep.__call__ = counting
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, {}, pool, setup=True)
    part = next(planning.pack(pipeline.datasource.list_inputs(), 1))
    marker = run_partition(pipeline, part, "cafe", pool).marker
    print(marker.rows_in, max(held), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


@pytest.mark.slow
def test_a_long_video_streams_clip_by_clip(tmp_path):
    """Issue 25 item 7: a video 4x longer holds no more frames, and its job's peak RSS
    stays within 20% (each length in a process of its own)."""
    results = {}
    for minutes in (2, 8):
        video = tmp_path / f"in-{minutes}" / f"long{minutes}.mp4"
        video.parent.mkdir()
        long_video(video, minutes=minutes)
        code = ("from tests.runtime.test_clip_partition import streamed; "
                f"streamed({str(video)!r}, {str(tmp_path / f'out-{minutes}')!r})")
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                              text=True, check=True, timeout=600)
        results[minutes] = tuple(map(int, done.stdout.split()[-3:]))
    (rows2, held2, rss2), (rows8, held8, rss8) = results[2], results[8]
    print(f"peak RSS: 2 min {rss2 / 1024:.0f} MiB, 8 min {rss8 / 1024:.0f} MiB")
    assert (rows2, rows8) == (12, 48)                 # one row per 10-second clip
    assert held2 == held8 == 4 * 20                   # a batch of 4 clips x 20 frames at 2 fps
    assert rss8 <= 1.2 * rss2, (rss2, rss8)
