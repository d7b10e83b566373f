"""Decoder edges of round 3: JPEGs without their final EOI (T3-13), formats without a
signature opened by their extension (T3-14), every default image extension decodes, and
the memory a bomb-like PNG may cost (finding 14)."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.columns import SOURCE_BYTES, SOURCE_URI, STATUS
from pipeline.errors import RecordError
from pipeline.media import imageio_util
from pipeline.media.decode import decode_image
from pipeline.records import ErrorReason
from pipeline.spec import DECODED_IMAGE_FORMATS, DecodeSpec, image_extensions
from pipeline.steps.image import DecodeStep, source_extension

CASES = Path(__file__).parents[2] / "data" / "cases"
T3_13 = CASES / "T3-13_jpeg_missing_eoi"
T3_14 = CASES / "T3-14_tga" / "files"


def quadrants(w: int = 40, h: int = 20) -> np.ndarray:
    """An (h, w, 3) image with four distinct flat quadrants."""
    arr = np.zeros((h, w, 3), np.uint8)
    arr[: h // 2, : w // 2] = (255, 0, 0)
    arr[: h // 2, w // 2:] = (0, 255, 0)
    arr[h // 2:, : w // 2] = (0, 0, 255)
    arr[h // 2:, w // 2:] = (255, 255, 0)
    return arr


def error_of(data: bytes, **kwargs) -> RecordError:
    with pytest.raises(RecordError) as info:
        decode_image(data, **kwargs)
    return info.value


def photo_jpeg(**params) -> bytes:
    buf = io.BytesIO()
    Image.open(T3_13 / "reference" / "photo.png").convert("RGB").save(buf, "JPEG", **params)
    return buf.getvalue()


# --- T3-13: JPEG without EOI -------------------------------------------------------------

@pytest.mark.skipif(not T3_13.is_dir(), reason="T3-13 case files not present")
def test_t3_13_complete_jpeg_without_eoi_decodes_like_the_whole_file_with_flag():
    files = T3_13 / "files"
    no_eoi = decode_image((files / "a_baseline_no_eoi.jpg").read_bytes())
    whole = decode_image((files / "c_baseline_complete.jpg").read_bytes())
    assert not (files / "a_baseline_no_eoi.jpg").read_bytes().endswith(b"\xff\xd9")
    assert no_eoi.flags == ("missing_eoi",)
    assert whole.flags == ()
    assert np.array_equal(no_eoi.pixels, whole.pixels)
    assert (no_eoi.width, no_eoi.height, no_eoi.format) == (320, 240, "JPEG")


@pytest.mark.skipif(not T3_13.is_dir(), reason="T3-13 case files not present")
def test_t3_13_really_truncated_jpeg_stays_truncated():
    err = error_of((T3_13 / "files" / "d_baseline_cut_60pct.jpg").read_bytes())
    assert err.reason == ErrorReason.TRUNCATED


@pytest.mark.parametrize("params", [
    {"quality": 90},
    {"quality": 95, "optimize": True},
    {"quality": 75, "progressive": True},
    {"quality": 50, "progressive": True, "subsampling": 0},
])
def test_generated_jpeg_without_eoi_decodes_and_every_cut_is_truncated(params):
    """Baseline and progressive: EOI removed -> same pixels, flag; cut a few bytes into
    the last scan, mid-file, or exactly between two progressive scans -> truncated."""
    whole = photo_jpeg(**params)
    assert whole.endswith(b"\xff\xd9")
    ref = decode_image(whole)
    fixed = decode_image(whole[:-2])
    assert fixed.flags == ("missing_eoi",) and np.array_equal(fixed.pixels, ref.pixels)
    # EOI cut after its 0xFF: a cut inside a marker (C01's kind) stays truncated
    assert error_of(whole[:-1]).reason == ErrorReason.TRUNCATED
    cuts = list(range(3, 40)) + [len(whole) // 3, len(whole) // 2, 2 * len(whole) // 3]
    # a progressive file cut right before a later scan's SOS: all scans before it whole
    sos = [i for i in range(len(whole) - 1) if whole[i:i + 2] == b"\xff\xda"]
    cuts += [len(whole) - i for i in sos[1:]]
    for cut in cuts:
        err = error_of(whole[:-cut])
        assert err.reason == ErrorReason.TRUNCATED, (cut, err)


def test_jpeg_scan_script_coverage():
    """imageio_util.jpeg_scans_complete: all scans of a progressive file cover it; a file
    cut before its last scan (all earlier scans whole) does not; a cut header is not."""
    whole = photo_jpeg(quality=75, progressive=True)
    sos = [i for i in range(len(whole) - 1) if whole[i:i + 2] == b"\xff\xda"]
    assert len(sos) > 2
    assert imageio_util.jpeg_scans_complete(whole[:-2])
    assert not imageio_util.jpeg_scans_complete(whole[:sos[-1]])
    assert not imageio_util.jpeg_scans_complete(whole[:sos[0] + 5])   # inside the SOS header
    assert imageio_util.jpeg_scans_complete(photo_jpeg(quality=90)[:-2])
    assert not imageio_util.jpeg_scans_complete(b"not a jpeg")


# --- T3-14: formats without a signature ------------------------------------------------------

@pytest.mark.skipif(not T3_14.is_dir(), reason="T3-14 case files not present")
@pytest.mark.parametrize("name", ["a_targa.tga", "b_targa_rle.tga"])
def test_t3_14_targa_decoded_by_its_extension(name):
    data = (T3_14 / name).read_bytes()
    control = decode_image((T3_14 / "f_control.png").read_bytes())
    d = decode_image(data, ext=".tga")
    assert (d.format, d.mime) == ("TGA", "image/x-tga")
    assert np.array_equal(d.pixels, control.pixels)
    assert d.pixels[0, 0].tolist() == [255, 0, 0] and d.pixels[-1, -1].tolist() == [255, 255, 0]
    # only the extension opens it: without one (or with another) it is not an image
    assert error_of(data).reason == ErrorReason.NOT_AN_IMAGE
    assert error_of(data, ext=".jpg").reason == ErrorReason.NOT_AN_IMAGE


def test_signature_less_failure_names_the_format():
    err = error_of(b"certainly not a targa file, just some text", ext=".tga")
    assert err.reason == ErrorReason.CORRUPT and err.message.startswith("TGA: ")
    buf = io.BytesIO()
    Image.fromarray(quadrants()).save(buf, "TGA")
    err = error_of(buf.getvalue()[:60], ext=".TGA")
    assert err.reason == ErrorReason.TRUNCATED and err.message.startswith("TGA: ")


def test_signature_formats_still_win_over_the_extension():
    """A PNG named .tga is a PNG; text named .sgi fails SGI's signature: not_an_image."""
    buf = io.BytesIO()
    Image.fromarray(quadrants()).save(buf, "PNG")
    assert decode_image(buf.getvalue(), ext=".tga").format == "PNG"
    assert error_of(b"hello, this is text" * 4, ext=".sgi").reason == ErrorReason.NOT_AN_IMAGE


