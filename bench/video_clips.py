#!/usr/bin/env python
"""Video clips benchmark: a plain loop vs ``mmpipe run`` of a clips spec, same files, one run.

    .venv/bin/python examples/make_tiny_models.py --only tiny-clip   # the +embed variants
    .venv/bin/python bench/video_clips.py                    # throughput set + 10/60 minutes
    .venv/bin/python bench/video_clips.py --generated 2 --minutes "" --variants loop  # smoke

Input sets (generated files cached in ``--workdir``; ``pipeline.testing.cut_videos``):
- ``real + N x 1 min`` (the throughput set): the three real videos of data/videos (copied)
  and ``--generated`` N one-minute 320x180 25 fps videos (``long_video``: hard cuts every
  4-6.75 s, a different scene length per file), so both sides have videos to balance over
  the cores. Clip settings: examples/video_clips.yaml's.
- ``M min`` for each ``--minutes`` value M (the memory sets): one generated M-minute video
  (128x72, 15 fps, a hard cut every 5 s), alone, with ``max_clips`` raised to
  ``LONG_MAX_CLIPS`` so the whole video becomes clips (the example caps 50 per video).

Variants (each in its own process tree; ``MemSampler`` of bench/throughput.py samples it):
- ``loop``: one process per core (``multiprocessing.Pool(--cores)``), one video per task:
  ``media.clips.detect_spans`` (PySceneDetect's content detector over PyAV frames) and
  ``media.clip_encode.encode_clip`` (libx264) for every span. No partitions, no commit
  markers, no Ray.
- ``loop+embed``: the same, and each clip's frames sampled as the example does (1 fps, at
  most 8) in the pass that encodes it (``media.video.decode_video`` with a
  ``media.clip_encode.ClipEncoder`` as its ``frame_sink``), embedded by the tiny CLIP
  (``transformers`` ``AutoModel.get_image_features``, one torch thread per process) and
  averaged.
- ``mmpipe``: ``mmpipe run`` of examples/video_clips.yaml with its model stages off
  (image_embedding, captioning), ``source.uri`` the input set, the default executor
  (worker processes, one per core of the machine; ``--cores`` applies to the loops only).
- ``mmpipe+embed``: the same with ``image_embedding`` on: ``backend: clip`` (the mean of
  the frame embeddings) with output/tiny-models/tiny-clip.
Clips are counted from the output: the sum of the commit markers' ``clips`` (mmpipe),
the spans encoded (loops).

Prints a markdown table: clips, video seconds, wall seconds, clips/s, video-seconds/s,
clips/s as a ratio of the loop with the same stages on the same set, the CPU seconds of the
variant's process tree (utime + stime, ``MemSampler``) and their ratio to that loop's, the
other processes' load during the run (cores), the peak RSS of the whole tree (MiB) and the
largest per-process high-water mark (VmHWM, MiB: the peak worker RSS).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
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

from pipeline.media.clip_encode import ClipEncoder, encode_clip
from pipeline.media.clips import detect_spans, list_frames
from pipeline.media.video import decode_video
from pipeline.output.checkpoint import CheckpointStore
from pipeline.spec import VideoSpec
from pipeline.testing.cut_videos import long_video

REAL = REPO / "data" / "videos"
EXAMPLE = REPO / "examples" / "video_clips.yaml"
TINY_CLIP = REPO / "output" / "tiny-models" / "tiny-clip"
LONG_MAX_CLIPS = 100_000  # the memory sets: every clip of the long video


def clip_settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """(detect_spans kwargs, encode_clip kwargs) from examples/video_clips.yaml."""
    clips = yaml.safe_load(EXAMPLE.read_text())["video"]["clips"]
    spans = {k: clips[k] for k in ("method", "detector", "min_clip_s", "max_clip_s",
                                   "max_clips") if k in clips}
    t = clips.get("transcode", {})
    encode = {k: t[k] for k in ("codec", "crf", "max_size_px") if k in t}
    return spans, encode


def sampling() -> VideoSpec:
    """The example's frame sampling (``video.sampling``, ``fps``, ``max_frames``)."""
    video = yaml.safe_load(EXAMPLE.read_text())["video"]
    return VideoSpec(**{k: video[k] for k in ("sampling", "fps", "max_frames") if k in video})


