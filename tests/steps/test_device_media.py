"""``decode.device: cuda`` on the worker side: the spec rules, which rows are sent encoded
(``media/device.py``), the model-input step, and a row the model could not decode
becoming an error row (``ModelStep.apply``). No torch, no Ray."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipeline.assembly import fingerprint
from pipeline.columns import (DEVICE_INPUT, HEIGHT, IMAGE, IMAGE_EMBEDDING, IMAGE_HEIGHT,
                              IMAGE_WIDTH, PHASH, PIXELS, SOURCE_BYTES, STATUS, WIDTH)
from pipeline.errors import SpecError
from pipeline.contracts import ImageGeometry, ModelInfo, OutputField
from pipeline.spec import DecodeSpec, ResizeSpec, parse_spec
from pipeline.media.decode import decode_image, decoded_size
from pipeline.media.device import (MEDIA_ERRORS, MEDIA_IMAGES, PHASH_DRAFT_PX, HostDecoded, JpegInput, device_input)
from pipeline.steps.image import DecodeStep, HashStep, ResizeStep
from pipeline.media.transform import phash64
from pipeline.steps.model import ModelStep
from pipeline.steps.model_input import ModelInputStep
from pipeline.media.geometry import model_input
from tests.conftest import CASES, PHOTOS

CLIP_GEOMETRY = ImageGeometry("center_crop", 224, 224, 224, 3)
PLAIN_PHOTO = PHOTOS / "000000000790.jpg"     # RGB baseline JPEG, no ICC profile
ICC_PHOTO = PHOTOS / "000000062554.jpg"       # carries an Adobe RGB (1998) ICC profile
SRGB_PHOTO = PHOTOS / "000000078499.jpg"      # carries an sRGB IEC61966-2.1 ICC profile


def spec_data(**sections) -> dict:
    data = {"source": {"kind": "files", "uri": "in"}, "sink": {"uri": "out"},
            "image_embedding": {"enabled": True, "model": "m"}}
    data.update(sections)
    return data


def jpeg_bytes(image: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", **save)
    return buf.getvalue()


# --- spec ------------------------------------------------------------------------------------
def test_cuda_is_valid_for_an_image_embedding_job():
    assert parse_spec(spec_data(decode={"device": "cuda"})).decode.device == "cuda"


@pytest.mark.parametrize("sections, problem", [
    ({"image_embedding": {"enabled": False}}, "image_embedding is not enabled"),
    ({"captioning": {"enabled": True, "model": "b"}}, "captioning is enabled"),
    ({"source": {"kind": "files", "uri": "in", "media": "video"}}, "source.media is 'video'"),
])
def test_cuda_is_refused_naming_the_field_and_the_value(sections, problem):
    with pytest.raises(SpecError) as err:
        parse_spec(spec_data(decode={"device": "cuda"}, **sections))
    assert f"decode.device: 'cuda' does not apply: {problem}" in str(err.value)


def test_cpu_keeps_the_fingerprint_and_cuda_changes_it():
    default = parse_spec(spec_data())
    assert fingerprint(parse_spec(spec_data(decode={"device": "cpu"}))) == fingerprint(default)
    assert fingerprint(parse_spec(spec_data(decode={"device": "cuda"}))) != fingerprint(default)


# --- which rows go encoded -------------------------------------------------------------------
def test_rgb_and_greyscale_jpegs_go_encoded_with_their_exif_orientation():
    entry = device_input(PLAIN_PHOTO.read_bytes(), 10**8, 256)
    assert isinstance(entry, JpegInput) and entry.orientation == 1
    assert (entry.max_pixels, entry.draft_min_side_px) == (10**8, 256)
    assert device_input((CASES / "C06_exif/hopper_orientation_6.jpg").read_bytes(),
                        10**8).orientation == 6
    assert device_input((CASES / "C07_exif/orientation_rectangle.jpg").read_bytes(),
                        10**8).orientation == 8
    grey = device_input((CASES / "C47_gray/hopper_gray.jpg").read_bytes(), 10**8)
    assert isinstance(grey, JpegInput)


def test_an_srgb_profile_goes_encoded_and_another_profile_does_not():
    """The worker's sRGB-to-sRGB conversion moves no colour by more than 1 of 255, so
    dropping it on the device is within the device path's tolerance; Adobe RGB is not."""
    assert Image.open(SRGB_PHOTO).info.get("icc_profile")
    assert isinstance(device_input(SRGB_PHOTO.read_bytes(), 10**8), JpegInput)
    assert device_input(ICC_PHOTO.read_bytes(), 10**8) == "icc_profile"


