#!/usr/bin/env python
"""Throughput and peak-memory benchmark: mmpipe vs a plain loop vs Ray Data, same data, one run.

DESIGN.md "Performance model": measure records/s and peak memory of the job as ratios
against the same job as a plain loop in one process and the same job on Ray Data
``map_batches``.

    .venv/bin/python bench/throughput.py                      # ~627 images, variants a,b,c,d
    .venv/bin/python bench/throughput.py --copies 5           # a smaller set (285 images)
    .venv/bin/python bench/throughput.py --variants a,b --cores 2 --workdir /tmp/bench
    .venv/bin/python bench/throughput.py --copies 1 --no-model   # CPU steps only, no torch

A rerun in the same ``--workdir`` overwrites each kept output (``runtime.mode=overwrite``:
variant (a) then writes generation 2); timings and outputs are read from the current
generation (``pipeline.output.generations.read_root``).

What it does:

1. Builds a data set from the 57 COCO photos in data/photos (cached in the work dir):
   every photo ``--copies`` times, each copy a different random crop (85-100 % of each
   side, random offset) and a random horizontal flip, upscaled with Lanczos to a random
   1-3 megapixels (aspect kept), JPEG quality 90, caption ``captions[copy % 5]``.
   The manifest (JSONL: ``path``, ``caption``, ``key``) is shuffled with the seed so the
   copies of one photo spread over partitions, as in a real crawl.
2. Runs the same job four ways, each in a fresh subprocess (``--variant a|b|c|d``), so
   one variant's memory does not pollute another's. All four run the same assembled
   ``Pipeline`` (``pipeline.assembly.assemble(spec, ...)``: the datasource, the CPU steps
   ``pipeline.steps``, the model stages ``pipeline.models``, the output schema
   ``pipeline.schema(partition)``) over the same partitions (``pipeline.output.plan.pack`` of
   ``pipeline.datasource.list_inputs()``, as the planner cuts them):

   a. mmpipe as ``mmpipe run`` runs it by default (``--executor auto``): with no model
      stage on GPUs, ``run_job(spec, processes=ProcessWorkers(..., cpus=--cores))``, one
      worker process per core, spawned before the plan, each loading its own copy of the
      model (``pipeline.models.local``, a ``BatchServer`` in its threads) and running
      ``assemble(spec, <its models>, pool, setup=True)`` and ``run_partition``; no Ray.
   d. mmpipe on Ray (``--executor ray``): ``run_job(spec)`` on a fresh
      ``ray.init(address="local", num_cpus=--cores)`` (never another session's cluster),
      default workers (cores minus the CPUs reserved for the ModelActor); each
      PartitionWorker calls the ModelActor pool.
   b. plain loop, one process: ``run_partition(assemble(spec, local_models(spec), pool,
      setup=True), partition, new_attempt_id(), pool)`` over every partition of the plan
      (``pipeline.models.local``: the model in this process behind a
      ``BatchServer``, which computes in its own threads like a ModelActor); no Ray
      imported. Same Parquet datasink and commit markers as (a).
   c. Ray Data: one block per planned partition (a one-row ``from_arrow`` table holding the
      ``Partition``) -> ``map_batches`` (callable class ``CpuStepsUDF``: the assembled
      pipeline, models unbound; per partition the datasource's public
      ``read_partition``, the runner's ``_start_batch`` and ``pipeline.steps``; yields one
      table per read batch; as many actors as mmpipe's workers) -> ``map_batches``
      (callable class ``EmbedUDF``: the pipeline assembled with ``local_models(spec,
      batch_server=False)``, running ``pipeline.models`` and writing rows in
      ``pipeline.schema(partition)``; concurrency=1) -> ``write_parquet``. Read batch size
      and embed batch size = ``runtime.batch_size``. No quarantine files or commit markers.

   The spec is examples/quickstart.yaml with the manifest columns, partition_size and
   mode overridden (see ``make_spec``).
3. Memory: a thread samples /proc every 0.2 s. It sums, over the variant process and
   all its descendants (a: its worker processes; c and d: the Ray processes that
   ``ray.init`` started -
   gcs_server, raylet, dashboard/runtime-env agents, log monitor, and every ``ray::``
   worker), VmRSS and Pss (from smaps_rollup), and keeps the peak of each sum; it also
   keeps each process's VmHWM and reports their sum. Ray processes not descended from
   the variant (another job on the machine) are counted and excluded.
   The same thread adds up the CPU time (utime+stime) of those processes, and the
   machine's non-idle CPU time from /proc/stat: the difference is other processes'
   load, reported per variant. Before each variant the script waits (``--quiet-wait``)
   until other processes use < 0.3 cores, and reruns a variant they disturbed
   (``--busy-retries``), keeping the least disturbed run.
4. Time: ``wall`` = ray.init (c, d), the worker processes' spawn (a) or nothing (b) +
   the whole job (planning, model load, processing, writing, commit); ``processing`` =
   first partition/batch started -> last partition committed (a, b, d: from the commit
   markers) or last embedding batch done (c: from the UDFs' call log). records/s = rows
   / seconds. Stopping Ray or the worker processes is reported apart (``shutdown``).
5. Reads the four outputs back (a, b, d: ``read_committed``, the files the commit markers
   name; c: every Parquet file written), checks that the output schemas, rows by status,
   rows by reason, every key's status and every output image's bytes agree, and reports
   the largest difference between text embeddings; prints a markdown summary with ratios
   vs (b)
   and saves it (with every number) to ``<workdir>/results/<tag>-summary.{md,json}``;
   ``--render <that json>`` prints it again.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
import math
import os
import platform
import posixpath
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the working tree

PHOTOS = REPO / "data" / "photos"
QUICKSTART = REPO / "examples" / "quickstart.yaml"
VARIANTS = {"a": "mmpipe run (default executor)", "b": "plain loop, 1 process",
            "c": "Ray Data map_batches", "d": "mmpipe on Ray (--executor ray)"}
DEFAULT_TARGET_IMAGES = 600
SAMPLE_INTERVAL_S = 0.2

log = logging.getLogger("bench")


# ----------------------------------------------------------------------------- data set

def make_copy(job: tuple[str, str, int, str]) -> dict[str, Any]:
    """Make one copy of one photo (runs in a worker process); return its stats."""
    from PIL import Image

    src, dst, copy, seed = job
    rng = random.Random(f"{seed}:{posixpath.basename(src)}:{copy}")
    with Image.open(src) as im:
        im = im.convert("RGB")
    w, h = im.size
    cw, ch = round(w * rng.uniform(0.85, 1.0)), round(h * rng.uniform(0.85, 1.0))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    im = im.crop((x, y, x + cw, y + ch))
    flipped = rng.random() < 0.5
    if flipped:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    target_mp = rng.uniform(1.0, 3.0)
    scale = math.sqrt(target_mp * 1e6 / (cw * ch))
    im = im.resize((round(cw * scale), round(ch * scale)), Image.Resampling.LANCZOS)
    tmp = dst + ".tmp"
    im.save(tmp, format="JPEG", quality=90)
    os.replace(tmp, dst)
    return {"width": im.width, "height": im.height, "bytes": os.path.getsize(dst),
            "flipped": flipped}


def build_dataset(workdir: Path, copies: int, seed: int, cores: int) -> tuple[Path, dict]:
    """Create (or reuse) the data set; return ``(manifest path, dataset info)``."""
    from concurrent.futures import ProcessPoolExecutor

    root = workdir / f"data-c{copies}-s{seed}"
    manifest = root / "manifest.jsonl"
    info_path = root / "dataset.json"
    if manifest.exists() and info_path.exists():
        info = json.loads(info_path.read_text())
        names = [json.loads(line)["path"] for line in manifest.read_text().splitlines()]
        if len(names) == info["images"] and all((root / n).exists() for n in names):
            log.info("reusing data set %s (%d images)", root, len(names))
            info["reused"] = True
            return manifest, info
    t0 = time.time()
    (root / "images").mkdir(parents=True, exist_ok=True)
    photos = [json.loads(line) for line in (PHOTOS / "captions.jsonl").read_text().splitlines()]
    rows, jobs = [], []
    for p in photos:
        for c in range(copies):
            rel = f"images/{p['key']}-c{c:02d}.jpg"
            jobs.append((str(PHOTOS / p["file"]), str(root / rel), c, str(seed)))
            rows.append({"path": rel, "caption": p["captions"][c % len(p["captions"])],
                         "key": f"{p['key']}-c{c:02d}"})
    with ProcessPoolExecutor(max(1, cores)) as ex:
        stats = list(ex.map(make_copy, jobs, chunksize=4))
    random.Random(seed).shuffle(rows)
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mp = [s["width"] * s["height"] / 1e6 for s in stats]
    info = {"photos": len(photos), "copies": copies, "seed": seed, "images": len(rows),
            "megapixels_min": round(min(mp), 2), "megapixels_mean": round(sum(mp) / len(mp), 2),
            "megapixels_max": round(max(mp), 2), "flipped": sum(s["flipped"] for s in stats),
            "total_mib": round(sum(s["bytes"] for s in stats) / 2**20, 1),
            "mean_kib": round(sum(s["bytes"] for s in stats) / len(stats) / 1024, 1),
            "build_s": round(time.time() - t0, 1)}
    info_path.write_text(json.dumps(info, indent=1))
    os.replace(tmp, manifest)  # last: a half-built set is never reused
    log.info("built data set %s: %s", root, info)
    info["reused"] = False
    return manifest, info


def make_spec(manifest: Path, output: Path, partition_size: int, model: bool = True):
    """examples/quickstart.yaml pointed at the bench manifest and ``output``; ``model``
    False: ``text_embedding.enabled=false`` (no model stage: ``--no-model``)."""
    from pipeline.spec import load_spec

    overrides = ["name=bench-throughput", "source.path_column=path",
                 "source.caption_column=caption", "source.key_column=key",
                 f"source.partition_size={partition_size}", "runtime.mode=overwrite"]
    if not model:
        overrides.append("text_embedding.enabled=false")
    return load_spec(QUICKSTART, overrides, str(manifest), str(output))


# ----------------------------------------------------------------------------- memory

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _status_kib(text: str, field: str) -> int:
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _label(pid: int, root: int) -> tuple[str, str]:
    """``(category, label)`` of a process: driver | worker process | ray worker | ray system."""
    raw = _read(f"/proc/{pid}/cmdline") or ""
    argv = [a for a in raw.split("\0") if a]
    if pid == root:
        return "driver", "driver"
    if any("multiprocessing.spawn" in a or "multiprocessing.resource_tracker" in a
           for a in argv):
        # ProcessWorkers' PartitionWorkers (and multiprocessing's resource tracker)
        return "worker process", ("resource tracker" if "resource_tracker" in raw
                                  else "PartitionWorker process")
    if argv and argv[0].startswith("ray::"):  # "ray::ModelActor.embed(...)" -> "ray::ModelActor"
        return "ray worker", re.sub(r"\.[A-Za-z_]\w*(\(.*\))?$", "", argv[0].split()[0])
    if not argv:
        return "ray system", "?"
    exe = posixpath.basename(argv[0])
    if exe.startswith("python"):
        script = next((a for a in argv[1:] if not a.startswith("-")), exe)
        return "ray system", "/".join(script.split("/")[-2:])
    return "ray system", exe


def machine_busy_ticks() -> int:
    """Non-idle CPU clock ticks of the whole machine since boot (/proc/stat)."""
    f = [int(x) for x in (_read("/proc/stat") or "cpu 0").splitlines()[0].split()[1:]]
    f += [0] * (8 - len(f))
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7]  # user nice system irq softirq steal


def _own_cpu_ticks() -> int:
    stat = _read("/proc/self/stat") or ") x x 0 0 0 0 0 0 0 0 0 0 0"
    f = stat[stat.rindex(")") + 2:].split()
    return int(f[11]) + int(f[12])


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.3) -> float:
    """Wait until the machine's CPU use over 3 s is below ``threshold_cores`` (others'
    jobs would skew the timings); give up after ``max_wait_s``. Return the last load."""
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.time() + max_wait_s
    while True:
        b0, t0 = machine_busy_ticks(), time.time()
        time.sleep(3)
        load = (machine_busy_ticks() - b0) / hz / (time.time() - t0)
        if load < threshold_cores or time.time() > deadline:
            if load >= threshold_cores:
                log.warning("machine still busy (%.2f cores used by other processes); "
                            "timings will be skewed", load)
            return load
        log.info("machine busy (%.2f cores used by other processes); waiting", load)
        time.sleep(7)


_RAY_MARKERS = ("ray::", "raylet", "gcs_server", "ray/dashboard", "ray/_private",
                "ray/autoscaler")


class MemSampler(threading.Thread):
    """Samples the memory of process ``root`` and its descendants every ``interval`` s.

    Keeps: the peak over samples of the sum of VmRSS (``peak_rss_mib``, with the
    breakdown by category and label at that moment), the peak of the sum of Pss
    (``peak_pss_mib``: shared pages - libraries, the plasma object store - counted
    once), and the sum over every process ever seen of its VmHWM (``sum_hwm_mib``).
    """

    def __init__(self, root: int | None = None, interval: float = SAMPLE_INTERVAL_S):
        super().__init__(daemon=True, name="mem-sampler")
        self.root = root or os.getpid()
        self.interval = interval
        self.stop_event = threading.Event()
        self.peak_rss_kib = 0
        self.peak_pss_kib = 0
        self.peak_breakdown: dict[str, Any] = {}
        self.hwm_kib: dict[int, int] = {}
        self.labels: dict[int, str] = {}
        self.max_procs = 0
        self.foreign_max = 0
        self.samples = 0
        self.cpu_ticks: dict[int, int] = {}  # pid -> utime+stime (clock ticks), max seen

    def _tree(self) -> tuple[list[int], int]:
        parent: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            stat = _read(f"/proc/{d}/stat")
            if stat:
                parent[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
        children = collections.defaultdict(list)
        for pid, ppid in parent.items():
            children[ppid].append(pid)
        tree, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, ()))
        mine = set(tree)
        foreign = 0
        for pid in parent:
            if pid not in mine:
                cmd = _read(f"/proc/{pid}/cmdline") or ""
                foreign += any(m in cmd for m in _RAY_MARKERS)
        return tree, foreign

    def sample(self) -> None:
        tree, foreign = self._tree()
        rss = pss = 0
        by_cat: collections.Counter = collections.Counter()
        by_label: dict[str, list] = {}
        for pid in tree:
            status = _read(f"/proc/{pid}/status")
            if not status:
                continue
            r = _status_kib(status, "VmRSS")
            if r == 0:  # a zombie, or a kernel thread
                continue
            cat, label = _label(pid, self.root)
            self.labels[pid] = label
            stat = _read(f"/proc/{pid}/stat")
            if stat:
                f = stat[stat.rindex(")") + 2:].split()
                self.cpu_ticks[pid] = max(self.cpu_ticks.get(pid, 0), int(f[11]) + int(f[12]))
            self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), _status_kib(status, "VmHWM"))
            rollup = _read(f"/proc/{pid}/smaps_rollup")
            p = _status_kib(rollup, "Pss") if rollup else r
            rss, pss = rss + r, pss + p
            by_cat[cat] += r
            entry = by_label.setdefault(label, [0, 0])
            entry[0] += 1
            entry[1] += r
        self.samples += 1
        self.foreign_max = max(self.foreign_max, foreign)
        self.max_procs = max(self.max_procs, len(tree))
        self.peak_pss_kib = max(self.peak_pss_kib, pss)
        if rss > self.peak_rss_kib:
            self.peak_rss_kib = rss
            self.peak_breakdown = {
                "at_s": round(time.time() - self.t0, 1), "processes": len(tree),
                "by_category_mib": {k: round(v / 1024) for k, v in sorted(by_cat.items())},
                "by_label": {k: {"n": n, "mib": round(v / 1024)}
                             for k, (n, v) in sorted(by_label.items(), key=lambda kv: -kv[1][1])},
            }

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a sampler must never kill the benchmark
                log.debug("sample failed", exc_info=True)
            self.stop_event.wait(self.interval)

    def start(self) -> None:
        self.t0 = time.time()
        self.busy0 = machine_busy_ticks()
        self.own0 = _own_cpu_ticks()
        super().start()

    def finish(self) -> dict[str, Any]:
        self.stop_event.set()
        self.join()
        self.sample()
        own = _read("/proc/self/status") or ""
        elapsed = time.time() - self.t0
        hz = os.sysconf("SC_CLK_TCK")
        ours = (sum(self.cpu_ticks.values()) - self.own0) / hz
        machine = (machine_busy_ticks() - self.busy0) / hz
        cpu = {"elapsed_s": round(elapsed, 1), "our_cpu_s": round(ours, 1),
               "machine_cpu_s": round(machine, 1),
               "others_cores": round(max(0.0, machine - ours) / elapsed, 2),
               "our_cores": round(ours / elapsed, 2)}
        return {"cpu": cpu, "peak_rss_mib": round(self.peak_rss_kib / 1024, 1),
                "peak_pss_mib": round(self.peak_pss_kib / 1024, 1),
                "sum_hwm_mib": round(sum(self.hwm_kib.values()) / 1024, 1),
                "driver_hwm_mib": round(_status_kib(own, "VmHWM") / 1024, 1),
                "processes_seen": len(self.hwm_kib), "max_processes": self.max_procs,
                "samples": self.samples, "foreign_ray_processes_excluded": self.foreign_max,
                "peak_breakdown": self.peak_breakdown,
                "hwm_by_label_mib": _hwm_by_label(self.hwm_kib, self.labels),
                "cpu_by_label_s": self._cpu_by_label(hz)}

    def _cpu_by_label(self, hz: int) -> dict[str, float]:
        out: collections.Counter = collections.Counter()
        for pid, ticks in self.cpu_ticks.items():
            out[self.labels.get(pid, "?")] += (ticks - (self.own0 if pid == self.root else 0)) / hz
        return {k: round(v, 1) for k, v in out.most_common()}


def _hwm_by_label(hwm: dict[int, int], labels: dict[int, str]) -> dict[str, Any]:
    out: dict[str, list] = {}
    for pid, kib in hwm.items():
        e = out.setdefault(labels.get(pid, "?"), [0, 0])
        e[0] += 1
        e[1] += kib
    return {k: {"n": n, "mib": round(v / 1024)}
            for k, (n, v) in sorted(out.items(), key=lambda kv: -kv[1][1])}


# ----------------------------------------------------------------------------- variants

def _quiet_ray_init(cores: int) -> float:
    import ray

    t0 = time.time()
    # address="local": always a fresh cluster of our own; a bare ray.init() attaches to any
    # cluster another session started with `ray start` on this machine (and then refuses
    # num_cpus)
    ray.init(address="local", num_cpus=cores, include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False)
    return time.time() - t0


def read_markers(out_dir: str | Path) -> list:
    """The commit markers (``CommitMarker``) of an output's current generation (the one
    readers use, ``generations.read_root``: a rerun of (a) in the same ``--workdir``
    overwrites its kept output as generation 2, whose markers are not at the root), in
    partition order."""
    from pipeline.output import generations
    from pipeline.output.checkpoint import CheckpointStore

    root = generations.read_root(str(out_dir))
    return [m for _, m in sorted(CheckpointStore(root).markers().items())]


def _marker_window(out_dir: str, t_job: float) -> dict[str, float]:
    """From the commit markers: seconds from job start to the first partition's start, and
    from then to the last partition's commit."""
    ms = read_markers(out_dir)
    if not ms:
        raise RuntimeError(f"{out_dir}: no commit marker in its current generation")
    first, last = min(m.started_at for m in ms), max(m.finished_at for m in ms)
    return {"startup_s": round(first - t_job, 2), "processing_s": round(last - first, 2)}


