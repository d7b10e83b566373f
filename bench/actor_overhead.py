#!/usr/bin/env python
"""ModelActor overhead: how many records/s one real ``ModelActor`` serves when its backend
does no model work (issue 13, item 1).

What it measures: the cost of the serving path alone - the sender's ``ray.put`` of a
(n, 224, 224, 3) uint8 batch, the actor call, Ray's transport and deserialisation in the
actor process, ``BatchServer`` queueing/coalescing (``merge_inputs``' concatenate), the
loader and compute threads, splitting the outputs and returning them to the sender. The
backend (``NoopBackend`` below) returns a zero vector per record and touches no pixel.

How: a local Ray (``ray.init(address="local", num_cpus=2)``, 127.0.0.1, no dashboard) is
started; the ModelActor is started by ``runtime.model_pool.start_model_pools`` for an
``image_embedding`` section, exactly as a job does. The registry has no spec-level hook for
a custom backend (``image_embedding.backend`` is a Literal), so every Ray worker process
runs ``register_noop_backend`` (``runtime_env`` ``worker_process_setup_hook``, with the repo
on ``PYTHONPATH``), which re-registers the backend name ``clip`` as
``bench.actor_overhead:NoopBackend``; the "model" is a temp directory holding only a
``config.json``. ``--workers`` sender actors (``num_cpus=0``) each hold a ``ModelClient``
from ``worker_models`` (the client PartitionWorkers use) and, for ``--seconds``, keep
``--in-flight`` batches of ``--batch`` rows outstanding (``submit`` / ``result``, oldest
first, as ``steps.model.ModelStages`` does), as fast as they can.

Printed: records/s (records completed by all senders / the send window), the actor's
per-record cost (the actor process's CPU seconds, and the backend's ``busy_s`` and
``prepare_s`` from ``model_stats``, each per record), the sender's per-request time split
(``ray.put``, the wait for the result), mean batch fill (``mean_batch_rows`` /
``batch_size``; at most ``workers * in_flight * batch`` rows can be waiting), and as the
last line ``actor_overhead: records_per_s=<n> batch_fill=<f>``. ``--profile`` also samples
the actor process with py-spy (if installed) during the run and prints the top frames.

    .venv/bin/python bench/actor_overhead.py
    .venv/bin/python bench/actor_overhead.py --workers 2 --batch 32 --seconds 20 \
        --batch-size 64 --in-flight 2 --concurrency 8 --profile
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipeline.contracts import ImageGeometry, ModelInfo, OutputField
from pipeline.models.base import ModelBackend, rows_of

SECTION = "image_embedding"
DIM = 512  # CLIP ViT-B/32's embedding width
HW = 224


class NoopBackend(ModelBackend):
    """An ``image_embedding`` backend that does no model work: a zero vector per row.
    ``prepare`` is the base class's (``dict(inputs)``); ``run`` reads only the row count."""

    def __init__(self, model_dir: str, spec, device: str, backend: str):
        self.device = device
        self.info = ModelInfo(
            backend="noop", outputs=(OutputField("image_embedding", "vector", DIM),),
            image=ImageGeometry("center_crop", HW, HW, HW), text=None,
            description=f"noop backend (zeros[{DIM}] per row) on {device}")

    def run(self, prepared):
        return {"image_embedding": np.zeros((rows_of(prepared["pixels"]), DIM), np.float32)}


