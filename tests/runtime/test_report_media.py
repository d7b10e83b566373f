"""The model actor's report line names how images were decoded only when the actor decoded
or received images itself (``decode.device: cuda``)."""

from __future__ import annotations

from pipeline.runtime.report import format_model_actor

SERVING = {"name": "ModelActor-image_embedding-0", "description": "clip", "records": 10,
           "batches": 2, "mean_batch_rows": 5.0, "records_per_s": 1.0, "busy_fraction": 0.5,
           "idle_fraction": 0.5, "queue_wait_mean_s": 0.01}
NOTHING = {"media_device_decoded": 0, "media_actor_cpu_decoded": {},
           "media_worker_decoded": {}, "media_decode_errors": {}, "media_images_encoded": {}}


def test_a_cpu_jobs_actor_line_has_no_media_counts():
    assert "images decoded" not in format_model_actor({**SERVING, **NOTHING})
    assert "images decoded" not in format_model_actor(SERVING)        # a text model


def test_a_cuda_jobs_actor_line_counts_each_path():
    line = format_model_actor({**SERVING, **NOTHING, "media_device_decoded": 7,
                               "media_actor_cpu_decoded": {"nvjpeg_error": 1},
                               "media_worker_decoded": {"icc_profile": 2, "not_jpeg": 1},
                               "media_decode_errors": {"truncated": 1},
                               "media_images_encoded": {"nvjpeg": 7, "pillow": 1}})
    assert line.endswith("; images decoded on the device 7, in the actor by Pillow 1 "
                         "(nvjpeg_error 1), on the workers 3 (icc_profile 2, not_jpeg 1), "
                         "undecodable 1 (truncated 1), output images encoded 8 (nvjpeg 7, "
                         "pillow 1)")