def plan_partitions(pipeline) -> list:
    """The partitions of the job, cut as the planner cuts them (``plan.pack`` of the
    datasource's listing, ``datasource.items_per_partition`` items each)."""
    from pipeline.output.plan import pack

    return list(pack(pipeline.datasource.list_inputs(), pipeline.datasource.items_per_partition))


def variant_a(spec, cores: int) -> dict[str, Any]:
    """mmpipe as ``mmpipe run`` runs it by default (``--executor auto``, ``cli._processes``):
    on worker processes (``executors.ProcessWorkers`` with ``--cores`` CPUs, spawned
    before the plan) when ``executors.needs_ray(spec)`` is empty, else on Ray (variant d)."""
    from pipeline.runtime.executors import (ProcessWorkers, needs_ray, new_run_id,
                                            planned_workers)
    from pipeline.runtime.driver import run_job

    if needs_ray(spec):
        return variant_d(spec, cores)
    t0 = time.time()
    processes = ProcessWorkers(spec.name, new_run_id(), cpus=cores)
    try:
        workers = planned_workers(spec, processes)
        processes.prestart(workers)
        report = run_job(spec, processes=processes)
    finally:
        t = time.time()
        processes.close()
        shutdown_s = time.time() - t
    if not report.complete:
        raise RuntimeError(f"job incomplete: {report.format()}")
    return {"job_s": round(report.wall_s, 2), "shutdown_s": round(shutdown_s, 2),
            "wall_s": round(t - t0, 2), "workers": workers, "executor": "processes",
            **_marker_window(spec.sink.uri, t0),
            "rows_by_status": dict(report.rows_by_status),
            "rows_by_reason": dict(report.rows_by_reason)}


