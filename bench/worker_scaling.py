#!/usr/bin/env python
"""Worker scaling (issue 13, item 2): the same image job on 1 and on 2 PartitionWorkers.

    .venv/bin/python bench/worker_scaling.py                  # 2000 records, workers 1,2, twice
    .venv/bin/python bench/worker_scaling.py --records 4000 --workers 1,2,4 --repeats 3

The job is the real one: ``run_job(spec)`` on a fresh local Ray (``ray.init(address=
"local", num_cpus=--cores)``, the same cluster size for every worker count), each run in
a fresh subprocess. The input is a JSONL manifest naming the 57 bundled COCO photos
(data/photos, 640 px JPEGs) over and over, ``--records`` rows with distinct keys, cut into
partitions of ``--partition-size``. The steps: decode, filters, sha256 + phash, resize
to 256 px (shorter side) and JPEG re-encode, Parquet, commit. Dedup off, no model step.

Per run it prints, from the commit markers, ``processing`` = first partition started ->
last partition committed, and the rate rows / processing (worker start-up, planning and
``ray.init`` excluded; ``wall`` includes them); the driver process's CPU seconds during
``run_job``; and, sampled every 0.5 s from /proc while the job runs, the most threads any
``ray::PartitionWorker`` process had, with their names (``comm``) counted. Runs of the
worker counts are interleaved (1, 2, 1, 2, ...) so drifting load on a noisy machine hits
both; the best run of each count is used. Efficiency of W workers =
rate(W) / (W * rate(1)). Last line:

    worker_scaling: workers=1,2 img_per_s=<a>,<b> efficiency=<e>
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the working tree

PHOTOS = REPO / "data" / "photos"
TICKS = os.sysconf("SC_CLK_TCK")


def build_manifest(workdir: Path, records: int) -> Path:
    """A JSONL manifest of ``records`` rows naming the bundled photos in turn, keys distinct."""
    photos = [json.loads(line) for line in (PHOTOS / "captions.jsonl").read_text().splitlines()]
    rows = []
    for i in range(records):
        p = photos[i % len(photos)]
        rows.append({"path": str(PHOTOS / p["file"]), "key": f"{p['key']}-{i:06d}"})
    manifest = workdir / f"manifest-{records}.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest


def make_spec(manifest: Path, out: Path, workers: int, partition_size: int, batch_size: int):
    from pipeline.spec import JobSpec

    return JobSpec.model_validate({
        "name": "bench-worker-scaling",
        "source": {"kind": "manifest", "uri": str(manifest), "path_column": "path",
                   "key_column": "key", "partition_size": partition_size,
                   "allowed_roots": [str(PHOTOS)]},
        "sink": {"uri": str(out)},
        "resize": {"mode": "shorter_side", "size_px": 256, "encode_format": "jpeg",
                   "quality": 90},
        "filters": {"min_width_px": 64, "min_height_px": 64, "max_aspect_ratio": 3.0},
        "dedup": {"exact": False, "near": False},
        "text_embedding": {"enabled": False},
        "runtime": {"num_workers": workers, "batch_size": batch_size, "mode": "overwrite"},
    })


class WorkerThreads(threading.Thread):
    """Samples the ``ray::PartitionWorker`` processes' threads every 0.5 s."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.max_threads = 0
        self.names: collections.Counter = collections.Counter()
        self.env: dict[str, str] = {}
        self.cpu_s: dict[str, float] = {}  # pid -> CPU seconds (utime + stime) last seen

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if not f.read(64).startswith(b"ray::PartitionWorker"):
                            continue
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    self.cpu_s[pid] = (int(fields[11]) + int(fields[12])) / TICKS
                    tasks = os.listdir(f"/proc/{pid}/task")
                    if len(tasks) > self.max_threads:
                        names = collections.Counter()
                        for t in tasks:
                            with open(f"/proc/{pid}/task/{t}/comm") as f:
                                names[f.read().strip()] += 1
                        self.max_threads, self.names = len(tasks), names
                    if not self.env:
                        with open(f"/proc/{pid}/environ", "rb") as f:
                            pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
                        self.env = {k.decode(): v.decode() for k, v in pairs
                                    if k.endswith(b"_NUM_THREADS") or k == b"OMP_THREAD_LIMIT"}
                except OSError:
                    continue


