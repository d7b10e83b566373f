"""media.motion: Farneback motion score and static fraction, on a moving pattern, a
still frame and the bundled real videos."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.media.motion import ANALYSIS_WIDTH_PX, motion_score, static_fraction
from pipeline.media.transform import phash64
from pipeline.media.video import decode_video
from pipeline.spec import VideoSpec

VIDEOS = Path(__file__).resolve().parents[2] / "data" / "videos"


def texture(h: int = 180, w: int = 320) -> np.ndarray:
    """A smooth random texture (seeded), (h, w, 3) uint8: something flow can track."""
    rng = np.random.default_rng(7)
    coarse = rng.integers(0, 256, (h // 8, w // 8), dtype=np.uint8)
    grey = np.kron(coarse, np.ones((8, 8), np.uint8))
    return np.repeat(grey[:, :, None], 3, axis=2)


def test_a_moving_pattern_scores_its_shift_and_a_still_one_zero():
    base = texture()
    step_px = 4      # per frame at 320 wide: 2 pixels at the analysis width (160)
    moving = [np.roll(base, k * step_px, axis=1) for k in range(6)]
    still = [base.copy() for _ in range(6)]
    m_moving, m_still = motion_score(moving), motion_score(still)
    expected = step_px * ANALYSIS_WIDTH_PX / base.shape[1]
    assert m_still == pytest.approx(0.0, abs=0.01)
    assert expected * 0.6 < m_moving < expected * 1.2
    assert m_moving > m_still


def test_the_score_does_not_depend_on_the_resolution():
    base = texture()
    big = np.kron(base, np.ones((2, 2, 1), np.uint8))   # the same footage at 640 x 360
    small_frames = [np.roll(base, k * 4, axis=1) for k in range(4)]
    big_frames = [np.roll(big, k * 8, axis=1) for k in range(4)]
    assert motion_score(big_frames) == pytest.approx(motion_score(small_frames), rel=0.2)


def test_static_fraction_of_a_repeated_frame_a_real_video_and_mixed_hashes():
    frames = decode_video(str(VIDEOS / "chaplin.mp4"), VideoSpec(num_frames=8)).frames
    hashes = [phash64(f) for f in frames]
    assert static_fraction([hashes[0]] * 8, 4) == 1.0
    assert static_fraction(hashes, 4) < 0.5                 # the footage changes
    assert static_fraction([hashes[0], hashes[0], hashes[3]], 0) == 0.5
    assert static_fraction([-1, -1], 0) == 1.0              # signed int64 hashes


def test_bad_inputs_name_what_is_wrong():
    with pytest.raises(ValueError, match="at least 2 frames, got 1"):
        motion_score([texture()])
    with pytest.raises(ValueError, match="uint8 RGB"):
        motion_score([texture(), texture()[:, :, 0]])
    with pytest.raises(ValueError, match="at least 2 frame hashes"):
        static_fraction([5], 4)
    with pytest.raises(ValueError, match="max_distance must be >= 0"):
        static_fraction([5, 5], -1)
