"""Videos with known cut points, made with PyAV, for the clip tests and benchmarks.

A video is a sequence of scenes of clearly different content (a hue, a noise texture that
drifts, a moving rectangle), joined by hard cuts or dissolves; ``CutVideo`` is its
ground truth. ``suite(folder)`` writes the standard set (24/25/30/60 fps, a variable frame
rate, a display matrix turned 90 degrees, 10-bit yuv420p10le) and ``long_video`` a cheap
low-resolution one of ``minutes`` for memory benchmarks.

    python -m pipeline.testing.cut_videos --report   # precision/recall of the detectors
"""

from __future__ import annotations

import argparse
import dataclasses
import struct
import tempfile
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

TIME_BASE = Fraction(1, 90_000)  # of the written streams (MPEG's 90 kHz clock)
SIZE = (160, 96)                 # (width, height) of the standard suite's videos
TOLERANCE_FRAMES = 2             # a detected cut this close to a true one matches it


@dataclasses.dataclass(frozen=True)
class CutVideo:
    """Ground truth of a generated video. ``cut_frames``: index of the first frame of each
    scene after a hard cut (presentation order), ``cut_times_s`` their pts in seconds;
    ``dissolves``: [first, end) frame ranges of the dissolves (each blends two scenes);
    ``times_s``: every frame's pts; ``end_s``: the end of the last frame; ``width`` x
    ``height``: the displayed size (after ``rotation_deg``, clockwise)."""

    path: str
    fps: float
    times_s: tuple[float, ...]
    end_s: float
    cut_frames: tuple[int, ...]
    cut_times_s: tuple[float, ...]
    dissolves: tuple[tuple[int, int], ...]
    width: int
    height: int
    rotation_deg: int = 0
    pix_fmt: str = "yuv420p"

    @property
    def frames(self) -> int:
        """Number of frames."""
        return len(self.times_s)


