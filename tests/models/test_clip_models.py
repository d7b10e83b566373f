"""Per-clip model work (issue 25 item 4): a multi-frame Qwen2-VL captioner
(``captioning.frames``) and the X-CLIP video embedding (``image_embedding.backend:
xclip``), as tiny random checkpoints through the normal loading path, in a video job on a
real local Ray and in-process."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest

from pipeline.errors import ModelLoadError, SpecError
from pipeline.media.geometry import model_input
from pipeline.media.video import decode_video
from pipeline.models.registry import check_models, load_backend
from pipeline.read import read_committed
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec, VideoSpec, load_spec
from pipeline.steps.model import ModelStep, frame_window
from tests.conftest import DATA
from tests.e2e.jobs import check_accounting
from tests.models.conftest import photo_pixels, section_spec

VIDEOS = ("chaplin", "nasa_13013", "big_buck_bunny_432_433")
VIDEO = {"sampling": "uniform", "num_frames": 6}
WINDOW = 4  # caption frames per row
SERVE = {"replicas": 1, "num_cpus": 0.25}


@pytest.fixture(scope="module")
def clip_models(tmp_path_factory) -> dict:
    from pipeline.testing.tiny_models import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("clip-models"),
                             names=("tiny-qwen2-vl", "tiny-xclip"))


def _caption_spec(models, **fields):
    return section_spec("captioning", str(models["tiny-qwen2-vl"]), frames=WINDOW,
                        max_new_tokens=5, min_new_tokens=5, image_size_px=56, **fields)


def _xclip_spec(models, **fields):
    return section_spec("image_embedding", str(models["tiny-xclip"]), backend="xclip",
                        score=False, **fields)


def _video_job(src, out, models) -> JobSpec:
    return JobSpec.model_validate({
        "name": "clip-models", "source": {"kind": "files", "media": "video", "uri": str(src),
                                          "partition_size": 2},
        "sink": {"uri": str(out)}, "video": VIDEO,
        "runtime": {"batch_size": 2, "num_workers": 1, "max_attempts": 1},
        "text_embedding": {"enabled": False},
        "image_embedding": {"enabled": True, "model": str(models["tiny-xclip"]),
                            "backend": "xclip", "score": False, **SERVE},
        "captioning": {"enabled": True, "model": str(models["tiny-qwen2-vl"]),
                       "frames": WINDOW, "max_new_tokens": 5, "min_new_tokens": 5,
                       "image_size_px": 56, **SERVE}})


def test_frame_window_spreads_frames_evenly_and_repeats_short_stacks():
    stack = np.arange(6)[:, None, None, None] * np.ones((6, 2, 2, 3), np.uint8)
    assert frame_window(stack, 4)[:, 0, 0, 0].tolist() == [0, 2, 3, 5]
    assert frame_window(stack, 6)[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert frame_window(stack[:2], 4)[:, 0, 0, 0].tolist() == [0, 0, 1, 1]
    assert frame_window(stack, 4).shape == (4, 2, 2, 3)


@pytest.fixture
def videos(tmp_path):
    """The three bundled real videos (data/videos, the same files as shared/data/videos)."""
    src = tmp_path / "videos"
    src.mkdir()
    for name in ("chaplin.mp4", "nasa_13013.mp4", "big_buck_bunny_432_433.webm"):
        shutil.copy(DATA / "videos" / name, src / name)
    return src


def _run(src, out, models):
    report = run_job(_video_job(src, out, models))
    assert report.complete and report.partitions_total == 2
    check_accounting(str(out))
    return report, {r["key"]: r for r in read_committed(str(out)).to_pylist()}


def test_video_job_captions_frame_windows_and_embeds_videos_with_xclip(
        ray_local, clip_models, videos, tmp_path):
    report, rows = _run(videos, tmp_path / "out", clip_models)
    schema = read_committed(str(tmp_path / "out")).schema
    assert "frame_embeddings" not in schema.names  # xclip: one vector per row
    assert schema.field("image_embedding").type == pa.list_(pa.float32(), 32)
    assert sorted(rows) == sorted(VIDEOS)
    assert all(r["status"] == "ok" for r in rows.values()), rows
    stats = {s["model"]: s for s in report.model_actors}
    # every video row reached the captioner as one window of WINDOW frames, and the
    # X-CLIP embedder as one of its num_frames (4)
    assert stats["captioning"]["frame_windows"] == len(VIDEOS)
    assert stats["captioning"]["window_frames"] == WINDOW * len(VIDEOS)
    assert stats["image_embedding"]["frame_windows"] == len(VIDEOS)
    assert stats["image_embedding"]["window_frames"] == 4 * len(VIDEOS)
    assert "3 frame windows (12 frames)" in report.format()
    for row in rows.values():
        assert isinstance(row["generated_caption"], str) and row["generated_caption"].strip()
    emb = np.asarray([rows[k]["image_embedding"] for k in VIDEOS], dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    for i in range(len(VIDEOS)):
        for j in range(i):
            assert np.abs(emb[i] - emb[j]).max() > 1e-3, (VIDEOS[i], VIDEOS[j])

    # a second run of each model, in this process, on the same window of the same
    # frames: the same caption (greedy) and the same embedding
    xclip = load_backend("image_embedding", _xclip_spec(clip_models), "cpu")
    captioner = load_backend("captioning", _caption_spec(clip_models), "cpu")
    for i, key in enumerate(VIDEOS):
        path = videos / rows[key]["source_uri"].rsplit("/", 1)[1]
        frames = decode_video(str(path), VideoSpec(**VIDEO)).frames
        assert len(frames) == 6
        for backend, width in ((xclip, 4), (captioner, WINDOW)):
            stack = np.stack([model_input(f, backend.info.image) for f in frames])
            window = frame_window(stack, width)[None]
            if backend is xclip:
                np.testing.assert_allclose(backend({"pixels": window})["image_embedding"][0],
                                           emb[i], atol=1e-4)
            else:
                want = backend({"pixels": window})["generated_caption"][0]
                assert want == rows[key]["generated_caption"], key


@pytest.mark.slow
def test_two_runs_of_the_video_job_give_the_same_captions_and_embeddings(
        ray_local, clip_models, videos, tmp_path):
    _, first = _run(videos, tmp_path / "a", clip_models)
    _, second = _run(videos, tmp_path / "b", clip_models)
    assert sorted(first) == sorted(second) == sorted(VIDEOS)
    for key in VIDEOS:
        assert first[key]["generated_caption"] == second[key]["generated_caption"]
        np.testing.assert_allclose(first[key]["image_embedding"],
                                   second[key]["image_embedding"], atol=1e-6)


def test_xclip_embeds_an_image_as_a_still_clip(clip_models):
    xclip = load_backend("image_embedding", _xclip_spec(clip_models), "cpu")
    g = xclip.info.image
    assert (xclip.info.frames, g.mode, g.height_px) == (4, "center_crop", 224)
    pixels = np.stack([model_input(p, g) for p in photo_pixels(3)])
    still = xclip({"pixels": pixels})["image_embedding"]
    assert still.shape == (3, 32) and still.dtype == np.float32
    windows = np.repeat(pixels[:, None], 4, axis=1)
    np.testing.assert_allclose(still, xclip({"pixels": windows})["image_embedding"], atol=1e-6)
    with pytest.raises(ValueError, match="windows of 4 frames, got 3"):
        xclip({"pixels": windows[:, :3]})
    half = _xclip_spec(clip_models, embedding_dtype="float16")
    assert load_backend("image_embedding", half, "cpu")(
        {"pixels": pixels})["image_embedding"].dtype == np.float16


def test_captioner_takes_one_image_for_image_rows_and_counts_only_windows(clip_models):
    captioner = load_backend("captioning", _caption_spec(clip_models), "cpu")
    assert captioner.info.frames == WINDOW and captioner.info.image.height_px == 56
    pixels = np.stack([model_input(p, captioner.info.image) for p in photo_pixels(2)])
    captions = captioner({"pixels": pixels})["generated_caption"]
    assert len(captions) == 2 and all(isinstance(c, str) and c for c in captions)
    assert captioner.media_stats() == {"frame_windows": 0, "window_frames": 0}
    captioner({"pixels": np.stack([pixels] * WINDOW, axis=1)})
    assert captioner.media_stats() == {"frame_windows": 2, "window_frames": 2 * WINDOW}


def test_frames_setting_is_left_out_of_the_fingerprint_until_set(clip_models):
    plain = section_spec("captioning", str(clip_models["tiny-qwen2-vl"]))
    assert "frames" not in ModelStep("captioning", plain.captioning).settings()
    assert ModelStep("captioning", _caption_spec(clip_models).captioning,
                     video=True).settings()["frames"] == WINDOW
    xclip = ModelStep("image_embedding", _xclip_spec(clip_models).image_embedding, video=True)
    assert "frame_embeddings" not in xclip.writes and "image_embedding" in xclip.writes


def test_bad_frame_and_xclip_settings_are_refused_naming_the_field(clip_models, tmp_path):
    blip = section_spec("captioning", str(clip_models["tiny-qwen2-vl"]), backend="blip",
                        frames=4)
    with pytest.raises(ModelLoadError, match="captioning.frames 4: backend 'blip'"):
        check_models(blip)
    with pytest.raises(ModelLoadError, match="backend xclip needs an X-CLIP checkpoint"):
        check_models(section_spec("image_embedding", str(clip_models["tiny-qwen2-vl"]),
                                  backend="xclip", score=False))
    with pytest.raises(ModelLoadError, match="set image_embedding.backend \\(xclip"):
        check_models(section_spec("image_embedding", str(clip_models["tiny-xclip"])))
    spec = tmp_path / "job.yaml"
    spec.write_text(f"source: {{kind: files, uri: in}}\nsink: {{uri: out}}\n"
                    f"image_embedding: {{enabled: true, model: {clip_models['tiny-xclip']}, "
                    f"backend: xclip}}\ncaptioning: {{frames: 0}}\n")
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert "image_embedding.score" in str(err.value) and "captioning.frames" in str(err.value)
    spec.write_text(f"source: {{kind: files, uri: in}}\nsink: {{uri: out}}\n"
                    f"decode: {{device: cuda}}\nimage_embedding: {{enabled: true, model: "
                    f"{clip_models['tiny-xclip']}, backend: xclip, score: false}}\n")
    with pytest.raises(SpecError, match="decode.device.*image_embedding.backend is xclip"):
        load_spec(spec)


@pytest.mark.slow
def test_clip_rows_are_captioned_and_embedded_from_frames_inside_their_span(
        ray_local, clip_models, videos, tmp_path):
    spec = _video_job(videos, tmp_path / "out", clip_models).model_dump(mode="json")
    spec["video"]["clips"] = {"method": "fixed", "clip_s": 4.0, "min_clip_s": 1.5,
                              "transcode": {"enabled": False}}
    report = run_job(JobSpec.model_validate(spec))
    assert report.complete
    check_accounting(str(tmp_path / "out"), planned=False)  # the plan counts videos
    rows = [r for r in read_committed(str(tmp_path / "out")).to_pylist() if r["status"] == "ok"]
    # chaplin 9.6 s: 0-4-8-9.6; nasa 13.1 s: 0-4-8-12 (12-13.1 is under min_clip_s); the
    # 1-second bunny has none
    assert sorted(r["key"] for r in rows) == [f"{v}/{i}" for v in ("chaplin", "nasa_13013")
                                             for i in range(3)]
    stats = {s["model"]: s for s in report.model_actors}
    assert stats["captioning"]["window_frames"] == WINDOW * len(rows)
    assert stats["image_embedding"]["frame_windows"] == len(rows)
    for row in rows:
        assert row["key"] == f"{row['parent_key']}/{row['clip_index']}"
        assert all(row["clip_start_s"] <= t < row["clip_end_s"]
                   for t in row["frame_timestamps_s"])
        assert isinstance(row["generated_caption"], str) and row["generated_caption"].strip()
        assert abs(np.linalg.norm(row["image_embedding"]) - 1) < 1e-5
