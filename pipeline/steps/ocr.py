"""Text in the image: RapidOCR (``rapidocr-onnxruntime``: PaddleOCR's PP-OCRv4 detector and
recogniser as ONNX models shipped in the wheel) on the CPU workers.

Per row: the RGB pixels are shrunk so that their longer side is at most
``signals.ocr.max_side_px`` (``cv2.INTER_AREA``; never enlarged), converted to BGR (what
the PaddleOCR models were trained on), and the DB text detector (Liao et al., "Real-time
Scene Text Detection with Differentiable Binarization", AAAI 2020) finds text boxes
(quadrilaterals). ``text_box_count`` counts them; ``text_area_fraction`` is the area of
their union (each polygon filled into one mask with ``cv2.fillPoly``, so overlaps count
once) over the image area, both at the detection scale. With ``signals.ocr.text`` the
boxes are also recognised (CRNN/SVTR recogniser, no angle classifier) and ``ocr_text``
holds the lines scored >= ``TEXT_SCORE``, one per line in RapidOCR's reading order
(top to bottom, left to right), and only those boxes count in ``text_box_count`` and
``text_area_fraction``: the detector alone also fires on text-like texture (fur, foliage,
fog), which the recogniser does not read. Measured on the 57 bundled photos against
by-eye labels (``examples/quality_labels.csv``: 13 with visible text), the best F1 of
``text_area_fraction`` is 0.76 from detection alone (precision 0.69, recall 0.85) and
0.92 with recognised boxes only (precision 1.0, recall 0.85), at about 3x the CPU cost.
Videos: the middle sampled frame (the one ``image`` shows).

Threads: onnxruntime runs each call on one thread (``intra_op``/``inter_op`` = 1); rows
run in parallel in the row-step threads (``RowStep.executor``). A RapidOCR engine keeps
per-call state (its detector's pre-processing), so each thread borrows an engine of its
own from a pool: ``setup()`` loads the first, a second concurrent row loads another.
"""

from __future__ import annotations

import queue
from typing import Any

import cv2
import numpy as np

from pipeline.columns import (
    FRAMES,
    OCR_TEXT,
    PIXELS,
    TEXT_AREA_FRACTION,
    TEXT_BOX_COUNT,
)
from pipeline.spec import JobSpec, OcrSpec
from pipeline.steps.base import RowStep

#: Recognised lines scored below this are left out of ``ocr_text`` (RapidOCR's default).
TEXT_SCORE = 0.5
#: Detector settings (RapidOCR's defaults, stated so they reach the fingerprint):
#: binarisation threshold, box score threshold, box expansion ratio (DB's unclip).
DET_THRESH, DET_BOX_THRESH, DET_UNCLIP_RATIO = 0.3, 0.5, 1.6