@pytest.mark.skipif(not T3_14.is_dir(), reason="T3-14 case files not present")
@pytest.mark.parametrize("uri, ext", [
    ("photos/a_targa.tga", ".tga"),
    ("s3://bucket/x/A.TGA", ".tga"),
    ("https://host/img/a.tga?sig=abc.png", ".tga"),
    ("shards/s-000.tar#sample1.tga", ".tga"),
    ("photos/noext", None),
])
def test_decode_step_passes_the_source_extension(uri, ext):
    data = (T3_14 / "a_targa.tga").read_bytes()
    batch = {SOURCE_BYTES: [data], SOURCE_URI: [uri], STATUS: ["ok"]}
    assert source_extension(batch, 0) == ext
    out = DecodeStep(DecodeSpec())(batch)
    if ext:
        assert out[STATUS] == ["ok"] and out["format"] == ["TGA"]
        assert out["_pixels"][0][0, 0].tolist() == [255, 0, 0]
    else:
        assert out[STATUS] == ["error"] and out["error_reason"] == ["not_an_image"]


# --- every default extension decodes ----------------------------------------------------------

def _dcx(pcx: bytes) -> bytes:
    """A one-page DCX: magic 0x3ADE68B1, page offsets (0-terminated), then a PCX."""
    return struct.pack("<III", 0x3ADE68B1, 12, 0) + pcx