def variant_d(spec, cores: int) -> dict[str, Any]:
    """mmpipe on Ray: ``run_job`` on a fresh local Ray (``mmpipe run --executor ray``)."""
    import ray

    from pipeline.runtime.driver import run_job
    from pipeline.runtime.model_pool import reserved_cpus

    init_s = _quiet_ray_init(cores)
    try:
        # the driver's default worker count: cluster CPUs minus the model actors' reservation
        workers = max(1, int(ray.cluster_resources().get("CPU", 1) - reserved_cpus(spec)))
        t_job = time.time()
        report = run_job(spec)
    finally:
        t = time.time()
        ray.shutdown()
        shutdown_s = time.time() - t
    if not report.complete:
        raise RuntimeError(f"job incomplete: {report.format()}")
    return {"ray_init_s": round(init_s, 2), "job_s": round(report.wall_s, 2),
            "shutdown_s": round(shutdown_s, 2), "wall_s": round(init_s + report.wall_s, 2),
            "workers": workers, "model_actors": report.model_actors,
            **_marker_window(spec.sink.uri, t_job),
            "rows_by_status": dict(report.rows_by_status),
            "rows_by_reason": dict(report.rows_by_reason)}


class _TimedStep:
    """Wraps a CPU step of the assembled pipeline to add its wall time to ``acc``
    (plain-loop profile). Everything else (``name``, ``writes``, ``settings``,
    ``start_partition``...) is the step's own, so the fingerprint does not change."""

    def __init__(self, inner, acc: collections.Counter):
        self.inner, self.acc, self.name = inner, acc, inner.name

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __call__(self, batch):
        t = time.perf_counter()
        out = self.inner(batch)
        self.acc[self.name] += time.perf_counter() - t
        return out


