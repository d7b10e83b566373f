"""A step added the documented way (DESIGN.md, "Extending the pipeline", "Add a step"):
this one file - its column declared once, the step declaring what it writes and which
setting changes it - plus its entry in ``assembly.STEP_FACTORIES`` (the test adds it)."""

from __future__ import annotations

import pyarrow as pa

from pipeline.columns import PIXELS, declare
from pipeline.steps.base import RowStep

MEAN_BRIGHTNESS = declare("mean_brightness", pa.float32(),
                          "Mean of the decoded RGB pixels, 0..255 (a test step).")


class MeanBrightnessStep(RowStep):
    """``_pixels`` (H, W, 3) uint8 -> ``mean_brightness`` float32, rounded to ``digits``."""

    reads = (PIXELS,)
    writes = (MEAN_BRIGHTNESS,)

    def __init__(self, digits: int = 2):
        self.digits = digits

    def settings(self):
        return {"digits": self.digits}

    def process_row(self, batch, i):
        return {MEAN_BRIGHTNESS: round(float(batch[PIXELS][i].mean()), self.digits)}
