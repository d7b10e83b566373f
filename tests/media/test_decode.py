"""Tests of pipeline.media.decode against the real broken files in data/cases/ (one test
per C* case of data/README.md) and against images generated in memory for each kind."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image, ImageCms, ImageOps

from pipeline.errors import RecordError
from pipeline.records import ErrorReason
from pipeline.media.decode import DEFAULT_MAX_PIXELS, DecodedImage, decode_image, sniff_format

DATA = Path(__file__).parents[2] / "data"
CASES = DATA / "cases"
WHITE = np.array([255, 255, 255], dtype=np.uint8)


def case(rel: str) -> bytes:
    return (CASES / rel).read_bytes()


def pil(rel: str) -> Image.Image:
    """Pillow's own lazy view of a case file (from bytes: no file handle left open)."""
    return Image.open(io.BytesIO(case(rel)))


def decode_case(rel: str, **kwargs) -> DecodedImage:
    return decode_image(case(rel), **kwargs)


def error_of(data: bytes, **kwargs) -> RecordError:
    with pytest.raises(RecordError) as info:
        decode_image(data, **kwargs)
    return info.value


def assert_rgb(d: DecodedImage, width: int, height: int) -> None:
    assert d.pixels.dtype == np.uint8
    assert d.pixels.shape == (height, width, 3)
    assert (d.width, d.height) == (width, height)


def pil_rgba(rel_or_image, frame: int = 0) -> np.ndarray:
    im = pil(rel_or_image) if isinstance(rel_or_image, str) else rel_or_image
    im.seek(frame)
    return np.asarray(im.convert("RGBA")).astype(np.float64)


def over_white(rgba: np.ndarray) -> np.ndarray:
    """Independent float reference of compositing over white."""
    a = rgba[..., 3:] / 255.0
    return rgba[..., :3] * a + 255.0 * (1.0 - a)


def cv2_unchanged(rel: str) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(case(rel), np.uint8), cv2.IMREAD_UNCHANGED)


def encode(im: Image.Image, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **params)
    return buf.getvalue()