def _timed_reads(read_partition, acc: collections.Counter):
    """Wraps ``datasource.read_partition`` to time each batch (manifest read + fetch)."""
    def timed(*args, **kwargs):
        it = read_partition(*args, **kwargs)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                acc["read+fetch"] += time.perf_counter() - t
                return
            acc["read+fetch"] += time.perf_counter() - t
            yield batch
    return timed


def _timed_client(acc: collections.Counter):
    """A ``LocalModelClient`` that adds the time the loop waits on ``result`` to ``acc``."""
    from pipeline.models.local import LocalModelClient

    class TimedClient(LocalModelClient):
        def result(self, handle):
            t = time.perf_counter()
            out = super().result(handle)
            acc["wait on model"] += time.perf_counter() - t
            return out

    return TimedClient


def variant_b(spec, cores: int) -> dict[str, Any]:
    """Plain loop in one process: ``run_partition`` of the assembled pipeline over the
    plan, the model in this process (``local_models``); no Ray."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.assembly import assemble
    from pipeline.models.registry import enabled_sections
    from pipeline.runtime.partition import new_attempt_id, run_partition
    from pipeline.storage import fs
    from pipeline.models.local import local_models

    assert "ray" not in sys.modules, "the plain loop must not import ray"
    t0 = time.time()
    fs.configure(**spec.storage.model_dump())
    fs.delete_tree(spec.sink.uri)  # runtime.mode=overwrite
    acc: collections.Counter = collections.Counter()
    pool = ThreadPoolExecutor(spec.runtime.decode_threads)
    if enabled_sections(spec):
        # the model gets the threads mmpipe's ModelActor gets (Ray sets OMP_NUM_THREADS to
        # the actor's num_cpus); torch's default (every core) would fight the decode threads
        import torch

        torch.set_num_threads(max(1, int(spec.text_embedding.num_cpus)))
    t = time.perf_counter()
    models = local_models(spec, client=_timed_client(acc))
    load_s = time.perf_counter() - t
    pipeline = assemble(spec, models, pool, setup=True)
    fp = pipeline.fingerprint
    partitions = plan_partitions(pipeline)
    # profile hooks; they leave the fingerprint (and so the markers) as they are
    pipeline.steps = [_TimedStep(s, acc) for s in pipeline.steps]
    pipeline.datasource.read_partition = _timed_reads(pipeline.datasource.read_partition, acc)
    assert pipeline.fingerprint == fp, "the profile hooks changed the fingerprint"
    rows: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    t_parts = time.perf_counter()
    for part in partitions:
        out = run_partition(pipeline, part, new_attempt_id(), pool)
        assert out.committed, out
        rows.update(out.marker.rows_by_status)
        reasons.update(out.marker.rows_by_reason)
    parts_s = time.perf_counter() - t_parts
    wall = time.time() - t0
    pool.shutdown()
    if not enabled_sections(spec):
        assert "torch" not in sys.modules, "the model-less plain loop imported torch"
    servers = {section: client.server.stats() for section, (client, _) in models.items()
               if hasattr(client.server, "stats")}
    profile = {"model load": round(load_s, 2)}
    profile.update({k: round(v, 2) for k, v in acc.items()})
    profile["sink+commit+other"] = round(parts_s - sum(acc.values()), 2)
    for section, st in servers.items():  # in the BatchServer's thread, overlapping the rest
        profile[f"{section} model busy (own thread)"] = st["busy_s"]
    return {"wall_s": round(wall, 2), "job_s": round(wall, 2), "workers": 1,
            **_marker_window(spec.sink.uri, t0),
            "partitions": len(partitions), "profile_s": profile,
            "torch_threads": _torch_threads(), "model_servers": servers,
            "rows_by_status": {k: v for k, v in rows.items() if v},
            "rows_by_reason": dict(reasons)}


def _torch_threads() -> int | None:
    """torch's intra-op threads, if the variant imported torch (a model-less one does not)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _log_call(path: str, kind: str, start: float, rows: int) -> None:
    """Append one UDF call (kind, start, end, rows) to the Ray Data timeline file."""
    with open(path, "a") as f:
        f.write(json.dumps([kind, start, time.time(), rows]) + "\n")


