#!/usr/bin/env python
"""Input kinds benchmark (issue 5): videos/s and samples/s, mmpipe vs a plain loop, one run.

    .venv/bin/python bench/inputs.py                                   # a, b, c
    .venv/bin/python bench/inputs.py --video-copies 8 --wds-copies 8 --no-urls

Three inputs, each run twice, every run in its own subprocess (so memory is per run):

a. **videos**: the 3 bundled videos (data/videos) copied ``--video-copies`` times into a
   temp dir; ``examples/video.yaml`` (files datasource, ``source.media: video``, uniform
   8 frames, 256 px JPEG frames) as one ``mmpipe run --address local`` job, against a
   plain loop over the same files: ``pipeline.steps.video.decode_video`` + resize and
   JPEG-encode each sampled frame (``resize_pixels``), no Ray.
b. **WebDataset samples**: shards made from the 57 photos x ``--wds-copies``
   (``examples/make_webdataset.py``, 10 samples per shard); ``examples/webdataset.yaml``
   (WebDataset input, Parquet + WebDataset output) as one job, against a plain loop:
   ``read_shard`` + ``decode_image`` (same JPEG draft as the job) + ``resize_pixels`` +
   JPEG encode.
c. **URL manifest samples** (skip with ``--no-urls``): the same photos x
   ``--url-copies`` served by a stdlib HTTP server on 127.0.0.1 in this process (a
   distinct ``?c=<copy>`` query per copy); ``examples/url_manifest.yaml`` as one job,
   against a plain loop: sequential ``HttpFetcher.fetch`` + decode + resize + encode.

All jobs run with ``text_embedding.enabled=false`` (no model actor: on 2 CPUs that gives
2 PartitionWorkers) and dedup off (the copies are byte-identical and would otherwise be
rejected as duplicates, skipping the resize). The jobs still do what the loops do not:
sha256 + pHash, Parquet (+ quarantine, + WebDataset shards for b), commit markers.

Reported per run:
- ``wall s``: the whole subprocess, i.e. Python start-up + imports + ``ray.init`` + the
  job + ``ray.shutdown`` (mmpipe), or start-up + imports + the loop (plain loop);
- ``job s`` / ``job rec/s``: mmpipe's own report (``wall_s``, ``records_per_s``: rows
  processed over ``run_job``'s wall time, planning included, ``ray.init`` not);
- ``processing s`` / ``rec/s while processing``: mmpipe from the first partition's
  ``started_at`` to the last ``finished_at`` in the commit markers; the loop: its own loop
  time (after imports);
- ``vs loop``: records/s while processing divided by the loop's;
- ``peak RSS MiB``: peak over samples every 0.2 s of the summed RSS of the subprocess and
  all its descendants (for mmpipe: every Ray process that ``ray.init`` started);
- ``others' load``: average cores used by processes outside the run (the machine is
  shared), from psutil's machine CPU times minus the run's own.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # import the working tree's pipeline

PHOTOS = REPO / "data" / "photos"
VIDEOS = REPO / "data" / "videos"
SAMPLE_S = 0.2


# ----------------------------------------------------------------------------- measuring

class Sampler:
    """Peak summed RSS and CPU seconds of a process tree, plus the machine's busy CPU."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self.cpu: dict[int, float] = {}
        self.stop = threading.Event()
        t = psutil.cpu_times()
        self.busy0 = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_S)

    def sample(self) -> None:
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return
        rss = 0
        for p in procs:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    c = p.cpu_times()
                    self.cpu[p.pid] = c.user + c.system
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, rss)

    def finish(self, wall_s: float) -> dict:
        self.stop.set()
        self.thread.join()
        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0) - self.busy0
        ours = sum(self.cpu.values())
        return {"peak_rss_mib": self.peak_rss / 2**20, "cpu_s": ours,
                "others_cores": max(0.0, (busy - ours) / wall_s) if wall_s > 0 else 0.0}


def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd`` from the repo root; return wall s, peak RSS, CPU, others' load, rc."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid)
    out, _ = proc.communicate()
    wall = time.time() - t0
    res = sampler.finish(wall)
    res.update(wall_s=wall, rc=proc.returncode, output=out)
    return res


def markers_window(output: str) -> tuple[float, int]:
    """(first started_at -> last finished_at seconds, rows) from the commit markers."""
    ms = [json.loads(Path(p).read_text()) for p in glob.glob(f"{output}/_checkpoints/*.json")]
    if not ms:
        return 0.0, 0
    return (max(m["finished_at"] for m in ms) - min(m["started_at"] for m in ms),
            sum(m["rows_in"] for m in ms))


