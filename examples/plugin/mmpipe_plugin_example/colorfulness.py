"""``colorfulness``: Hasler and Süsstrunk's colourfulness metric (2003, "Measuring
colourfulness in natural images"), a cheap signal curation teams use to find grayscale,
sepia or washed-out images: 0 for a gray image, about 15 "slightly", 33 "moderately",
45 "averagely", 59 "quite", 82 "highly" and over 109 "extremely" colourful."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.columns import PIXELS, declare
from pipeline.steps.base import RowStep

COLORFULNESS = declare("colorfulness", pa.float32(),
                       "Hasler-Süsstrunk colourfulness of the decoded RGB pixels: "
                       "sqrt(std(rg)^2 + std(yb)^2) + 0.3 sqrt(mean(rg)^2 + mean(yb)^2) "
                       "with rg = R - G, yb = (R + G) / 2 - B on 0..255 values; 0 for gray "
                       "(example plugin step).")


def colorfulness(pixels: np.ndarray) -> float:
    """The metric of an (H, W, 3) uint8 RGB array (float64 arithmetic)."""
    rgb = pixels.reshape(-1, 3).astype(np.float64)
    rg = rgb[:, 0] - rgb[:, 1]
    yb = 0.5 * (rgb[:, 0] + rgb[:, 1]) - rgb[:, 2]
    return float(np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean()))


class ColorfulnessStep(RowStep):
    """``_pixels`` (H, W, 3) uint8 -> ``colorfulness`` float32, rounded to ``digits``
    decimals. Raises ``ValueError`` for ``digits`` that is not an integer in 0..6."""

    reads = (PIXELS,)
    writes = (COLORFULNESS,)

    def __init__(self, digits: int = 2):
        if isinstance(digits, bool) or not isinstance(digits, int) or not 0 <= digits <= 6:
            raise ValueError(f"digits must be an integer in 0..6, got {digits!r}")
        self.digits = digits

    def settings(self) -> dict[str, int]:
        return {"digits": self.digits}

    def process_row(self, batch, i):
        return {COLORFULNESS: round(colorfulness(batch[PIXELS][i]), self.digits)}
