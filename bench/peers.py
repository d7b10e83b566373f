#!/usr/bin/env python
"""Peers benchmark (issue 32, point 5): job 1 as mmpipe, bare Pillow, Ray Data and Daft, one run.

Job 1: N JPEGs of 1-3 MP -> decode -> shorter side 224 -> centre crop 224 x 224 -> JPEG
quality 90 -> Parquet (``key``, ``image``), no model, no dedup.

    .venv/bin/pip install --no-deps daft==0.7.26           # the bench extra, keeping the locks
    .venv/bin/python bench/peers.py                        # --sizes 600,2400, 3 repeats
    .venv/bin/python bench/peers.py --sizes 60,120 --repeats 1 --workdir /tmp/peers

(``pip install -e '.[bench]'`` installs the same Daft but moves pyarrow below 26 and
tqdm below 4.68, as Daft's metadata asks; Ray Data comes with ``ray[data]``.)

Variants, each run as a fresh subprocess (``--child``), interleaved: for each size, repeat
``--repeats`` times the sequence of ``--variants`` (so a slow spell of the machine hits
every variant, not one):

- ``mmpipe``: ``python -m pipeline run <spec> --mode overwrite`` of a generated spec
  (``<workdir>/spec-peers.yaml``: manifest source, ``resize.mode: center_crop``,
  ``size_px: 224``, JPEG q90, dedup and text embedding off, every other setting the
  default, ``source.partition_size`` included); ``--mmpipe-args`` adds CLI arguments
  (e.g. ``--executor ray``). ``RAY_ADDRESS`` is removed from its environment.
- ``pillow``: bare Pillow, one process per core (``multiprocessing.Pool(--cores)``,
  ``imap_unordered`` over chunks of the manifest, each worker reads its files and runs
  ``pillow_job``); the parent writes one Parquet file as the chunks come back.
- ``raydata``: ``ray.init(address="local", num_cpus=--cores)``, ``read_binary_files``
  -> ``map_batches(pillow_job per row, batch_size=32)`` -> ``write_parquet``.
- ``daft-udf``: Daft's default (native, local) runner: ``download`` -> ``pillow_job`` as a
  ``@daft.func`` UDF -> ``write_parquet``.
- ``daft-native``: Daft's own kernels: ``download`` -> ``decode_image`` -> ``crop`` of the
  centred square (``to_list`` of per-row expressions) -> ``resize(224, 224)`` ->
  ``encode_image("JPEG")`` (Daft's encoder has no quality setting) -> ``write_parquet``.

``pillow_job`` is the same Pillow code in pillow, raydata and daft-udf, and the same
operations as mmpipe's decode/resize/encode (``pipeline.media``): JPEG draft when the
shorter side is at least 2 x 224, bicubic resize with ``reducing_gap=2.0`` to shorter
side 224, centre crop, JPEG quality 90.

Inputs (cached in ``<workdir>/inputs-s<seed>/``, built once for the largest size; the
first N are used for size N): image i is photo ``i % 57`` of data/photos (the 57 COCO
photos), copy ``i // 57``, made by ``throughput.make_copy`` (random crop of 85-100 % of each
side, random flip, Lanczos to 1-3 MP, JPEG q90).

Measured per run, by this (parent) process:

- ``to output s``: from just before ``Popen`` to the newest modification time of any
  file under the variant's output directory (process start to output written; a
  process that goes on after that, e.g. Ray's shutdown, is in ``exit s``);
  ``images/s`` = N / ``to output s``;
- ``CPU s``: user + system CPU of the process tree: the larger of the sum over every
  process seen by a 0.2 s psutil sampler (``inputs.Sampler``) and the ``wait4`` rusage of
  the child (itself plus every descendant it reaped);
- ``peak RSS MiB``: the peak over those samples of the summed RSS of the tree (for Ray:
  gcs_server, raylet, dashboard agents and every worker);
- ``load``: the 1-minute load average just before the run starts.

Checks (every run): rows == N, keys equal the manifest's, every output JPEG is 224 x 224;
(the last repeat of each size) pillow, raydata and daft-udf outputs byte-identical, and on
``--check-rows`` keys the decoded pixels of each variant against pillow's: mean absolute
difference at most ``PIXEL_TOLERANCE[variant]`` (levels of 255; Daft's kernels at 1/4
scale, ``PIXEL_REDUCE``). Exit status 1 if any
check fails or a variant fails.

Prints, and writes to ``<workdir>/results/peers-<time>.{md,json}``, a markdown table per
size (medians of the repeats) and a ratio table (mmpipe against each peer) to paste into
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))   # the working tree's pipeline
sys.path.insert(0, str(BENCH))  # throughput.make_copy, inputs.Sampler

PHOTOS = REPO / "data" / "photos"
SIZE_PX = 224     # output side, pixels
QUALITY = 90      # JPEG quality of pillow_job and of the mmpipe spec
VARIANTS = {
    "mmpipe": "mmpipe run",
    "mmpipe-base": "mmpipe run of --baseline (before)",
    "pillow": "bare Pillow, 1 process per core",
    "raydata": "Ray Data + the Pillow code",
    "daft-udf": "Daft + the Pillow code as a UDF",
    "daft-native": "Daft's own image kernels",
}
#: Largest mean absolute pixel difference (levels of 255) of a variant's decoded output
#: against pillow's on each checked row, compared at 1 / ``PIXEL_REDUCE[variant]`` scale
#: (``Image.reduce``: box averages). The three running ``pillow_job`` must be
#: byte-identical (checked separately); mmpipe runs the same operations (identical on the
#: bench's inputs, which carry no ICC profile). Daft's kernels crop before resizing,
#: decode without a draft, resize with another filter and encode at their own quality:
#: measured on 120 bench inputs, mean differences of 1.9-10.7 at full scale (aliasing of
#: its resize) and 0.9-4.3 at 1/4 scale (56 x 56), where a crop taken at the left edge
#: instead of the centre differs by 44 (median; 81 at most).
PIXEL_TOLERANCE = {"mmpipe": 1.0, "mmpipe-base": 1.0, "pillow": 0.0, "raydata": 0.0, "daft-udf": 0.0,
                   "daft-native": 8.0}
PIXEL_REDUCE = {"daft-native": 4}
SAME_CODE = ("pillow", "raydata", "daft-udf")
RAY_BATCH = 32    # map_batches batch_size of the raydata variant, rows


# ----------------------------------------------------------------------------- the job

def pillow_job(data: bytes) -> bytes:
    """One image: JPEG bytes in, a ``SIZE_PX`` x ``SIZE_PX`` centre crop (JPEG, quality
    ``QUALITY``) out, by the operations of mmpipe's ``resize.mode: center_crop`` (decode
    with a JPEG draft when the shorter side is >= 2 x SIZE_PX, shorter side to SIZE_PX,
    bicubic, ``reducing_gap=2.0``, no upscaling, centre crop, no metadata copied): the
    bytes mmpipe writes. An image smaller than SIZE_PX gives a square of its shorter side."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        if im.format == "JPEG" and min(im.size) >= 2 * SIZE_PX:
            im.draft(im.mode, (SIZE_PX, SIZE_PX))
        img = im.convert("RGB")
    w, h = img.size
    scale = SIZE_PX / min(w, h)
    if scale < 1:
        img = img.resize((max(1, round(w * scale)), max(1, round(h * scale))),
                         Image.Resampling.BICUBIC, reducing_gap=2.0)
    side = min(img.width, img.height, SIZE_PX)
    left, top = (img.width - side) // 2, (img.height - side) // 2
    img = img.crop((left, top, left + side, top + side))
    img.info.clear()  # no input comment or EXIF copied into the output, as in mmpipe
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=QUALITY)
    return buf.getvalue()