def mmpipe_job(spec: str, input_uri: str, output: str, sets: list[str], env: dict) -> dict:
    """One ``mmpipe run --address local`` job, measured."""
    report = output.rstrip("/") + ".report.json"
    cmd = [sys.executable, "-m", "pipeline", "run", spec, "--input", input_uri, "--output",
           output, "--address", "local", "--mode", "overwrite", "--report-json", report]
    for s in sets:
        cmd += ["--set", s]
    r = run_measured(cmd, env)
    if r["rc"] != 0 or not os.path.exists(report):
        print(r["output"][-4000:], file=sys.stderr)
        raise SystemExit(f"mmpipe job failed: {' '.join(cmd)}")
    rep = json.loads(Path(report).read_text())
    window, rows = markers_window(output)
    r.update(rows=rep["rows_processed"], by_status=rep["rows_by_status"],
             job_s=rep["wall_s"], job_rps=rep["records_per_s"], processing_s=window,
             partitions=rep["partitions_total"])
    assert rows == rep["rows_processed"], (rows, rep["rows_processed"])
    del r["output"]
    return r


def loop_child(kind: str, target: str, env: dict, extra: list[str] = ()) -> dict:
    """Run this script's plain loop ``kind`` in a subprocess, measured."""
    result = Path(tempfile.mkstemp(prefix="mmpipe-bench-", suffix=".json")[1])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--target", target,
           "--result", str(result), *extra]
    r = run_measured(cmd, env)
    if r["rc"] != 0:
        print(r["output"][-4000:], file=sys.stderr)
        raise SystemExit(f"plain loop {kind} failed")
    child = json.loads(result.read_text())
    result.unlink()
    del r["output"]
    r.update(child)
    return r


# ----------------------------------------------------------------------------- plain loops