def register_noop_backend() -> None:
    """Ray ``worker_process_setup_hook``: serve the ``clip`` backend name with NoopBackend."""
    from pipeline.models.registry import register

    register("clip", "bench.actor_overhead:NoopBackend", (SECTION,))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="sender actors")
    p.add_argument("--batch", type=int, default=32, help="rows per request")
    p.add_argument("--seconds", type=float, default=20.0, help="send window per sender")
    p.add_argument("--batch-size", type=int, default=64,
                   help="the backend's batch_size (ModelServingSpec's default)")
    p.add_argument("--in-flight", type=int, default=2,
                   help="requests each sender keeps outstanding (max_in_flight's default)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="actor_concurrency (actor threads: this + 2)")
    p.add_argument("--batch-wait", type=float, default=None,
                   help="batch_wait_s (default: the spec's default)")
    p.add_argument("--cpus", type=int, default=2, help="ray.init num_cpus")
    p.add_argument("--profile", action="store_true",
                   help="sample the ModelActor process with py-spy during the run")
    return p.parse_args()


def make_spec(args, model_dir: Path, tmp: Path):
    from pipeline.spec import JobSpec

    return JobSpec.model_validate({
        "name": "actor-overhead",
        "source": {"kind": "manifest", "uri": str(tmp / "manifest.jsonl")},
        "sink": {"uri": str(tmp / "out")},
        "text_embedding": {"enabled": False},
        SECTION: {"enabled": True, "model": str(model_dir), "backend": "clip", "score": False,
                  "replicas": 1, "num_cpus": 1, "num_gpus": 0, "batch_size": args.batch_size,
                  "max_in_flight": args.in_flight, "actor_concurrency": args.concurrency,
                  **({} if args.batch_wait is None else {"batch_wait_s": args.batch_wait})}})


def sender_class():
    import ray

    @ray.remote(num_cpus=0)
    class Sender:
        """One PartitionWorker's model traffic: ``in_flight`` batches outstanding."""

        def __init__(self, pools, index: int, rows: int, in_flight: int):
            from pipeline.runtime.model_pool import worker_models

            self.client = worker_models(pools, index)[SECTION][0]
            rng = np.random.default_rng(index)
            self.pixels = rng.integers(0, 256, (rows, HW, HW, 3), dtype=np.uint8)
            self.rows, self.in_flight = rows, in_flight

        def run(self, seconds: float, start_at: float) -> dict:
            while time.time() < start_at:
                time.sleep(0.001)
            pending: collections.deque = collections.deque()
            put_s = wait_s = 0.0
            requests = records = 0
            t0, c0 = time.perf_counter(), time.process_time()
            end = t0 + seconds
            while True:
                now = time.perf_counter()
                while now < end and len(pending) < self.in_flight:
                    ts = time.perf_counter()
                    pending.append(self.client.submit({"pixels": self.pixels}))
                    put_s += time.perf_counter() - ts
                    now = time.perf_counter()
                if not pending:
                    break
                tw = time.perf_counter()
                out = self.client.result(pending.popleft())
                wait_s += time.perf_counter() - tw
                assert out["image_embedding"].shape == (self.rows, DIM)
                requests += 1
                records += self.rows
            return {"records": records, "requests": requests, "elapsed_s":
                    time.perf_counter() - t0, "submit_s": put_s, "result_wait_s": wait_s,
                    "cpu_s": time.process_time() - c0}

    return Sender


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> tuple[float, float]:
    """(non-idle CPU seconds of the whole machine, wall time) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK"), time.time()


def ray_daemon_pids() -> dict[str, list[int]]:
    """Pids of the Ray daemons this driver started (raylet, gcs_server, ...); best effort."""
    try:
        import ray

        node = ray._private.worker._global_node  # noqa: SLF001 - no public accessor
        return {k: [p.process.pid for p in v] for k, v in node.all_processes.items()}
    except Exception:  # noqa: BLE001
        return {}


def start_profile(pid: int, seconds: float, out: Path):
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        print("profile: py-spy not found; skipped")
        return None
    return subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(max(1, int(seconds))),
                             "-r", "200", "--format", "raw", "--threads", "--gil", "-o", str(out),
                             "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def summarise_profile(path: Path, top: int = 18) -> list[str]:
    """Collapsed stacks -> samples per thread and the top self (leaf) frames."""
    if not path.exists():
        return ["profile: no output"]
    threads: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        n = int(n)
        frames = stack.split(";")
        total += n
        threads[frames[0]] += n
        leaves[frames[-1]] += n
        for fr in set(frames[1:]):
            incl[fr] += n
    out = [f"profile: {total} samples of the ModelActor's Python threads (py-spy --gil: samples where the thread holds the GIL, 200 Hz, "
           "idle excluded)"]
    out += [f"  thread {t}: {n / total:.0%}" for t, n in threads.most_common(8)]
    out.append("  top self frames:")
    out += [f"    {n / total:6.1%} {fr[:140]}" for fr, n in leaves.most_common(top)]
    out.append("  top inclusive frames (pipeline/ray/numpy):")
    keep = [(fr, n) for fr, n in incl.most_common(200)
            if any(k in fr for k in ("pipeline/", "serialization", "numpy", "queue.py",
                                     "threading.py", "function_manager", "worker.py"))]
    out += [f"    {n / total:6.1%} {fr[:140]}" for fr, n in keep[:top]]
    return out


def main() -> int:
    args = parse_args()
    import ray

    from pipeline.runtime.model_pool import model_stats, start_model_pools, stop_model_pools

    tmp = Path(tempfile.mkdtemp(prefix="actor-overhead-"))
    model_dir = tmp / "noop-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "clip"}))
    spec = make_spec(args, model_dir, tmp)
    env = {"PYTHONPATH": os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "HF_HUB_OFFLINE": "1"}
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False,
             _node_ip_address="127.0.0.1", logging_level="WARNING",
             runtime_env={"env_vars": env,
                          "worker_process_setup_hook": "bench.actor_overhead.register_noop_backend"})
    try:
        pools = start_model_pools(spec, run_id="bench")
        actor = pools[0].actors[0]
        info = pools[0].info
        assert info.backend == "noop", f"the actor loaded {info.backend!r}, not the noop backend"
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        Sender = sender_class()
        senders = [Sender.remote(pools, i, args.batch, args.in_flight) for i in range(args.workers)]
        ray.get([s.__ray_ready__.remote() for s in senders])
        start_at = time.time() + 1.0
        daemons = {k: v for k, v in ray_daemon_pids().items() if k in ("raylet", "gcs_server")}
        while time.time() < start_at:
            time.sleep(0.001)
        cpu0 = cpu_seconds(pid)
        dcpu0 = {k: sum(cpu_seconds(p) for p in v) for k, v in daemons.items()}
        busy0 = machine_busy_s()
        prof_path = tmp / "actor.pyspy"
        prof = None
        if args.profile:
            time.sleep(1.0)  # past the start-up
            prof = start_profile(pid, args.seconds - 2, prof_path)
        results = ray.get([s.run.remote(args.seconds, start_at) for s in senders])
        cpu_s = cpu_seconds(pid) - cpu0
        busy1 = machine_busy_s()
        dcpu = {k: sum(cpu_seconds(p) for p in v) - dcpu0[k] for k, v in daemons.items()}
        stats = model_stats(pools)[0]
        if prof is not None:
            _, err = prof.communicate(timeout=60)
            if prof.returncode:
                print(f"profile: py-spy exited {prof.returncode}: {err.strip()[-400:]}")
        stop_model_pools(pools)
    finally:
        ray.shutdown()

    records = sum(r["records"] for r in results)
    reqs = sum(r["requests"] for r in results)
    window = max(r["elapsed_s"] for r in results)
    rps = records / window
    fill = stats["mean_batch_rows"] / args.batch_size
    waiting_max = args.workers * args.in_flight * args.batch
    print(f"actor_overhead: {args.workers} senders x {args.in_flight} in flight x {args.batch} "
          f"rows of {HW}x{HW}x3 uint8 ({args.batch * HW * HW * 3 / 2**20:.1f} MiB/request), "
          f"batch_size {args.batch_size}, actor_concurrency {args.concurrency}, "
          f"{args.cpus} CPUs, {args.seconds:g} s")
    print(f"  senders: {records} records in {reqs} requests over {window:.2f} s = "
          f"{rps:,.0f} records/s ({rps * HW * HW * 3 / 2**30:.2f} GiB/s of pixels)")
    print(f"  sender per request: submit (ray.put + call) {1e3 * sum(r['submit_s'] for r in results) / reqs:.2f} ms, "
          f"result wait {1e3 * sum(r['result_wait_s'] for r in results) / reqs:.2f} ms; sender "
          f"processes' CPU {1e6 * sum(r['cpu_s'] for r in results) / records:.1f} us/record "
          f"({sum(r['cpu_s'] for r in results) / window:.2f} cores)")
    print(f"  actor: {stats['records']} records, {stats['requests']} requests, "
          f"{stats['batches']} backend calls, mean {stats['mean_batch_rows']} rows/call; "
          f"queue wait mean {1e3 * stats['queue_wait_mean_s']:.2f} ms, submit->compute "
          f"{1e3 * (stats['submit_wait_mean_s'] or 0):.2f} ms")
    print(f"  actor per record: process CPU {1e6 * cpu_s / max(1, records):.1f} us "
          f"({cpu_s:.2f} CPU-s = {cpu_s / window:.2f} cores), backend run (busy_s) "
          f"{1e6 * stats['busy_s'] / max(1, stats['records']):.2f} us, prepare+merge "
          f"(prepare_s) {1e6 * stats['prepare_s'] / max(1, stats['records']):.2f} us, "
          f"wall {1e6 * window / max(1, records):.1f} us")
    machine = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1])
    print(f"  machine: {machine:.2f} of {os.cpu_count()} cores busy during the run ("
          + ", ".join(f"{k} {v / (busy1[1] - busy0[1]):.2f}" for k, v in dcpu.items())
          + f", ModelActor {cpu_s / (busy1[1] - busy0[1]):.2f}, senders "
          f"{sum(r['cpu_s'] for r in results) / (busy1[1] - busy0[1]):.2f})")
    print(f"  batch fill: {stats['mean_batch_rows']} / {args.batch_size} = {fill:.3f} "
          f"(at most {waiting_max} rows can be waiting)")
    if args.profile:
        for line in summarise_profile(prof_path):
            print(line)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"actor_overhead: records_per_s={rps:.0f} batch_fill={fill:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
