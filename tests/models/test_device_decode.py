"""``decode.device: cuda`` in the image-embedding backend (``models/media.py``), on CPU.

This machine has no GPU and no torchvision, so the real nvJPEG call never runs here. What
runs: (a) the actor's Pillow fallback - the branch every JPEG takes without nvJPEG - and
(b) the device branch itself (one batched decode, per-image retry, EXIF orientation on the
tensor, torch resize and crop, assembly) with nvJPEG replaced by a stand-in that decodes
like it does: full resolution, RGB, EXIF ignored. Also one whole job through the runner.

Tolerance of the device branch against the ``cpu`` path (Pillow, JPEG draft, Pillow
bicubic) on the bundled photos: cosine of the image embeddings >= 0.999 with the tiny
random CLIP (measured: >= 0.9999), mean absolute model-input difference <= 4 of 255 per
image; output images within 1 px of the ``cpu`` size (computed from the full-resolution
size, not the draft's) and, brought to that size, within a mean of 6 of 255 (measured:
<= 3.9). The Pillow fallback equals the ``cpu`` path exactly (inputs and output images).
"""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.columns import IMAGE_EMBEDDING
from pipeline.read import read_committed
from pipeline.contracts import ImageGeometry
from pipeline.models.media import MediaDecoder, fit, orient
from pipeline.models.registry import load_backend
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec, ResizeSpec
from pipeline.media.decode import _TRANSPOSE, decode_image
from pipeline.media.device import MEDIA_ERRORS, MEDIA_IMAGES, HostDecoded, JpegInput, device_input
from pipeline.media.transform import encode, phash64, resize_pixels
from pipeline.media.geometry import model_input
from tests.conftest import CASES, PHOTOS, TRUNCATED_JPEG, coco_captions
from tests.e2e.jobs import check_accounting
from tests.models.conftest import section_spec

DRAFT = 256  # the worker's draft size for the default resize (256 px) and CLIP (224 px)
RESIZE = ResizeSpec()
EXIF = ["C06_exif/hopper_orientation_6.jpg", "C07_exif/orientation_rectangle.jpg"]
GREY = "C47_gray/hopper_gray.jpg"
CMYK = "C12_cmyk/jpg-cmyk-2.jpg"
PNG = "C40_ext/hopper_png_bytes.jpg"


def stand_in_nvjpeg(data: list[torch.Tensor]) -> list[torch.Tensor]:
    """What nvJPEG returns: (3, H, W) uint8 at full resolution, EXIF not applied."""
    return [torch.from_numpy(np.array(Image.open(io.BytesIO(d.numpy().tobytes()))
                                      .convert("RGB"))).permute(2, 0, 1) for d in data]


def cpu_path(data: bytes, geometry) -> np.ndarray:
    """A ``cpu`` job's model input: decoded on the worker (draft), resized with Pillow."""
    return model_input(decode_image(data, draft_min_side_px=DRAFT).pixels, geometry)


def cpu_image(data: bytes) -> tuple[bytes, int, int]:
    """A ``cpu`` job's output ``image``, ``image_width``, ``image_height``."""
    img = resize_pixels(decode_image(data, draft_min_side_px=DRAFT).pixels, RESIZE)
    return encode(img, RESIZE), img.width, img.height


def entry(data: bytes, geometry):
    """What a worker of a ``cuda`` job sends for ``data``."""
    got = device_input(data, 10**9, DRAFT, RESIZE)
    return HostDecoded(cpu_path(data, geometry), got) if isinstance(got, str) else got


def inputs() -> list[bytes]:
    photos = [(PHOTOS / r["file"]).read_bytes() for r in coco_captions()]
    return photos + [(CASES / c).read_bytes() for c in EXIF + [GREY, CMYK, PNG]]


@pytest.fixture(scope="module")
def clip(tiny_models):
    return load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models["tiny-clip"]), score=False), "cpu")