def _scene_image(seed: int, size: tuple[int, int]) -> np.ndarray:
    """A (H, W, 3) uint8 scene background: its own hue and brightness over a blocky noise
    texture, so two scenes differ in colour and in edges."""
    w, h = size
    rng = np.random.default_rng(seed)
    hue = (seed * 0.381966) % 1.0  # golden-angle steps: neighbours far apart in hue
    base = np.array([abs(hue * 6 - 3) - 1, 2 - abs(hue * 6 - 2), 2 - abs(hue * 6 - 4)])
    base = np.clip(base, 0, 1) * (150 + 90 * (seed % 2))
    cell = 8 + 4 * (seed % 3)
    noise = rng.integers(-60, 60, (h // cell + 2, (w + 8) // cell + 2, 1))
    noise = np.repeat(np.repeat(noise, cell, 0), cell, 1)[:h, : w + 8]
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _scene_frame(image: np.ndarray, k: int, seed: int, size: tuple[int, int]) -> np.ndarray:
    """Frame ``k`` of a scene: its texture pans one pixel every 4 frames (back and forth)
    and a rectangle moves."""
    w, h = size
    dx = abs((k // 4) % 16 - 8)
    a = np.ascontiguousarray(image[:h, dx:dx + w])
    bw, bh = w // 5, h // 4
    x = int((w - bw) * (0.5 + 0.4 * np.sin(k / 9 + seed)))
    y = int((h - bh) * (0.5 + 0.4 * np.cos(k / 13 + seed)))
    a[y:y + bh, x:x + bw] = (255 - seed * 37 % 256, seed * 91 % 256, 255)
    return a


def _frames(scenes: list[int], transitions: list[str], dissolve_frames: int,
            size: tuple[int, int], seed: int) -> Iterator[tuple[np.ndarray, str]]:
    """(frame, tag) for each frame; tag ``cut`` on the first frame after a hard cut,
    ``dissolve`` on blended frames, else empty."""
    for i, n in enumerate(scenes):
        image = _scene_image(seed + i, size)
        into = transitions[i - 1] if i else ""
        blend = min(dissolve_frames, n) if into == "dissolve" else 0
        prev = _scene_image(seed + i - 1, size) if blend else None
        for k in range(n):
            a = _scene_frame(image, k, seed + i, size)
            if k < blend:
                alpha = (k + 1) / (blend + 1)
                b = _scene_frame(prev, scenes[i - 1] + k, seed + i - 1, size)
                a = (alpha * a + (1 - alpha) * b).astype(np.uint8)
            yield a, ("cut" if k == 0 and into == "cut" else "dissolve" if k < blend else "")


def _quarter_turn(path: Path) -> None:
    """Set the (only) ``tkhd`` matrix to a 90 degree clockwise turn (ISO 14496-12 8.3.2)."""
    data = bytearray(path.read_bytes())
    i = data.index(b"tkhd")
    off = i + 4 + 4 + (32 if data[i + 4] == 1 else 20) + 16
    data[off:off + 36] = struct.pack(">9i", 0, 1 << 16, 0, -(1 << 16), 0, 0, 0, 0, 1 << 30)
    path.write_bytes(bytes(data))


def make_cut_video(path: str | Path, *, fps: float = 25.0, scenes_s: tuple[float, ...] = (
        2.0, 1.5, 2.5, 1.2, 2.0, 1.8), transitions: tuple[str, ...] = (
        "cut", "cut", "dissolve", "cut", "cut"), dissolve_frames: int = 12,
        size: tuple[int, int] = SIZE, vfr: bool = False, rotate_90: bool = False,
        ten_bit: bool = False, seed: int = 0, preset: str = "veryfast") -> CutVideo:
    """Write an H.264 MP4 of scenes ``scenes_s`` (seconds each) joined by ``transitions``
    (``cut`` or ``dissolve``, one fewer than the scenes) and return its ground truth.

    ``fps``: frames per second; ``vfr``: the frame interval alternates per scene between
    1/fps and 2/fps (a variable frame rate; ``fps`` is then the fastest rate).
    ``rotate_90``: a display matrix turning the picture 90 degrees clockwise (displayed
    size ``size`` swapped). ``ten_bit``: yuv420p10le. ``size``: (width, height), even.
    Raises ``ValueError`` for a wrong number of transitions or an unknown one.
    """
    if len(transitions) != len(scenes_s) - 1 or set(transitions) - {"cut", "dissolve"}:
        raise ValueError(f"transitions must be {len(scenes_s) - 1} of 'cut'/'dissolve', "
                         f"got {transitions}")
    path = Path(path)
    step = [round(Fraction(1) / Fraction(fps).limit_denominator(1001) / TIME_BASE)] * 2
    if vfr:
        step[1] *= 2
    counts = [max(1, round(s * fps / (2 if vfr and i % 2 else 1))) for i, s in enumerate(scenes_s)]
    times, cuts, dissolves, pts = [], [], [], 0
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p10le" if ten_bit else "yuv420p"
        stream.time_base = TIME_BASE
        stream.codec_context.time_base = TIME_BASE
        stream.options = {"preset": preset, "crf": "20"}
        scene = 0
        for a, tag in _frames(counts, list(transitions), dissolve_frames, size, seed):
            n = len(times)
            if n >= sum(counts[: scene + 1]):
                scene += 1
            if tag == "cut":
                cuts.append(n)
            elif tag == "dissolve" and (not dissolves or dissolves[-1][1] != n):
                dissolves.append((n, n + 1))
            elif tag == "dissolve":
                dissolves[-1] = (dissolves[-1][0], n + 1)
            frame = av.VideoFrame.from_ndarray(a, format="rgb24")
            frame.pts, frame.time_base = pts, TIME_BASE
            times.append(float(pts * TIME_BASE))
            pts += step[scene % 2]
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    if rotate_90:
        _quarter_turn(path)
    w, h = (size[1], size[0]) if rotate_90 else size
    return CutVideo(str(path), float(fps), tuple(times), float(pts * TIME_BASE), tuple(cuts),
                    tuple(times[c] for c in cuts), tuple(dissolves), w, h,
                    90 if rotate_90 else 0, "yuv420p10le" if ten_bit else "yuv420p")


def suite(folder: str | Path) -> dict[str, CutVideo]:
    """The standard set, written under ``folder``: ``fps24``, ``fps25``, ``fps30``,
    ``fps60``, ``vfr`` (25/12.5 fps alternating), ``rotated`` (90 degrees, 25 fps) and
    ``10bit`` (yuv420p10le, 30 fps); each with hard cuts and one dissolve."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    specs = {"fps24": {"fps": 24}, "fps25": {"fps": 25, "seed": 10},
             "fps30": {"fps": 30, "seed": 20}, "fps60": {"fps": 60, "seed": 30},
             "vfr": {"fps": 25, "vfr": True, "seed": 40},
             "rotated": {"fps": 25, "rotate_90": True, "seed": 50},
             "10bit": {"fps": 30, "ten_bit": True, "seed": 60}}
    return {name: make_cut_video(folder / f"{name}.mp4", **kw) for name, kw in specs.items()}


def long_video(path: str | Path, *, minutes: float, fps: float = 15.0, scene_s: float = 5.0,
               size: tuple[int, int] = (128, 72)) -> CutVideo:
    """A ``minutes``-long low-resolution video of ``scene_s`` scenes joined by hard cuts
    (ultrafast preset: about a second of CPU per minute of video)."""
    n = max(2, round(minutes * 60 / scene_s))
    return make_cut_video(path, fps=fps, scenes_s=(scene_s,) * n,
                          transitions=("cut",) * (n - 1), size=size, preset="ultrafast")


def match_cuts(found: list[int], truth: CutVideo,
               tolerance: int = TOLERANCE_FRAMES) -> dict[str, float]:
    """Score detected cut frames against ``truth``: a hard cut is found when a detection is
    within ``tolerance`` frames of it (each detection matches once); a detection inside a
    dissolve (within ``tolerance``) reports that dissolve and is no false positive.
    Returns ``tp``, ``fp``, ``fn``, ``precision``, ``recall`` and ``dissolves_found``."""
    free = sorted(found)
    tp = 0
    for cut in truth.cut_frames:
        hit = next((f for f in free if abs(f - cut) <= tolerance), None)
        if hit is not None:
            free.remove(hit)
            tp += 1
    in_dissolve = [f for f in free if any(a - tolerance <= f < b + tolerance
                                          for a, b in truth.dissolves)]
    dissolves_found = sum(any(a - tolerance <= f < b + tolerance for f in in_dissolve)
                          for a, b in truth.dissolves)
    fp = len(free) - len(in_dissolve)
    fn = len(truth.cut_frames) - tp
    return {"tp": tp, "fp": fp, "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0,
            "dissolves_found": dissolves_found}


def report(folder: str | Path) -> list[dict]:
    """Precision/recall of ``media.clips.detect_cuts`` (both detectors) on ``suite``."""
    from pipeline.media.clips import detect_cuts

    rows = []
    for name, video in suite(folder).items():
        for detector in ("content", "adaptive"):
            found = detect_cuts(video.path, detector=detector).cuts
            rows.append({"video": name, "detector": detector, "cuts": len(video.cut_frames),
                         "dissolves": len(video.dissolves), **match_cuts(list(found), video)})
    return rows


def main(argv: list[str] | None = None) -> int:
    """``--report``: print the precision/recall table of ``report``."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.testing.cut_videos")
    parser.add_argument("--report", action="store_true", help="print precision/recall")
    args = parser.parse_args(argv)
    if not args.report:
        parser.print_help()
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = report(tmp)
    print(f"{'video':8} {'detector':9} cuts  tp fp fn precision recall dissolves_found")
    for r in rows:
        print(f"{r['video']:8} {r['detector']:9} {r['cuts']:4} {r['tp']:3} {r['fp']:2} "
              f"{r['fn']:2} {r['precision']:9.3f} {r['recall']:6.3f} "
              f"{r['dissolves_found']}/{r['dissolves']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
