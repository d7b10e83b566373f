#!/usr/bin/env python
"""GPU check: images/s per GPU for embedding and captioning, through mmpipe vs the model alone.

    .venv/bin/python bench/gpu_check.py                 # GPU machine: < 10 minutes
    .venv/bin/python bench/gpu_check.py --reduced       # CPU / smoke: tiny models, ~2 minutes
    .venv/bin/python bench/gpu_check.py --clip-model DIR --blip-model DIR   # real weights

For each check (``embedding``: CLIP image + caption embeddings and their score;
``captioning``: BLIP, greedy, ``max_new_tokens``):

1. **alone**: the same backend class mmpipe loads, in this process, in a tight loop over a
   pre-made uint8 batch already in host memory (``backend(inputs)``: host->device copy,
   normalisation, forward, result back to the host), after warm-up. The ceiling.
2. **mmpipe**: ``run_job`` on a local Ray (every CPU, one GPU): a manifest of the bundled
   COCO photos repeated to N records (distinct keys, dedup off), decoded, resized,
   re-encoded and written by PartitionWorkers, the model served by one ModelActor with
   ``num_gpus=1``. Images/s over the window from the first partition start to the last
   commit (model loading excluded), and the actor's own busy fraction.

It prints ``ratio = mmpipe / alone`` per check: 1.0 means the pipeline feeds the GPU as
fast as the model can eat; the actor's ``idle`` share says how long the GPU waited for
input. With no CUDA device (or ``--reduced``) it runs a reduced mode: tiny random models
(``pipeline/testing/tiny_models.py``), fewer records, CPU only; the numbers then only show that
the script works. Without ``--clip-model``/``--blip-model`` on a GPU it builds full-size
random checkpoints (CLIP ViT-B/32, BLIP base): compute per image equals the real models',
captions are junk (``min_new_tokens = max_new_tokens`` keeps their length fixed, in
both measurements).
Writes the results as JSON to ``--out`` (default ``bench/out/gpu_check.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

log = logging.getLogger("gpu_check")
DEADLINE_S = 540  # stop starting new phases after this (the whole check must stay < 10 min)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reduced", action="store_true", help="force the CPU reduced mode")
    p.add_argument("--clip-model", help="CLIP/SigLIP checkpoint (default: built, random)")
    p.add_argument("--blip-model", help="BLIP checkpoint (default: built, random)")
    p.add_argument("--records", type=int, help="records per mmpipe run (default 8192 / 32)")
    p.add_argument("--caption-records", type=int, help="records for captioning (default 1536 / 16)")
    p.add_argument("--max-new-tokens", type=int, default=20)
    p.add_argument("--workdir", default=str(REPO / "bench" / "out" / "gpu_check"))
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "gpu_check.json"))
    return p.parse_args()


def make_manifest(workdir: Path, n: int) -> Path:
    """JSONL of n records: the bundled photos repeated, distinct keys, first captions."""
    rows = [json.loads(line) for line in (REPO / "data/photos/captions.jsonl").read_text().splitlines()]
    path = workdir / f"manifest-{n}.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            r = rows[i % len(rows)]
            f.write(json.dumps({"path": str(REPO / "data/photos" / r["file"]),
                                "caption": r["captions"][i // len(rows) % 5],
                                "key": f"{r['key']}-{i:06d}"}) + "\n")
    return path


def job_spec(section: str, model: str, manifest: Path, out: Path, gpu: bool, n: int,
             max_new_tokens: int):
    from pipeline.spec import JobSpec

    workers = max(1, (os.cpu_count() or 2) - 1)
    serve = {"enabled": True, "model": model, "replicas": 1, "num_cpus": 1,
             "num_gpus": 1 if gpu else 0, "max_in_flight": 4, "actor_concurrency": 16}
    if section == "image_embedding":
        serve.update(batch_size=256 if gpu else 32)
    else:
        serve.update(batch_size=64 if gpu else 8, max_new_tokens=max_new_tokens,
                     min_new_tokens=max_new_tokens)  # random weights: fixed caption length
    return JobSpec.model_validate({
        "name": f"gpu-check-{section}",
        "source": {"kind": "manifest", "uri": str(manifest),
                   "partition_size": max(16, n // (4 * workers))},
        "sink": {"uri": str(out), "rows_per_row_group": 256},
        "dedup": {"exact": False, "near": False},
        "text_embedding": {"enabled": False},
        section: serve,
        "runtime": {"batch_size": 64 if gpu else 16, "mode": "overwrite",
                    "decode_threads": 2, "progress_interval_s": 30}})


def model_alone(section: str, spec, device: str, batch: int, seconds: float) -> dict:
    """The backend in a tight loop on one pre-made batch; images/s after warm-up."""
    import numpy as np
    import torch
    from PIL import Image

    from pipeline.models.registry import load_backend
    from pipeline.steps.model_input import model_input

    t0 = time.time()
    backend = load_backend(section, spec, device)
    load_s = time.time() - t0
    rows = [json.loads(line) for line in (REPO / "data/photos/captions.jsonl").read_text().splitlines()]
    pixels = [model_input(np.asarray(Image.open(REPO / "data/photos" / r["file"]).convert("RGB")),
                          backend.info.image) for r in rows]
    inputs = {"pixels": np.stack([pixels[i % len(pixels)] for i in range(batch)])}
    if backend.info.text:
        inputs["text"] = [rows[i % len(rows)]["captions"][0] for i in range(batch)]
    with torch.inference_mode():
        for _ in range(2):
            backend(inputs)
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds or n < 3 * batch:
            backend(inputs)
            n += batch
        elapsed = time.perf_counter() - t
    out = {"images_per_s": round(n / elapsed, 1), "batch": batch, "images": n,
           "seconds": round(elapsed, 2), "load_s": round(load_s, 1),
           "model": backend.info.description}
    del backend
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def through_mmpipe(spec, gpu: bool) -> dict:
    """``run_job`` on the local Ray; throughput over the partitions' window."""
    from pipeline.io.checkpoint import CheckpointStore
    from pipeline.runtime.driver import run_job

    t0 = time.time()
    report = run_job(spec)
    wall = time.time() - t0
    markers = CheckpointStore(spec.sink.uri).markers().values()
    window = max(m.finished_at for m in markers) - min(m.started_at for m in markers)
    actor = report.model_actors[0] if report.model_actors else {}
    return {"images_per_s": round(report.rows_processed / window, 1),
            "records": report.rows_processed, "window_s": round(window, 2),
            "wall_s": round(wall, 1), "complete": report.complete,
            "rows_by_status": dict(report.rows_by_status),
            "actor_records_per_s": actor.get("records_per_s"),
            "actor_busy_fraction": actor.get("busy_fraction"),
            "actor_idle_fraction": actor.get("idle_fraction"),
            "actor_mean_batch_rows": actor.get("mean_batch_rows"),
            "actor_queue_wait_mean_s": actor.get("queue_wait_mean_s"),
            "actor": actor.get("description")}