def _sun(arr: np.ndarray) -> bytes:
    """Sun raster, 24-bit, RT_STANDARD (1), no colour map, BGR rows padded to 16 bits."""
    h, w, _ = arr.shape
    row = arr[:, :, ::-1].reshape(h, w * 3)
    if (w * 3) % 2:
        row = np.concatenate([row, np.zeros((h, 1), np.uint8)], axis=1)
    body = row.tobytes()
    return struct.pack(">8I", 0x59A66A95, w, h, 24, len(body), 1, 0, 0) + body


def _xpm(arr: np.ndarray) -> bytes:
    h, w, _ = arr.shape
    colours = {tuple(c): chr(ord("a") + n) for n, c in enumerate(
        sorted({tuple(p) for p in arr.reshape(-1, 3).tolist()}))}
    lines = [f'"{w} {h} {len(colours)} 1"'] + [
        f'"{ch} c #{c[0]:02X}{c[1]:02X}{c[2]:02X}"' for c, ch in colours.items()] + [
        '"' + "".join(colours[tuple(p)] for p in r.tolist()) + '"' for r in arr]
    return ("/* XPM */\nstatic char *img[] = {\n" + ",\n".join(lines) + "\n};\n").encode()


def _psd(arr: np.ndarray) -> bytes:
    """Minimal PSD: RGB, 8 bits, raw (compression 0) planar data (Adobe PSD spec)."""
    h, w, _ = arr.shape
    head = b"8BPS" + struct.pack(">H6xHIIHH", 1, 3, h, w, 8, 3)
    planes = b"".join(arr[:, :, c].tobytes() for c in range(3))
    return head + struct.pack(">III", 0, 0, 0) + struct.pack(">H", 0) + planes


