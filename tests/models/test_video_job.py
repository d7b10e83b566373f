"""Video through a whole job on a real local Ray with model actors: per-frame CLIP
embeddings, the mean-pooled clip embedding, clip_score and a BLIP caption of the middle
frame, next to the broken containers of data/README.md (V06, V08, V09, V10)."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa

from pipeline.read import read_committed
from pipeline.models.registry import load_backend
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec, VideoSpec
from pipeline.media.geometry import model_input
from pipeline.media.video import decode_video
from tests.conftest import CASES, DATA
from tests.e2e.jobs import check_accounting
from tests.models.conftest import section_spec

SERVE = {"replicas": 1, "num_cpus": 0.25}
CAPTION = "a man in a bowler hat walks down a street"
BROKEN = {"zero_empty_stsc": "no_frames", "result_0byte": "empty_file",
          "chunk_out_of_range": "corrupt_container"}


def test_video_job_with_frame_embeddings_clip_score_and_caption(ray_local, tiny_models, tmp_path):
    src = tmp_path / "videos"
    src.mkdir()
    for f in (DATA / "videos").iterdir():
        shutil.copy(f, src / f.name)
    (src / "chaplin.txt").write_text(CAPTION)
    for case in ("V03_vrot/video_rotation_90.mp4", "V06_v0/zero_empty_stsc.mp4",
                 "V08_vcorrupt/result_0byte.webm", "V09_vcorrupt/chunk_out_of_range.mp4",
                 "V10_vcorrupt/corrupted.mp4"):
        shutil.copy(CASES / case, src / case.split("/")[1])
    out = tmp_path / "out"
    video = {"sampling": "uniform", "num_frames": 4}
    spec = JobSpec.model_validate({
        "name": "video-models", "source": {"kind": "files", "media": "video", "uri": str(src),
                                           "partition_size": 4},
        "sink": {"uri": str(out)}, "video": video,
        "runtime": {"batch_size": 2, "num_workers": 1, "max_attempts": 1},
        "text_embedding": {"enabled": False},
        "image_embedding": {"enabled": True, "model": str(tiny_models["tiny-clip"]), **SERVE},
        "captioning": {"enabled": True, "model": str(tiny_models["tiny-blip"]),
                       "max_new_tokens": 6, **SERVE}})
    report = run_job(spec)
    assert report.complete and report.partitions_total == 2
    check_accounting(str(out))
    table = read_committed(str(out))
    dim = table.schema.field("image_embedding").type.list_size
    assert table.schema.field("frame_embeddings").type == pa.list_(pa.list_(pa.float32(), dim))
    rows = {r["key"]: r for r in table.to_pylist()}
    assert len(rows) == 8
    for key, reason in BROKEN.items():
        assert rows[key]["status"] == "error" and rows[key]["error"].startswith(f"{reason}: ")
        assert rows[key]["frame_embeddings"] is None and rows[key]["image_embedding"] is None
    assert rows["corrupted"]["partial"] is True and rows["corrupted"]["status"] == "ok"

    clip = load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models["tiny-clip"])), "cpu")
    for key in ("chaplin", "nasa_13013", "big_buck_bunny_432_433", "video_rotation_90",
                "corrupted"):
        row = rows[key]
        assert row["status"] == "ok", (key, row["error"])
        frames = np.asarray(row["frame_embeddings"], dtype=np.float32)
        assert frames.shape[0] == len(row["frame_timestamps_s"]) == len(row["frames"])
        assert frames.shape[0] == min(4, row["frame_count"])
        pooled = frames.mean(axis=0)
        np.testing.assert_allclose(row["image_embedding"], pooled / np.linalg.norm(pooled),
                                   atol=1e-5)
        assert isinstance(row["generated_caption"], str)
        # the same frames through the same backend in this process
        info = decode_video(str(src / row["source_uri"].rsplit("/", 1)[1]), VideoSpec(**video))
        assert [round(t, 6) for t in info.timestamps_s] == [round(t, 6) for t in
                                                          row["frame_timestamps_s"]]
        pixels = np.stack([model_input(f, clip.info.image) for f in info.frames])
        text = [CAPTION] * len(pixels) if key == "chaplin" else [None] * len(pixels)
        want = clip({"pixels": pixels, "text": text})
        np.testing.assert_allclose(frames, want["image_embedding"], atol=1e-4)
        if key == "chaplin":
            assert abs(row["clip_score"] - float(np.mean(want["clip_score"]))) < 1e-4
        else:
            assert row["clip_score"] is None
