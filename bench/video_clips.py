#!/usr/bin/env python
"""Video clips benchmark: a plain loop vs ``mmpipe run`` of a clips spec, same files, one run.

    .venv/bin/python bench/video_clips.py                    # real videos + a 10-minute one
    .venv/bin/python bench/video_clips.py --minutes 10,60    # peak RSS: 10 vs 60 minutes
    .venv/bin/python bench/video_clips.py --minutes 1 --variants loop   # a quick smoke

Inputs, per ``--minutes`` value M (one input set each): the three real videos of
data/videos (copied) and one generated M-minute video (``pipeline.testing.cut_videos.long_video``:
128x72, 15 fps, a hard cut every 5 s; cached in ``--workdir``).

Variants (each in its own process tree; ``MemSampler`` of bench/throughput.py samples it):
- ``loop``: one process per core (``multiprocessing.Pool(--cores)``), one video per task:
  ``media.clips.detect_spans`` (PySceneDetect's content detector over PyAV frames) and
  ``media.clip_encode.encode_clip`` (libx264) for every span, with the clip settings of
  examples/video_clips.yaml. No partitions, no commit markers, no Ray.
- ``mmpipe``: ``mmpipe run`` of examples/video_clips.yaml with its model stages off
  (image_embedding, captioning), ``source.uri`` the input set, the default executor
  (worker processes, one per core of the machine; ``--cores`` applies to ``loop`` only).
  Clips are counted as the ``.mp4`` files under the output.

Prints a markdown table: clips, video seconds, wall seconds, clips/s, video-seconds/s, the
peak RSS of the whole tree (MiB) and the largest per-process high-water mark (VmHWM, MiB:
the peak worker RSS).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the working tree
sys.path.insert(0, str(REPO / "bench"))

from throughput import MemSampler

from pipeline.media.clip_encode import encode_clip
from pipeline.media.clips import detect_spans, list_frames
from pipeline.testing.cut_videos import long_video

REAL = REPO / "data" / "videos"
EXAMPLE = REPO / "examples" / "video_clips.yaml"


def clip_settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """(detect_spans kwargs, encode_clip kwargs) from examples/video_clips.yaml."""
    clips = yaml.safe_load(EXAMPLE.read_text())["video"]["clips"]
    spans = {k: clips[k] for k in ("method", "detector", "min_clip_s", "max_clip_s",
                                   "max_clips") if k in clips}
    t = clips.get("transcode", {})
    encode = {k: t[k] for k in ("codec", "crf", "max_size_px") if k in t}
    return spans, encode


def inputs(workdir: Path, minutes: float) -> Path:
    """The input set folder for ``minutes``: copies of the real videos (mmpipe refuses a
    symbolic link out of its input root) and the long one."""
    folder = workdir / f"inputs-{minutes:g}min"
    folder.mkdir(parents=True, exist_ok=True)
    for p in sorted(REAL.iterdir()):
        if not (folder / p.name).exists():
            shutil.copyfile(p, folder / p.name)
    long = folder / f"long-{minutes:g}min.mp4"
    if not long.exists():
        long_video(long, minutes=minutes)
    return folder


def video_seconds(folder: Path) -> float:
    """Sum of the videos' presentation spans (demux only)."""
    total = 0.0
    for p in sorted(folder.iterdir()):
        tl = list_frames(str(p))
        total += tl.end_s - float(tl.times_s[0])
    return total


def _clip_one(job: tuple[str, str]) -> tuple[int, int]:
    """Clips of one video into ``out``: (clips written, this process's VmHWM KiB)."""
    path, out = job
    spans_kw, encode_kw = clip_settings()
    spans = detect_spans(path, **spans_kw)
    for span in spans:
        encode_clip(path, span, f"{out}/{Path(path).stem}-{span.index:05d}.mp4", **encode_kw)
    return len(spans), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_loop(folder: Path, cores: int) -> dict[str, Any]:
    """The plain loop: a pool of ``cores`` processes, one video per task."""
    with tempfile.TemporaryDirectory() as out:
        sampler = MemSampler()
        sampler.start()
        t0 = time.time()
        jobs = [(str(p), out) for p in sorted(folder.iterdir())]
        with multiprocessing.get_context("spawn").Pool(cores) as pool:
            results = pool.map(_clip_one, jobs, chunksize=1)
        wall = time.time() - t0
        mem = sampler.finish()
    return {"clips": sum(n for n, _ in results), "wall_s": wall,
            "peak_rss_mib": mem["peak_rss_mib"],
            "worker_hwm_mib": max(kib for _, kib in results) / 1024}


def run_mmpipe(folder: Path, workdir: Path) -> dict[str, Any]:
    """``mmpipe run`` of the example spec without its model stages over ``folder``."""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["source"]["uri"] = str(folder)
    spec["sink"]["uri"] = str(workdir / f"out-{folder.name}")
    for section in ("image_embedding", "captioning"):
        spec[section] = {"enabled": False}
    spec["runtime"]["mode"] = "overwrite"
    path = workdir / f"spec-{folder.name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    t0 = time.time()
    proc = subprocess.Popen([str(REPO / ".venv" / "bin" / "mmpipe"), "run", str(path)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    sampler = MemSampler(root=proc.pid)
    sampler.start()
    _, err = proc.communicate()
    wall = time.time() - t0
    mem = sampler.finish()
    if proc.returncode != 0:
        raise SystemExit(f"mmpipe run exited {proc.returncode}:\n{err[-2000:]}")
    clips = len(list(Path(spec["sink"]["uri"]).rglob("*.mp4")))
    return {"clips": clips, "wall_s": wall, "peak_rss_mib": mem["peak_rss_mib"],
            "worker_hwm_mib": max(sampler.hwm_kib.values(), default=0) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", default="10", help="comma-separated lengths of the "
                    "generated video, one input set each")
    ap.add_argument("--variants", default="loop,mmpipe")
    ap.add_argument("--cores", type=int, default=max(1, multiprocessing.cpu_count()))
    ap.add_argument("--workdir", type=Path, default=REPO / "output" / "bench-video-clips")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    runners = {"loop": lambda f: run_loop(f, args.cores),
               "mmpipe": lambda f: run_mmpipe(f, args.workdir)}
    print(f"{args.cores} cores; clip settings {clip_settings()}\n")
    head = ["input", "variant", "clips", "video s", "wall s", "clips/s", "video-s/s",
            "peak tree RSS MiB", "peak worker RSS MiB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for minutes in (float(m) for m in args.minutes.split(",")):
        folder = inputs(args.workdir, minutes)
        seconds = video_seconds(folder)
        for variant in args.variants.split(","):
            r = runners[variant](folder)
            row = [f"real + {minutes:g} min", variant, str(r["clips"]), f"{seconds:.0f}",
                   f"{r['wall_s']:.1f}", f"{r['clips'] / r['wall_s']:.2f}",
                   f"{seconds / r['wall_s']:.1f}", f"{r['peak_rss_mib']:.0f}",
                   f"{r['worker_hwm_mib']:.0f}"]
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