def partition_to_json(partition) -> str:
    import dataclasses

    return json.dumps(dataclasses.asdict(partition))


def partition_from_json(text: str):
    from pipeline.records import InputItem, Partition

    d = json.loads(text)
    return Partition(d["partition_id"], tuple(InputItem(**i) for i in d["inputs"]))


def cpu_schema(pipeline, partition):
    """The output schema without the model columns (the CPU stage's tables in variant c):
    the columns of kind ``output`` that the datasource, the runner and the CPU steps write,
    in ``pipeline.columns`` order, then the datasource's carried columns. The models are
    unbound here, so ``pipeline.schema`` (which types the model columns) cannot be used."""
    import pyarrow as pa

    from pipeline.columns import COLUMNS, lookup, output_order

    model_cols = set(pipeline.models.writes)
    typed = {f.name: f for s in pipeline.steps for f in s.fields()}
    names = {n for n in pipeline.writes if n not in model_cols and lookup(n).kind == "output"}
    fields = [typed[n] if n in typed else COLUMNS[n].field() for n in output_order(names)]
    return pa.schema(fields + pipeline.datasource.extra_fields(partition))


class CpuStepsUDF:
    """Ray Data callable class: a partition (one row: the ``Partition`` as JSON) -> the
    rows after the CPU steps, one table per read batch.

    Assembles the job's pipeline once, models unbound (``assemble(spec, None, pool,
    setup=True)``), and per partition does what ``run_partition`` does before the models:
    every step's ``start_partition`` (dedup state is per partition), the datasource's
    ``read_partition``, ``_start_batch``, then ``pipeline.steps``. A whole partition is one
    call, so its rows are never split across actors.
    """

    def __init__(self, spec_json: str, fingerprint: str, timeline: str):
        from concurrent.futures import ThreadPoolExecutor

        from pipeline.assembly import assemble
        from pipeline.storage import fs
        from pipeline.spec import JobSpec

        self.spec = JobSpec.model_validate_json(spec_json)
        fs.configure(**self.spec.storage.model_dump())
        self.pool = ThreadPoolExecutor(self.spec.runtime.decode_threads)
        self.pipeline = assemble(self.spec, None, self.pool, setup=True)
        if self.pipeline.fingerprint != fingerprint:
            raise RuntimeError(f"CPU UDF assembled fingerprint {self.pipeline.fingerprint}, "
                               f"the driver {fingerprint}")
        self.timeline = timeline

    def __call__(self, table):
        for text in table.column("partition").to_pylist():
            t, rows = time.time(), 0
            for out in self._partition(partition_from_json(text)):
                rows += out.num_rows
                yield out
            _log_call(self.timeline, "cpu", t, rows)

    def _partition(self, partition):
        from pipeline.output.sinks.parquet import to_table
        from pipeline.runtime.partition import _start_batch

        pid = partition.partition_id
        schema = cpu_schema(self.pipeline, partition)
        for step in self.pipeline.parts:
            step.start_partition(pid)
        for batch in self.pipeline.datasource.read_partition(
                partition, self.spec.runtime.batch_size, self.pool):
            batch = _start_batch(batch, pid)
            for step in self.pipeline.steps:
                batch = step(batch)
            yield to_table(batch, schema, list(range(len(batch["key"]))))


class EmbedUDF:
    """Ray Data callable class: runs the pipeline's model stages (``pipeline.models``,
    bound to the model loaded in this actor by ``local_models``, called synchronously) on
    the CPU stage's rows and returns them in ``pipeline.schema(partition)``, the output
    schema of (a) and (b)."""

    def __init__(self, spec_json: str, fingerprint: str, partitions_json: list[str],
                 timeline: str):
        from pipeline.assembly import assemble
        from pipeline.spec import JobSpec
        from pipeline.models.local import local_models

        self.spec = JobSpec.model_validate_json(spec_json)
        self.pipeline = assemble(self.spec, local_models(self.spec, batch_server=False))
        if self.pipeline.fingerprint != fingerprint:
            raise RuntimeError(f"embed UDF assembled fingerprint {self.pipeline.fingerprint}, "
                               f"the driver {fingerprint}")
        self.partitions = {p.partition_id: p for p in map(partition_from_json, partitions_json)}
        self.schemas: dict[str, Any] = {}
        self.timeline = timeline

    def __call__(self, table):
        t = time.time()
        pids = table.column("partition_id").to_pylist()
        i = 0
        while i < len(pids):  # runs of one partition (a batch may span two blocks)
            j = i
            while j < len(pids) and pids[j] == pids[i]:
                j += 1
            yield self._rows(table.slice(i, j - i), pids[i])
            i = j
        _log_call(self.timeline, "embed", t, table.num_rows)

    def _rows(self, table, pid: str):
        from pipeline.output.sinks.parquet import to_table

        if pid not in self.schemas:
            self.schemas[pid] = self.pipeline.schema(self.partitions[pid])
        models = self.pipeline.models
        batch = models.finish(models.start(table.to_pydict()))
        return to_table(batch, self.schemas[pid], list(range(table.num_rows)))


def variant_c(spec, cores: int) -> dict[str, Any]:
    """Ray Data: blocks = partitions -> map_batches(CPU steps) -> map_batches(models) -> Parquet."""
    import pyarrow as pa
    import ray

    from pipeline.assembly import assemble
    from pipeline.models.registry import enabled_sections
    from pipeline.runtime.model_pool import reserved_cpus
    from pipeline.storage import fs

    init_s = _quiet_ray_init(cores)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        t0 = time.time()
        fs.configure(**spec.storage.model_dump())
        fs.delete_tree(spec.sink.uri)
        timeline = Path(str(spec.sink.uri) + ".timeline.jsonl")
        timeline.unlink(missing_ok=True)
        pipeline = assemble(spec)  # as the driver: listing and fingerprint, models unbound
        partitions = plan_partitions(pipeline)
        parts_json = [partition_to_json(p) for p in partitions]
        blocks = [pa.table({"partition": [p]}) for p in parts_json]
        te = spec.text_embedding
        # as variant (a): the driver's default worker count
        workers = max(1, int(cores - reserved_cpus(spec)))
        ds = ray.data.from_arrow(blocks)
        ds = ds.map_batches(CpuStepsUDF, batch_size=1, batch_format="pyarrow",
                            fn_constructor_kwargs={"spec_json": spec.model_dump_json(),
                                                   "fingerprint": pipeline.fingerprint,
                                                   "timeline": str(timeline)},
                            compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1)
        last_stage = "embed" if enabled_sections(spec) else "cpu"
        if last_stage == "embed":  # --no-model: the CPU stage's tables are the output
            ds = ds.map_batches(EmbedUDF, batch_size=spec.runtime.batch_size,
                                batch_format="pyarrow",
                                fn_constructor_kwargs={"spec_json": spec.model_dump_json(),
                                                       "fingerprint": pipeline.fingerprint,
                                                       "partitions_json": parts_json,
                                                       "timeline": str(timeline)},
                                compute=ray.data.ActorPoolStrategy(size=1), num_cpus=te.num_cpus)
        ds.write_parquet(str(fs.normalize(spec.sink.uri)), compression="zstd")
        job_s = time.time() - t0
        calls = [json.loads(line) for line in timeline.read_text().splitlines()]
        first = min(c[1] for c in calls if c[0] == "cpu")
        last = max(c[2] for c in calls if c[0] == last_stage)
        busy = {k: round(sum(c[2] - c[1] for c in calls if c[0] == k), 2) for k in ("cpu", "embed")}
    finally:
        t = time.time()
        ray.shutdown()
        shutdown_s = time.time() - t
    return {"ray_init_s": round(init_s, 2), "job_s": round(job_s, 2),
            "shutdown_s": round(shutdown_s, 2), "wall_s": round(init_s + job_s, 2),
            "workers": workers, "partitions": len(partitions),
            "startup_s": round(first - t0, 2), "processing_s": round(last - first, 2),
            "udf_busy_s": busy}