@pytest.fixture(scope="module")
def expected(clip):
    """``cpu`` path embeddings of ``inputs()``."""
    pixels = np.stack([cpu_path(d, clip.geometry) for d in inputs()])
    return clip({"pixels": pixels})[IMAGE_EMBEDDING]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_on_the_tensor_is_pillows_exif_transpose(orientation):
    pixels = np.random.default_rng(orientation).integers(0, 255, (5, 7, 3), np.uint8)
    want = Image.fromarray(pixels)
    if orientation in _TRANSPOSE:
        want = want.transpose(_TRANSPOSE[orientation])
    got = orient(torch.from_numpy(pixels).permute(2, 0, 1), orientation).permute(1, 2, 0)
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))


def test_torch_resize_and_crop_match_pillows(clip):
    for r in coco_captions()[:6]:
        pixels = np.array(Image.open(PHOTOS / r["file"]).convert("RGB"))
        got = fit(torch.from_numpy(pixels).permute(2, 0, 1), clip.geometry).numpy()
        want = model_input(pixels, clip.geometry)
        assert got.shape == want.shape == (224, 224, 3) and got.dtype == np.uint8
        assert np.abs(got.astype(int) - want).mean() < 1.0


def test_pillow_fallback_in_the_actor_equals_the_cpu_path(clip, expected):
    """No GPU here: every JPEG is decoded with Pillow in the actor, counted ``no_gpu``."""
    decoder = clip.media = MediaDecoder(clip.geometry, "cpu")
    entries = [entry(d, clip.geometry) for d in inputs()]
    out = clip({"pixels": entries})
    np.testing.assert_allclose(out[IMAGE_EMBEDDING], expected, atol=1e-6)
    assert out[MEDIA_ERRORS] == [None] * len(entries)
    for d, e, image in zip(inputs(), entries, out[MEDIA_IMAGES]):
        assert image == (cpu_image(d) if isinstance(e, JpegInput) else None)
    stats = decoder.stats()
    encoded = sum(isinstance(e, JpegInput) for e in entries)
    assert stats["media_images_encoded"] == {"pillow": encoded}
    assert stats["media_device_decoded"] == 0
    assert stats["media_actor_cpu_decoded"] == {"no_gpu": encoded}
    worker = stats["media_worker_decoded"]
    assert worker["mode_cmyk"] == 1 and worker["not_jpeg"] == 1 and worker["icc_profile"] >= 1
    assert sum(worker.values()) + encoded == len(entries)


def test_device_branch_matches_the_cpu_path_within_tolerance(clip, expected):
    decoder = clip.media = MediaDecoder(clip.geometry, "cpu", stand_in_nvjpeg)
    data = inputs()
    entries = [entry(d, clip.geometry) for d in data]
    out = clip({"pixels": entries})
    cosine = np.sum(out[IMAGE_EMBEDDING] * expected, axis=1)
    assert cosine.min() >= 0.999, cosine.min()
    media, diffs = decoder(entries), []
    for d, got in zip(data, media.pixels.numpy()):
        assert np.abs(got.astype(int) - cpu_path(d, clip.geometry)).mean() <= 4
    assert media.errors == [None] * len(entries)
    for d, e, image in zip(data, entries, media.images):
        if not isinstance(e, JpegInput):
            assert image is None
            continue
        want, width, height = cpu_image(d)
        # sizes from the full-resolution dims; a cpu job's from its draft's: may round apart
        assert abs(image[1] - width) <= 1 and abs(image[2] - height) <= 1
        got = Image.open(io.BytesIO(image[0])).resize((width, height), Image.Resampling.BICUBIC)
        want = np.asarray(Image.open(io.BytesIO(want)), dtype=int)
        diffs.append(np.abs(np.asarray(got, dtype=int) - want).mean())
    assert max(diffs) <= 6, max(diffs)             # measured: <= 3.9 (1 px size offsets)
    encoded = sum(isinstance(e, JpegInput) for e in entries)
    assert decoder.stats()["media_device_decoded"] == 2 * encoded  # two calls above
    assert decoder.stats()["media_actor_cpu_decoded"] == {}
    # the EXIF-rotated and greyscale cases went the device way and match
    for case in EXIF + [GREY]:
        assert isinstance(entry((CASES / case).read_bytes(), clip.geometry), JpegInput)
    assert cosine[len(coco_captions()):len(coco_captions()) + 3].min() >= 0.999


