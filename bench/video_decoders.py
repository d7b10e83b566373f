"""Why mmpipe decodes video with PyAV: headers (OpenCV and PyAV) vs decoded truth.

For every file in data/videos and data/cases/V*/ prints a markdown table of
- OpenCV (cv2.VideoCapture, FFmpeg backend): CAP_PROP_FPS, CAP_PROP_FRAME_COUNT, frames
  cv2 actually reads, and the shape of its first frame (does it apply the rotation?);
- the PyAV header of the stream mmpipe picks (``streams.best("video")``):
  ``stream.frames``, ``stream.average_rate``, ``stream.duration * time_base``;
- the truth from ``pipeline.steps.video.decode_video``: decoded frames, pts span
  (seconds), measured fps, displayed W x H, rotation, partial / error;
- the time of ``decode_video`` with uniform 8-frame sampling (median of ``--repeat``
  runs) as videos/s.

Run: ``.venv/bin/python bench/video_decoders.py [--repeat 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import av
import cv2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.errors import RecordError  # noqa: E402
from pipeline.spec import VideoSpec  # noqa: E402
from pipeline.media.video import decode_video


def opencv_facts(path: Path) -> dict:
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        return {"cv_fps": "not opened", "cv_count": "-", "cv_read": "-", "cv_shape": "-"}
    fps = cap.get(cv2.CAP_PROP_FPS)
    count = cap.get(cv2.CAP_PROP_FRAME_COUNT)
    read, shape = 0, None
    while read < 100_000:
        ok, frame = cap.read()
        if not ok:
            break
        if shape is None:
            shape = f"{frame.shape[1]}x{frame.shape[0]}"
        read += 1
    cap.release()
    return {"cv_fps": f"{fps:.3f}", "cv_count": f"{count:.0f}", "cv_read": str(read),
            "cv_shape": shape or "-"}


def pyav_header(path: Path) -> dict:
    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                return {"av_frames": "no video", "av_rate": "-", "av_dur": "-"}
            s = c.streams.best("video")
            dur = (f"{float(s.duration * s.time_base):.3f}" if s.duration is not None
                   else "None")
            rate = s.average_rate
            return {"av_frames": str(s.frames),
                    "av_rate": f"{float(rate):.3f}" if rate else "None", "av_dur": dur}
    except av.error.FFmpegError as e:
        return {"av_frames": f"open failed ({type(e).__name__})", "av_rate": "-",
                "av_dur": "-"}


def truth(path: Path, repeat: int) -> dict:
    spec = VideoSpec(sampling="uniform", num_frames=8)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            info = decode_video(str(path), spec)
        except RecordError as e:
            times.append(time.perf_counter() - t0)
            res = {"n": "-", "span": "-", "fps": "-", "wh": "-", "rot": "-",
                   "status": f"error {e.reason}"}
            continue
        times.append(time.perf_counter() - t0)
        res = {"n": str(info.frame_count), "span": f"{info.duration_s:.3f}",
               "fps": f"{info.fps:.3f}", "wh": f"{info.width}x{info.height}",
               "rot": str(info.rotation_deg),
               "status": f"partial ({info.decode_errors} err)" if info.partial else "ok"}
    med = statistics.median(times)
    res["vps"] = f"{1 / med:.1f}" if med > 0 else "inf"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files = sorted((REPO / "data" / "videos").iterdir()) + \
        sorted(p for d in sorted((REPO / "data" / "cases").glob("V*")) for p in d.iterdir())
    ffmpeg = getattr(av, "ffmpeg_version_info", "?")
    print(f"PyAV {av.__version__} (FFmpeg {ffmpeg}), OpenCV {cv2.__version__}; "
          f"{os.cpu_count()} CPUs; decode_video uniform 8 frames, median of {args.repeat}\n")
    head = ["file", "bytes", "cv2 FPS", "cv2 FRAME_COUNT", "cv2 frames read", "cv2 W x H",
            "PyAV stream.frames", "PyAV average_rate", "PyAV duration (s)",
            "decoded frames", "pts span (s)", "measured fps", "displayed W x H", "rotation",
            "decode_video", "videos/s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for p in files:
        cv, hd, tr = opencv_facts(p), pyav_header(p), truth(p, args.repeat)
        rel = p.relative_to(REPO / "data")
        row = [f"`{rel}`", str(p.stat().st_size), cv["cv_fps"], cv["cv_count"], cv["cv_read"],
               cv["cv_shape"], hd["av_frames"], hd["av_rate"], hd["av_dur"], tr["n"],
               tr["span"], tr["fps"], tr["wh"], tr["rot"], tr["status"], tr["vps"]]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