def _busy_s() -> float:
    """CPU seconds this machine has spent not idle (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / TICKS  # minus idle and iowait


def run_one(args) -> dict:
    """One job on ``args.one`` workers (in this fresh process); the numbers as a dict."""
    import ray

    from pipeline.output.checkpoint import CheckpointStore
    from pipeline.runtime.driver import run_job

    workdir = Path(args.workdir)
    out = Path(tempfile.mkdtemp(prefix=f"out-w{args.one}-", dir=workdir))
    spec = make_spec(Path(args.manifest), out, args.one, args.partition_size, args.batch_size)
    t0 = time.time()
    ray.init(address="local", num_cpus=args.cores, include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False)
    init_s = time.time() - t0
    sampler = WorkerThreads()
    sampler.start()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t_job, busy0 = time.time(), _busy_s()
    report = run_job(spec)
    busy = _busy_s() - busy0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    sampler.stop.set()
    ray.shutdown()
    markers = list(CheckpointStore(report.output_uri).markers().values())
    first, last = min(m.started_at for m in markers), max(m.finished_at for m in markers)
    rows = sum(m.rows_in for m in markers)
    firsts: dict[str, float] = {}
    for m in markers:
        w = m.ran_on.get("worker", "?")
        firsts[w] = min(firsts.get(w, m.started_at), m.started_at)
    shutil.rmtree(out, ignore_errors=True)
    return {"workers": args.one, "rows": rows, "ok": report.rows_by_status.get("ok", 0),
            "partitions": len(markers), "ray_init_s": round(init_s, 2),
            "job_s": round(report.wall_s, 2), "startup_s": round(first - t_job, 2),
            "processing_s": round(last - first, 3),
            "stagger_s": round(max(firsts.values()) - min(firsts.values()), 2),
            "machine_busy_cores": round(busy / report.wall_s, 2),
            "img_per_s": round(rows / (last - first), 1),
            "img_per_s_wall": round(rows / report.wall_s, 1),
            "driver_cpu_s": round(cpu1.ru_utime + cpu1.ru_stime
                                  - cpu0.ru_utime - cpu0.ru_stime, 2),
            "worker_cpu_s": round(sum(sampler.cpu_s.values()), 2),
            "worker_cpu_ms_per_img": round(1000 * sum(sampler.cpu_s.values()) / rows, 2),
            "worker_threads_max": sampler.max_threads,
            "worker_thread_names": dict(sampler.names.most_common()),
            "worker_env": sampler.env}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each worker count")
    ap.add_argument("--partition-size", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--cores", type=int, default=os.cpu_count(),
                    help="CPUs of the local Ray (default: this machine's)")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a single run (subprocess)
    ap.add_argument("--manifest", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="worker-scaling-"))
    workdir.mkdir(parents=True, exist_ok=True)
    manifest = build_manifest(workdir, args.records)
    counts = [int(w) for w in args.workers.split(",")]
    best: dict[int, dict] = {}
    for r in range(args.repeats):
        for w in counts:
            cmd = [sys.executable, __file__, "--one", str(w), "--manifest", str(manifest),
                   "--workdir", str(workdir), "--cores", str(args.cores),
                   "--partition-size", str(args.partition_size),
                   "--batch-size", str(args.batch_size)]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if proc.returncode != 0:
                sys.exit(f"run failed ({w} workers):\n{proc.stderr[-4000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            if res["ok"] != res["rows"] or res["rows"] != args.records:
                sys.exit(f"run ({w} workers) did not process every record ok: {res}")
            print(f"run {r + 1} workers={w}: {res['rows']} rows ({res['ok']} ok) in "
                  f"{res['partitions']} partitions; processing {res['processing_s']} s -> "
                  f"{res['img_per_s']} img/s (wall {res['job_s']} s -> "
                  f"{res['img_per_s_wall']} img/s; start-up {res['startup_s']} s, workers' first "
                  f"partitions {res['stagger_s']} s apart); machine busy "
                  f"{res['machine_busy_cores']} cores; driver CPU "
                  f"{res['driver_cpu_s']} s; workers' CPU {res['worker_cpu_s']} s = "
                  f"{res['worker_cpu_ms_per_img']} ms/img = "
                  f"{res['worker_cpu_s'] / res['job_s']:.2f} cores over the job; worker threads max {res['worker_threads_max']} "
                  f"{res['worker_thread_names']} env {res['worker_env']}", flush=True)
            if w not in best or res["img_per_s"] > best[w]["img_per_s"]:
                best[w] = res
    base = best[counts[0]]["img_per_s"] / counts[0]
    effs = [best[w]["img_per_s"] / (w * base) for w in counts]
    for w, e in zip(counts, effs):
        print(f"best workers={w}: {best[w]['img_per_s']} img/s, efficiency {e:.2f}")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"worker_scaling: workers={','.join(map(str, counts))} img_per_s="
          f"{','.join(str(best[w]['img_per_s']) for w in counts)} efficiency={effs[-1]:.2f}")


if __name__ == "__main__":
    main()
