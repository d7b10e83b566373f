"""examples/video_clips.yaml end to end on a fresh local Ray (``mmpipe run --address local``):
one row per clip with its keys and span, clip files that decode to their span, WebDataset
``.mp4`` members, fan-out accounting in the markers, the report and ``mmpipe status``, and a
resume after SIGKILL that leaves each clip committed exactly once."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import av
import pytest

from pipeline.assembly import assemble
from pipeline.output.checkpoint import CheckpointStore
from pipeline.spec import load_spec
from tests.conftest import REPO
from tests.e2e.jobs import clean_ray_env, finish, markers, rows_by_key

VIDEOS = REPO / "data" / "videos"
SPEC = "examples/video_clips.yaml"
#: without the model stages (the README test runs them): split, decode, transcode, write
NO_MODELS = ["--set", "image_embedding.enabled=false", "--set", "captioning.enabled=false"]


def run_clips(out: str, home: Path, *extra: str, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline", "run", SPEC, "--address", "local",
           "--executor", "ray", "--output", out, *NO_MODELS,
           "--set", "runtime.num_workers=1", *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=clean_ray_env(HOME=str(home), HF_HUB_OFFLINE="1"),
                            start_new_session=True, **popen)


def durations() -> dict[str, float]:
    """Video key -> duration (seconds): the end of its last frame, by a plain PyAV decode."""
    out = {}
    for path in VIDEOS.iterdir():
        with av.open(str(path)) as c:
            s = c.streams.best("video")      # the stream FFmpeg (and mmpipe) picks
            out[path.stem] = max(float(f.time + (f.duration or 0) * f.time_base)
                                 for f in c.decode(s))
    return out


def decoded(data: bytes) -> tuple[int, float, int, int]:
    """(frames, duration_s, width, height) of an MP4 by a plain PyAV decode."""
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        frames = list(c.decode(s))
        duration = float(frames[-1].time - frames[0].time) + 1 / float(s.average_rate)
        return len(frames), duration, frames[0].width, frames[0].height


def test_the_example_splits_the_videos_into_clip_rows_and_clip_files(tmp_path):
    out = str(tmp_path / "out")
    report = tmp_path / "report.json"
    home = tmp_path / "home"
    home.mkdir()
    text = finish(run_clips(out, home, "--set", "sink.webdataset.enabled=true",
                            "--report-json", str(report), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True), timeout_s=600)
    rows = rows_by_key(out)
    by_video: dict[str, list[dict]] = {}
    for r in rows.values():
        by_video.setdefault(r["parent_key"] or r["key"], []).append(r)
    assert sorted(by_video) == ["big_buck_bunny_432_433", "chaplin", "nasa_13013"]
    bunny = by_video["big_buck_bunny_432_433"]      # 1.0 s < min_clip_s 1.5: no clip
    assert [(r["key"], r["status"], r["reject_reason"], r["clip_index"]) for r in bunny] == [
        ("big_buck_bunny_432_433", "rejected", "no_clips", None)]
    lengths = durations()
    clips = [r for r in rows.values() if r["parent_key"] is not None]
    for video in ("chaplin", "nasa_13013"):
        mine = sorted(by_video[video], key=lambda r: r["clip_index"])
        assert len(mine) >= 3        # max_clip_s 4 cuts every 9.6 s / 13.1 s video into >= 3
        assert [r["key"] for r in mine] == [f"{video}/{i}" for i in range(len(mine))]
        for r in mine:
            assert 0 <= r["clip_start_s"] < r["clip_end_s"] <= lengths[video] + 1e-3
            assert 1.5 - 1e-6 <= r["clip_end_s"] - r["clip_start_s"] <= 4.0 + 1e-6
            assert all(r["clip_start_s"] - 1e-6 <= t < r["clip_end_s"]
                       for t in r["frame_timestamps_s"])
    members = wds_members(out)
    ok = [r for r in clips if r["status"] == "ok"]
    assert ok
    for r in ok:
        data = (Path(out) / r["clip_path"]).read_bytes()
        assert len(data) == r["clip_bytes"] and members[r["key"] + ".mp4"] == data
        frames, duration, width, height = decoded(data)
        assert abs(frames - r["clip_frames"]) <= 1, r["key"]
        assert abs(duration - (r["clip_end_s"] - r["clip_start_s"])) <= 1 / 25 + 1e-3, r["key"]
        assert (width, height) == (320, 180)      # max_size_px 320, aspect 16:9 kept
    assert not [r for r in clips if r["status"] != "ok" and r["clip_path"] is not None]
    # accounting: inputs, clips and rows in the markers, the report and `mmpipe status`
    found = CheckpointStore(out).markers()
    for m in found.values():
        assert m.inputs == m.rows_planned == len(m.rows_per_input)
        assert sum(m.rows_per_input) == m.rows_in == sum(m.rows_by_status.values())
        assert all(n >= 1 for n in m.rows_per_input)
        assert sorted(f for f in m.files if f.startswith("clips/")) == sorted(
            r["clip_path"] for r in ok if r["partition_id"] == m.partition_id)
    got = json.loads(report.read_text())
    assert (got["inputs_read"], got["clips"], got["rows_out"]) == (3, len(clips), len(rows))
    assert got["complete"] is True
    assert f"3 records planned, 3 read, {len(clips)} clips, {len(rows)} rows out" in text
    status = subprocess.run([sys.executable, "-m", "pipeline", "status", out], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    assert f"3 read, {len(clips)} clips, {len(rows)} rows out" in status


def wds_members(out: str) -> dict[str, bytes]:
    """Member name -> bytes of every committed WebDataset shard."""
    members = {}
    for m in CheckpointStore(out).markers().values():
        for rel in m.files:
            if rel.startswith("wds/"):
                with tarfile.open(Path(out) / rel) as tar:
                    for info in tar.getmembers():
                        members[info.name] = tar.extractfile(info).read()
    return members


def test_method_none_assembles_the_video_job_of_before():
    """``video.clips.method: none`` (the default): no splitter, no clip step or datasink,
    the same steps and the same fingerprint as a spec without the section."""
    plain = assemble(load_spec(REPO / "examples/video.yaml"))
    none = assemble(load_spec(REPO / "examples/video.yaml", ["video.clips.method=none"]))
    clips = assemble(load_spec(REPO / SPEC))
    assert none.splitter is None and none.fingerprint == plain.fingerprint
    assert [s.name for s in none.steps] == [s.name for s in plain.steps]
    assert [s.name for s in none.datasinks] == [s.name for s in plain.datasinks]
    assert clips.splitter is not None and clips.datasinks[0].name == "clips"


@pytest.mark.slow
def test_a_resumed_job_after_sigkill_commits_each_clip_once(tmp_path):
    out = str(tmp_path / "out")
    home = tmp_path / "home"
    home.mkdir()
    one = ["--set", "source.partition_size=1", "--set", "runtime.batch_size=1",
           "--set", "runtime.mode=resume"]            # the example overwrites
    with open(tmp_path / "killed.log", "w") as log:
        proc = run_clips(out, home, *one, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline and not markers(out):
        assert proc.poll() is None, "the job ended before it could be killed"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)          # the driver, mid-job (its workers die with it;
    # the rerun stops the local Ray it left, as tests/e2e/test_resume.py checks)
    proc.wait()
    before = markers(out)
    assert 1 <= len(before) < 3
    finish(run_clips(out, home, *one, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True), timeout_s=600)
    after = markers(out)
    assert len(after) == 3 and all(after[p] == a for p, a in before.items())  # not redone
    rows = rows_by_key(out)          # keys are unique: a repeated clip would collide here
    named = [f for m in CheckpointStore(out).markers().values() for f in m.files
             if f.startswith("clips/")]
    paths = [r["clip_path"] for r in rows.values() if r["clip_path"] is not None]
    assert sorted(paths) == sorted(named) and len(set(paths)) == len(paths)
    assert all((Path(out) / p).is_file() for p in paths)
    assert len(rows) == sum(m.rows_in for m in CheckpointStore(out).markers().values())
