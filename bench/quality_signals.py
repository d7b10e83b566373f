"""Per-image cost of the CPU quality signals (issue 26): ``image_signals`` (sharpness,
brightness, contrast, clipped fraction) and OCR (RapidOCR detection only, and detection +
recognition), on one thread, over the bundled photos (``data/photos``, COCO, 640 px on the
longer side) decoded as ``DecodeStep`` decodes them.

Reported: the median over the photos of each photo's median over ``--repeats`` runs (wall
and CPU ms),
at the default sizes (``signals.image.analysis_px``, ``signals.ocr.max_side_px``). Then the
``max_side_px`` trade-off behind the OCR default: detection ms and recall of rendered text
lines of several heights pasted on 1280x853 versions of the photos (a line is found when a
detected box's centre lies in its bounding box).

    .venv/bin/python bench/quality_signals.py --repeats 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORDS = ["SALE", "Hello world", "mmpipe 2026", "OPEN DAILY", "caption text", "WATERMARK",
         "Photo by Ann", "www.example.com"]
FONT_PX = (14, 20, 28, 40, 56)  # text heights at 1280 px wide: 1.1% .. 4.4% of the side


def per_image_ms(fn, images: list, repeats: int) -> str:
    """Median over ``images`` of the median of ``repeats`` timed calls of ``fn(image)``:
    wall ms and this thread's CPU ms (``time.thread_time``: onnxruntime with one intra-op
    thread and OpenCV with ``setNumThreads(1)`` compute on the calling thread, so CPU time
    is the cost even on a busy machine, where wall time is not)."""
    walls, cpus = [], []
    for img in images:
        wall, cpu = [], []
        for _ in range(repeats):
            t, c = time.perf_counter(), time.thread_time()
            fn(img)
            wall.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
        walls.append(statistics.median(wall))
        cpus.append(statistics.median(cpu))
    return (f"{1000 * statistics.median(walls):.1f} ms wall, "
            f"{1000 * statistics.median(cpus):.1f} ms CPU")


def text_on_photos(photos: list, seed: int = 0) -> list[tuple[np.ndarray, list]]:
    """(pixels, [(font_px, bbox)]) per photo: one line per ``FONT_PX`` on white boxes."""
    from PIL import Image, ImageDraw, ImageFont

    rng, cases = random.Random(seed), []
    for px in photos:
        im = Image.fromarray(px).resize((1280, 853))
        draw, lines, y = ImageDraw.Draw(im), [], 20
        for size in FONT_PX:
            text, font, x = rng.choice(WORDS), ImageFont.load_default(size=size), rng.randint(10, 500)
            box = draw.textbbox((x, y), text, font=font)
            draw.rectangle((box[0] - 4, box[1] - 4, box[2] + 4, box[3] + 4), fill="white")
            draw.text((x, y), text, fill="black", font=font)
            lines.append((size, box))
            y = box[3] + rng.randint(60, 110)
        cases.append((np.asarray(im), lines))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--photos", type=int, default=0, help="first N photos (0: all)")
    ap.add_argument("--sweep", default="320,480,640,800,960",
                    help="max_side_px values of the OCR trade-off")
    args = ap.parse_args()

    import cv2

    cv2.setNumThreads(1)
    from pipeline.media.decode import decode_image
    from pipeline.spec import ImageSignalsSpec, OcrSpec
    from pipeline.steps.image_signals import image_signals
    from pipeline.steps.ocr import detect_text, new_engine

    paths = sorted((REPO / "data" / "photos").glob("*.jpg"))[:args.photos or None]
    photos = [decode_image(p.read_bytes(), draft_min_side_px=512).pixels for p in paths]
    analysis, side = ImageSignalsSpec().analysis_px, OcrSpec().max_side_px
    engine = new_engine()
    print(f"{len(photos)} photos, {args.repeats} repeats, one thread")
    print(f"image_signals (analysis_px {analysis}): "
          f"{per_image_ms(lambda p: image_signals(p, analysis), photos, args.repeats)}")
    for text in (False, True):
        ms = per_image_ms(lambda p, text=text: detect_text(engine, p, side, text), photos,
                          args.repeats)
        print(f"ocr max_side_px {side} {'det+rec' if text else 'det only'}: {ms}")
    cases = text_on_photos(photos[:12])
    texts = [px for px, _ in cases]
    for text in (False, True):
        ms = per_image_ms(lambda p, text=text: detect_text(engine, p, side, text), texts,
                          args.repeats)
        print(f"ocr max_side_px {side} {'det+rec' if text else 'det only'}, 1280x853 photos "
              f"with 5 text lines: {ms}")
    print("ocr trade-off on 1280x853 photos with rendered text (12 images, 5 lines each):")
    for m in (int(v) for v in args.sweep.split(",")):
        found, times = dict.fromkeys(FONT_PX, 0), []
        for px, lines in cases:
            t = time.thread_time()
            got, _ = engine(cv2.cvtColor(cv2.resize(px, (m, round(853 * m / 1280)),
                                                    interpolation=cv2.INTER_AREA),
                                         cv2.COLOR_RGB2BGR), use_det=True, use_cls=False,
                            use_rec=False)
            times.append(time.thread_time() - t)
            centres = [np.asarray(b).mean(axis=0) * 1280 / m for b in (got or [])]
            for size, (x0, y0, x1, y1) in lines:
                found[size] += any(x0 - 4 <= cx <= x1 + 4 and y0 - 4 <= cy <= y1 + 4
                                   for cx, cy in centres)
        recall = " ".join(f"{s}px:{n}/{len(cases)}" for s, n in found.items())
        print(f"  max_side_px {m:5d}: det {1000 * statistics.median(times):6.1f} ms CPU, "
              f"lines found by font size: {recall}")


if __name__ == "__main__":
    main()