def _encode(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def loop_videos(target: str) -> dict:
    from pipeline.spec import ResizeSpec, VideoSpec
    from pipeline.media.transform import resize_pixels
    from pipeline.media.video import decode_video

    vspec, rspec = VideoSpec(sampling="uniform", num_frames=8), ResizeSpec(size_px=256)
    files = sorted(str(p) for p in Path(target).iterdir())
    t0 = time.time()
    decode_s, ok, frames = 0.0, 0, 0
    for path in files:
        t = time.time()
        info = decode_video(path, vspec)
        decode_s += time.time() - t
        for f in info.frames:
            _encode(resize_pixels(f, rspec))
        ok += 1
        frames += len(info.frames)
    return {"rows": len(files), "ok": ok, "frames": frames, "processing_s": time.time() - t0,
            "decode_s": decode_s}


def loop_wds(target: str) -> dict:
    from pipeline.input.shards import read_shard
    from pipeline.spec import ResizeSpec
    from pipeline.media.decode import decode_image
    from pipeline.media.transform import resize_pixels

    rspec = ResizeSpec(size_px=256)
    shards = sorted(glob.glob(f"{target}/*.tar"))
    t0 = time.time()
    rows = ok = 0
    for shard in shards:
        for s in read_shard(shard):
            rows += 1
            if s.error is None and "jpg" in s.members:
                img = decode_image(s.members["jpg"], draft_min_side_px=rspec.size_px)
                _encode(resize_pixels(img.pixels, rspec))
                ok += 1
    return {"rows": rows, "ok": ok, "processing_s": time.time() - t0}


def loop_urls(target: str) -> dict:
    import pyarrow.parquet as pq

    from pipeline.storage.http import HttpFetcher
    from pipeline.spec import DecodeSpec, DownloadSpec, ResizeSpec
    from pipeline.media.decode import decode_image
    from pipeline.media.transform import resize_pixels

    rspec = ResizeSpec(size_px=256)
    fetcher = HttpFetcher(DownloadSpec(timeout_s=5), DecodeSpec().max_bytes)
    urls = pq.read_table(target, columns=["url"]).column("url").to_pylist()
    t0 = time.time()
    ok = 0
    for url in urls:
        data, err = fetcher.fetch(url)
        if err is None:
            img = decode_image(data, draft_min_side_px=rspec.size_px)
            _encode(resize_pixels(img.pixels, rspec))
            ok += 1
    return {"rows": len(urls), "ok": ok, "processing_s": time.time() - t0}


LOOPS = {"videos": loop_videos, "wds": loop_wds, "urls": loop_urls}


# ----------------------------------------------------------------------------- inputs

def make_videos(d: Path, copies: int) -> int:
    d.mkdir(parents=True, exist_ok=True)
    n = 0
    for c in range(copies):
        for src in sorted(VIDEOS.iterdir()):
            shutil.copyfile(src, d / f"{src.stem}_c{c}{src.suffix}")
            n += 1
    return n


def make_wds(d: Path, copies: int) -> int:
    spec = importlib.util.spec_from_file_location("make_webdataset",
                                                  REPO / "examples" / "make_webdataset.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_shards(d, samples_per_shard=10, copies=copies)
    return len(mod.photo_samples()) * copies


def start_server():
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802
            path = PHOTOS / os.path.basename(self.path.split("?", 1)[0])
            if path.suffix != ".jpg" or not path.is_file():
                self.send_error(404)
                return
            body = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def make_url_manifest(path: Path, base_url: str, copies: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [json.loads(line) for line in (PHOTOS / "captions.jsonl").read_text().splitlines()
            if line.strip()]
    urls = [f"{base_url}/photos/{r['file']}?c={c}" for c in range(copies) for r in recs]
    caps = [r["captions"][0] for c in range(copies) for r in recs]
    pq.write_table(pa.table({"url": urls, "caption": caps}), path)
    return len(urls)


# ----------------------------------------------------------------------------- report

def table(rows: list[tuple[str, str, dict, dict]]) -> str:
    out = ["| input | run | records | ok | wall s (incl. start-up) | records/s wall | "
           "job s (report) | job records/s (report) | processing s | records/s while "
           "processing | vs loop | peak RSS MiB | CPU s | others' load (cores) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for inp, unit, job, loop in rows:
        loop_rps = loop["rows"] / loop["processing_s"]
        for name, r in (("mmpipe run --address local", job), ("plain loop, 1 process", loop)):
            ok = r["by_status"].get("ok", 0) if "by_status" in r else r["ok"]
            rps = r["rows"] / r["processing_s"] if r["processing_s"] else 0.0
            job_cols = (f"{r['job_s']:.1f} | {r['job_rps']:.1f}" if "job_s" in r else "- | -")
            out.append(
                f"| {inp} ({unit}) | {name} | {r['rows']} | {ok} | {r['wall_s']:.1f} | "
                f"{r['rows'] / r['wall_s']:.2f} | {job_cols} | {r['processing_s']:.1f} | "
                f"{rps:.2f} | {rps / loop_rps:.2f}x | {r['peak_rss_mib']:.0f} | "
                f"{r['cpu_s']:.1f} | {r['others_cores']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--video-copies", type=int, default=4, help="copies of the 3 videos (4)")
    p.add_argument("--wds-copies", type=int, default=4, help="copies of the 57 photos in "
                   "WebDataset shards (4)")
    p.add_argument("--url-copies", type=int, default=4, help="copies of the 57 photo URLs (4)")
    p.add_argument("--no-urls", action="store_true", help="skip (c), the URL manifest")
    p.add_argument("--workers", type=int, default=2, help="PartitionWorkers per job "
                   "(runtime.num_workers; default 2; the local Ray gets every CPU)")
    p.add_argument("--workdir", default=str(REPO / "bench" / "out" / "inputs"),
                   help="inputs and outputs (default bench/out/inputs, git-ignored)")
    p.add_argument("--child", choices=sorted(LOOPS), help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        Path(args.result).write_text(json.dumps(LOOPS[args.child](args.target)))
        return 0

    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost",
               PYTHONPATH=os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]]
                                                         if os.environ.get("PYTHONPATH") else [])))
    common = ["text_embedding.enabled=false", "dedup.exact=false", "dedup.near=false",
              f"runtime.num_workers={args.workers}"]
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()[0]
    rows = []

    vdir = work / "videos"
    n = make_videos(vdir, args.video_copies)
    print(f"(a) {n} videos in {vdir}", flush=True)
    job = mmpipe_job("examples/video.yaml", str(vdir), str(work / "out-video"),
                     common + ["source.partition_size=2"], env)
    loop = loop_child("videos", str(vdir), env)
    rows.append(("a. videos", "videos/s", job, loop))
    print(table(rows[-1:]), flush=True)

    wdir = work / "wds"
    n = make_wds(wdir, args.wds_copies)
    print(f"(b) {n} samples in {len(list(wdir.glob('*.tar')))} shards in {wdir}", flush=True)
    job = mmpipe_job("examples/webdataset.yaml", str(wdir), str(work / "out-wds"),
                     common + ["source.shards_per_partition=2"], env)
    loop = loop_child("wds", str(wdir), env)
    rows.append(("b. WebDataset", "samples/s", job, loop))
    print(table(rows[-1:]), flush=True)

    if not args.no_urls:
        server, base = start_server()
        try:
            manifest = work / "urls.parquet"
            n = make_url_manifest(manifest, base, args.url_copies)
            print(f"(c) {n} URLs served at {base}", flush=True)
            job = mmpipe_job("examples/url_manifest.yaml", str(manifest),
                             str(work / "out-urls"), common + ["source.partition_size=20"], env)
            loop = loop_child("urls", str(manifest), env)
        finally:
            server.shutdown()
            server.server_close()
        rows.append(("c. URL manifest", "samples/s", job, loop))

    cmd = " ".join([os.path.relpath(sys.executable, REPO), os.path.relpath(__file__, REPO)]
                   + (argv if argv is not None else sys.argv[1:]))
    print(f"\n{started}; `{cmd}`; nproc {os.cpu_count()}, "
          f"1-min load average at the start {load_before:.2f}\n")
    print(table(rows))
    (work / "results.json").write_text(json.dumps(
        {"date": started, "command": cmd, "rows": [
            {"input": i, "unit": u, "mmpipe": j, "loop": lo} for i, u, j, lo in rows]},
        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