def _pillow(im: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


def generated(ext: str) -> tuple[bytes, np.ndarray, float]:
    """A file of extension ``ext``, the RGB pixels it holds and the mean abs tolerance."""
    Image.init()
    fmt = Image.registered_extensions().get(ext)
    arr = quadrants()
    im = Image.fromarray(arr)
    lossy = {"JPEG", "MPO", "JPEG2000", "AVIF", "WEBP", "DDS", "BLP"}
    if ext in (".heic", ".heics", ".heif", ".heifs", ".hif"):
        pillow_heif = pytest.importorskip("pillow_heif")
        pillow_heif.register_heif_opener()
        return _pillow(im, "HEIF"), arr, 12.0
    if fmt == "CUR":   # an ICO whose ICONDIR type is 2 (cursor)
        buf = io.BytesIO()
        Image.fromarray(quadrants(32, 32)).save(buf, "ICO", bitmap_format="bmp")
        data = bytearray(buf.getvalue())
        data[2] = 2
        return bytes(data), quadrants(32, 32), 0.0
    if fmt == "DCX":
        return _dcx(_pillow(im, "PCX")), arr, 0.0
    if fmt == "SUN":
        return _sun(arr), arr, 0.0
    if fmt == "XPM":
        return _xpm(arr), arr, 0.0
    if fmt == "PSD":
        return _psd(arr), arr, 0.0
    if fmt in ("XBM", "MSP"):   # 1-bit formats: the image as black and white
        bw = im.convert("1")
        return _pillow(bw, fmt), np.asarray(bw.convert("RGB")), 0.0
    if ext == ".pfm":
        grey = np.asarray(im.convert("L"))
        pfm = Image.fromarray((grey / 255.0).astype(np.float32))
        return _pillow(pfm, "PPM"), np.repeat(grey[..., None], 3, axis=2), 0.0
    if fmt == "BLP":   # BLP holds a palette image
        return _pillow(im.convert("P"), fmt), arr, 0.0
    if fmt == "ICNS":
        big = Image.fromarray(quadrants(64, 64))
        return _pillow(big, fmt), quadrants(64, 64), 4.0   # Pillow rescales the sizes
    if fmt == "ICO":
        sq = Image.fromarray(quadrants(32, 32))
        return _pillow(sq, fmt), quadrants(32, 32), 0.0
    return _pillow(im, fmt), arr, 14.0 if fmt in lossy else 0.0


@pytest.mark.parametrize("ext", [e for e in image_extensions() if e != ".svg"])
def test_every_default_extension_decodes_a_generated_file(ext):
    data, expect, tolerance = generated(ext)
    d = decode_image(data, ext=ext)
    if d.pixels.shape != expect.shape:   # ICNS: Pillow picks its largest size
        expect = np.asarray(Image.fromarray(expect).resize(d.pixels.shape[1::-1],
                                                            Image.Resampling.NEAREST))
    diff = np.abs(d.pixels.astype(int) - expect.astype(int)).mean()
    assert diff <= tolerance, (ext, d.format, diff)


def test_svg_default_extension_is_an_unsupported_format_row():
    """.svg is in the default list on purpose: read, then refused by name."""
    err = error_of(b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>',
                   ext=".svg")
    assert err.reason == ErrorReason.UNSUPPORTED_FORMAT


def test_default_list_formats_agree_with_the_decoder():
    """spec.DECODED_IMAGE_FORMATS (the spec imports no media module) is what the decoder
    opens; the stubs and untested openers are out of the default list."""
    decoded = imageio_util.RASTER_FORMATS | imageio_util.EXTENSION_FORMATS | {"MPO"}
    assert DECODED_IMAGE_FORMATS == decoded - {"HEIF"}   # HEIF: spec.HEIF_EXTENSIONS
    for ext in (".h5", ".grib", ".bufr", ".wmf", ".emf", ".eps", ".mpg", ".mpeg", ".iim"):
        assert ext not in image_extensions()
    for ext in (".tga", ".cur", ".pcx", ".sgi", ".ras", ".xpm", ".dcx", ".pfm", ".psd"):
        assert ext in image_extensions()


# --- finding 14: the peak memory of a bomb-like PNG --------------------------------------

def flat_png(width: int, height: int, color_type: int, pixel: bytes, depth: int = 8) -> bytes:
    """A PNG of one ``pixel`` (its bytes as stored) everywhere, built chunk by chunk (rows
    streamed through zlib, so a 20000 x 20000 image costs a few MiB here): colour type 2
    RGB, 6 RGBA, 0 grey; ``depth`` bits per sample."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    row = b"\x00" + pixel * width
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


_PEAK = """
import json, resource, sys
from pipeline.media.decode import decode_image
data = open(sys.argv[1], "rb").read()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
try:
    d = decode_image(data)
    out = {"shape": list(d.pixels.shape), "pixel": d.pixels[7, 7].tolist()}
except Exception as exc:
    out = {"error": str(exc)}
out["added"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps(out))
"""


def peak_of(tmp_path: Path, data: bytes) -> dict:
    path = tmp_path / "img.png"
    path.write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, check=False,
                          text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("color_type, stored, depth, bytes_per_pixel, pixel", [
    (2, bytes([200, 30, 90]), 8, 9.0, [200, 30, 90]),          # before: 12.1 bytes/pixel
    (6, bytes([200, 30, 90, 128]), 8, 10.0, [227, 142, 172]),  # RGBA over white; before 46
    (0, (4660).to_bytes(2, "big"), 16, 13.0, [18, 18, 18]),    # 16-bit grey; before ~28
])
def test_large_flat_png_peak_is_bounded_per_pixel(tmp_path, color_type, stored, depth,
                                                  bytes_per_pixel, pixel):
    """A 6000 x 6000 single-colour PNG (~100 KB on disk, 36 M pixels, under max_pixels)
    costs Pillow's image (4 bytes per pixel; 16-bit grey: its samples + an 8-bit copy) +
    the output array (3) + strips, not the former extra copies (convert, tobytes, uint32
    compositing, int64 samples). Measured after the change: 5.9, 7.4, ~10 bytes/pixel."""
    data = flat_png(6000, 6000, color_type, stored, depth)
    assert len(data) < 400_000
    m = peak_of(tmp_path, data)
    assert m.get("shape") == [6000, 6000, 3] and m["pixel"] == pixel, m
    assert m["added"] < bytes_per_pixel * 36e6, m["added"] / 36e6


def test_png_bomb_dimensions_refused_before_decoding(tmp_path):
    """20000 x 20000 (400 M pixels) in a few hundred KB: ``too_large`` naming the limit,
    from the header, with no pixel buffer allocated."""
    data = flat_png(20000, 20000, 0, b"\x00")
    assert len(data) < 1_000_000
    m = peak_of(tmp_path, data)
    assert m["error"].startswith("too_large: 20000x20000 (400000000 pixels) exceeds "
                                 "max_pixels=89478485"), m
    assert m["added"] < 64 * 2**20


# --- the files datasource end to end: TGA by extension, JPEG without EOI ---------------------

def test_files_job_decodes_targa_and_eoi_less_jpeg_and_keeps_the_cut_one_an_error(tmp_path):
    """A real files-datasource partition (run_partition, no Ray): the TGA files are read
    (default extension list) and decoded by their extension; the EOI-less JPEG is ``ok``
    with ``missing_eoi``; the really cut JPEG is a ``truncated`` error row."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from pipeline.assembly import assemble
    from pipeline.output import plan as planning
    from pipeline.runtime.partition import run_partition
    from pipeline.spec import JobSpec

    src = tmp_path / "in"
    src.mkdir()
    for path in [T3_14 / "a_targa.tga", T3_14 / "b_targa_rle.tga", T3_14 / "f_control.png",
                 T3_13 / "files" / "a_baseline_no_eoi.jpg",
                 T3_13 / "files" / "d_baseline_cut_60pct.jpg"]:
        (src / path.name).write_bytes(path.read_bytes())
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(src), "partition_size": 10},
        "sink": {"uri": str(tmp_path / "out"), "hash_columns": ["phash"]},
        "dedup": {"exact": False, "near": False}, "text_embedding": {"enabled": False}})
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, {}, pool, setup=True)
    part = next(planning.pack(pipeline.datasource.list_inputs(), spec.source.partition_size))
    out = run_partition(pipeline, part, "cafe", pool)
    assert out.committed
    data = next(f for f in out.marker.files if f.startswith("data/"))
    rows = {r["key"]: r for r in pq.read_table(tmp_path / "out" / data).to_pylist()}
    assert set(rows) == {"a_targa", "b_targa_rle", "f_control", "a_baseline_no_eoi",
                         "d_baseline_cut_60pct"}
    for key in ("a_targa", "b_targa_rle"):
        assert (rows[key]["status"], rows[key]["format"], rows[key]["mime"]) == (
            "ok", "TGA", "image/x-tga"), rows[key]["error"]
        assert (rows[key]["width"], rows[key]["height"]) == (64, 48)
        assert rows[key]["phash"] == rows["f_control"]["phash"]
    eoi = rows["a_baseline_no_eoi"]
    assert (eoi["status"], eoi["decode_flags"], eoi["width"]) == ("ok", ["missing_eoi"], 320)
    cut = rows["d_baseline_cut_60pct"]
    assert (cut["status"], cut["error_reason"]) == ("error", "truncated")