def test_a_failing_batch_is_retried_per_image_and_a_broken_jpeg_is_an_error_row(clip):
    broken = (CASES / TRUNCATED_JPEG).read_bytes()
    good = [(PHOTOS / r["file"]).read_bytes() for r in coco_captions()[:3]]
    entries = [JpegInput(good[0], 1, 10**9, DRAFT), JpegInput(broken, 1, 10**9, DRAFT),
               JpegInput(good[1], 1, 10**9, DRAFT), JpegInput(good[2], 1, 10**9, DRAFT)]
    calls = []

    def flaky_nvjpeg(data):
        calls.append(len(data))
        if any(d.numel() == len(broken) for d in data):
            raise RuntimeError("nvjpegDecode failed: 6")
        return stand_in_nvjpeg(data)

    decoder = clip.media = MediaDecoder(clip.geometry, "cpu", flaky_nvjpeg)
    out = clip({"pixels": entries})
    assert calls == [4, 1, 1, 1, 1]                      # the batch, then one by one
    errors = out[MEDIA_ERRORS]
    assert errors[0] is None and errors[2:] == [None, None]
    assert errors[1][0] == "truncated" and "JPEG" in errors[1][1]
    stats = decoder.stats()
    assert stats["media_device_decoded"] == 3
    assert stats["media_actor_cpu_decoded"] == {"nvjpeg_error": 1}
    assert stats["media_decode_errors"] == {"truncated": 1}
    alone = clip({"pixels": [entries[0]]})[IMAGE_EMBEDDING][0]
    np.testing.assert_allclose(out[IMAGE_EMBEDDING][0], alone, atol=1e-5)


def test_device_decoding_is_cut_into_chunks_by_header_pixels(clip):
    """With a budget of 2.5 times the smallest photo's pixels per nvJPEG call, 6 photos go
    in calls of at most 2 images (by the header sizes), and the results equal one call's."""
    data = [(PHOTOS / r["file"]).read_bytes() for r in coco_captions()]
    entries = [e for e in (device_input(d, 10**9, DRAFT) for d in data)
               if isinstance(e, JpegInput)][:6]
    assert len(entries) == 6 and all(e.pixels > 0 for e in entries)
    calls = []

    def counting(batch):
        calls.append(len(batch))
        return stand_in_nvjpeg(batch)

    whole = MediaDecoder(clip.geometry, "cpu", stand_in_nvjpeg)(entries).pixels
    decoder = MediaDecoder(clip.geometry, "cpu", counting)
    decoder.chunk_pixels = int(2.5 * min(e.pixels for e in entries))  # 3 never fit
    got = decoder(entries)
    assert len(calls) >= 3 and max(calls) <= 2 and sum(calls) == 6, calls
    assert torch.equal(got.pixels, whole) and got.errors == [None] * 6


def test_array_batches_keep_the_fast_path(clip):
    pixels = np.stack([cpu_path(d, clip.geometry) for d in inputs()[:2]])
    out = clip({"pixels": pixels})
    assert set(out) == {IMAGE_EMBEDDING}