# ----------------------------------------------------------------------------- inputs

def build_inputs(workdir: Path, n: int, seed: int, cores: int) -> Path:
    """Make (or reuse) images 0..n-1 under ``<workdir>/inputs-s<seed>/images`` and write
    ``manifest-<n>.jsonl`` (``key``, ``path``: absolute) beside them; return its path."""
    from concurrent.futures import ProcessPoolExecutor

    from throughput import make_copy

    if n < 1:
        raise ValueError(f"--sizes: each size must be >= 1 image, got {n}")
    root = workdir / f"inputs-s{seed}"
    (root / "images").mkdir(parents=True, exist_ok=True)
    photos = [json.loads(line) for line in (PHOTOS / "captions.jsonl").read_text().splitlines()
              if line.strip()]
    rows, jobs = [], []
    for i in range(n):
        p, copy = photos[i % len(photos)], i // len(photos)
        key = f"{p['key']}-c{copy:03d}"
        dst = root / "images" / f"{key}.jpg"
        rows.append({"key": key, "path": str(dst)})
        if not dst.exists():
            jobs.append((str(PHOTOS / p["file"]), str(dst), copy, str(seed)))
    if jobs:
        t = time.time()
        with ProcessPoolExecutor(max(1, cores)) as ex:
            list(ex.map(make_copy, jobs, chunksize=4))
        print(f"built {len(jobs)} input images in {time.time() - t:.0f}s ({root})", flush=True)
    manifest = root / f"manifest-{n}.jsonl"
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, manifest)
    return manifest


