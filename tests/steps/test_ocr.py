"""Text in the image (pipeline.steps.ocr, RapidOCR): rendered text vs blank images, the
downscale, the union area, error rows, videos' middle frame, and real jobs (Ray for the
bundled photos, in process for the bundled videos) writing every signal column typed."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image, ImageDraw, ImageFont

from pipeline.columns import (
    BRIGHTNESS,
    CLIPPED_FRACTION,
    CONTRAST,
    FRAMES,
    OCR_TEXT,
    PIXELS,
    SHARPNESS,
    STATUS,
    TEXT_AREA_FRACTION,
    TEXT_BOX_COUNT,
)
from pipeline.read import read_output
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec, OcrSpec
from pipeline.steps.ocr import (
    OcrStep,
    detect_text,
    new_engine,
    shrink,
    union_area_fraction,
)
from tests.conftest import DATA, PHOTOS
from tests.input.local_job import run_job as run_job_in_process

#: The detected union area over the rendered text's bounding-box area (Pillow
#: ``textbbox``): DB's unclip (ratio 1.6) grows every box by area * 1.6 / perimeter on each
#: side, so small text gets relatively larger boxes. Measured 1.07-1.63 on the cases below.
AREA_RATIO = (0.9, 1.8)


@pytest.fixture(scope="module")
def engine():
    return new_engine()


def render(lines: list[tuple[str, int, tuple[int, int]]], width: int, height: int,
           background: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Black text (Pillow's bundled font at each size) on white or on ``background``;
    returns the RGB pixels and the area fraction of the union of the texts' bboxes."""
    im = (Image.fromarray(background).resize((width, height)) if background is not None
          else Image.new("RGB", (width, height), "white"))
    draw, mask = ImageDraw.Draw(im), np.zeros((height, width), bool)
    for text, size, xy in lines:
        font = ImageFont.load_default(size=size)
        box = draw.textbbox(xy, text, font=font)
        if background is not None:
            draw.rectangle((box[0] - 6, box[1] - 6, box[2] + 6, box[3] + 6), fill="white")
        draw.text(xy, text, fill="black", font=font)
        mask[box[1]:box[3], box[0]:box[2]] = True
    return np.asarray(im), float(mask.mean())


CASES = {
    "one_line": ([("HELLO WORLD", 48, (40, 60))], 640, 480, ["HELLO WORLD"]),
    "three_lines": ([("Quality signals", 32, (30, 40)), ("text in image", 40, (60, 200)),
                     ("2026", 64, (300, 330))], 640, 480, ["Quality signals", "2026"]),
    "shrunk_1280": ([("BIG SALE TODAY", 96, (80, 120)), ("www.example.com", 48, (100, 600))],
                    1280, 960, ["example.com"]),
    "small_800": ([("caption", 28, (20, 20))], 800, 600, ["caption"]),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rendered_text_is_found_with_its_area_and_words(engine, case):
    lines, width, height, words = CASES[case]
    pixels, bbox_fraction = render(lines, width, height)
    got = detect_text(engine, pixels, 640, text=True)
    assert got[TEXT_BOX_COUNT] == len(lines)
    ratio = got[TEXT_AREA_FRACTION] / bbox_fraction
    assert AREA_RATIO[0] <= ratio <= AREA_RATIO[1], ratio
    for word in words:
        assert word in got[OCR_TEXT], got[OCR_TEXT]
    # rendered text is read, so every detected box is kept: the same as detection alone
    assert detect_text(engine, pixels, 640, text=False) == {
        TEXT_AREA_FRACTION: got[TEXT_AREA_FRACTION], TEXT_BOX_COUNT: got[TEXT_BOX_COUNT]}


def test_recognition_drops_boxes_it_cannot_read(engine):
    """Detection alone finds a text-like box on a bundled photo without text (a cat's fur,
    000000196393); with recognition on, that box is not read, so it does not count."""
    photo = np.asarray(Image.open(PHOTOS / "000000196393.jpg").convert("RGB"))
    alone = detect_text(engine, photo, 640, text=False)
    read = detect_text(engine, photo, 640, text=True)
    assert alone[TEXT_BOX_COUNT] >= 1 and alone[TEXT_AREA_FRACTION] > 0.3
    assert read == {TEXT_AREA_FRACTION: 0.0, TEXT_BOX_COUNT: 0, OCR_TEXT: ""}


def test_text_on_a_photo_is_found(engine):
    photo = np.asarray(Image.open(min(PHOTOS.glob("*.jpg"))).convert("RGB"))
    pixels, bbox_fraction = render([("PHOTO CREDIT", 40, (30, 300))], 640, 427, photo)
    got = detect_text(engine, pixels, 640, text=True)
    assert got[TEXT_BOX_COUNT] >= 1 and "CREDIT" in got[OCR_TEXT]
    assert got[TEXT_AREA_FRACTION] >= AREA_RATIO[0] * bbox_fraction


@pytest.mark.parametrize("level", [0, 128, 255])
def test_blank_images_have_no_text(engine, level):
    got = detect_text(engine, np.full((480, 640, 3), level, np.uint8), 640, text=True)
    assert got == {TEXT_AREA_FRACTION: 0.0, TEXT_BOX_COUNT: 0, OCR_TEXT: ""}


def test_images_are_shrunk_to_max_side_and_never_enlarged():
    assert shrink(np.zeros((960, 2560, 3), np.uint8), 640).shape == (240, 640, 3)
    small = np.zeros((100, 50, 3), np.uint8)
    assert shrink(small, 640) is small


def test_the_union_counts_overlaps_once():
    a = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], np.float32)
    b = a + 5  # overlaps a in a 6x6 square (pixels 5..10 inclusive)
    assert union_area_fraction([a], 100, 100) == pytest.approx(121 / 10_000)
    assert union_area_fraction([a, b], 100, 100) == pytest.approx((121 * 2 - 36) / 10_000)
    assert union_area_fraction([], 100, 100) == 0.0


