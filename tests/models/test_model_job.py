"""Model steps in whole jobs on a real local Ray: three model pools, the score filter, the
documented column types, per-actor stats, and a batch retried when its actor dies."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from pipeline.read import read_committed
from pipeline.models.registry import load_backend
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec
from pipeline.media.decode import decode_image
from pipeline.media.geometry import model_input
from tests.conftest import PHOTOS, REPO, coco_captions
from tests.e2e.jobs import check_accounting
from tests.models.conftest import photo_pixels, section_spec

SERVE = {"replicas": 1, "num_cpus": 0.25}


def job_spec(out, tiny_models, min_clip_score) -> JobSpec:
    return JobSpec.model_validate({
        "name": "models-e2e",
        "source": {"kind": "manifest", "uri": str(REPO / "data/photos/captions.jsonl"),
                   "path_column": "file", "caption_column": "captions", "key_column": "key",
                   "partition_size": 12},
        "sink": {"uri": str(out), "rows_per_row_group": 8},
        "filters": {"min_width_px": 64, "min_height_px": 64},
        "runtime": {"batch_size": 6, "num_workers": 1, "max_attempts": 1},
        "text_embedding": SERVE,
        "image_embedding": {"enabled": True, "model": str(tiny_models["tiny-clip"]),
                            "embedding_dtype": "float16", "min_clip_score": min_clip_score,
                            **SERVE},
        "captioning": {"enabled": True, "model": str(tiny_models["tiny-blip"]),
                       "max_new_tokens": 8, **SERVE}})


def test_clip_score_filter_blip_and_minilm_through_model_actors(ray_local, tiny_models, tmp_path):
    rows = coco_captions()[:24]
    clip = load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models["tiny-clip"])), "cpu")
    # what a worker sends: decoded once (JPEG draft to the largest consumer, BLIP's 384 px)
    pixels = np.stack([model_input(decode_image((PHOTOS / r["file"]).read_bytes(),
                                                draft_min_side_px=384).pixels, clip.info.image)
                       for r in rows])
    expected = clip({"pixels": pixels, "text": [r["captions"][0] for r in rows]})
    threshold = float(np.median(expected["clip_score"]))
    out = tmp_path / "out"
    report = run_job(job_spec(out, tiny_models, threshold))
    assert report.complete and report.partitions_total == 5
    check_accounting(str(out))

    table = read_committed(str(out))
    schema = table.schema
    assert schema.field("image_embedding").type == pa.list_(pa.float16(), 64)
    assert schema.field("clip_score").type == pa.float32()
    assert schema.field("generated_caption").type == pa.large_string()
    assert schema.field("text_embedding").type == pa.list_(pa.float32(), 384)
    by_key = {r["key"]: r for r in table.to_pylist()}
    low = {r["key"] for r, s in zip(rows, expected["clip_score"]) if s < threshold}
    assert low and len(low) < len(rows)
    for i, r in enumerate(rows):
        got = by_key[r["key"]]
        emb = np.asarray(got["image_embedding"], dtype=np.float32)
        np.testing.assert_allclose(emb, expected["image_embedding"][i], atol=2e-3)
        assert abs(got["clip_score"] - expected["clip_score"][i]) < 1e-4
        assert abs(np.linalg.norm(got["text_embedding"]) - 1) < 1e-4
        if r["key"] in low:
            assert (got["status"], got["reject_reason"]) == ("rejected", "low_clip_score")
            assert got["generated_caption"] is None and got["image"] is None  # not captioned
        else:
            assert got["status"] == "ok" and isinstance(got["generated_caption"], str)
            assert got["generated_caption"] and got["image"] is not None

    stats = {a["model"]: a for a in report.model_actors}
    assert set(stats) == {"text_embedding", "image_embedding", "captioning"}
    assert stats["image_embedding"]["records"] == len(coco_captions())
    assert stats["captioning"]["records"] == report.rows_by_status["ok"]
    for a in stats.values():
        assert a["batches"] >= 1 and 0 < a["busy_fraction"] <= 1 and a["records_per_s"] > 0
        assert a["queue_wait_mean_s"] >= 0 and a["description"]
    assert "busy" in report.format() and "ModelActor-captioning-0" in report.format()
    success = json.loads((out / "_SUCCESS").read_text())
    assert len(success["model_actors"]) == 3


def test_a_batch_whose_actor_died_is_retried_on_another_replica(ray_local, tiny_models):
    import ray

    from pipeline.runtime.model_pool import ModelClient, start_model_pools, stop_model_pools

    spec = section_spec("image_embedding", str(tiny_models["tiny-clip"]), score=False,
                        replicas=2, num_cpus=0.25)
    pools = start_model_pools(spec)
    try:
        (pool,) = pools
        pixels = np.stack([model_input(p, pool.info.image) for p in photo_pixels(3)])
        client = ModelClient(pool.actors, 0)
        want = client.result(client.submit({"pixels": pixels}))["image_embedding"]
        ray.kill(pool.actors[0], no_restart=True)
        client = ModelClient(pool.actors, 0)           # the next batch goes to the dead replica
        got = client.result(client.submit({"pixels": pixels}))["image_embedding"]
        np.testing.assert_allclose(got, want, atol=1e-6)
    finally:
        stop_model_pools(pools)


def test_a_missing_model_fails_the_job_at_start_naming_it(ray_local, tiny_models, tmp_path):
    from pipeline.errors import ModelLoadError

    spec = job_spec(tmp_path / "out", tiny_models, None)
    spec = spec.model_copy(update={"captioning": spec.captioning.model_copy(
        update={"model": str(tmp_path / "missing-blip")})})
    with pytest.raises(ModelLoadError, match="captioning.model .*missing-blip"):
        run_job(spec)
    assert not (tmp_path / "out").exists()                     # nothing ran, nothing written


@pytest.mark.slow
def test_gpu_check_runs_in_reduced_mode(tmp_path):
    """bench/gpu_check.py on a CPU: reduced mode, both checks, a ratio each (about 1 min)."""
    import subprocess
    import sys

    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--reduced",
                           "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"].startswith("reduced") and set(result["checks"]) == {"embedding",
                                                                              "captioning"}
    assert result["gpu_util_source"] == "unavailable"          # no GPU here: said, not faked
    for name, check in result["checks"].items():
        assert check["alone"]["images_per_s"] > 0 and check["mmpipe"]["complete"]
        assert check["ratio_mmpipe_over_alone"] > 0
        assert check["mmpipe"]["gpu_util"] == {"source": "unavailable", "samples": 0}
        n = check["mmpipe"]["records"]
        assert check["mmpipe"]["rows_by_status"]["ok"] == n > 0, (name, check["mmpipe"])
        assert check["mmpipe"]["actor_mean_batch_rows"] > 1
    media = result["checks"]["embedding"]["gpu_media"]
    assert media["complete"] and media["rows_by_status"]["ok"] == media["records"] == 32
    # no GPU here: every JPEG the workers sent encoded was decoded by Pillow in the actor
    decoded = media["actor_media"]["media_actor_cpu_decoded"].get("no_gpu", 0)
    assert decoded + sum(media["actor_media"]["media_worker_decoded"].values()) == 32
    assert decoded > 0 and media["actor_media"]["media_device_decoded"] == 0
    assert result["checks"]["embedding"]["ratio_gpu_media_over_alone"] > 0
    assert set(result["cpu_pipeline"]) == {"1", str(max(2, (os.cpu_count() or 2) - 1))}
    for run in result["cpu_pipeline"].values():
        assert run["complete"] and run["rows_by_status"]["ok"] == run["records"] > 0
    assert result["cpu_pipeline_efficiency"] > 0
