"""A step that holds its batches at an explicit barrier: while the file ``hold`` exists,
every batch waits (checked every 0.05 s, at most ``max_wait_s`` seconds in all per batch),
then passes through unchanged. A test removes the file when the moment it needs has come,
so what a job has done by then does not depend on how loaded the machine is."""

from __future__ import annotations

import os
import time

from pipeline.steps.base import Step


class GateStep(Step):
    """Identity over batches, held while ``hold`` (a local path) exists.

    ``max_wait_s``: the longest one batch waits (seconds), so a test that fails before
    opening the gate cannot hang a job for ever."""

    def __init__(self, hold: str, max_wait_s: float = 240.0):
        self.hold = hold
        self.max_wait_s = max_wait_s

    def __call__(self, batch):
        deadline = time.monotonic() + self.max_wait_s
        while os.path.exists(self.hold) and time.monotonic() < deadline:
            time.sleep(0.05)
        return batch
