#!/usr/bin/env python
"""GPU check: every phase of issue 13 in one invocation, GPU utilisation sampled in each.

    .venv/bin/python bench/gpu_check.py                 # GPU machine: < 10 minutes
    .venv/bin/python bench/gpu_check.py --reduced       # CPU / smoke: tiny models, ~2 minutes
    .venv/bin/python bench/gpu_check.py --clip-model DIR --blip-model DIR   # real weights

Phases, in this order (each is skipped, and said so, once ``DEADLINE_S`` has passed):

1. ``embedding.alone``: the CLIP backend mmpipe loads, in this process, in a tight loop over
   a pre-made (batch, 224, 224, 3) uint8 batch in host memory (``backend(inputs)``:
   host->device copy, normalisation, forward, result back to the host), after warm-up.
   The ceiling.
2. ``cpu_pipeline``: ``run_job`` with no model (decode, hash, resize, re-encode, Parquet,
   commit) with 1 PartitionWorker and with one per CPU less one (at least 2); images/s
   each and the
   scaling efficiency ``rate(N) / (N * rate(1))``.
3. ``embedding.mmpipe``: ``run_job`` on a local Ray (every CPU, one GPU) with the model
   served by one ModelActor (``num_gpus=1``), images decoded on the workers
   (``decode.device: cpu``).
4. ``embedding.gpu_media``: the same job with ``decode.device: cuda``: JPEG bytes go to the
   actor and are decoded there (nvJPEG when torchvision has CUDA; see DecodeSpec).
5. ``captioning.alone`` and ``captioning.mmpipe``: BLIP, greedy, ``max_new_tokens``.

Jobs read a manifest of the bundled COCO photos repeated to N records (distinct keys,
dedup off). Pipeline images/s are over the window from the first partition start to the
last commit (model loading excluded); the actor's busy fraction, mean batch and (GPU media)
decode counters come from its stats. During every phase a thread samples GPU utilisation
(NVML through ``pynvml`` when installed, else ``nvidia-smi``; ``unavailable`` on a CPU
machine) every ``SAMPLE_S`` seconds: mean and max percent per phase.

It prints ``ratio = mmpipe / alone`` per check: 1.0 means the pipeline feeds the GPU as
fast as the model can eat. With no CUDA device (or ``--reduced``) it runs a reduced mode:
tiny random models (``pipeline/testing/tiny_models.py``), few records, CPU only; the
numbers then only show that the script works. Without ``--clip-model``/``--blip-model`` on
a GPU it builds full-size random checkpoints (CLIP ViT-B/32, BLIP base): compute per image
equals the real models', captions are junk (``min_new_tokens = max_new_tokens`` keeps their
length fixed, in both measurements).
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
SAMPLE_S = 0.5  # GPU utilisation sampling period (seconds)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reduced", action="store_true", help="force the CPU reduced mode")
    p.add_argument("--clip-model", help="CLIP/SigLIP checkpoint (default: built, random)")
    p.add_argument("--blip-model", help="BLIP checkpoint (default: built, random)")
    p.add_argument("--records", type=int, help="records per mmpipe run (default 8192 / 32)")
    p.add_argument("--caption-records", type=int, help="records for captioning (default 1536 / 16)")
    p.add_argument("--cpu-records", type=int,
                   help="records of the CPU-only pipeline with N workers (default 2048 / 32; "
                        "a quarter of it with 1 worker)")
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


def job_spec(section: str | None, model: str | None, manifest: Path, out: Path, gpu: bool,
             n: int, max_new_tokens: int, workers: int | None = None,
             decode_device: str = "cpu"):
    """The job of one phase: ``section`` None is the CPU-only image path (no model)."""
    from pipeline.spec import JobSpec

    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    spec = {
        "name": f"gpu-check-{section or 'cpu'}",
        "source": {"kind": "manifest", "uri": str(manifest),
                   "allowed_roots": [str(REPO / "data" / "photos")],   # the manifest's paths
                   "partition_size": max(16, n // (4 * workers))},
        "sink": {"uri": str(out), "rows_per_row_group": 256},
        "decode": {"device": decode_device},
        "dedup": {"exact": False, "near": False},
        "text_embedding": {"enabled": False},
        "runtime": {"batch_size": 64 if gpu else 16, "mode": "overwrite", "num_workers": workers,
                    "decode_threads": 2, "progress_interval_s": 30}}
    if section:
        serve = {"enabled": True, "model": model, "replicas": 1, "num_cpus": 1,
                 "num_gpus": 1 if gpu else 0, "max_in_flight": 4, "actor_concurrency": 16}
        if section == "image_embedding":
            serve.update(batch_size=256 if gpu else 32)
        else:
            serve.update(batch_size=64 if gpu else 8, max_new_tokens=max_new_tokens,
                         min_new_tokens=max_new_tokens)  # random weights: fixed caption length
        spec[section] = serve
    return JobSpec.model_validate(spec)


class GpuSampler:
    """Samples GPU 0's utilisation (percent of time a kernel ran, NVML's definition) every
    ``SAMPLE_S`` seconds on a thread, between ``start()`` and ``stop() -> dict``.

    Source: ``pynvml.nvmlDeviceGetUtilizationRates`` when ``pynvml`` (nvidia-ml-py)
    imports, else one ``nvidia-smi --query-gpu=utilization.gpu`` call per sample, else
    none (``{"source": "unavailable"}``)."""

    def __init__(self):
        import shutil
        import threading

        self._read, self.source = None, "unavailable"
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            self.source = "nvml"
        except Exception:  # noqa: BLE001 - no NVML here: try nvidia-smi
            smi = shutil.which("nvidia-smi")
            if smi:
                import subprocess

                def read() -> float:
                    out = subprocess.run([smi, "--query-gpu=utilization.gpu",
                                          "--format=csv,noheader,nounits", "-i", "0"],
                                         capture_output=True, text=True, timeout=5)
                    return float(out.stdout.strip().splitlines()[0])
                self._read, self.source = read, "nvidia-smi"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[float] = []

    def start(self) -> None:
        import threading

        self._samples, self._stop = [], threading.Event()
        if self._read is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                self._samples.append(self._read())
            except Exception:  # noqa: BLE001 - a failed sample is left out
                pass

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        xs = self._samples
        if not xs:
            return {"source": self.source, "samples": 0}
        return {"source": self.source, "samples": len(xs),
                "mean_pct": round(sum(xs) / len(xs), 1), "max_pct": max(xs)}


def model_alone(section: str, spec, device: str, batch: int, seconds: float) -> dict:
    """The backend in a tight loop on one pre-made batch; images/s after warm-up."""
    import numpy as np
    import torch
    from PIL import Image

    from pipeline.models.registry import load_backend
    from pipeline.media.geometry import model_input

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


def through_mmpipe(spec) -> dict:
    """``run_job`` on the local Ray; throughput over the partitions' window."""
    from pipeline.output.checkpoint import CheckpointStore
    from pipeline.runtime.driver import run_job

    t0 = time.time()
    report = run_job(spec)
    wall = time.time() - t0
    markers = CheckpointStore(report.output_uri).markers().values()  # this run's generation
    window = max(m.finished_at for m in markers) - min(m.started_at for m in markers)
    actor = report.model_actors[0] if report.model_actors else {}
    out = {"images_per_s": round(report.rows_processed / window, 1),
           "records": report.rows_processed, "window_s": round(window, 2),
           "wall_s": round(wall, 1), "complete": report.complete,
           "workers": spec.runtime.num_workers,
           "rows_by_status": dict(report.rows_by_status)}
    if actor:
        out.update({
            "actor_records_per_s": actor.get("records_per_s"),
            "actor_busy_fraction": actor.get("busy_fraction"),
            "actor_idle_fraction": actor.get("idle_fraction"),
            "actor_mean_batch_rows": actor.get("mean_batch_rows"),
            "actor_queue_wait_mean_s": actor.get("queue_wait_mean_s"),
            "actor_media": {k: v for k, v in actor.items() if k.startswith("media")},
            "actor": actor.get("description")})
    return out