def throughput_inputs(workdir: Path, generated: int) -> Path:
    """The throughput set: copies of the real videos (mmpipe refuses a symbolic link out of
    its input root) and ``generated`` one-minute 320x180 videos."""
    folder = workdir / f"inputs-real-{generated}x1min"
    folder.mkdir(parents=True, exist_ok=True)
    for p in sorted(REAL.iterdir()):
        if not (folder / p.name).exists():
            shutil.copyfile(p, folder / p.name)
    for k in range(generated):
        path = folder / f"gen-{k:02d}.mp4"
        if not path.exists():
            long_video(path, minutes=1, fps=25.0, scene_s=4.0 + 0.25 * (k % 12),
                       size=(320, 180))
    return folder


def long_inputs(workdir: Path, minutes: float) -> Path:
    """A memory set: one generated ``minutes``-long 128x72 15 fps video."""
    folder = workdir / f"inputs-{minutes:g}min"
    folder.mkdir(parents=True, exist_ok=True)
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


@functools.cache
def _tiny_clip():
    """(processor, model) of the tiny CLIP, once per loop process, one torch thread."""
    import torch
    from transformers import AutoModel, AutoProcessor

    torch.set_num_threads(1)
    return (AutoProcessor.from_pretrained(str(TINY_CLIP)),
            AutoModel.from_pretrained(str(TINY_CLIP)).eval())


def _embed(frames: list) -> Any:
    """The mean of the tiny CLIP's image embeddings of ``frames`` ((H, W, 3) uint8)."""
    import torch

    processor, model = _tiny_clip()
    with torch.inference_mode():
        pixels = processor(images=frames, return_tensors="pt")["pixel_values"]
        out = model.get_image_features(pixel_values=pixels)
        out = out.pooler_output if hasattr(out, "pooler_output") else out
        return out.mean(dim=0).numpy()


def _clip_one(job: tuple[str, str, bool, int | None]) -> tuple[int, int]:
    """Clips of one video into ``out`` (and their embeddings when ``embed``): (clips
    written, this process's VmHWM KiB)."""
    path, out, embed, max_clips = job
    spans_kw, encode_kw = clip_settings()
    if max_clips is not None:
        spans_kw["max_clips"] = max_clips
    spans = detect_spans(path, **spans_kw)
    for span in spans:
        clip = f"{out}/{Path(path).stem}-{span.index:05d}.mp4"
        if not embed:
            encode_clip(path, span, clip, **encode_kw)
            continue
        encoder = ClipEncoder(clip, span, crf=encode_kw["crf"],
                              max_size_px=encode_kw["max_size_px"])
        info = decode_video(path, sampling(), start_s=span.start_s, end_s=span.end_s,
                            frame_sink=encoder)
        encoder.finish()
        _embed(info.frames)
    return len(spans), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_loop(folder: Path, cores: int, embed: bool, max_clips: int | None) -> dict[str, Any]:
    """The plain loop: a pool of ``cores`` processes, one video per task, longest first."""
    with tempfile.TemporaryDirectory() as out:
        sampler = MemSampler()
        sampler.start()
        t0 = time.time()
        paths = sorted(folder.iterdir(), key=lambda p: -p.stat().st_size)
        jobs = [(str(p), out, embed, max_clips) for p in paths]
        with multiprocessing.get_context("spawn").Pool(cores) as pool:
            results = pool.map(_clip_one, jobs, chunksize=1)
        wall = time.time() - t0
        mem = sampler.finish()
    return {"clips": sum(n for n, _ in results), "wall_s": wall, **_cpu(sampler, mem),
            "peak_rss_mib": mem["peak_rss_mib"],
            "worker_hwm_mib": max(kib for _, kib in results) / 1024}


def _cpu(sampler: MemSampler, mem: dict[str, Any]) -> dict[str, float]:
    """``cpu_s``: CPU seconds (utime + stime) of the sampled processes but this one (the
    loop's pool, or ``mmpipe run`` and its workers; this process only samples and waits),
    ``others_cores``: the other processes' mean load (cores) meanwhile."""
    cpu = sum(t for pid, t in sampler.cpu_ticks.items()
              if pid != os.getpid()) / os.sysconf("SC_CLK_TCK")
    others = max(0.0, mem["cpu"]["machine_cpu_s"] - cpu) / mem["cpu"]["elapsed_s"]
    return {"cpu_s": cpu, "others_cores": others}