def test_the_step_writes_per_row_and_a_failing_row_is_that_rows_error():
    step = OcrStep(OcrSpec(enabled=True))
    assert step.writes == (TEXT_AREA_FRACTION, TEXT_BOX_COUNT)  # no ocr_text unless text
    step.setup()
    text, _ = render(CASES["one_line"][0], 640, 480)
    batch = {STATUS: ["ok", "ok", "ok", "rejected"],
             PIXELS: [text, np.zeros((8, 8), np.uint8), np.full((64, 64, 3), 255, np.uint8),
                      None]}
    out = step(batch)
    assert out[STATUS] == ["ok", "error", "ok", "rejected"]
    assert out["error_reason"][1] == "step_failed" and "OcrStep" in out["error"][1]
    assert out[TEXT_BOX_COUNT] == [1, None, 0, None]
    assert OCR_TEXT not in out


def test_rows_in_threads_borrow_their_own_engines_and_match_one_thread():
    lines, width, height, _ = CASES["three_lines"]
    images = [render(lines, width, height)[0], render(CASES["shrunk_1280"][0], 1280, 960)[0],
              np.full((300, 400, 3), 255, np.uint8)] * 2
    step = OcrStep(OcrSpec(enabled=True, text=True))
    step.setup()
    alone = step({STATUS: ["ok"] * 6, PIXELS: list(images)})
    with ThreadPoolExecutor(3) as pool:
        step.executor = pool
        threaded = step({STATUS: ["ok"] * 6, PIXELS: list(images)})
    for col in (TEXT_AREA_FRACTION, TEXT_BOX_COUNT, OCR_TEXT):
        assert threaded[col] == alone[col], col
    assert alone[TEXT_BOX_COUNT] == [3, 2, 0] * 2
    assert 1 < step._engines.qsize() <= 3  # more engines only while rows overlapped


def test_a_video_row_is_read_on_its_middle_frame():
    step = OcrStep(OcrSpec(enabled=True, text=True), video=True)
    assert step.reads == (FRAMES,)
    text, _ = render(CASES["one_line"][0], 640, 480)
    blank = np.full_like(text, 255)
    out = step({STATUS: ["ok", "ok"], FRAMES: [[blank, text, blank], [text, blank, blank]]})
    assert out[TEXT_BOX_COUNT] == [1, 0]
    assert out[OCR_TEXT] == ["HELLO WORLD", ""]


SIGNALS = {"image": {"enabled": True}, "ocr": {"enabled": True, "text": True}}
TYPES = {SHARPNESS: pa.float32(), BRIGHTNESS: pa.float32(), CONTRAST: pa.float32(),
         CLIPPED_FRACTION: pa.float32(), TEXT_AREA_FRACTION: pa.float32(),
         TEXT_BOX_COUNT: pa.int32(), OCR_TEXT: pa.large_string()}


def _check_typed(table: pa.Table) -> list[dict]:
    for name, arrow_type in TYPES.items():
        assert table.schema.field(name).type == arrow_type, name
    rows = table.to_pylist()
    for r in rows:
        assert r[STATUS] == "ok", r.get("error")
        assert r[SHARPNESS] > 0 and 0 < r[BRIGHTNESS] < 255 and 0 < r[CONTRAST] < 128
        assert 0 <= r[CLIPPED_FRACTION] <= 1 and 0 <= r[TEXT_AREA_FRACTION] <= 1
        assert r[TEXT_BOX_COUNT] >= 0 and isinstance(r[OCR_TEXT], str)
    return rows


def test_a_ray_job_writes_the_signal_columns_on_the_bundled_photos(ray_local, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for path in sorted(PHOTOS.glob("*.jpg"))[:5]:
        shutil.copy(path, src / path.name)
    pixels, _ = render(CASES["one_line"][0], 640, 480)
    Image.fromarray(pixels).save(src / "zz_text.png")
    spec = JobSpec.model_validate({
        "name": "signals", "source": {"kind": "files", "uri": str(src), "partition_size": 10},
        "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False},
        "signals": SIGNALS, "runtime": {"num_workers": 1, "max_attempts": 1}})
    report = run_job(spec)
    assert report.complete, report.format()
    rows = {r["key"]: r for r in _check_typed(read_output(str(tmp_path / "out")).to_table())}
    assert len(rows) == 6
    assert rows["zz_text"][TEXT_BOX_COUNT] == 1 and rows["zz_text"][OCR_TEXT] == "HELLO WORLD"
    assert rows["zz_text"][BRIGHTNESS] > 200 and rows["zz_text"][CLIPPED_FRACTION] > 0.9


def test_a_video_job_writes_the_signal_columns(tmp_path):
    rows, _ = run_job_in_process({"kind": "files", "uri": str(DATA / "videos"),
                                  "media": "video"}, tmp_path / "out", signals=SIGNALS,
                                 video={"num_frames": 4})
    assert len(rows) == 3
    _check_typed(read_output(str(tmp_path / "out")).to_table())