@pytest.mark.parametrize("data, reason", [
    ((CASES / "C12_cmyk/jpg-cmyk-2.jpg").read_bytes(), "mode_cmyk"),
    ((CASES / "C13_cmyk/pil_sample_cmyk.jpg").read_bytes(), "mode_cmyk"),
    ((CASES / "C40_ext/hopper_png_bytes.jpg").read_bytes(), "not_jpeg"),
    (ICC_PHOTO.read_bytes(), "icc_profile"),
    ((CASES / "C03_trunc/corrupt-header.jpg").read_bytes(), "header_error"),
    (PLAIN_PHOTO.read_bytes(), "too_large"),       # max_pixels below: 100
])
def test_everything_else_is_decoded_on_the_worker_with_a_reason(data, reason):
    assert device_input(data, 100 if reason == "too_large" else 10**8) == reason


def test_adobe_rgb_samples_are_not_sent_to_nvjpeg():
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), np.uint8))
    # Pillow writes an Adobe marker with transform 0 (no YCbCr) for keep_rgb
    assert device_input(jpeg_bytes(rgb, keep_rgb=True), 10**8) == "adobe_rgb"
    assert isinstance(device_input(jpeg_bytes(rgb), 10**8), JpegInput)


# --- decode, model input and resize on the worker ---------------------------------------
def test_worker_sends_encoded_jpegs_drafts_them_for_phash_and_leaves_their_image_to_the_actor():
    files = [PLAIN_PHOTO, CASES / "C12_cmyk/jpg-cmyk-2.jpg", ICC_PHOTO]
    data = [f.read_bytes() for f in files]
    resize = ResizeSpec()
    decode = DecodeStep(DecodeSpec(device="cuda"), draft_min_side_px=256, resize=resize)
    assert decode.settings()["device"] == "cuda" and DEVICE_INPUT in decode.writes
    assert "device" not in DecodeStep(DecodeSpec()).settings()
    assert DEVICE_INPUT not in DecodeStep(DecodeSpec()).writes
    # the batch byte budget counts what the worker will hold: the draft of a JPEG sent
    # encoded, the full decode of the others
    rows = {SOURCE_BYTES: data}
    assert [decode.decoded_bytes(rows, i) for i in range(3)] == [
        decoded_size(data[0], PHASH_DRAFT_PX), decoded_size(data[1], 256),
        decoded_size(data[2], 256)]
    assert decode.decoded_bytes(rows, 0) * 16 <= decoded_size(data[0], 256)
    batch = decode({STATUS: ["ok"] * 3, SOURCE_BYTES: data})
    sent = batch[DEVICE_INPUT][0]
    assert isinstance(sent, JpegInput) and sent.data == data[0]
    assert (sent.draft_min_side_px, sent.resize) == (256, resize)
    assert batch[DEVICE_INPUT][1:] == ["mode_cmyk", "icc_profile"]
    full = decode_image(data[0])
    assert (batch[WIDTH][0], batch[HEIGHT][0]) == (full.width, full.height)
    assert PHASH_DRAFT_PX <= min(batch[PIXELS][0].shape[:2]) < 2 * PHASH_DRAFT_PX  # a draft
    batch = HashStep()(batch)
    assert batch[PHASH][0] == phash64(decode_image(data[0], draft_min_side_px=32).pixels)

    step = ModelInputStep([CLIP_GEOMETRY])
    (column,) = step.writes
    entries = step(batch)[column]
    assert entries[0] is sent
    assert [type(e) for e in entries[1:]] == [HostDecoded, HostDecoded]
    assert [e.reason for e in entries[1:]] == ["mode_cmyk", "icc_profile"]
    cpu = decode_image(data[2], draft_min_side_px=256).pixels
    np.testing.assert_array_equal(entries[2].pixels, model_input(cpu, CLIP_GEOMETRY))

    batch = ResizeStep(resize)(batch)
    assert batch[IMAGE][0] is None and batch[IMAGE_WIDTH][0] is None   # the actor's job
    assert batch[IMAGE][1] and batch[IMAGE][2] and batch[PIXELS] == [None] * 3