def read_manifest(manifest: str | Path) -> list[dict[str, str]]:
    """The manifest's rows (``key``, ``path``)."""
    return [json.loads(line) for line in Path(manifest).read_text().splitlines() if line]


def write_spec(path: Path, manifest: Path, output: Path) -> Path:
    """The mmpipe spec of job 1 (YAML) at ``path``."""
    import yaml

    spec = {"name": "bench-peers",
            "source": {"kind": "manifest", "uri": str(manifest), "path_column": "path",
                       "key_column": "key"},
            "sink": {"uri": str(output)},
            "resize": {"mode": "center_crop", "size_px": SIZE_PX, "encode_format": "jpeg",
                       "quality": QUALITY},
            "dedup": {"exact": False, "near": False},
            "text_embedding": {"enabled": False},
            "runtime": {"mode": "overwrite"}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- variants (children)

def _pillow_chunk(rows: list[dict[str, str]]) -> tuple[list[str], list[bytes]]:
    """A pillow worker's chunk: read each file, ``pillow_job`` it."""
    keys, images = [], []
    for r in rows:
        with open(r["path"], "rb") as f:
            images.append(pillow_job(f.read()))
        keys.append(r["key"])
    return keys, images


def run_pillow(rows: list[dict[str, str]], output: Path, cores: int) -> None:
    """Bare Pillow: a pool of ``cores`` processes, one Parquet file written by the parent."""
    import multiprocessing

    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk = max(1, min(64, len(rows) // (4 * cores)))
    chunks = [rows[i:i + chunk] for i in range(0, len(rows), chunk)]
    schema = pa.schema([("key", pa.string()), ("image", pa.binary())])
    output.mkdir(parents=True)
    with multiprocessing.Pool(cores) as pool, \
            pq.ParquetWriter(output / "part-0.parquet", schema) as writer:
        for keys, images in pool.imap_unordered(_pillow_chunk, chunks):
            writer.write_table(pa.table({"key": keys, "image": images}, schema=schema))


def _ray_batch(batch):
    """Ray Data map_batches function: rows ``path``, ``bytes`` -> ``key``, ``image``."""
    import pyarrow as pa

    paths = batch.column("path").to_pylist()
    data = batch.column("bytes").to_pylist()
    return pa.table({"key": [Path(p).stem for p in paths],
                     "image": pa.array([pillow_job(d) for d in data], pa.binary())})


def run_raydata(rows: list[dict[str, str]], output: Path, cores: int) -> None:
    """Ray Data: read_binary_files -> map_batches(pillow_job) -> write_parquet."""
    import logging

    import ray

    ray.init(address="local", num_cpus=cores, include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ds = ray.data.read_binary_files([r["path"] for r in rows], include_paths=True)
        ds = ds.map_batches(_ray_batch, batch_size=RAY_BATCH, batch_format="pyarrow")
        ds.write_parquet(str(output))
    finally:
        ray.shutdown()


def run_daft(rows: list[dict[str, str]], output: Path, native: bool) -> None:
    """Daft (default runner): ``pillow_job`` as a UDF, or Daft's own image kernels."""
    import daft
    from daft import col
    from daft import functions as F

    df = daft.from_pydict({"key": [r["key"] for r in rows], "path": [r["path"] for r in rows]})
    df = df.with_column("data", F.download(col("path")))
    if native:
        img = F.decode_image(col("data"), mode="RGB")
        w, h = F.image_width(col("img")), F.image_height(col("img"))
        side = col("side")
        df = df.with_column("img", img).with_column("side", F.when(w < h, w).otherwise(h))
        bbox = F.to_list((w - side) // 2, (h - side) // 2, side, side)
        square = F.crop(col("img"), bbox.cast(daft.DataType.list(daft.DataType.uint32())))
        image = F.encode_image(F.resize(square, SIZE_PX, SIZE_PX), "JPEG")
    else:
        image = daft.func(pillow_job, return_dtype=daft.DataType.binary())(col("data"))
    df.select(col("key"), image.alias("image")).write_parquet(str(output))


def run_child(args) -> int:
    """Child mode: run one variant (not mmpipe: that child is ``mmpipe run``)."""
    rows = read_manifest(args.manifest)
    output = Path(args.output)
    if args.child == "pillow":
        run_pillow(rows, output, args.cores)
    elif args.child == "raydata":
        run_raydata(rows, output, args.cores)
    else:
        run_daft(rows, output, native=args.child == "daft-native")
    return 0


# ----------------------------------------------------------------------------- measuring

def newest_mtime(root: Path) -> float:
    """The newest modification time (Unix s) of any file under ``root``; 0 if none."""
    newest = 0.0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def measure(cmd: list[str], output: Path, log_path: Path, env: dict[str, str],
            timeout_s: float) -> dict[str, Any]:
    """Run ``cmd`` (which writes ``output``), measured: ``to_output_s``, ``exit_s``,
    ``cpu_s``, ``peak_rss_mib``, ``others_cores``, ``load``, ``rc``."""
    from inputs import Sampler

    load = os.getloadavg()[0]
    with open(log_path, "w") as log:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid)
        deadline = t0 + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        exit_s = time.time() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    res = sampler.finish(exit_s)
    newest = newest_mtime(output)
    return {"rc": proc.returncode, "load": round(load, 2), "exit_s": round(exit_s, 2),
            "to_output_s": round(newest - t0, 2) if newest else None,
            "cpu_s": round(max(res["cpu_s"], usage.ru_utime + usage.ru_stime), 1),
            "peak_rss_mib": round(res["peak_rss_mib"]), "others_cores": round(res["others_cores"], 2),
            "timed_out": exit_s >= timeout_s}


def variant_cmd(v: str, manifest: Path, output: Path, workdir: Path, args) -> list[str]:
    """The command line of variant ``v``."""
    if v in ("mmpipe", "mmpipe-base"):
        spec = write_spec(workdir / "spec-peers.yaml", manifest, output)
        run = ["run", str(spec), "--input", str(manifest), "--output", str(output),
               "--mode", "overwrite", *shlex.split(args.mmpipe_args)]
        if v == "mmpipe":
            return [sys.executable, "-m", "pipeline", *run]
        # the baseline checkout's pipeline package, in the driver and in every process it
        # starts (Ray's workers take PYTHONPATH; `-m` puts the current directory first)
        base = str(Path(args.baseline).resolve())
        return ["bash", "-c", 'cd "$0" && PYTHONPATH="$0" exec "$@"', base,
                sys.executable, "-m", "pipeline", *run]
    return [sys.executable, os.path.abspath(__file__), "--child", v, "--manifest",
            str(manifest), "--output", str(output), "--cores", str(args.cores)]


# ----------------------------------------------------------------------------- checks

def read_images(v: str, output: Path) -> dict[str, bytes]:
    """``key -> output JPEG bytes`` of one variant's output (mmpipe: the committed
    ``ok`` rows, ``pipeline.read``; the peers: every Parquet file under ``output``)."""
    import pyarrow.dataset as ds

    if v.startswith("mmpipe"):
        from pipeline.read import read_committed

        t = read_committed(str(output), columns=["key", "status", "image"]).to_pylist()
        bad = [r["key"] for r in t if r["status"] != "ok"]
        if bad:
            raise AssertionError(f"mmpipe: {len(bad)} rows not ok (e.g. {bad[:3]})")
    else:
        files = sorted(str(p) for p in output.rglob("*.parquet"))
        t = ds.dataset(files, format="parquet").to_table(columns=["key", "image"]).to_pylist()
    out: dict[str, bytes] = {}
    for r in t:
        if r["key"] in out:
            raise AssertionError(f"{v}: key {r['key']} written twice")
        out[r["key"]] = r["image"]
    return out


def check_rows(v: str, images: dict[str, bytes], keys: list[str]) -> list[str]:
    """Problems of one output: keys other than the manifest's, images not SIZE_PX square."""
    from PIL import Image

    problems = []
    if set(images) != set(keys):
        missing, extra = set(keys) - set(images), set(images) - set(keys)
        problems.append(f"{v}: {len(images)} rows for {len(keys)} inputs ({len(missing)} "
                        f"missing, {len(extra)} unknown keys)")
    wrong = [k for k, b in images.items()
             if b is None or Image.open(io.BytesIO(b)).size != (SIZE_PX, SIZE_PX)]
    if wrong:
        problems.append(f"{v}: {len(wrong)} images not {SIZE_PX}x{SIZE_PX} (e.g. {wrong[0]})")
    return problems


def pixel_diff(a: bytes, b: bytes, reduce: int = 1) -> tuple[float, int]:
    """(mean, max) absolute difference of two JPEGs' decoded RGB pixels, levels of 255,
    at 1 / ``reduce`` scale (``Image.reduce``). Raises ``ValueError`` if their sizes
    differ."""
    import numpy as np
    from PIL import Image

    def pixels(data: bytes):
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return np.asarray(img.reduce(reduce) if reduce > 1 else img, dtype=np.int16)

    x, y = pixels(a), pixels(b)
    if x.shape != y.shape:
        raise ValueError(f"image sizes differ: {x.shape[1]}x{x.shape[0]} vs {y.shape[1]}x{y.shape[0]}")
    d = np.abs(x - y)
    return float(d.mean()), int(d.max())


def compare(outputs: dict[str, dict[str, bytes]], sample: list[str]) -> tuple[list[str], list[str]]:
    """Agreement of the variants' outputs (``v -> key -> bytes``) with pillow's (or the
    first variant's): ``(report lines, problems)``."""
    ref = "pillow" if "pillow" in outputs else next(iter(outputs))
    lines, problems = [], []
    for v, imgs in outputs.items():
        if v == ref:
            continue
        if v in SAME_CODE and ref in SAME_CODE:
            differ = [k for k in outputs[ref] if imgs.get(k) != outputs[ref][k]]
            lines.append(f"{v} vs {ref}: {len(differ)} of {len(outputs[ref])} images differ "
                         f"in bytes (same code: must be 0)")
            if differ:
                problems.append(f"{v}: {len(differ)} images differ from {ref}'s bytes")
        scale = max(PIXEL_REDUCE.get(v, 1), PIXEL_REDUCE.get(ref, 1))
        diffs = [pixel_diff(imgs[k], outputs[ref][k], scale) for k in sample
                 if k in imgs and k in outputs[ref]]
        mean = max((d[0] for d in diffs), default=0.0)
        peak = max((d[1] for d in diffs), default=0)
        tol = PIXEL_TOLERANCE[v] if ref == "pillow" else max(PIXEL_TOLERANCE[v],
                                                             PIXEL_TOLERANCE[ref])
        at = f" at 1/{scale} scale" if scale > 1 else ""
        lines.append(f"{v} vs {ref} on {len(diffs)} rows{at}: mean |pixel diff| up to "
                     f"{mean:.2f} (tolerance {tol}), max {peak}")
        if mean > tol:
            problems.append(f"{v}: mean |pixel diff| {mean:.2f} against {ref} > {tol}")
    return lines, problems


# ----------------------------------------------------------------------------- report

def _median(runs: list[dict], field: str) -> float | None:
    vals = [r[field] for r in runs if r.get(field) is not None]
    return statistics.median(vals) if vals else None


def tables(results: dict[int, dict[str, list[dict]]], cores: int) -> str:
    """Markdown: one row per size and variant (medians of the repeats), then mmpipe's
    ratios against each peer (mmpipe images/s divided by the peer's)."""
    out = [("| N | variant | images/s | to output s (min-max) | exit s | CPU s | peak RSS MiB | "
            "load avg at starts |"), "|---:|---|---:|---:|---:|---:|---:|---|"]
    for n, by_v in results.items():
        for v, runs in by_v.items():
            ok = [r for r in runs if r["rc"] == 0 and r.get("to_output_s")]
            if not ok:
                out.append(f"| {n:,} | {VARIANTS[v]} | failed | | | | | |")
                continue
            t = [r["to_output_s"] for r in ok]
            out.append(f"| {n:,} | {VARIANTS[v]} | {n / statistics.median(t):.1f} | "
                       f"{statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f}) | "
                       f"{_median(ok, 'exit_s'):.1f} | {_median(ok, 'cpu_s'):.1f} | "
                       f"{_median(ok, 'peak_rss_mib'):.0f} | "
                       f"{', '.join(format(r['load'], '.2f') for r in runs)} |")
    peers = [v for v in ("raydata", "daft-native", "daft-udf", "pillow")
             if any(v in by_v for by_v in results.values())]
    if any("mmpipe" in by_v for by_v in results.values()) and peers:
        names = {"raydata": "Ray Data", "daft-native": "Daft native",
                 "daft-udf": "Daft + the Pillow UDF", "pillow": f"bare Pillow, {cores} processes"}
        out += ["", "| N | mmpipe img/s | " + " | ".join(f"vs {names[v]}" for v in peers) + " |",
                "|---:|---:|" + "---:|" * len(peers)]
        for n, by_v in results.items():
            rate = {v: n / m for v, runs in by_v.items()
                    if (m := _median([r for r in runs if r["rc"] == 0], "to_output_s"))}
            for mine in ("mmpipe-base", "mmpipe"):
                if mine not in rate:
                    continue
                cells = [f"{rate[mine] / rate[v]:.2f}x" if v in rate else "-" for v in peers]
                label = " (before)" if mine == "mmpipe-base" else ""
                out.append(f"| {n:,}{label} | {rate[mine]:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# ----------------------------------------------------------------------------- main

def orchestrate(args) -> int:
    """Build the inputs, run every size x repeat x variant, check, report."""
    from throughput import wait_for_quiet

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.baseline and "mmpipe-base" not in variants:
        variants.insert(0, "mmpipe-base")
    if not args.baseline and "mmpipe-base" in variants:
        if args.variants != ",".join(VARIANTS):
            raise SystemExit("--variants: mmpipe-base needs --baseline PATH")
        variants.remove("mmpipe-base")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise SystemExit(f"--variants: unknown {unknown or args.variants!r}; "
                         f"choose from {', '.join(VARIANTS)}")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"--sizes: comma-separated image counts, got {args.sizes!r}") from None
    if args.repeats < 1:
        raise SystemExit(f"--repeats: must be >= 1, got {args.repeats}")
    workdir = Path(args.workdir).resolve()
    for d in ("results", "runs"):
        (workdir / d).mkdir(parents=True, exist_ok=True)
    build_inputs(workdir, max(sizes), args.seed, args.cores)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results: dict[int, dict[str, list[dict]]] = {}
    checks: list[str] = []
    problems: list[str] = []
    for n in sizes:
        manifest = build_inputs(workdir, n, args.seed, args.cores)
        keys = [r["key"] for r in read_manifest(manifest)]
        results[n] = {v: [] for v in variants}
        last: dict[str, dict[str, bytes]] = {}
        for rep in range(args.repeats):
            for v in variants:
                if args.quiet_wait > 0:
                    wait_for_quiet(args.quiet_wait)
                output = workdir / "runs" / f"n{n}-{v}"
                shutil.rmtree(output, ignore_errors=True)
                r = measure(variant_cmd(v, manifest, output, workdir, args), output,
                            workdir / "runs" / f"n{n}-{v}.log", env, args.timeout)
                r["repeat"] = rep + 1
                results[n][v].append(r)
                print(f"N={n} {v} #{rep + 1}: rc {r['rc']}, to output {r['to_output_s']}s, "
                      f"exit {r['exit_s']}s, CPU {r['cpu_s']}s, peak RSS {r['peak_rss_mib']} "
                      f"MiB, load {r['load']}", flush=True)
                if r["rc"] != 0:
                    problems.append(f"N={n} {v} #{rep + 1}: exit {r['rc']} (log "
                                    f"{workdir / 'runs' / f'n{n}-{v}.log'})")
                    continue
                images = read_images(v, output)
                problems += [f"N={n} #{rep + 1} {p}" for p in check_rows(v, images, keys)]
                last[v] = images
        sample = random.Random(args.seed).sample(keys, min(args.check_rows, len(keys)))
        lines, bad = compare(last, sample)
        checks += [f"N={n}: {line}" for line in lines]
        problems += [f"N={n}: {p}" for p in bad]
    cmd = " ".join([os.path.relpath(sys.executable, REPO), os.path.relpath(__file__, REPO)]
                   + sys.argv[1:])
    md = [(f"{started}; `{cmd}`; nproc {os.cpu_count()}, --cores {args.cores}; medians of "
           f"{args.repeats} interleaved runs; images/s = N / (process start -> output written)"),
          "", tables(results, args.cores), "",
          "Checks: " + ("OK" if not problems else "FAILED")]
    md += [f"- {line}" for line in checks + problems]
    text = "\n".join(md)
    print("\n" + text)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (workdir / "results" / f"peers-{stamp}.md").write_text(text + "\n")
    (workdir / "results" / f"peers-{stamp}.json").write_text(json.dumps(
        {"date": started, "command": cmd, "args": vars(args), "results": results,
         "checks": checks, "problems": problems}, indent=1))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="600,2400", help="image counts, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per size")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated subset of {', '.join(VARIANTS)}")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                   help="pillow processes and Ray num_cpus (default: the usable CPUs)")
    p.add_argument("--workdir", default=str(REPO / "bench" / "out" / "peers"),
                   help="inputs, outputs and results (default bench/out/peers, git-ignored)")
    p.add_argument("--seed", type=int, default=0, help="input images seed")
    p.add_argument("--check-rows", type=int, default=8,
                   help="rows whose pixels are compared between variants")
    p.add_argument("--mmpipe-args", default="", help="extra `mmpipe run` arguments")
    p.add_argument("--baseline", default=None,
                   help="another checkout of mmpipe (e.g. `git worktree add /tmp/base REV`): "
                   "adds the variant mmpipe-base, the same job run by that checkout's code")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--quiet-wait", type=float, default=0,
                   help="before each run wait up to this many seconds for other processes to "
                   "use < 0.3 cores (0: do not wait)")
    p.add_argument("--child", choices=[v for v in VARIANTS if not v.startswith("mmpipe")],
                   help=argparse.SUPPRESS)
    p.add_argument("--manifest", help=argparse.SUPPRESS)
    p.add_argument("--output", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cores < 1:
        raise SystemExit(f"--cores: must be >= 1, got {args.cores}")
    if args.child:
        return run_child(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
