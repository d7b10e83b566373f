"""One test per Pillow mode the image decoder can meet, with known pixel values.

Each image is generated in memory, saved to a format that keeps its mode (PNG: 1, L, LA,
P, I;16, RGB, RGBA; TIFF: F, I, I;16, I;16B, PA, CMYK, YCbCr, LAB; PPM: 16-bit "I") and
decoded through the real ``decode_image(bytes)`` path. Modes that no format Pillow writes
keeps (La, RGBa, RGBX, HSV, I;16N; I;16L reopens as I;16) are checked on the conversion
function ``_to_rgb`` directly. Expected values are the documented rules of
``pipeline.media.decode`` computed by hand, never read back from the decoder. The last
tests cover data/README.md case N12 (32-bit float TIFFs) and the ``decode_flags`` column.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.columns import DECODE_FLAGS, ERROR_REASON, STATUS
from pipeline.errors import RecordError
from pipeline.records import ErrorReason
from pipeline.spec import DecodeSpec
from pipeline.media.decode import DecodedImage, _to_rgb, decode_image
from pipeline.steps.image import DecodeStep

WHITE = [255, 255, 255]
FLOAT = ("float_scaled",)
FLOAT_MINMAX = ("float_scaled", "minmax_scaled")
N12 = Path(__file__).parents[2] / "data" / "cases" / "N12_tiff_float32" / "files"


def encode(im: Image.Image, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **params)
    return buf.getvalue()


def decode_as(im: Image.Image, fmt: str, mode: str | None = None) -> DecodedImage:
    """Save ``im`` as ``fmt``, check Pillow reopens it as ``mode`` (default: im.mode),
    and decode the bytes with ``decode_image``."""
    data = encode(im, fmt)
    assert Image.open(io.BytesIO(data)).mode == (mode or im.mode)
    return decode_image(data)


def row(d: DecodedImage) -> list[list[int]]:
    """Row 0 of the decoded pixels as [[r, g, b], ...] (after checking the layout)."""
    assert d.pixels.dtype == np.uint8 and d.pixels.ndim == 3 and d.pixels.shape[2] == 3
    return d.pixels[0].tolist()


def grey(values) -> list[list[int]]:
    return [[v, v, v] for v in values]


def direct(im: Image.Image) -> tuple[list[list[int]], bool, tuple[str, ...]]:
    """The conversion function itself, for modes no writable format keeps."""
    rgb, has_alpha, flags = _to_rgb(im)
    assert rgb.dtype == np.uint8 and rgb.shape == (im.height, im.width, 3)
    return rgb[0].tolist(), has_alpha, flags


def float_tiff(values, shape=None) -> bytes:
    arr = np.asarray(values, np.float32).reshape(shape or (1, -1))
    im = Image.fromarray(arr)
    assert im.mode == "F"
    return encode(im, "TIFF")


def int32_tiff(values) -> bytes:
    im = Image.fromarray(np.asarray(values, np.int32).reshape(1, -1))
    assert im.mode == "I"
    return encode(im, "TIFF")


def set_tiff_short_tag(data: bytes, tag: int, value: int) -> bytes:
    """Rewrite the first value of a SHORT tag in IFD 0 of a little-endian TIFF."""
    out = bytearray(data)
    (ifd,) = struct.unpack("<I", out[4:8])
    (count,) = struct.unpack("<H", out[ifd:ifd + 2])
    for i in range(count):
        entry = ifd + 2 + 12 * i
        if struct.unpack("<H", out[entry:entry + 2])[0] == tag:
            out[entry + 8:entry + 10] = struct.pack("<H", value)
            return bytes(out)
    raise KeyError(tag)


# --- 1, L, LA, La, P, PA ------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_mode_1_becomes_0_or_255(fmt):
    im = Image.fromarray(np.array([[True, False, True, False]]))
    assert im.mode == "1"
    d = decode_as(im, fmt)
    assert row(d) == grey([255, 0, 255, 0]) and d.flags == () and not d.has_alpha


def test_mode_l_replicated():
    d = decode_as(Image.fromarray(np.array([[0, 1, 127, 128, 254, 255]], np.uint8)), "PNG")
    assert row(d) == grey([0, 1, 127, 128, 254, 255]) and d.flags == ()


def test_mode_la_composited_over_white():
    la = Image.merge("LA", [Image.new("L", (3, 1), 40),
                            Image.fromarray(np.array([[0, 128, 255]], np.uint8))])
    d = decode_as(la, "PNG")
    # (40 * 128 + 255 * 127 + 127) // 255 = 147
    assert row(d) == grey([255, 147, 40]) and d.has_alpha and d.flags == ()


def test_mode_la_premultiplied_direct():
    la = Image.merge("LA", [Image.new("L", (3, 1), 200),
                            Image.fromarray(np.array([[0, 128, 255]], np.uint8))])
    pixels, has_alpha, flags = direct(la.convert("La"))  # no format writes "La"
    # un-premultiplied by Pillow back to ~200, then (200 * 128 + 255 * 127 + 127) // 255
    assert pixels[0] == WHITE and pixels[2] == [200] * 3
    assert abs(pixels[1][0] - 227) <= 1 and has_alpha and flags == ()


def test_mode_p_palette_lookup_and_trns_index():
    im = Image.fromarray(np.array([[0, 1, 2]], np.uint8), "P")
    im.putpalette([255, 0, 0, 0, 128, 0, 10, 20, 30])
    d = decode_as(im, "PNG")
    assert row(d) == [[255, 0, 0], [0, 128, 0], [10, 20, 30]] and not d.has_alpha
    data = encode(im, "PNG", transparency=1)
    d = decode_image(data)
    assert row(d) == [[255, 0, 0], WHITE, [10, 20, 30]] and d.has_alpha and d.flags == ()


def test_mode_pa_tiff_composited():
    pa = Image.new("PA", (3, 1))
    pa.putpalette([255, 0, 0, 0, 0, 255])
    pa.putdata([(0, 255), (1, 128), (1, 0)])
    d = decode_as(pa, "TIFF")
    # blue at alpha 128: (0 * 128 + 255 * 127 + 127) // 255 = 127, (255 * 255 + 127) // 255
    assert row(d) == [[255, 0, 0], [127, 127, 255], WHITE] and d.has_alpha and d.flags == ()


# --- I;16 variants and I -------------------------------------------------------------------

SIXTEEN = [0, 255, 256, 4660, 32768, 65535]
SIXTEEN_8 = grey([0, 0, 1, 18, 128, 255])  # v >> 8


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_mode_i16_shifted(fmt):
    im = Image.fromarray(np.array([SIXTEEN], "<u2"))
    assert im.mode == "I;16"
    d = decode_as(im, fmt)
    assert row(d) == SIXTEEN_8 and d.flags == ()


def test_mode_i16b_big_endian_tiff_shifted():
    im = Image.fromarray(np.array([SIXTEEN], ">u2"))
    assert im.mode == "I;16B"
    d = decode_as(im, "TIFF")
    assert row(d) == SIXTEEN_8 and d.flags == ()


def test_mode_i16l_tiff_and_direct():
    im = Image.fromarray(np.array([SIXTEEN], "<u2")).convert("I").convert("I;16L")
    assert im.mode == "I;16L"
    assert direct(im) == (SIXTEEN_8, False, ())
    assert row(decode_as(im, "TIFF", mode="I;16")) == SIXTEEN_8  # TIFF reopens it as I;16


def test_mode_i16n_direct():
    im = Image.new("I;16N", (len(SIXTEEN), 1))
    im.putdata(SIXTEEN)
    assert direct(im) == (SIXTEEN_8, False, ())  # no format writes I;16N


def test_mode_i_16bit_ppm_uses_the_declared_depth():
    im = Image.fromarray(np.array([SIXTEEN], np.int32))
    d = decode_as(im, "PPM")  # maxval 65535: 16-bit samples in Pillow's mode "I"
    assert row(d) == SIXTEEN_8 and d.flags == ()


def test_mode_i_32bit_tiff_min_max_not_black():
    # v >> 24 (the 32-bit depth rule) would give all 0 here
    d = decode_image(int32_tiff([0, 1000, 2000, 500]))
    assert row(d) == grey([0, 128, 255, 64]) and d.flags == ("minmax_scaled",)


def test_mode_i_32bit_negative_values_min_max():
    d = decode_image(int32_tiff([-100, 0, 100, -50]))
    assert row(d) == grey([0, 128, 255, 64]) and d.flags == ("minmax_scaled",)


def test_mode_i_uint32_tiff_read_unsigned():
    data = int32_tiff(np.array([0, 3_000_000_000, 1_500_000_000], np.uint32).view(np.int32))
    data = set_tiff_short_tag(data, 339, 1)  # SampleFormat 1: unsigned integer
    raw = np.asarray(Image.open(io.BytesIO(data)))
    assert raw.dtype == np.int32 and raw[0, 1] < 0  # Pillow reads the bits as signed
    d = decode_image(data)
    assert row(d) == grey([0, 255, 128]) and d.flags == ("minmax_scaled",)


def test_mode_i_constant_32bit_image_is_its_min():
    d = decode_image(int32_tiff([70_000] * 4))
    assert row(d) == grey([0] * 4) and d.flags == ("minmax_scaled",)


# --- F --------------------------------------------------------------------------------------

def test_mode_f_0_1_times_255():
    d = decode_image(float_tiff([0.0, 0.25, 0.5, 1.0, 1 / 255]))
    # round half up: 63.75 -> 64, 127.5 -> 128
    assert row(d) == grey([0, 64, 128, 255, 1]) and d.flags == FLOAT


def test_mode_f_0_1000_min_max():
    d = decode_image(float_tiff([0.0, 250.0, 500.0, 1000.0]))
    assert row(d) == grey([0, 64, 128, 255]) and d.flags == FLOAT_MINMAX


def test_mode_f_negative_range_min_max():
    d = decode_image(float_tiff([-1.0, 0.0, 1.0]))
    assert row(d) == grey([0, 128, 255]) and d.flags == FLOAT_MINMAX


def test_mode_f_nan_and_inf_left_out_of_the_range():
    d = decode_image(float_tiff([np.nan, np.inf, -np.inf, 0.0, 0.5, 1.0]))
    assert row(d) == grey([0, 255, 0, 0, 128, 255])
    assert d.flags == ("float_scaled", "nonfinite_samples")
    d = decode_image(float_tiff([np.nan, 0.0, 500.0, 1000.0]))
    assert row(d) == grey([0, 0, 128, 255])
    assert d.flags == ("float_scaled", "minmax_scaled", "nonfinite_samples")


def test_mode_f_constant_images():
    assert row(decode_image(float_tiff([0.5] * 3))) == grey([128] * 3)
    d = decode_image(float_tiff([500.0] * 3))
    assert row(d) == grey([0] * 3) and d.flags == FLOAT_MINMAX  # documented: its min


def test_mode_f_without_a_finite_sample_is_unsupported():
    with pytest.raises(RecordError) as e:
        decode_image(float_tiff([np.nan, np.inf]))
    assert e.value.reason == ErrorReason.UNSUPPORTED_FORMAT
    assert "no finite sample" in e.value.message


def test_three_channel_float_tiff_is_unsupported():
    cv2 = pytest.importorskip("cv2")
    ok, buf = cv2.imencode(".tiff", np.zeros((4, 4, 3), np.float32))
    assert ok
    with pytest.raises(RecordError) as e:
        decode_image(buf.tobytes())
    assert e.value.reason == ErrorReason.UNSUPPORTED_FORMAT  # Pillow: unknown pixel mode


# --- RGB, RGBA, RGBa, RGBX -------------------------------------------------------------------

RGB_ROW = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30]]


def test_mode_rgb_unchanged():
    d = decode_as(Image.fromarray(np.array([RGB_ROW], np.uint8)), "PNG")
    assert row(d) == RGB_ROW and d.flags == () and not d.has_alpha


def test_mode_rgba_composited_over_white():
    arr = np.array([[[200, 100, 0, 0], [200, 100, 0, 128], [200, 100, 0, 255]]], np.uint8)
    d = decode_as(Image.fromarray(arr), "PNG")
    assert row(d) == [WHITE, [227, 177, 127], [200, 100, 0]] and d.has_alpha


def test_mode_rgba_premultiplied_direct():
    arr = np.array([[[200, 100, 0, 0], [200, 100, 0, 128], [200, 100, 0, 255]]], np.uint8)
    rgba_pre = Image.fromarray(arr).convert("RGBa")  # no format writes "RGBa"
    assert np.asarray(rgba_pre)[0, 1].tolist() == [100, 50, 0, 128]
    assert direct(rgba_pre) == ([WHITE, [227, 177, 127], [200, 100, 0]], True, ())


def test_mode_rgbx_padding_dropped_direct():
    arr = np.array([[[10, 20, 30, 0], [40, 50, 60, 255], [70, 80, 90, 7]]], np.uint8)
    im = Image.frombytes("RGBX", (3, 1), arr.tobytes())
    # direct: Pillow opens no file as "RGBX" (a TIFF with an unspecified extra sample
    # opens as "RGB"); X is padding, never alpha
    assert direct(im) == ([[10, 20, 30], [40, 50, 60], [70, 80, 90]], False, ())


def test_tiff_with_unspecified_extra_sample_drops_it():
    arr = np.array([[[10, 20, 30, 0], [40, 50, 60, 255]]], np.uint8)
    data = set_tiff_short_tag(encode(Image.fromarray(arr), "TIFF"), 338, 0)  # ExtraSamples
    d = decode_image(data)
    assert row(d) == [[10, 20, 30], [40, 50, 60]] and not d.has_alpha


# --- CMYK, YCbCr, LAB, HSV -------------------------------------------------------------------

def test_mode_cmyk_tiff_without_profile():
    cmyk = np.array([[[0, 0, 0, 0], [255, 0, 0, 0], [0, 0, 0, 128], [0, 255, 255, 0],
                      [100, 0, 0, 200]]], np.uint8)
    d = decode_as(Image.fromarray(cmyk, "CMYK"), "TIFF")
    # R = (255 - C) * (255 - K) / 255 rounded: (155 * 55) / 255 = 33.4 -> 33
    assert row(d) == [WHITE, [0, 255, 255], [127, 127, 127], [255, 0, 0], [33, 55, 55]]
    assert d.flags == () and not d.has_alpha


def test_mode_cmyk_jpeg_adobe_inverted_round_trip():
    data = encode(Image.new("CMYK", (16, 16), (0, 255, 255, 0)), "JPEG", quality=95)
    im = Image.open(io.BytesIO(data))
    assert im.mode == "CMYK" and "adobe" in im.info  # Pillow writes inverted Adobe CMYK
    r, g, b = decode_image(data).pixels[8, 8].astype(int)
    assert r >= 250 and g <= 5 and b <= 5  # red, not its inverse (cyan)


def test_mode_ycbcr_tiff_bt601_full_range():
    ycc = np.array([[[0, 128, 128], [255, 128, 128], [128, 128, 128], [128, 128, 255],
                     [128, 0, 128], [81, 90, 240]]], np.uint8)
    d = decode_as(Image.fromarray(ycc, "YCbCr"), "TIFF")
    y, cb, cr = (ycc[0, :, i].astype(float) for i in range(3))
    ref = np.stack([y + 1.402 * (cr - 128),  # ITU-T T.871 (JFIF), BT.601 coefficients
                    y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128),
                    y + 1.772 * (cb - 128)], axis=1)
    ref = np.clip(np.round(ref), 0, 255)
    assert np.abs(d.pixels[0].astype(int) - ref).max() <= 1
    assert row(d)[:3] == [[0] * 3, WHITE, [128] * 3] and d.flags == ()


def test_mode_lab_tiff_to_srgb_via_littlecms():
    # Pillow LAB (as ImageCms and TIFF CIELab hold it): L 0..255 = L* 0..100, a*/b* signed
    # bytes. sRGB red is L*a*b* (D50) (54.29, 80.80, 69.89) -> (138, 81, 70); sRGB blue
    # (29.57, 68.30, -112.03) -> (75, 68, 144).
    lab = np.array([[[0, 0, 0], [255, 0, 0], [128, 0, 0], [138, 81, 70], [75, 68, 144]]],
                   np.uint8)
    im = Image.fromarray(lab, "LAB")
    d = decode_as(im, "TIFF")
    px = d.pixels[0].astype(int)
    assert px[0].max() <= 2 and px[1].min() >= 253  # black, white
    # neutral L* = 50.2: Y = ((L* + 16) / 116) ** 3, sRGB = 1.055 Y ** (1 / 2.4) - 0.055
    y = ((128 / 255 * 100 + 16) / 116) ** 3
    expected_grey = 255 * (1.055 * y ** (1 / 2.4) - 0.055)
    assert np.abs(px[2] - expected_grey).max() <= 2
    assert px[3][0] >= 245 and px[3][1:].max() <= 30  # red
    assert px[4][2] >= 245 and px[4][:2].max() <= 30  # blue
    assert d.flags == () and not d.has_alpha
    assert np.abs(d.pixels.astype(int) - lab).max() > 100  # not the bands copied as RGB


def test_mode_hsv_direct():
    hsv = np.array([[[0, 255, 255], [85, 255, 255], [170, 255, 255], [0, 0, 128]]], np.uint8)
    pixels, has_alpha, flags = direct(Image.fromarray(hsv, "HSV"))  # no format writes HSV
    assert pixels == [[255, 0, 0], [0, 255, 0], [0, 0, 255], [128, 128, 128]]
    assert not has_alpha and flags == ()


# --- N12: real 32-bit float TIFFs ----------------------------------------------------------

@pytest.fixture(scope="module")
def n12() -> Path:
    return N12


@pytest.mark.parametrize("name, scale, flags", [("float01.tif", 1.0, FLOAT),
                                                ("float_0_1000.tif", 1000.0, FLOAT_MINMAX)])
def test_n12_float_tiff_scaled_not_black_not_clipped(n12, name, scale, flags):
    data = (n12 / name).read_bytes()
    raw = np.asarray(Image.open(io.BytesIO(data)))
    assert raw.dtype == np.float32 and raw.min() == 0.0 and raw.max() == scale
    d = decode_image(data)
    assert d.pixels.shape == (96, 128, 3) and d.flags == flags
    assert d.format == "TIFF" and not d.has_alpha
    px = d.pixels[..., 0].astype(float)
    assert (d.pixels[..., 0] == d.pixels[..., 2]).all()
    assert 120 < px.mean() < 135 and px.std() > 40  # not black, not flat
    assert (px == 255).mean() < 0.01 and (px == 0).mean() < 0.01  # not clipped
    # the file is the diagonal ramp (x / 127 + y / 95) / 2 times scale
    y, x = np.mgrid[0:96, 0:128]
    ramp = (x / 127 + y / 95) / 2 * 255
    assert np.abs(px - ramp).max() <= 1
    assert np.corrcoef(px.ravel(), raw.ravel())[0, 1] > 0.999


def test_n12_control_png_is_an_ordinary_image(n12):
    # control.png is an 8-bit RGB test card (a different picture), decoded without flags.
    d = decode_image((n12 / "control.png").read_bytes())
    assert d.pixels.shape == (96, 128, 3) and d.flags == ()
    np.testing.assert_array_equal(d.pixels, np.asarray(Image.open(n12 / "control.png")))


# --- decode_flags column ------------------------------------------------------------------------

def test_decode_step_writes_decode_flags_on_every_row():
    blobs = [float_tiff([0.0, 0.5, 1.0]), encode(Image.new("RGB", (2, 2)), "PNG"),
             b"<html>gone</html>", float_tiff([0.0, 500.0, 1000.0])]
    n = len(blobs)
    batch = {STATUS: ["ok"] * n, "_source_bytes": blobs}
    batch = DecodeStep(DecodeSpec())(batch)
    assert batch[STATUS] == ["ok", "ok", "error", "ok"]
    assert batch[ERROR_REASON][2] == "not_an_image"
    assert batch[DECODE_FLAGS] == [["float_scaled"], [], None,
                                   ["float_scaled", "minmax_scaled"]]
    assert batch["_pixels"][0][0].tolist() == grey([0, 128, 255])