def test_each_row_header_is_read_once_for_the_budget_and_the_decode(monkeypatch):
    """The batch byte budget (``decoded_bytes``) and the decode share one ``device_input``
    per row: the header is not read again for the decode."""
    import pipeline.steps.image as image

    calls = []
    monkeypatch.setattr(image, "device_input",
                        lambda *a, **k: calls.append(a[0]) or device_input(*a, **k))
    data = [PLAIN_PHOTO.read_bytes(), (CASES / "C12_cmyk/jpg-cmyk-2.jpg").read_bytes()]
    decode = DecodeStep(DecodeSpec(device="cuda"), draft_min_side_px=256, resize=ResizeSpec())
    batch = {STATUS: ["ok", "ok"], SOURCE_BYTES: data}
    sizes = [decode.decoded_bytes(batch, i) for i in range(2)]
    batch = decode(batch)
    assert calls == data                                   # once each, in the budget
    assert isinstance(batch[DEVICE_INPUT][0], JpegInput) and batch[DEVICE_INPUT][1] == "mode_cmyk"
    assert sizes == [decoded_size(data[0], PHASH_DRAFT_PX), decoded_size(data[1], 256)]
    assert PHASH_DRAFT_PX <= min(batch[PIXELS][0].shape[:2]) < 2 * PHASH_DRAFT_PX
    fresh = decode({STATUS: ["ok"], SOURCE_BYTES: data[:1]})   # no budget asked: the decode
    assert calls == data + data[:1] and isinstance(fresh[DEVICE_INPUT][0], JpegInput)


# --- undecodable rows from the model ---------------------------------------------------------
def test_a_row_the_model_could_not_decode_becomes_an_error_row():
    spec = parse_spec(spec_data(decode={"device": "cuda"}, image_embedding={
        "enabled": True, "model": "m", "score": False}))
    step = ModelStep("image_embedding", spec.image_embedding, media_entries=True)
    info = ModelInfo("clip", (OutputField(IMAGE_EMBEDDING, "vector", 2),), image=CLIP_GEOMETRY)
    step.bind(None, info)
    entries = [JpegInput(b"\xff\xd8\xff-a"), HostDecoded(np.zeros((224, 224, 3), np.uint8), "x")]
    batch = {STATUS: ["ok", "ok"], CLIP_GEOMETRY.column: entries, IMAGE: [None, b"b"],
             IMAGE_WIDTH: [None, 5], IMAGE_HEIGHT: [None, 4], IMAGE_EMBEDDING: [None, None]}
    assert step.inputs(batch, [0, 1])["pixels"] == entries          # a list, not a stack
    vectors = np.ones((2, 2), np.float32)
    errors = [("truncated", "JPEG: image file is truncated"), None]
    step.apply(batch, [0, 1], {IMAGE_EMBEDDING: vectors, MEDIA_ERRORS: errors,
                               MEDIA_IMAGES: [(b"x", 3, 2), None]})
    assert batch[STATUS] == ["error", "ok"]
    assert batch["error_reason"][0] == "truncated"
    assert batch["error"][0] == "truncated: JPEG: image file is truncated"
    assert batch[IMAGE_EMBEDDING][0] is None and batch[IMAGE][0] is None   # image dropped
    assert batch[IMAGE_WIDTH][0] is None
    np.testing.assert_array_equal(batch[IMAGE_EMBEDDING][1], vectors[1])
    assert batch[IMAGE][1] == b"b"                     # made on the worker, kept


def test_the_model_fills_in_the_image_of_rows_it_decoded():
    spec = parse_spec(spec_data(decode={"device": "cuda"}))
    step = ModelStep("image_embedding", spec.image_embedding, media_entries=True)
    step.bind(None, ModelInfo("clip", (OutputField(IMAGE_EMBEDDING, "vector", 2),),
                              image=CLIP_GEOMETRY))
    batch = {STATUS: ["ok"], IMAGE: [None], IMAGE_WIDTH: [None], IMAGE_HEIGHT: [None],
             IMAGE_EMBEDDING: [None]}
    step.apply(batch, [0], {IMAGE_EMBEDDING: np.ones((1, 2), np.float32),
                            MEDIA_ERRORS: [None], MEDIA_IMAGES: [(b"jpeg", 256, 341)]})
    assert (batch[IMAGE][0], batch[IMAGE_WIDTH][0], batch[IMAGE_HEIGHT][0]) == (b"jpeg", 256, 341)