def shrink(pixels: np.ndarray, max_side_px: int) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> the same, longer side at most ``max_side_px`` (INTER_AREA)."""
    h, w = pixels.shape[:2]
    if max(h, w) <= max_side_px:
        return pixels
    scale = max_side_px / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))  # cv2 wants (w, h)
    return cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)


def union_area_fraction(boxes: list[np.ndarray], height: int, width: int) -> float:
    """Area of the union of ``boxes`` (each an (N, 2) array of x, y pixel vertices) over
    ``height * width``, rasterised on a (height, width) mask (``cv2.fillPoly``, each
    polygon filled on its own so that overlaps count once): 0..1."""
    if not boxes:
        return 0.0
    mask = np.zeros((height, width), np.uint8)
    for box in boxes:  # one call per polygon: fillPoly fills several with the even-odd rule
        cv2.fillPoly(mask, [np.round(box).astype(np.int32).reshape(-1, 1, 2)], 1)
    return float(np.count_nonzero(mask)) / (height * width)


def new_engine():
    """A RapidOCR engine with one onnxruntime thread per call and the detector set to
    never enlarge its input (``limit_type: max``, inputs already shrunk)."""
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1, det_limit_type="max",
                    det_thresh=DET_THRESH, det_box_thresh=DET_BOX_THRESH,
                    det_unclip_ratio=DET_UNCLIP_RATIO, text_score=TEXT_SCORE)


def detect_text(engine, pixels: np.ndarray, max_side_px: int, text: bool) -> dict[str, Any]:
    """Run ``engine`` on one (H, W, 3) uint8 RGB image (module docstring) and return the
    ``text_area_fraction`` (float), ``text_box_count`` (int) and, if ``text``,
    ``ocr_text`` (str, "" when nothing is read) values. Raises ``ValueError`` on a
    malformed array."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8 or not pixels.size:
        raise ValueError(f"expected (H, W, 3) uint8 pixels, got {pixels.shape} {pixels.dtype}")
    bgr = cv2.cvtColor(shrink(pixels, max_side_px), cv2.COLOR_RGB2BGR)
    found, _ = engine(bgr, use_det=True, use_cls=False, use_rec=False)
    boxes = [np.asarray(b, np.float32) for b in (found or [])]
    h, w = bgr.shape[:2]
    out: dict[str, Any] = {}
    if text:
        read = []
        if boxes:
            recognised, _ = engine.text_rec(engine.get_crop_img_list(bgr, boxes))
            read = [(b, r[0]) for b, r in zip(boxes, recognised)
                    if float(r[1]) >= TEXT_SCORE and r[0].strip()]
        boxes = [b for b, _ in read]  # only boxes the recogniser reads count
        out[OCR_TEXT] = "\n".join(line for _, line in read)
    out[TEXT_AREA_FRACTION] = union_area_fraction(boxes, h, w)
    out[TEXT_BOX_COUNT] = len(boxes)
    return out


class OcrStep(RowStep):
    """``_pixels`` (images) or the middle of ``_frames`` (videos) -> ``text_area_fraction``
    (float32 0..1), ``text_box_count`` (int32) and, with ``signals.ocr.text``,
    ``ocr_text``. A row the engine fails on becomes that row's error (``step_failed``)."""

    def __init__(self, spec: OcrSpec, video: bool = False):
        self.spec = spec
        self.video = video
        self.reads = (FRAMES,) if video else (PIXELS,)
        self.writes = (TEXT_AREA_FRACTION, TEXT_BOX_COUNT) + ((OCR_TEXT,) if spec.text else ())
        self._engines: queue.SimpleQueue | None = None

    def settings(self) -> dict[str, Any]:
        return {"max_side_px": self.spec.max_side_px, "text": self.spec.text,
                "engine": "rapidocr-onnxruntime PP-OCRv4", "det": [DET_THRESH, DET_BOX_THRESH,
                                                                   DET_UNCLIP_RATIO],
                "text_score": TEXT_SCORE}

    def setup(self) -> None:
        """Load the first engine (the ONNX models), once per worker."""
        self._engines = queue.SimpleQueue()
        self._engines.put(new_engine())

    def process_row(self, batch, i):
        if self._engines is None:
            self.setup()
        if self.video:
            frames = batch[FRAMES][i]
            if not frames:
                raise ValueError("no sampled frames")
            pixels = frames[len(frames) // 2]
        else:
            pixels = batch[PIXELS][i]
        try:
            engine = self._engines.get_nowait()
        except queue.Empty:
            engine = new_engine()  # another row thread holds the others
        try:
            return detect_text(engine, pixels, self.spec.max_side_px, self.spec.text)
        finally:
            self._engines.put(engine)


def ocr_step(spec: JobSpec) -> OcrStep | None:
    """``assembly.STEP_FACTORIES`` entry: the step when ``signals.ocr.enabled``."""
    if not spec.signals.ocr.enabled:
        return None
    return OcrStep(spec.signals.ocr, video=spec.source.media == "video")
