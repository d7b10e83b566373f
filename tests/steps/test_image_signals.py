"""Measured image signals (pipeline.steps.image_signals): known values on synthetic images,
blur ordering and scale invariance on the bundled photos, video frames, error rows, spec."""

from __future__ import annotations

import io
import itertools

import cv2
import numpy as np
import pytest
from PIL import Image

from pipeline import assembly
from pipeline.columns import (
    BRIGHTNESS,
    CLIPPED_FRACTION,
    CONTRAST,
    FRAMES,
    PIXELS,
    SHARPNESS,
    STATUS,
)
from pipeline.errors import SpecError
from pipeline.media.decode import decode_image
from pipeline.spec import ImageSignalsSpec, JobSpec, parse_spec
from pipeline.steps.image import DecodeStep
from pipeline.steps.image_signals import ImageSignalsStep, analysis_luma, image_signals
from tests.conftest import PHOTOS

FIRST_PHOTOS = sorted(PHOTOS.glob("*.jpg"))[:6]


def _photo(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def _grey(values: list[int], shape=(64, 64)) -> np.ndarray:
    """An RGB image of equal-width vertical bands of the grey ``values``."""
    h, w = shape
    band = w // len(values)
    img = np.zeros((h, band * len(values), 3), np.uint8)
    for k, v in enumerate(values):
        img[:, k * band:(k + 1) * band] = v
    return img


def test_a_flat_grey_image_has_its_level_as_brightness_and_nothing_else():
    s = image_signals(np.full((40, 60, 3), 100, np.uint8), 256)
    assert s == {SHARPNESS: 0.0, BRIGHTNESS: 100.0, CONTRAST: 0.0, CLIPPED_FRACTION: 0.0}


def test_half_black_half_white_is_mid_brightness_full_contrast_all_clipped():
    s = image_signals(_grey([0, 255]), 256)
    assert s[BRIGHTNESS] == pytest.approx(127.5) and s[CONTRAST] == pytest.approx(127.5)
    assert s[CLIPPED_FRACTION] == 1.0 and s[SHARPNESS] > 0


def test_brightness_uses_bt601_luma_weights():
    # OpenCV's RGB2GRAY: Y = 0.299 R + 0.587 G + 0.114 B, rounded
    for rgb, luma in [((255, 0, 0), 76), ((0, 255, 0), 150), ((0, 0, 255), 29)]:
        s = image_signals(np.full((8, 8, 3), rgb, np.uint8), 256)
        assert s[BRIGHTNESS] == luma, rgb


def test_clipped_fraction_counts_luma_at_or_beyond_5_and_250():
    s = image_signals(_grey([4, 5, 6, 249, 250, 251]), 256)
    assert s[CLIPPED_FRACTION] == pytest.approx(4 / 6)
    assert s[BRIGHTNESS] == pytest.approx(np.mean([4, 5, 6, 249, 250, 251]))
    assert s[CONTRAST] == pytest.approx(np.std([4, 5, 6, 249, 250, 251]))


@pytest.mark.parametrize("path", FIRST_PHOTOS, ids=lambda p: p.stem)
def test_sharpness_falls_strictly_with_gaussian_blur(path):
    px = _photo(path)
    values = [image_signals(cv2.GaussianBlur(px, (0, 0), sigma) if sigma else px,
                            256)[SHARPNESS] for sigma in (0, 0.75, 1.5, 3, 6)]
    assert all(a > b for a, b in itertools.pairwise(values)), values
    assert values[0] > 5 * values[2]  # not a marginal ordering
    # exposure barely moves under blur (mean is blur-invariant up to borders and rounding)
    assert image_signals(cv2.GaussianBlur(px, (0, 0), 3), 256)[BRIGHTNESS] == pytest.approx(
        image_signals(px, 256)[BRIGHTNESS], abs=1.0)


#: Relative tolerance of sharpness between two resolutions of one photo, both at least
#: twice the analysis scale (measured on the bundled photos: mean -11%, worst 13%).
RESOLUTION_RTOL = 0.2


@pytest.mark.parametrize("path", FIRST_PHOTOS, ids=lambda p: p.stem)
def test_the_same_photo_at_two_resolutions_has_close_sharpness(path):
    px = _photo(path)
    h, w = px.shape[:2]
    k = 320 / min(h, w)
    smaller = cv2.resize(px, (round(w * k), round(h * k)), interpolation=cv2.INTER_AREA)
    a, b = (image_signals(p, 128)[SHARPNESS] for p in (px, smaller))
    assert min(analysis_luma(px, 128).shape) == 128 == min(analysis_luma(smaller, 128).shape)
    assert b == pytest.approx(a, rel=RESOLUTION_RTOL)
    # without the fixed scale the two differ far more
    raw = [cv2.Laplacian(cv2.cvtColor(p, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var()
           for p in (px, smaller)]
    assert abs(raw[1] / raw[0] - 1) > abs(b / a - 1)


#: Relative tolerance of sharpness between a full decode and the JPEG draft the assembler
#: asks for (shorter side >= 2 x analysis_px); measured: mean 4%, worst 10%.
DRAFT_RTOL = 0.15


@pytest.mark.parametrize("path", FIRST_PHOTOS[:4], ids=lambda p: p.stem)
def test_a_jpeg_draft_measures_like_the_full_decode(path):
    px = _photo(path)
    h, w = px.shape[:2]
    big = cv2.resize(px, (w * 4, h * 4), interpolation=cv2.INTER_CUBIC)
    buf = io.BytesIO()
    Image.fromarray(big).save(buf, "JPEG", quality=92)
    full = decode_image(buf.getvalue()).pixels
    draft = decode_image(buf.getvalue(), draft_min_side_px=2 * 256).pixels
    assert min(draft.shape[:2]) < min(full.shape[:2]) / 1.5  # a real draft
    a, b = (image_signals(p, 256)[SHARPNESS] for p in (full, draft))
    assert b == pytest.approx(a, rel=DRAFT_RTOL)


def test_small_images_are_never_enlarged():
    px = _photo(FIRST_PHOTOS[0])
    assert analysis_luma(px, 4096).shape == px.shape[:2]
    assert min(analysis_luma(px, 100).shape) == 100


def test_video_rows_take_the_mean_over_their_frames():
    step = ImageSignalsStep(ImageSignalsSpec(enabled=True), video=True)
    assert step.reads == (FRAMES,)
    dark, bright = np.full((32, 48, 3), 40, np.uint8), _grey([0, 255], (32, 48))
    batch = {STATUS: ["ok"], FRAMES: [[dark, bright]]}
    out = step(batch)
    assert out[BRIGHTNESS][0] == pytest.approx((40 + 127.5) / 2)
    assert out[CONTRAST][0] == pytest.approx(127.5 / 2)
    assert out[SHARPNESS][0] == pytest.approx(image_signals(bright, 256)[SHARPNESS] / 2)


def test_a_malformed_row_is_that_rows_error_and_the_others_are_measured():
    step = ImageSignalsStep(ImageSignalsSpec(enabled=True))
    good = np.full((16, 16, 3), 10, np.uint8)
    batch = {STATUS: ["ok", "ok", "rejected"],
             PIXELS: [np.zeros((16, 16), np.uint8), good, None]}
    out = step(batch)
    assert out[STATUS] == ["error", "ok", "rejected"]
    assert out["error_reason"][0] == "step_failed" and "(H, W, 3) uint8" in out["error"][0]
    assert out[BRIGHTNESS][1] == 10.0 and out[BRIGHTNESS][2] is None


def _spec(tmp_path, **extra) -> JobSpec:
    return JobSpec.model_validate({"source": {"kind": "files", "uri": str(PHOTOS)},
                                   "sink": {"uri": str(tmp_path / "out")},
                                   "text_embedding": {"enabled": False}, **extra})


def test_the_step_is_assembled_only_when_enabled_and_keeps_drafts_twice_its_scale(tmp_path):
    off = assembly.assemble(_spec(tmp_path))
    assert not any(isinstance(s, ImageSignalsStep) for s in off.steps)
    on = assembly.assemble(_spec(tmp_path, signals={"image": {"enabled": True,
                                                              "analysis_px": 300}}))
    names = [type(s).__name__ for s in on.steps]
    assert names.index("ImageSignalsStep") < names.index("ResizeStep")
    decode = next(s for s in on.steps if isinstance(s, DecodeStep))
    assert decode.draft_min_side_px == 600
    types = {f.name: str(f.type) for f in on.fields()}
    assert {types[c] for c in (SHARPNESS, BRIGHTNESS, CONTRAST, CLIPPED_FRACTION)} == {"float"}
    other = assembly.assemble(_spec(tmp_path, signals={"image": {"enabled": True}}))
    assert other.fingerprint != on.fingerprint  # analysis_px changes the rows


def test_decode_device_cuda_with_image_signals_fails_naming_the_field(tmp_path):
    with pytest.raises(SpecError, match=r"decode.device: 'cuda' does not apply: signals.image "
                                        r"or signals.ocr is enabled"):
        parse_spec({"source": {"kind": "files", "uri": str(PHOTOS)},
                    "sink": {"uri": str(tmp_path / "out")}, "decode": {"device": "cuda"},
                    "image_embedding": {"enabled": True, "model": "x"},
                    "signals": {"image": {"enabled": True}}})