def run_mmpipe(folder: Path, workdir: Path, embed: bool,
               max_clips: int | None) -> dict[str, Any]:
    """``mmpipe run`` of the example spec over ``folder``: its captioning off, its
    image_embedding the tiny CLIP (``embed``) or off."""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["source"]["uri"] = str(folder)
    tag = f"{folder.name}{'-embed' if embed else ''}"
    spec["sink"]["uri"] = str(workdir / f"out-{tag}")
    spec["captioning"] = {"enabled": False}
    spec["image_embedding"] = ({**spec["image_embedding"], "model": str(TINY_CLIP),
                                "backend": "clip"} if embed else {"enabled": False})
    if max_clips is not None:
        spec["video"]["clips"]["max_clips"] = max_clips
    spec["runtime"]["mode"] = "overwrite"
    # a fresh output each time: generation 1 at its root, where the markers are counted
    shutil.rmtree(spec["sink"]["uri"], ignore_errors=True)
    path = workdir / f"spec-{tag}.yaml"
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
    markers = CheckpointStore(spec["sink"]["uri"]).markers().values()
    return {"clips": sum(m.clips for m in markers), "wall_s": wall, **_cpu(sampler, mem),
            "peak_rss_mib": mem["peak_rss_mib"],
            "worker_hwm_mib": max(sampler.hwm_kib.values(), default=0) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generated", type=int, default=12, help="one-minute videos added to "
                    "the real ones in the throughput set (0: no throughput set)")
    ap.add_argument("--minutes", default="10,60", help="comma-separated lengths of the "
                    "generated video of each memory set ('': none)")
    ap.add_argument("--variants", default="loop,mmpipe,loop+embed,mmpipe+embed")
    ap.add_argument("--long-variants", default="loop,mmpipe",
                    help="the variants run on the memory sets")
    ap.add_argument("--cores", type=int, default=max(1, multiprocessing.cpu_count()))
    ap.add_argument("--workdir", type=Path, default=REPO / "output" / "bench-video-clips")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    runners = {"loop": lambda f, e, m: run_loop(f, args.cores, e, m),
               "mmpipe": lambda f, e, m: run_mmpipe(f, args.workdir, e, m)}
    sets = ([(f"real + {args.generated} x 1 min", throughput_inputs(args.workdir,
                                                                    args.generated),
              args.variants, None)] if args.generated else [])
    sets += [(f"{float(m):g} min", long_inputs(args.workdir, float(m)), args.long_variants,
              LONG_MAX_CLIPS) for m in args.minutes.split(",") if m.strip()]
    print(f"{args.cores} cores; clip settings {clip_settings()}\n")
    head = ["input", "variant", "clips", "video s", "wall s", "clips/s", "video-s/s",
            "vs loop", "CPU s", "CPU vs loop", "others' cores", "peak tree RSS MiB",
            "peak worker RSS MiB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, folder, variants, max_clips in sets:
        seconds = video_seconds(folder)
        loop_rate: dict[bool, float] = {}
        loop_cpu: dict[bool, float] = {}
        for variant in variants.split(","):
            kind, embed = variant.removesuffix("+embed"), variant.endswith("+embed")
            r = runners[kind](folder, embed, max_clips)
            rate = r["clips"] / r["wall_s"]
            cpu = r["cpu_s"]
            if kind == "loop":
                loop_rate[embed], loop_cpu[embed] = rate, cpu
            ratio = f"{rate / loop_rate[embed]:.2f}" if embed in loop_rate else "-"
            cpu_ratio = f"{cpu / loop_cpu[embed]:.2f}" if embed in loop_cpu else "-"
            row = [name, variant, str(r["clips"]), f"{seconds:.0f}", f"{r['wall_s']:.1f}",
                   f"{rate:.2f}", f"{seconds / r['wall_s']:.1f}", ratio, f"{cpu:.0f}",
                   cpu_ratio, f"{r['others_cores']:.2f}",
                   f"{r['peak_rss_mib']:.0f}", f"{r['worker_hwm_mib']:.0f}"]
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