def phase(name: str, sampler: GpuSampler, started: float, fn, *args) -> dict | None:
    """Run one phase with GPU sampling; None (logged) once the deadline has passed."""
    if time.time() - started > DEADLINE_S:
        log.warning("deadline (%d s): skipping %s", DEADLINE_S, name)
        return None
    log.info("phase %s", name)
    sampler.start()
    try:
        out = fn(*args)
    finally:
        util = sampler.stop()
    out["gpu_util"] = util
    log.info("phase %s: %.1f img/s, GPU util %s", name, out["images_per_s"], util)
    return out


def ratio(piped: dict | None, alone: dict | None) -> float | None:
    if not piped or not alone or not alone["images_per_s"]:
        return None
    return round(piped["images_per_s"] / alone["images_per_s"], 3)


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
    n_cpu = args.cpu_records or (2048 if gpu else 32)
    cpus = os.cpu_count() or 2
    sampler = GpuSampler()
    result = {"mode": "gpu" if gpu else "reduced (cpu)", "device":
              torch.cuda.get_device_name(0) if gpu else "cpu", "cpus": cpus,
              "torch": torch.__version__, "models": models, "gpu_util_source": sampler.source,
              "checks": {}, "cpu_pipeline": {}}
    ray.init(address="local", num_cpus=cpus, num_gpus=1 if gpu else 0, include_dashboard=False,
             logging_level=logging.WARNING, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}})

    def spec(section, model, n, name, **kw):
        return job_spec(section, model, make_manifest(workdir, n), workdir / f"out-{name}",
                        gpu, n, args.max_new_tokens, **kw)

    try:
        emb = spec("image_embedding", models["clip"], n_embed, "embedding")
        batch = emb.image_embedding.batch_size
        embedding = result["checks"]["embedding"] = {
            "alone": phase("embedding.alone", sampler, started, model_alone, "image_embedding",
                           emb, device, batch, 20 if gpu else 3)}
        for w in sorted({1, max(2, cpus - 1)}):
            result["cpu_pipeline"][str(w)] = phase(
                f"cpu_pipeline.{w}", sampler, started, through_mmpipe,
                spec(None, None, n_cpu if w > 1 else max(16, n_cpu // 4), f"cpu-{w}", workers=w))
        rates = {int(k): v["images_per_s"] for k, v in result["cpu_pipeline"].items() if v}
        if len(rates) == 2:
            hi = max(rates)
            result["cpu_pipeline_efficiency"] = round(rates[hi] / (hi * rates[1]), 3)
        embedding["mmpipe"] = phase("embedding.mmpipe", sampler, started, through_mmpipe, emb)
        embedding["gpu_media"] = phase(
            "embedding.gpu_media", sampler, started, through_mmpipe,
            spec("image_embedding", models["clip"], n_embed, "gpu-media", decode_device="cuda"))
        embedding["ratio_mmpipe_over_alone"] = ratio(embedding["mmpipe"], embedding["alone"])
        embedding["ratio_gpu_media_over_alone"] = ratio(embedding["gpu_media"],
                                                        embedding["alone"])
        cap = spec("captioning", models["blip"], n_caption, "captioning")
        captioning = result["checks"]["captioning"] = {
            "alone": phase("captioning.alone", sampler, started, model_alone, "captioning", cap,
                           device, cap.captioning.batch_size, 20 if gpu else 3)}
        captioning["mmpipe"] = phase("captioning.mmpipe", sampler, started, through_mmpipe, cap)
        captioning["ratio_mmpipe_over_alone"] = ratio(captioning["mmpipe"], captioning["alone"])
    finally:
        ray.shutdown()
    result["total_s"] = round(time.time() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(summary(result))
    return 0


def summary(result: dict) -> str:
    """The Markdown table of a result (phases skipped by the deadline show as ``-``)."""
    def util(d):
        u = (d or {}).get("gpu_util") or {}
        return f"{u['mean_pct']:.0f}% / {u['max_pct']:.0f}%" if u.get("samples") else "-"

    def rate(d):
        return d["images_per_s"] if d else "-"

    lines = [f"gpu_check ({result['mode']}, {result['device']}, {result['cpus']} CPUs, "
             f"torch {result['torch']}, GPU util from {result['gpu_util_source']}, "
             f"{result['total_s']} s)",
             "| phase | img/s | ratio to model alone | GPU util mean / max | actor busy | "
             "mean batch |", "|---|---|---|---|---|---|"]
    for name, c in result["checks"].items():
        alone = c.get("alone")
        lines.append(f"| {name}: model alone | {rate(alone)} | 1.0 | {util(alone)} | | |")
        for key in ("mmpipe", "gpu_media"):
            if key not in c:
                continue
            m = c[key] or {}
            busy = m.get("actor_busy_fraction")
            lines.append(f"| {name}: {key} | {rate(c[key])} | "
                         f"{c.get(f'ratio_{key}_over_alone', '-')} | {util(m)} | "
                         f"{'-' if busy is None else f'{busy:.0%}'} | "
                         f"{m.get('actor_mean_batch_rows', '-')} |")
    for w, c in result["cpu_pipeline"].items():
        lines.append(f"| cpu pipeline, {w} worker{'s' if w != '1' else ''} | {rate(c)} | | "
                     f"{util(c)} | | |")
    if "cpu_pipeline_efficiency" in result:
        lines.append(f"cpu pipeline scaling efficiency: {result['cpu_pipeline_efficiency']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