def run_variant(args) -> int:
    """Child mode: run one variant, write its result JSON."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sampler = MemSampler()
    sampler.start()
    manifest = Path(args.manifest)
    out_dir = Path(args.output)
    spec = make_spec(manifest, out_dir, args.partition_size, model=not args.no_model)
    try:
        res = {"a": variant_a, "b": variant_b, "c": variant_c,
               "d": variant_d}[args.variant](spec, args.cores)
    finally:
        mem = sampler.finish()
    res.update(variant=args.variant, output=str(out_dir), memory=mem)
    Path(args.result).write_text(json.dumps(res, indent=1, default=str))
    return 0


# ----------------------------------------------------------------------------- outputs

def read_output(kind: str, out_dir: Path) -> tuple[dict[str, dict[str, Any]], Any]:
    """``(key -> {status, reason, image sha256, embedding}, schema)`` of one variant's
    output: (a, b, d) the committed output (``read_committed``: the data files the commit
    markers name), (c) every Parquet file Ray Data wrote."""
    import numpy as np
    import pyarrow.parquet as pq

    columns = ["key", "status", "reject_reason", "image", "text_embedding"]
    if kind in ("a", "b", "d"):
        from pipeline.read import committed_files, read_committed

        schema = pq.read_schema(committed_files(str(out_dir))[0])
        columns = [c for c in columns if c in schema.names]  # --no-model: no embedding
        table = read_committed(str(out_dir), columns=columns)
    else:
        files = sorted(str(p) for p in out_dir.rglob("*.parquet"))
        schema = pq.read_schema(files[0])
        columns = [c for c in columns if c in schema.names]
        table = pq.ParquetDataset(files).read(columns=columns)
    rows: dict[str, dict[str, Any]] = {}
    for r in table.to_pylist():
        if r["key"] in rows:
            raise RuntimeError(f"{kind}: key {r['key']} written twice")
        emb = r.get("text_embedding")
        rows[r["key"]] = {"status": r["status"], "reason": r["reject_reason"],
                          "image": hashlib.sha256(r["image"]).hexdigest() if r["image"] else None,
                          "emb": np.asarray(emb, dtype=np.float32) if emb is not None else None}
    return rows, schema.remove_metadata()


def _schema_diff(a, b) -> list[str]:
    """Fields (``name: type``) in one schema and not the other, or in another order."""
    fa, fb = [f"{f.name}: {f.type}" for f in a], [f"{f.name}: {f.type}" for f in b]
    if fa == fb:
        return []
    only = [f"-{x}" for x in fa if x not in fb] + [f"+{x}" for x in fb if x not in fa]
    return only or ["same fields, another order"]


def compare(read: dict[str, tuple]) -> tuple[bool, list[str], dict[str, dict]]:
    """Check the variants' outputs (``v -> read_output(...)``) agree; return ``(ok, lines,
    counts by variant)``."""
    import numpy as np

    lines, ok = [], True
    counts = {}
    outputs = {v: rows for v, (rows, _) in read.items()}
    schemas = {v: schema for v, (_, schema) in read.items()}
    for v, rows in outputs.items():
        st = collections.Counter(r["status"] for r in rows.values())
        rs = collections.Counter(f"{r['status']}:{r['reason']}" for r in rows.values()
                                 if r["status"] == "rejected")
        counts[v] = {"rows": len(rows), "ok": st.get("ok", 0), "rejected": st.get("rejected", 0),
                     "error": st.get("error", 0), "duplicates": rs.get("rejected:duplicate", 0),
                     "reasons": dict(rs)}
    names = list(outputs)
    ref = names[0]
    for v in names[1:]:
        a, b = outputs[ref], outputs[v]
        same_counts = {k: c for k, c in counts[ref].items()} == counts[v]
        same_keys = a.keys() == b.keys()
        status_diff = [k for k in a if k in b and (a[k]["status"], a[k]["reason"]) !=
                       (b[k]["status"], b[k]["reason"])]
        image_diff = [k for k in a if k in b and a[k]["image"] != b[k]["image"]]
        emb = [float(np.abs(a[k]["emb"] - b[k]["emb"]).max()) for k in a
               if k in b and a[k]["emb"] is not None and b[k]["emb"] is not None]
        emb_missing = sum(1 for k in a if k in b and (a[k]["emb"] is None) != (b[k]["emb"] is None))
        schema_diff = _schema_diff(schemas[ref], schemas[v])
        good = (same_counts and same_keys and not status_diff and not image_diff
                and not emb_missing and not schema_diff)
        ok &= good
        lines.append(f"{ref} vs {v}: {'MATCH' if good else 'MISMATCH'} - output schema "
                     f"{'equal (' + str(len(schemas[v])) + ' columns)' if not schema_diff else 'DIFFERS ' + ', '.join(schema_diff)}, rows by status "
                     f"{'equal' if same_counts else 'DIFFER'}, keys {'equal' if same_keys else 'DIFFER'}, "
                     f"{len(status_diff)} keys with another status/reason, {len(image_diff)} "
                     f"output images differ, {emb_missing} embeddings present in only one, "
                     f"max |embedding diff| {max(emb) if emb else 0:.2e}")
    return ok, lines, counts


# ----------------------------------------------------------------------------- report

def code_info(label: str | None) -> dict[str, Any]:
    """Which ``pipeline`` was measured: its path, and git HEAD / local changes if a checkout."""
    import pipeline

    info: dict[str, Any] = {"pipeline": os.path.dirname(pipeline.__file__), "label": label}
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True,  # noqa: E731
                                        text=True, check=True).stdout.strip()
        info["git_head"] = run("rev-parse", "--short", "HEAD")
        info["git_changes_in_pipeline"] = run("status", "--porcelain", "--", "pipeline").splitlines()
    except (OSError, subprocess.CalledProcessError):
        info["git_head"] = None
    return info


def _code_line(code: dict[str, Any]) -> str:
    where = f"pipeline measured: {code['pipeline']}"
    if code.get("git_head"):
        changes = code.get("git_changes_in_pipeline") or []
        where += f" (git HEAD {code['git_head']}, {len(changes)} uncommitted changes in pipeline/)"
    return where + (f"; {code['label']}" if code.get("label") else "")


def machine_info() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                (_read("/proc/cpuinfo") or "").splitlines() if line.startswith("model name")), "?")
    mem = _status_kib(_read("/proc/meminfo") or "", "MemTotal")
    versions = {}
    for mod in ("ray", "torch", "pyarrow", "PIL", "sentence_transformers", "numpy"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = "?"
    return {"nproc": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)), "cpu": cpu,
            "mem_gib": round(mem / 2**20, 1), "python": platform.python_version(),
            "kernel": platform.release(), **versions}


def summary_markdown(results: dict[str, dict], counts: dict[str, dict], base: str) -> str:
    """Three markdown tables: throughput, memory, rows; ratios against ``base``."""
    def ratio(x, y):
        return f"{x / y:.2f}x" if y else "-"

    b = results[base]
    n_b = counts[base]["rows"]
    out = ["| variant | wall s | records/s | vs (b) | of which ray.init s | processing s | "
           "records/s while processing | vs (b) | CPU s, all our processes | vs (b) | "
           "others' CPU load (cores) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for v, r in results.items():
        n = counts[v]["rows"]
        rps, b_rps = n / r["wall_s"], n_b / b["wall_s"]
        prps, b_prps = n / r["processing_s"], n_b / b["processing_s"]
        out.append(f"| ({v}) {VARIANTS[v]} | {r['wall_s']:.1f} | {rps:.1f} | {ratio(rps, b_rps)} | "
                   f"{r.get('ray_init_s', '-')} | {r['processing_s']:.1f} | {prps:.1f} | "
                   f"{ratio(prps, b_prps)} | {r['memory']['cpu']['our_cpu_s']:.1f} | "
                   f"{ratio(r['memory']['cpu']['our_cpu_s'], b['memory']['cpu']['our_cpu_s'])} | "
                   f"{r['memory']['cpu']['others_cores']:.2f} |")
    out += ["", "| variant | peak Σ RSS MiB | vs (b) | peak Σ PSS MiB | vs (b) | Σ VmHWM MiB | "
            "processes | at the RSS peak: driver / workers (Ray or processes) / Ray system MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    bm = b["memory"]
    for v, r in results.items():
        m = r["memory"]
        cat = m["peak_breakdown"].get("by_category_mib", {})
        out.append(f"| ({v}) {VARIANTS[v]} | {m['peak_rss_mib']:.0f} | "
                   f"{ratio(m['peak_rss_mib'], bm['peak_rss_mib'])} | {m['peak_pss_mib']:.0f} | "
                   f"{ratio(m['peak_pss_mib'], bm['peak_pss_mib'])} | {m['sum_hwm_mib']:.0f} | "
                   f"{m['processes_seen']} | {cat.get('driver', 0)} / "
                   f"{cat.get('ray worker', 0) + cat.get('worker process', 0)} / "
                   f"{cat.get('ray system', 0)} |")
    out += ["", "| variant | rows | ok | rejected | of which duplicate | error |",
            "|---|---:|---:|---:|---:|---:|"]
    for v, c in counts.items():
        out.append(f"| ({v}) {VARIANTS[v]} | {c['rows']} | {c['ok']} | {c['rejected']} | "
                   f"{c['duplicates']} | {c['error']} |")
    return "\n".join(out)


def details_markdown(results: dict[str, dict]) -> str:
    lines = []
    for v, r in results.items():
        m = r["memory"]
        bits = [f"wall {r['wall_s']}s"]
        if "ray_init_s" in r:
            bits.append(f"ray.init {r['ray_init_s']}s + job {r['job_s']}s "
                        f"(shutdown {r['shutdown_s']}s, not counted)")
        bits.append(f"job start -> first row {r.get('startup_s')}s, processing "
                    f"{r.get('processing_s')}s")
        bits.append(f"workers {r.get('workers')}, kept run #{r.get('attempt', 1)}")
        c = m["cpu"]
        bits.append(f"CPU: this variant {c['our_cpu_s']}s ({c['our_cores']} cores avg), "
                    f"other processes {c['others_cores']} cores avg")
        if "udf_busy_s" in r:
            bits.append(f"UDF busy s {r['udf_busy_s']}")
        lines.append(f"- ({v}) {VARIANTS[v]}: " + ", ".join(bits))
        pb = m.get("peak_breakdown", {})
        if pb:
            labels = ", ".join(f"{k} x{e['n']} {e['mib']}" for k, e in pb["by_label"].items())
            lines.append(f"  - peak Σ RSS {m['peak_rss_mib']:.0f} MiB at t={pb['at_s']}s over "
                         f"{pb['processes']} processes: {pb['by_category_mib']} MiB; by process: "
                         f"{labels}")
        lines.append("  - VmHWM by process (MiB): " + ", ".join(
            f"{k} x{e['n']} {e['mib']}" for k, e in m["hwm_by_label_mib"].items()))
        if m.get("cpu_by_label_s"):
            lines.append("  - CPU s by process (after the variant's own imports): " + ", ".join(
                f"{k} {v}" for k, v in m["cpu_by_label_s"].items() if v >= 0.1))
        if m.get("foreign_ray_processes_excluded"):
            lines.append(f"  - excluded {m['foreign_ray_processes_excluded']} Ray processes not "
                         f"started by this variant")
        if "profile_s" in r:
            lines.append(f"  - plain-loop profile (s, wall inside the loop; torch threads "
                         f"{r.get('torch_threads')}): {r['profile_s']}")
        for a in r.get("model_actors") or []:
            lines.append(f"  - {a.get('name')}: {a.get('requests')} calls, {a.get('batches')} "
                         f"forward passes (mean {a.get('mean_batch_rows')} rows), "
                         f"{a.get('records')} captions, busy {a.get('busy_s', 0):.1f}s of "
                         f"{a.get('alive_s', 0):.1f}s alive")
        for section, a in (r.get("model_servers") or {}).items():
            lines.append(f"  - in-process {section} BatchServer: {a.get('requests')} calls, "
                         f"{a.get('batches')} forward passes (mean {a.get('mean_batch_rows')} "
                         f"rows), {a.get('records')} captions, busy {a.get('busy_s', 0):.1f}s "
                         f"of a {a.get('window_s', 0):.1f}s window")
    return "\n".join(lines)


BUSY_CORES = 0.3  # other processes' average CPU use above which a run counts as disturbed


def _run_child(args, v: str, manifest: Path, workdir: Path, tag: str,
               attempt: int) -> dict | None:
    """Run variant ``v`` in a fresh subprocess; return its result, or None if it failed.
    Each attempt writes its own output (``runs/<tag>-<v>-r<attempt>``), so the kept run's
    output is the one compared, whatever a later attempt does."""
    result = workdir / "results" / f"{tag}-{v}.json"
    result.unlink(missing_ok=True)
    load = wait_for_quiet(args.quiet_wait) if args.quiet_wait > 0 else None
    cmd = [sys.executable, os.path.abspath(__file__), "--variant", v, "--manifest",
           str(manifest), "--result", str(result), "--workdir", str(workdir), "--tag", tag,
           "--cores", str(args.cores), "--partition-size", str(args.partition_size),
           "--output", str(workdir / "runs" / f"{tag}-{v}-r{attempt}")]
    if args.no_model:
        cmd.append("--no-model")
    log.info("variant %s (%s): starting %s", v, VARIANTS[v], " ".join(cmd[1:4]))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # the ``pipeline`` next to this script is the one measured, in Ray workers too
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    t = time.time()
    proc = subprocess.run(cmd, timeout=args.timeout, env=env)
    if proc.returncode != 0 or not result.exists():
        log.error("variant %s failed (exit %s)", v, proc.returncode)
        return None
    r = json.loads(result.read_text())
    r["load_before_cores"] = None if load is None else round(load, 2)
    log.info("variant %s: wall %.1fs (process %.1fs), peak Σ RSS %.0f MiB, others' load %.2f "
             "cores", v, r["wall_s"], time.time() - t, r["memory"]["peak_rss_mib"],
             r["memory"]["cpu"]["others_cores"])
    return r


def orchestrate(args) -> int:
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    copies = args.copies or max(1, round(DEFAULT_TARGET_IMAGES / 57))
    manifest, dataset = build_dataset(workdir, copies, args.seed, args.cores)
    tag = f"c{copies}-s{args.seed}-p{args.partition_size}"
    tag += "-nomodel" if args.no_model else ""
    (workdir / "results").mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    for v in args.variants.split(","):
        v = v.strip()
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r} (a, b, c or d)")
        best = None
        outputs_made = []
        for attempt in range(1 + args.busy_retries):
            outputs_made.append(workdir / "runs" / f"{tag}-{v}-r{attempt + 1}")
            r = _run_child(args, v, manifest, workdir, tag, attempt + 1)
            if r is None:
                break
            busy = r["memory"]["cpu"]["others_cores"]
            r["attempt"] = attempt + 1
            if best is None or busy < best["memory"]["cpu"]["others_cores"]:
                best = r
            if busy < BUSY_CORES:
                break
            log.warning("variant %s: other processes used %.2f cores on average during the run; "
                        "%s", v, busy, "running it again" if attempt < args.busy_retries
                        else "keeping the least disturbed run")
        for out in outputs_made:  # keep only the kept run's output
            if best is None or str(out) != best["output"]:
                shutil.rmtree(out, ignore_errors=True)
                Path(str(out) + ".timeline.jsonl").unlink(missing_ok=True)
        if best is not None:
            results[v] = best
    if not results:
        return 1
    outputs = {v: read_output(v, Path(r["output"])) for v, r in results.items()}
    ok, check_lines, counts = compare(outputs)
    summary = {"dataset": dataset, "machine": machine_info(), "code": code_info(args.label),
               "args": vars(args),
               "command": " ".join([os.path.relpath(sys.executable, REPO)] + sys.argv),
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "check_ok": ok,
               "check": check_lines, "counts": counts, "results": results}
    text = render(summary)
    print("\n" + text + "\n")
    (workdir / "results" / f"{tag}-summary.json").write_text(json.dumps(summary, indent=1,
                                                                        default=str))
    (workdir / "results" / f"{tag}-summary.md").write_text(text + "\n")
    return 0 if ok and len(results) == len(args.variants.split(",")) else 1


def render(summary: dict[str, Any]) -> str:
    """The markdown report of one invocation (also: ``--render <tag>-summary.json``)."""
    dataset, args, results = summary["dataset"], summary["args"], summary["results"]
    base = "b" if "b" in results else next(iter(results))
    md = ["## " + f"{dataset['images']} images ({dataset['photos']} photos x "
          f"{dataset['copies']} copies, {dataset['megapixels_min']}-"
          f"{dataset['megapixels_max']} MP, mean {dataset['megapixels_mean']} MP, "
          f"{dataset['total_mib']} MiB JPEG), partition_size {args['partition_size']}, "
          f"--cores {args['cores']}" + (", no model (--no-model)" if args.get("no_model") else ""),
          "", f"{summary['date']}; `{summary['command']}`; {_code_line(summary['code'])}", "",
          summary_markdown(results, summary["counts"], base), "",
          "Check: " + ("OK, outputs agree" if summary["check_ok"] else "FAILED"), ""]
    md += [f"- {line}" for line in summary["check"]]
    md += ["", details_markdown(results)]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=None,
                   help="copies of each of the 57 photos (default: about 600 images, i.e. 11)")
    p.add_argument("--workdir", default=str(REPO / "bench" / "out"),
                   help="data set, outputs and results (default bench/out, git-ignored)")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                   help="ray.init(num_cpus=...) for a and c; also the data set build processes")
    p.add_argument("--variants", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    p.add_argument("--partition-size", type=int, default=100, help="source.partition_size")
    p.add_argument("--seed", type=int, default=0, help="data set seed")
    p.add_argument("--no-model", action="store_true",
                   help="text_embedding.enabled=false: the CPU steps only (the plain loop "
                   "then imports no torch; Ray Data has no embed stage)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per variant")
    p.add_argument("--quiet-wait", type=float, default=600,
                   help="before each variant wait up to this many seconds for other processes "
                   "to use < 0.3 cores (0: do not wait)")
    p.add_argument("--busy-retries", type=int, default=2,
                   help="run a variant again (up to this many times) when other processes used "
                   f"more than {BUSY_CORES} cores during it; the least disturbed run is kept")
    p.add_argument("--label", help="free text recorded with the results (e.g. the code measured)")
    p.add_argument("--render", metavar="SUMMARY_JSON",
                   help="only print the report of a saved <workdir>/results/<tag>-summary.json")
    # child mode (internal)
    p.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--manifest", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--tag", help=argparse.SUPPRESS)
    p.add_argument("--output", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("ray", "ray.data", "sentence_transformers", "pipeline"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.variant:
        return run_variant(args)
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
