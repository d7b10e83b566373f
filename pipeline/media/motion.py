"""Frame signals of a video or clip: motion (optical flow) and the static fraction (pHash).

Pure: lists of (H, W, 3) uint8 RGB frames or of 64-bit pHashes in, floats out; no I/O.
``steps.clip_signals`` applies them to each video or clip row's sampled ``_frames``.

- ``motion_score``: the mean magnitude of OpenCV's dense Farneback optical flow
  (``cv2.calcOpticalFlowFarneback``; Farneback, "Two-frame motion estimation based on
  polynomial expansion", SCIA 2003) between consecutive frames, each converted to grey and
  resized to ``ANALYSIS_WIDTH_PX`` wide. Unit: pixels at that width per step from one given
  frame to the next, so the score does not depend on the video's resolution, but it does
  depend on the sampling (``video.sampling``): with ``fps`` sampling at 1 Hz one step is one
  second of video; with ``uniform`` sampling it is the clip's length / (frames - 1).
- ``static_fraction``: the fraction of consecutive frame pairs whose pHashes
  (``media.transform.phash64``) are at most ``max_distance`` bits apart: 1.0 for a still
  frame repeated, near 0 for footage that keeps changing.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

#: Width (pixels) every frame is resized to (aspect kept) before the optical flow: a
#: fixed analysis scale, so a 4K and a 360p copy of the same footage score alike, and the
#: flow of one frame pair costs about a millisecond.
ANALYSIS_WIDTH_PX = 160
#: ``cv2.calcOpticalFlowFarneback`` parameters: pyramid scale 0.5, 3 levels, a 15-pixel
#: averaging window, 3 iterations, a 5-pixel polynomial neighbourhood with sigma 1.2
#: (OpenCV's documented example values).
FARNEBACK = {"pyr_scale": 0.5, "levels": 3, "winsize": 15, "iterations": 3, "poly_n": 5,
             "poly_sigma": 1.2, "flags": 0}


def _grey(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``frame`` (H, W, 3) uint8 RGB -> grey uint8 of ``size`` (width, height)."""
    a = np.asarray(frame)
    if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
        raise ValueError(f"frames must be (H, W, 3) uint8 RGB arrays, got shape {a.shape} "
                         f"dtype {a.dtype}")
    return cv2.resize(cv2.cvtColor(a, cv2.COLOR_RGB2GRAY), size, interpolation=cv2.INTER_AREA)


def analysis_size(width: int, height: int) -> tuple[int, int]:
    """``(width, height)`` in pixels of a ``width`` x ``height`` frame resized to
    ``ANALYSIS_WIDTH_PX`` wide, aspect kept (height at least 8 pixels)."""
    return ANALYSIS_WIDTH_PX, max(8, round(height * ANALYSIS_WIDTH_PX / max(width, 1)))


def motion_score(frames: Sequence[np.ndarray]) -> float:
    """Mean Farneback optical-flow magnitude over consecutive pairs of ``frames``.

    ``frames``: at least 2 (H, W, 3) uint8 RGB frames in time order (their sizes may
    differ: each is resized to the first one's ``analysis_size``). Returns pixels (at
    ``ANALYSIS_WIDTH_PX`` wide) per step between consecutive frames (module docstring),
    0.0 for identical frames. Raises ``ValueError`` for fewer than 2 frames or a frame
    that is not (H, W, 3) uint8."""
    if len(frames) < 2:
        raise ValueError(f"motion_score needs at least 2 frames, got {len(frames)}")
    first = np.asarray(frames[0])
    size = analysis_size(first.shape[1], first.shape[0]) if first.ndim == 3 else (0, 0)
    prev = _grey(first, size)
    total = 0.0
    for frame in frames[1:]:
        cur = _grey(frame, size)
        flow = cv2.calcOpticalFlowFarneback(prev, cur, None, **FARNEBACK)
        total += float(np.hypot(flow[..., 0], flow[..., 1]).mean())
        prev = cur
    return total / (len(frames) - 1)


def static_fraction(phashes: Sequence[int], max_distance: int) -> float:
    """Fraction (0..1) of consecutive pairs of ``phashes`` (64-bit pHashes as signed or
    unsigned ints, one per sampled frame in time order) at most ``max_distance`` bits
    apart. Raises ``ValueError`` for fewer than 2 hashes or a negative ``max_distance``."""
    if len(phashes) < 2:
        raise ValueError(f"static_fraction needs at least 2 frame hashes, got {len(phashes)}")
    if max_distance < 0:
        raise ValueError(f"max_distance must be >= 0 bits, got {max_distance}")
    bits = np.array([h & 0xFFFFFFFFFFFFFFFF for h in phashes], dtype=np.uint64)
    distance = np.bitwise_count(bits[1:] ^ bits[:-1])
    return float(np.count_nonzero(distance <= max_distance)) / (len(bits) - 1)