def test_a_cuda_job_runs_through_the_runner_on_cpu_actors(ray_local, tiny_models, clip,
                                                          tmp_path):
    """The whole job with ``decode.device: cuda`` and CPU model actors: JPEGs travel encoded
    and are decoded by Pillow in the actor, which also makes their output image; the rest
    travel as arrays; embeddings and images equal a ``cpu`` job's; a truncated JPEG is an
    error row (its draft decode on the worker fails); every partition reconciles."""
    src = tmp_path / "in"
    src.mkdir()
    files = {r["file"].removesuffix(".jpg"): PHOTOS / r["file"] for r in coco_captions()[:8]}
    files.update({c.split("/")[1].rsplit(".", 1)[0]: CASES / c
                  for c in EXIF + [GREY, CMYK, PNG]})
    files["truncated_jpeg"] = CASES / TRUNCATED_JPEG
    for key, path in files.items():
        shutil.copy(path, src / f"{key}.jpg")
    out = tmp_path / "out"
    report = run_job(JobSpec.model_validate({
        "name": "device-decode", "source": {"kind": "files", "uri": str(src),
                                            "partition_size": 7},
        "sink": {"uri": str(out), "hash_columns": ["phash"]}, "decode": {"device": "cuda"},
        "dedup": {"near": False},                   # the hopper cases are near duplicates
        "runtime": {"batch_size": 4, "num_workers": 1, "max_attempts": 1},
        "text_embedding": {"enabled": False},
        "image_embedding": {"enabled": True, "model": str(tiny_models["tiny-clip"]),
                            "score": False, "replicas": 1, "num_cpus": 0.25}}))
    assert report.complete
    check_accounting(str(out))
    (stats,) = report.model_actors
    encoded = sum(isinstance(device_input(p.read_bytes(), 10**9), JpegInput)
                  for k, p in files.items() if k != "truncated_jpeg")
    assert stats["media_device_decoded"] == 0                    # no GPU here
    assert stats["media_actor_cpu_decoded"] == {"no_gpu": encoded}
    worker = stats["media_worker_decoded"]
    assert worker["mode_cmyk"] == 1 and worker["not_jpeg"] == 1
    assert sum(worker.values()) + encoded == len(files) - 1
    assert stats["media_images_encoded"] == {"pillow": encoded}
    line = next(x for x in report.format().splitlines() if x.startswith("  model "))
    assert (f"images decoded on the device 0, in the actor by Pillow {encoded} (no_gpu "
            f"{encoded}), on the workers {len(files) - 1 - encoded} (") in line
    rows = {r["key"]: r for r in read_committed(str(out)).to_pylist()}
    assert set(rows) == set(files)
    assert rows["truncated_jpeg"]["status"] == "error"
    assert rows["truncated_jpeg"]["error_reason"] == "truncated"
    for key, path in files.items():
        if key == "truncated_jpeg":
            continue
        assert rows[key]["status"] == "ok", (key, rows[key]["reject_reason"], rows[key]["error"])
        data, row = path.read_bytes(), rows[key]
        want = clip({"pixels": cpu_path(data, clip.geometry)[None]})
        np.testing.assert_allclose(np.asarray(row["image_embedding"], np.float32),
                                   want[IMAGE_EMBEDDING][0], atol=1e-5)
        # the image: made in the actor (Pillow there) for JPEGs sent encoded, else here
        assert (row["image"], row["image_width"], row["image_height"]) == cpu_image(data)
        sent = isinstance(device_input(data, 10**9), JpegInput)
        draft = 32 if sent else DRAFT                       # pHash of a small draft only
        assert row["phash"] == phash64(decode_image(data, draft_min_side_px=draft).pixels)


def _nvjpeg_available() -> bool:
    from pipeline.models.media import nvjpeg_decoder

    geometry = ImageGeometry("center_crop", 224, 224, 224, 3)
    return torch.cuda.is_available() and nvjpeg_decoder("cuda", geometry)[0] is not None


@pytest.mark.skipif(not _nvjpeg_available(), reason="needs a CUDA GPU and torchvision")
def test_real_nvjpeg_matches_the_cpu_path_within_tolerance(tiny_models):
    """The only test of the real nvJPEG call: skipped on machines without both."""
    clip = load_backend("image_embedding", section_spec(
        "image_embedding", str(tiny_models["tiny-clip"]), score=False, dtype="float32"), "cuda")
    data = inputs()
    entries = [entry(d, clip.geometry) for d in data]
    out = clip({"pixels": entries})
    want = clip({"pixels": np.stack([cpu_path(d, clip.geometry) for d in data])})
    cosine = np.sum(out[IMAGE_EMBEDDING] * want[IMAGE_EMBEDDING], axis=1)
    assert cosine.min() >= 0.999, cosine.min()
    stats = clip.media_stats()
    assert stats["media_device_decoded"] == sum(isinstance(e, JpegInput) for e in entries)
    assert stats["media_actor_cpu_decoded"] == {}
    assert stats["media_images_encoded"] == {"nvjpeg": stats["media_device_decoded"]}
    for d, e, image in zip(data, entries, out[MEDIA_IMAGES]):
        if isinstance(e, JpegInput):
            _, width, height = cpu_image(d)
            assert Image.open(io.BytesIO(image[0])).size == image[1:]
            assert abs(image[1] - width) <= 1 and abs(image[2] - height) <= 1