def quadrants(w: int = 40, h: int = 20) -> np.ndarray:
    """An (h, w, 3) image with four distinct flat quadrants (orientation is visible)."""
    arr = np.zeros((h, w, 3), np.uint8)
    arr[: h // 2, : w // 2] = (255, 0, 0)
    arr[: h // 2, w // 2:] = (0, 255, 0)
    arr[h // 2:, : w // 2] = (0, 0, 255)
    arr[h // 2:, w // 2:] = (255, 255, 0)
    return arr


# --- C01-C03: truncated / corrupt -------------------------------------------------------

@pytest.mark.parametrize(
    ("rel", "decoder_text"),
    [
        ("C02_trunc/truncated_image.png", "image file is truncated"),
        ("C03_trunc/corrupt-header.jpg", "Truncated File Read"),
    ],
)
def test_c02_c03_truncated_is_an_error_not_a_grey_image(rel, decoder_text):
    err = error_of(case(rel))
    assert err.reason == ErrorReason.TRUNCATED.value
    assert decoder_text in err.message


def test_c01_progressive_jpeg_cut_inside_its_eoi_is_truncated():
    """C01 ends with the 0xFF of its EOI (``…7b ff``): a byte-level cut inside a marker, so
    it stays ``truncated`` although its ten scans are whole; the same bytes with the whole
    EOI removed lack only the marker (T3-13's kind) and decode with ``missing_eoi``; a cut
    one byte into its last scan is ``truncated``. No grey-filled rows: every row varies
    (the image is noise)."""
    data = case("C01_trunc/truncated_jpeg.jpg")
    assert data.endswith(b"\xff") and data.count(b"\xff\xda") == 10
    err = error_of(data)
    assert err.reason == ErrorReason.TRUNCATED
    d = decode_image(data[:-1])
    assert d.flags == ("missing_eoi",)
    assert_rgb(d, 100, 100)
    assert (d.pixels.reshape(100, -1).std(axis=1) > 20).all()
    assert np.array_equal(d.pixels, decode_image(data[:-1] + b"\xff\xd9").pixels)
    assert error_of(data[:-3]).reason == ErrorReason.TRUNCATED


# --- C06-C08: EXIF orientation -----------------------------------------------------------

def test_c06_orientation_6_rotated_upright():
    raw = np.asarray(pil("C06_exif/hopper_orientation_6.jpg").convert("RGB"))
    d = decode_case("C06_exif/hopper_orientation_6.jpg")
    assert_rgb(d, 128, 128)
    assert (d.format, d.mime) == ("JPEG", "image/jpeg")
    np.testing.assert_array_equal(d.pixels, np.rot90(raw, k=-1))  # 6 = rotate 90 clockwise
    assert not np.array_equal(d.pixels, raw)


def test_c07_orientation_8_swaps_width_and_height():
    im = pil("C07_exif/orientation_rectangle.jpg")
    assert im.size == (2, 1) and im.getexif()[0x0112] == 8
    raw = np.asarray(im.convert("RGB"))
    d = decode_case("C07_exif/orientation_rectangle.jpg")
    assert_rgb(d, 1, 2)  # upright: 1 wide, 2 high
    np.testing.assert_array_equal(d.pixels, np.rot90(raw, k=1))  # 8 = rotate 90 counter-cw


def test_c08_orientation_6_with_icc_profile():
    im = pil("C08_exif/Landscape_6.jpg")
    assert im.size == (450, 600)
    d = decode_case("C08_exif/Landscape_6.jpg")
    assert_rgb(d, 600, 450)
    upright = ImageOps.exif_transpose(im).convert("RGB")
    ref = ImageCms.profileToProfile(upright, io.BytesIO(im.info["icc_profile"]),
                                    ImageCms.createProfile("sRGB"), outputMode="RGB")
    np.testing.assert_array_equal(d.pixels, np.asarray(ref))


# --- C12, C13, C15: CMYK JPEG / TIFF ------------------------------------------------------

@pytest.mark.parametrize(
    ("rel", "fmt", "size"),
    [
        ("C12_cmyk/jpg-cmyk-2.jpg", "JPEG", (256, 256)),
        ("C13_cmyk/pil_sample_cmyk.jpg", "JPEG", (100, 100)),
        ("C15_cmyk/tiff_strip_cmyk_jpeg.tif", "TIFF", (100, 100)),
    ],
)
def test_cmyk_decodes_to_three_channel_rgb_matching_an_independent_decoder(rel, fmt, size):
    assert pil(rel).mode == "CMYK"
    d = decode_case(rel)
    assert_rgb(d, *size)
    assert d.format == fmt
    # OpenCV (libjpeg's own CMYK->BGR, Adobe inversion included) agrees within rounding.
    ref = cv2.imdecode(np.frombuffer(case(rel), np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
    assert np.abs(d.pixels.astype(int) - ref).max() <= 3
    np.testing.assert_array_equal(d.pixels, np.asarray(pil(rel).convert("RGB")))


def test_c12_cmyk_background_white_and_text_dark():
    d = decode_case("C12_cmyk/jpg-cmyk-2.jpg")
    assert (d.pixels[0, 0] == 255).all() and (d.pixels[-1, -1] == 255).all()  # paper white
    assert (np.abs(d.pixels.astype(int) - 255).sum(axis=2) < 30).mean() > 0.9
    assert d.pixels.min() < 60  # the word "black" is dark, not inverted to white


@pytest.mark.parametrize("rel", ["C13_cmyk/pil_sample_cmyk.jpg",
                                 "C15_cmyk/tiff_strip_cmyk_jpeg.tif"])
def test_c13_c15_cmyk_not_inverted_red_corner_black_background(rel):
    d = decode_case(rel)
    r, g, b = d.pixels[0, 0].astype(int)  # the source has red pixels in the upper left
    assert r > 200 and g < 60 and b < 60
    assert d.pixels[-1, -1].max() < 30  # and the opposite corner is black


# --- C16-C18: 16-bit ---------------------------------------------------------------------

def test_c16_uint16_4660_scales_to_18_same_as_cv2():
    d = decode_case("C16_b16/uint16_1_4660.tif")
    assert_rgb(d, 10, 10)
    assert (d.pixels == 18).all()  # 4660 >> 8 == round(4660 / 257) == 18
    raw = cv2_unchanged("C16_b16/uint16_1_4660.tif")
    assert raw.dtype == np.uint16
    np.testing.assert_array_equal(d.pixels[..., 0], (raw >> 8).astype(np.uint8))


def test_c17_16bit_grey_with_trns_scaled_and_composited():
    raw = cv2_unchanged("C17_b16/i_trns.png")  # uint16 grey, tRNS ignored by cv2
    assert raw.dtype == np.uint16 and raw.max() == 255
    d = decode_case("C17_b16/i_trns.png")
    assert_rgb(d, 64, 64)
    assert d.has_alpha
    transparent = raw == 255  # the tRNS grey sample value
    assert transparent.sum() == 559
    assert (d.pixels[transparent] == WHITE).all()
    # opaque pixels: v >> 8 exactly as from cv2 (0 here: values < 256 are very dark);
    # a clipping converter would have returned the raw values 0..254 instead.
    expected = (raw >> 8).astype(np.uint8)
    for c in range(3):
        np.testing.assert_array_equal(d.pixels[..., c][~transparent], expected[~transparent])


def test_c18_16bit_rgb_tiff_matches_cv2_uint16_shifted():
    raw = cv2_unchanged("C18_b16/tiff_16bit_RGB.tiff")
    assert raw.dtype == np.uint16 and raw.shape == (40, 100, 3)
    d = decode_case("C18_b16/tiff_16bit_RGB.tiff")
    assert_rgb(d, 100, 40)
    np.testing.assert_array_equal(d.pixels, (raw[..., ::-1] >> 8).astype(np.uint8))


# --- C21-C27: transparency and alpha -----------------------------------------------------

@pytest.mark.parametrize(
    ("rel", "size", "fmt"),
    [
        ("C21_ptrns/pil123p.png", (162, 150), "PNG"),
        ("C22_ptrns/p_trns_single.png", (64, 64), "PNG"),
        ("C23_ptrns/first_frame_transparency.gif", (75, 50), "GIF"),
        ("C25_ptrns/rgb_trns.png", (64, 64), "PNG"),
        ("C26_alpha/transparent.png", (200, 150), "PNG"),
        ("C27_alpha/uncompressed_la.png", (128, 128), "PNG"),
    ],
)
def test_transparency_composited_over_white(rel, size, fmt):
    rgba = pil_rgba(rel)
    alpha = rgba[..., 3]
    assert (alpha == 0).any()  # every case has fully transparent pixels
    d = decode_case(rel)
    assert_rgb(d, *size)
    assert d.format == fmt and d.has_alpha
    assert (d.pixels[alpha == 0] == WHITE).all()
    np.testing.assert_array_equal(d.pixels[alpha == 255], rgba[alpha == 255][:, :3])
    assert np.abs(d.pixels - over_white(rgba)).max() <= 1


def test_c22_single_transparent_palette_index():
    im = pil("C22_ptrns/p_trns_single.png")
    index = np.asarray(im)
    d = decode_case("C22_ptrns/p_trns_single.png")
    assert (d.pixels[index == im.info["transparency"]] == WHITE).all()


def test_c23_gif_first_frame_transparency():
    im = pil("C23_ptrns/first_frame_transparency.gif")
    index = np.asarray(im)
    d = decode_case("C23_ptrns/first_frame_transparency.gif")
    assert (d.n_frames, d.is_animated) == (1, False)
    assert (d.pixels[index == 1] == WHITE).all()  # transparency index 1 of frame 0
    assert (d.pixels[index != 1] != WHITE).any(axis=1).all()


def test_c25_rgb_trns_colour_becomes_white():
    raw = np.asarray(pil("C25_ptrns/rgb_trns.png"))
    key = (raw == (0, 255, 52)).all(axis=2)
    d = decode_case("C25_ptrns/rgb_trns.png")
    assert key.any() and (d.pixels[key] == WHITE).all()
    np.testing.assert_array_equal(d.pixels[~key], raw[~key])


def test_c27_la_grey_replicated():
    d = decode_case("C27_alpha/uncompressed_la.png")
    assert (d.pixels[..., 0] == d.pixels[..., 1]).all()
    assert (d.pixels[..., 1] == d.pixels[..., 2]).all()


# --- C30-C32: animations -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("rel", "fmt", "mime", "size", "n_frames"),
    [
        ("C30_anim/dispose_prev.gif", "GIF", "image/gif", (100, 100), 5),
        ("C31_anim/apng_delay.png", "PNG", "image/apng", (128, 64), 5),
        ("C32_anim/rotating-squares.webp", "WEBP", "image/webp", (80, 80), 9),
    ],
)
def test_animation_first_frame_and_frame_count(rel, fmt, mime, size, n_frames):
    d = decode_case(rel)
    assert_rgb(d, *size)
    assert (d.format, d.mime, d.n_frames, d.is_animated) == (fmt, mime, n_frames, True)
    first = over_white(pil_rgba(rel, frame=0))
    assert np.abs(d.pixels - first).max() <= 1
    later = over_white(pil_rgba(rel, frame=n_frames - 1))
    assert np.abs(d.pixels - later).max() > 1  # it really is frame 0, not the last one


# --- C35, C36: decompression bombs -------------------------------------------------------

def test_c35_gif_bomb_rejected_with_header_dims():
    err = error_of(case("C35_bomb/decompression_bomb.gif"))
    assert err.reason == ErrorReason.TOO_LARGE.value
    assert err.message.startswith("65535x66601 ")


def test_c36_png_zlib_text_bomb_rejected():
    err = error_of(case("C36_bomb/png_decompression_dos.png"))
    assert err.reason == ErrorReason.TOO_LARGE.value
    assert err.message.startswith("1x1 ")
    assert "MAX_TEXT_CHUNK" in err.message


def test_c35_still_rejected_when_pillow_limit_is_disabled(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    err = error_of(case("C35_bomb/decompression_bomb.gif"))
    assert err.reason == ErrorReason.TOO_LARGE.value
    assert err.message.startswith("65535x66601 ")


# --- C38, C40, C41: empty file, wrong extension, HTML -----------------------------------

def test_c38_empty_file():
    assert error_of(case("C38_zero/empty.jpg")).reason == ErrorReason.EMPTY_FILE.value


def test_c40_png_bytes_with_jpg_extension_decoded_as_png():
    d = decode_case("C40_ext/hopper_png_bytes.jpg")
    assert_rgb(d, 128, 128)
    assert (d.format, d.mime) == ("PNG", "image/png")
    ref = np.asarray(pil("C40_ext/hopper_png_bytes.jpg").convert("RGB"))
    np.testing.assert_array_equal(d.pixels, ref)


def test_c41_html_with_jpg_extension_not_an_image():
    err = error_of(case("C41_ext/html_redirect_page.jpg"))
    assert err.reason == ErrorReason.NOT_AN_IMAGE.value
    assert "HTML" in err.message


# --- C44, C45: HEIF / AVIF ---------------------------------------------------------------

@pytest.mark.parametrize(("rel", "fmt", "mime"),
                         [("C44_heic/hopper.heif", "HEIF", "image/heif"),
                          ("C45_heic/hopper.avif", "AVIF", "image/avif")])
def test_heif_avif_decoded_close_to_the_png_original(rel, fmt, mime):
    d = decode_case(rel)
    assert_rgb(d, 128, 128)
    assert (d.format, d.mime, d.has_alpha) == (fmt, mime, False)
    hopper = decode_case("C40_ext/hopper_png_bytes.jpg").pixels.astype(int)
    assert np.abs(d.pixels.astype(int) - hopper).mean() < 8  # lossy, same picture


# --- C47, C48: grey and 1-bit ------------------------------------------------------------

def test_c47_grey_jpeg_replicated_to_three_channels():
    grey = np.asarray(pil("C47_gray/hopper_gray.jpg"))
    assert grey.ndim == 2
    d = decode_case("C47_gray/hopper_gray.jpg")
    assert_rgb(d, 128, 128)
    for c in range(3):
        np.testing.assert_array_equal(d.pixels[..., c], grey)


def test_c48_one_bit_becomes_0_or_255():
    d = decode_case("C48_gray/hopper_bw_500.png")
    assert_rgb(d, 500, 500)
    assert set(np.unique(d.pixels).tolist()) == {0, 255}
    assert (d.pixels[..., 0] == d.pixels[..., 2]).all()
    bits = np.asarray(pil("C48_gray/hopper_bw_500.png"))
    np.testing.assert_array_equal(d.pixels[..., 1] == 255, bits)


# --- C51: ICC ----------------------------------------------------------------------------

def test_c51_display_p3_converted_to_srgb():
    im = pil("C51_icc/p3.png")
    naive = np.asarray(im.convert("RGB"))
    ref = ImageCms.profileToProfile(im.convert("RGB"), io.BytesIO(im.info["icc_profile"]),
                                    ImageCms.createProfile("sRGB"), outputMode="RGB")
    d = decode_case("C51_icc/p3.png")
    assert_rgb(d, 8, 8)
    assert (np.asarray(im)[..., 3] == 255).all()  # opaque: compositing changes nothing
    np.testing.assert_array_equal(d.pixels, np.asarray(ref))
    assert not np.array_equal(d.pixels, naive)


# --- C53: multi-page TIFF ---------------------------------------------------------------

def test_c53_multipage_tiff_page_zero_and_page_count():
    im = pil("C53_tiffmp/multipage.tiff")
    page0 = np.asarray(im.convert("RGB"))
    d = decode_case("C53_tiffmp/multipage.tiff")
    assert_rgb(d, 10, 10)
    assert (d.format, d.n_frames, d.is_animated) == ("TIFF", 3, False)
    np.testing.assert_array_equal(d.pixels, page0)
    im.seek(1)
    assert not np.array_equal(np.asarray(im.convert("RGB")), page0)


# --- C55: SVG ----------------------------------------------------------------------------

def test_c55_svg_unsupported():
    err = error_of(case("C55_svg/check.svg"))
    assert err.reason == ErrorReason.UNSUPPORTED_FORMAT.value
    assert "svg" in err.message


# --- whole kinds, generated in memory ---------------------------------------------------

@pytest.mark.parametrize("fmt", ["WEBP", "PNG", "JPEG", "TIFF"])
def test_exif_orientation_6_applied_for_every_container(fmt):
    arr = quadrants(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6
    params = {"lossless": True} if fmt == "WEBP" else {"quality": 95} if fmt == "JPEG" else {}
    data = encode(Image.fromarray(arr), fmt, exif=exif.tobytes(), **params)
    d = decode_image(data)
    assert_rgb(d, 20, 40)
    assert d.format == fmt
    diff = np.abs(d.pixels.astype(int) - np.rot90(arr, k=-1))
    if fmt == "JPEG":  # lossy: ringing at the quadrant edges, flat centres
        assert diff.mean() < 10 and diff[5, 5].max() <= 8 and diff[-5, -5].max() <= 8
    else:
        assert diff.max() == 0


def png_chunks(data: bytes) -> list[bytes]:
    out, i = [], 8
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        out.append(data[i:i + 12 + n])
        i += 12 + n
    return out


def test_png_exif_chunk_after_idat_still_applied():
    arr = quadrants(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6
    chunks = png_chunks(encode(Image.fromarray(arr), "PNG", exif=exif.tobytes()))
    exif_chunk = next(c for c in chunks if c[4:8] == b"eXIf")
    rest = [c for c in chunks if c is not exif_chunk]
    data = b"\x89PNG\r\n\x1a\n" + b"".join(rest[:-1]) + exif_chunk + rest[-1]
    assert data.index(b"eXIf") > data.index(b"IDAT")
    d = decode_image(data)
    assert_rgb(d, 20, 40)
    np.testing.assert_array_equal(d.pixels, np.rot90(arr, k=-1))


def test_rgba_png_composited_over_white():
    arr = np.zeros((4, 3, 4), np.uint8)
    arr[..., :3] = (200, 100, 0)
    arr[0, :, 3] = 0
    arr[1, :, 3] = 128
    arr[2:, :, 3] = 255
    d = decode_image(encode(Image.fromarray(arr), "PNG"))
    assert d.has_alpha
    assert (d.pixels[0] == 255).all()
    np.testing.assert_array_equal(d.pixels[1, 0], [227, 177, 127])  # (c*128 + 255*127) / 255
    assert (d.pixels[2:] == (200, 100, 0)).all()


def test_opaque_rgb_has_no_alpha():
    d = decode_image(encode(Image.fromarray(quadrants()), "PNG"))
    assert not d.has_alpha and (d.n_frames, d.is_animated) == (1, False)
    np.testing.assert_array_equal(d.pixels, quadrants())


def test_la_image_composited_and_grey():
    la = Image.merge("LA", [Image.new("L", (5, 2), 40),
                            Image.fromarray(np.array([[0] * 5, [255] * 5], np.uint8))])
    d = decode_image(encode(la, "PNG"))
    assert d.has_alpha
    assert (d.pixels[0] == 255).all() and (d.pixels[1] == 40).all()


def test_16bit_grey_png_scaled_not_clipped():
    ramp = np.linspace(0, 65535, 256 * 4).astype(np.uint16).reshape(4, 256)
    im = Image.fromarray(ramp)
    assert im.mode == "I;16"
    d = decode_image(encode(im, "PNG"))
    assert_rgb(d, 256, 4)
    np.testing.assert_array_equal(d.pixels[..., 0], (ramp >> 8).astype(np.uint8))
    assert d.pixels.min() == 0 and d.pixels.max() == 255
    assert np.all(np.diff(d.pixels[..., 0].ravel().astype(int)) >= 0)  # monotone, no wrap
    assert (d.pixels[..., 0] == 255).mean() < 0.01  # not clipped to white


def test_broken_icc_profile_falls_back_to_plain_rgb():
    data = encode(Image.fromarray(quadrants()), "PNG", icc_profile=b"not an icc profile")
    assert Image.open(io.BytesIO(data)).info["icc_profile"] == b"not an icc profile"
    np.testing.assert_array_equal(decode_image(data).pixels, quadrants())


def test_srgb_icc_profile_is_nearly_identity():
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    data = encode(Image.fromarray(quadrants()), "PNG", icc_profile=srgb)
    assert np.abs(decode_image(data).pixels.astype(int) - quadrants()).max() <= 2


@pytest.mark.parametrize("orientation", [1, 6])
def test_jpeg_draft_keeps_short_side_and_reports_full_size(orientation):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (600, 800, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(Image.fromarray(arr), "JPEG", exif=exif.tobytes())
    d = decode_image(data, draft_min_side_px=100)
    full = (800, 600) if orientation == 1 else (600, 800)
    assert (d.width, d.height) == full
    h, w = d.pixels.shape[:2]
    assert 100 <= min(h, w) < 600
    assert (w > h) == (full[0] > full[1])
    assert decode_image(data).pixels.shape[:2] == (full[1], full[0])  # no draft by default


def test_jpeg_draft_on_cmyk():
    d = decode_case("C13_cmyk/pil_sample_cmyk.jpg", draft_min_side_px=25)
    assert (d.width, d.height) == (100, 100)
    assert d.pixels.shape == (25, 25, 3)
    assert d.pixels[0, 0, 0] > 200 and d.pixels[-1, -1].max() < 30  # still red / black


def test_draft_not_applied_when_image_already_small():
    d = decode_case("C06_exif/hopper_orientation_6.jpg", draft_min_side_px=100)
    assert d.pixels.shape == (128, 128, 3)


def png_with_ihdr_size(width: int, height: int) -> bytes:
    data = bytearray(encode(Image.new("RGB", (1, 1)), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_png_header_bomb_rejected_before_decoding():
    err = error_of(png_with_ihdr_size(100_000, 100_000))
    assert err.reason == ErrorReason.TOO_LARGE.value
    assert err.message.startswith("100000x100000 ")


def test_max_pixels_is_a_parameter():
    data = encode(Image.fromarray(quadrants(100, 60)), "PNG")
    assert decode_image(data).width == 100
    err = error_of(data, max_pixels=5999)
    assert err.reason == ErrorReason.TOO_LARGE.value and err.message.startswith("100x60 ")
    assert decode_image(data, max_pixels=6000).height == 60
    assert DEFAULT_MAX_PIXELS == 89_478_485


def test_just_over_pillow_warning_limit_rejected_by_own_check():
    w, h = 10_000, 9_000  # 9.0e7 > 89_478_485 but < 2x: Pillow would only warn
    err = error_of(png_with_ihdr_size(w, h))
    assert err.reason == ErrorReason.TOO_LARGE.value and err.message.startswith("10000x9000 ")


@pytest.mark.parametrize(
    "data",
    [
        b"<!DOCTYPE html><html><head><title>404</title></head><body>gone</body></html>",
        b"  \n<html><body>Access denied</body></html>",
        b"This is plain text, not a picture.\n",
        b"BMW 320i for sale, call now",
        bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)),
        b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n",
        b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom",
    ],
)
def test_non_images_are_not_an_image(data):
    assert error_of(data).reason == ErrorReason.NOT_AN_IMAGE.value


def test_truncated_half_of_a_real_photo():
    photo = sorted((DATA / "photos").glob("*.jpg"))[0].read_bytes()
    assert decode_image(photo).pixels.ndim == 3
    err = error_of(photo[: len(photo) // 2])
    assert err.reason == ErrorReason.TRUNCATED.value


def test_garbage_after_valid_magic_is_corrupt_not_unidentified():
    err = error_of(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    assert err.reason in (ErrorReason.CORRUPT.value, ErrorReason.TRUNCATED.value)


def test_pixels_array_is_writable_and_contiguous():
    d = decode_case("C06_exif/hopper_orientation_6.jpg")
    assert d.pixels.flags.writeable and d.pixels.flags.c_contiguous


@pytest.mark.parametrize(
    ("data", "fmt"),
    [
        (b"\xff\xd8\xff\xe0", "JPEG"),
        (b"\x89PNG\r\n\x1a\n", "PNG"),
        (b"GIF89a", "GIF"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "WEBP"),
        (b"II*\x00", "TIFF"),
        (b"MM\x00*", "TIFF"),
        (b"BM" + b"\x00" * 12 + b"\x28\x00\x00\x00", "BMP"),
        (b"\x00\x00\x00\x1cftypheic\x00\x00\x00\x00mif1heic", "HEIF"),
        (b"\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1avif", "AVIF"),
        (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>', "SVG"),
        (b"\xef\xbb\xbf<!doctype HTML><p>", "HTML"),
        (b"hello", None),
        (b"", None),
    ],
)
def test_sniff_format(data, fmt):
    assert sniff_format(data) == fmt