def build_models(args, workdir: Path, gpu: bool) -> dict[str, str]:
    from pipeline.testing.tiny_models import build_clip, build_blip, build_tiny_models

    if args.clip_model and args.blip_model:
        return {"clip": args.clip_model, "blip": args.blip_model}
    if not gpu:
        built = build_tiny_models(workdir / "tiny", ("tiny-clip", "tiny-blip"))
        return {"clip": args.clip_model or str(built["tiny-clip"]),
                "blip": args.blip_model or str(built["tiny-blip"])}
    import torch

    out = {}
    for name, builder, given in (("clip", build_clip, args.clip_model),
                                 ("blip", build_blip, args.blip_model)):
        path = workdir / f"full-{name}"
        if not given and not (path / "config.json").is_file():
            torch.manual_seed(0)
            builder(path, full_size=True)
        out[name] = given or str(path)
    return out


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import ray
    import torch

    started = time.time()
    gpu = torch.cuda.is_available() and not args.reduced
    device = "cuda" if gpu else "cpu"
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    models = build_models(args, workdir, gpu)
    n_embed = args.records or (8192 if gpu else 32)
    n_caption = args.caption_records or (1536 if gpu else 16)
    result = {"mode": "gpu" if gpu else "reduced (cpu)", "device":
              torch.cuda.get_device_name(0) if gpu else "cpu", "cpus": os.cpu_count(),
              "torch": torch.__version__, "models": models, "checks": {}}
    ray.init(num_cpus=os.cpu_count(), num_gpus=1 if gpu else 0, include_dashboard=False,
             logging_level=logging.WARNING,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}})
    checks = (("embedding", "image_embedding", models["clip"], n_embed),
              ("captioning", "captioning", models["blip"], n_caption))
    try:
        for name, section, model, n in checks:
            if time.time() - started > DEADLINE_S:
                log.warning("deadline: skipping %s", name)
                continue
            spec = job_spec(section, model, make_manifest(workdir, n), workdir / f"out-{name}",
                            gpu, n, args.max_new_tokens)
            batch = getattr(spec, section).batch_size
            alone = model_alone(section, spec, device, batch, 20 if gpu else 3)
            piped = through_mmpipe(spec, gpu)
            ratio = piped["images_per_s"] / alone["images_per_s"] if alone["images_per_s"] else None
            result["checks"][name] = {"alone": alone, "mmpipe": piped,
                                      "ratio_mmpipe_over_alone": round(ratio, 3) if ratio else None}
            log.info("%s: alone %.1f img/s, mmpipe %.1f img/s, ratio %.2f, actor busy %.0f%%",
                     name, alone["images_per_s"], piped["images_per_s"], ratio or 0,
                     100 * (piped["actor_busy_fraction"] or 0))
    finally:
        ray.shutdown()
    result["total_s"] = round(time.time() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(summary(result))
    return 0


def summary(result: dict) -> str:
    lines = [f"gpu_check ({result['mode']}, {result['device']}, {result['cpus']} CPUs, "
             f"torch {result['torch']}, {result['total_s']} s)",
             "| check | model alone img/s | mmpipe img/s | ratio | actor busy | actor img/s | mean batch |",
             "|---|---|---|---|---|---|---|"]
    for name, c in result["checks"].items():
        a, m = c["alone"], c["mmpipe"]
        busy = m["actor_busy_fraction"]
        lines.append(f"| {name} | {a['images_per_s']} | {m['images_per_s']} | "
                     f"{c['ratio_mmpipe_over_alone']} | {busy:.0%} | {m['actor_records_per_s']} | "
                     f"{m['actor_mean_batch_rows']} |" if busy is not None else f"| {name} | ... |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
