"""The driver at 10k, 100k and 1M partitions, against a local S3 server (SeaweedFS).

For each size N, in one invocation (issue 15, item 4):

1. **plan**: a JSONL manifest of N rows, each naming the same tiny JPEG beside it
   (`partition_size: 1`, so N partitions), is planned by the real driver code in a fresh
   process (``planning.load_or_create``): wall seconds and the process's peak RSS.
2. **commit 99%**: commit markers for all but 1% of the partitions are written with the
   real ``CheckpointStore.commit`` (conditional create) into the job's generation, each
   naming one real committed Parquet file: a job that stopped after 99% of its partitions.
3. **resume** (sizes up to ``--resume-max``): ``run_job`` on a local Ray (2 CPUs, no model steps) in a fresh process
   resumes the job and runs the remaining 1%. Measured in that driver process: time from
   the start of ``run_job`` to the first partition handed to a worker, peak RSS, RSS after
   the plan was loaded (the plan index), driver CPU seconds, and control-plane messages:
   every call the driver makes into Ray (``ray.get``/``ray.wait``/``ray.kill``/``put`` and
   actor method calls).

Memory "beyond the plan index" is peak RSS minus the RSS right after the plan was loaded,
divided by N (it includes a constant: Ray's client threads, the worker handles); "marginal" is
that difference's growth from the previous size to this one, per partition added. Run:

    .venv/bin/python bench/scale.py --sizes 10000,100000,1000000
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PHOTO = REPO / "data" / "photos" / "000000000790.jpg"
BUCKET = "scale"


def _rss_mib(field: str = "VmRSS") -> float:
    """This process's resident set (``VmRSS``) or its peak (``VmHWM``), MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def _spec(n: int, endpoint: str):
    from pipeline.spec import parse_spec

    return parse_spec({
        "name": f"scale{n}",
        "source": {"kind": "manifest", "uri": f"s3://{BUCKET}/in{n}/manifest.jsonl",
                   "path_column": "path", "partition_size": 1},
        "sink": {"uri": f"s3://{BUCKET}/out{n}"},
        "storage": {"endpoint_url": endpoint},
        "text_embedding": {"enabled": False},
        "runtime": {"num_workers": 2, "batch_size": 1, "progress_interval_s": 3600},
    })


def child_plan(n: int, endpoint: str) -> dict:
    """Plan the job (a fresh process, so the peak RSS is planning's)."""
    from pipeline.assembly import assemble
    from pipeline.storage import fs
    from pipeline.output import plan as planning
    from pipeline.runtime import driver

    spec = _spec(n, endpoint)
    fs.configure(**spec.storage.model_dump())
    pipeline = assemble(spec)
    base = _rss_mib()
    t0 = time.perf_counter()
    output = driver.open_output(spec, pipeline, "bench-plan")  # job lease, generation
    try:
        root = output.spec.sink.uri
        source = pipeline.datasource
        plan, how = planning.load_or_create(root, spec.source, source.list_inputs,
                                            source.items_per_partition, source.plan_metadata,
                                            source.rows_known)
    finally:
        output.close()
    wall = time.perf_counter() - t0
    return {"partitions": len(plan), "plan": how, "plan_s": round(wall, 2),
            "plan_rss_before_mib": round(base, 1), "plan_peak_rss_mib": round(_rss_mib("VmHWM"), 1),
            "root": root, "fingerprint": pipeline.fingerprint}


def child_resume(n: int, endpoint: str) -> dict:
    """Resume the job with the real driver on a local Ray; measure the driver process."""
    import ray
    import ray.actor

    from pipeline.output import plan as planning
    from pipeline.runtime import driver

    counts = {"calls": 0}

    def counted(fn):
        def wrapper(*a, **k):
            counts["calls"] += 1
            return fn(*a, **k)
        return wrapper

    spec = _spec(n, endpoint)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {k: os.environ[k] for k in os.environ
                                       if k.startswith("AWS_")}})
    marks: dict = {}
    load = planning.load_or_create

    def load_and_mark(*a, **k):
        out = load(*a, **k)
        marks["rss_after_plan_mib"] = _rss_mib()
        marks["plan_loaded_s"] = time.perf_counter() - marks["t0"]
        return out

    dispatch = driver._Scheduler._dispatch  # noqa: SLF001 - the bench times the first call

    def first_dispatch(self, *a, **k):
        marks.setdefault("first_dispatch_s", time.perf_counter() - marks["t0"])
        return dispatch(self, *a, **k)

    def marking(name: str, fn):
        def wrapper(*a, **k):
            marks.setdefault(name + "_entered_s", time.perf_counter() - marks["t0"])
            out = fn(*a, **k)
            marks.setdefault(name + "_returned_s", time.perf_counter() - marks["t0"])
            return out
        return wrapper

    driver._run_partitions = marking("run_partitions", driver._run_partitions)  # noqa: SLF001
    driver._Scheduler.start_initial = marking("start_initial", driver._Scheduler.start_initial)  # noqa: SLF001
    driver._Scheduler._started = marking("worker_up", driver._Scheduler._started)  # noqa: SLF001
    planning.load_or_create = load_and_mark
    driver.planning.load_or_create = load_and_mark
    driver._Scheduler._dispatch = first_dispatch  # noqa: SLF001
    for name in ("get", "wait", "kill", "put"):
        setattr(driver.ray, name, counted(getattr(ray, name)))
    ray.actor.ActorMethod._remote = counted(ray.actor.ActorMethod._remote)  # noqa: SLF001
    rss_before = _rss_mib()
    cpu0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    marks["t0"] = time.perf_counter()
    if os.environ.get("SCALE_PROFILE"):  # where the driver's CPU goes: top functions to stderr
        import cProfile
        import pstats

        prof = cProfile.Profile()
        report = prof.runcall(driver.run_job, spec)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(45)
    else:
        report = driver.run_job(spec)
    wall = time.perf_counter() - marks["t0"]
    cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - cpu0
    ray.shutdown()
    ran = len(report.partitions_committed) + len(report.partitions_failed)
    peak = _rss_mib("VmHWM")
    return {
        "complete": report.complete, "skipped": len(report.partitions_skipped), "ran": ran,
        "rows_out": report.rows_out,
        "resume_wall_s": round(wall, 1), "plan_loaded_s": round(marks["plan_loaded_s"], 2),
        "first_dispatch_s": round(marks.get("first_dispatch_s", float("nan")), 2),
        "marks_s": {k: round(v, 2) for k, v in marks.items() if k.endswith("_s")},
        "driver_rss_before_mib": round(rss_before, 1),
        "driver_rss_after_plan_mib": round(marks["rss_after_plan_mib"], 1),
        "driver_peak_rss_mib": round(peak, 1),
        "bytes_beyond_plan_per_partition": round(
            max(0.0, peak - marks["rss_after_plan_mib"]) * 2**20 / n, 1),
        "driver_cpu_s": round(cpu, 2),
        "driver_cpu_ms_per_partition": round(1000 * cpu / n, 4),
        "driver_cpu_ms_per_partition_run": round(1000 * cpu / max(ran, 1), 2),
        "ray_calls_per_partition_run": round(counts["calls"] / max(ran, 1), 2),
    }


def _populate(client, n: int) -> None:
    """The manifest (N rows naming one JPEG beside it) and the JPEG."""
    client.put_object(Bucket=BUCKET, Key=f"in{n}/photo.jpg", Body=PHOTO.read_bytes())
    buf = io.BytesIO()
    for i in range(n):
        buf.write(b'{"path": "photo.jpg", "key": "r%08d"}\n' % i)
    client.put_object(Bucket=BUCKET, Key=f"in{n}/manifest.jsonl", Body=buf.getvalue())


def _commit_markers(n: int, endpoint: str, root: str, fingerprint: str) -> tuple[int, float]:
    """Markers for every partition but the last 1%, each naming one real Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.storage import fs
    from pipeline.output.checkpoint import CheckpointStore, CommitMarker
    from pipeline.output.plan import read_plan

    fs.configure(endpoint_url=endpoint)
    plan = read_plan(root)
    ids = plan.partition_ids[: n - max(1, n // 100)]
    rel = "data/bench/part-00000.parquet"
    sink = io.BytesIO()
    pq.write_table(pa.table({"key": ["r"], "status": ["ok"]}), sink)
    fs.write_bytes(f"{root.rstrip('/')}/{rel}", sink.getvalue())
    store = CheckpointStore(root)
    now = time.time()

    def commit(pid: str) -> None:
        store.commit(CommitMarker(
            version=2, job=f"scale{n}", partition_id=pid, attempt_id="bench", fingerprint=fingerprint,
            files=[rel], rows_in=1, rows_planned=1, rows_by_status={"ok": 1},
            bytes_written=len(sink.getvalue()), started_at=now, finished_at=now))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(commit, ids))
    return len(ids), time.perf_counter() - t0


def _child(mode: str, n: int, endpoint: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(n), endpoint],
                         env=env, capture_output=True, text=True)
    if env.get("SCALE_PROFILE"):
        sys.stderr.write(out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} {n} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--resume-max", type=int, default=100000,
                    help="sizes above this are planned only (a resume needs a marker PUT per "
                    "committed partition first: ~30 min for 1M on a 2-core machine)")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "N", "ENDPOINT"))
    args = ap.parse_args()
    if args.child:
        mode, n, endpoint = args.child[0], int(args.child[1]), args.child[2]
        print(json.dumps((child_plan if mode == "plan" else child_resume)(n, endpoint)))
        return
    from pipeline.testing.seaweedfs import SeaweedS3

    rows = []
    with tempfile.TemporaryDirectory(prefix="mmpipe-scale-bench-") as tmp:
        server = SeaweedS3(Path(tmp))
        env = dict(os.environ, HOME=tmp, HF_HUB_OFFLINE="1", **server.env())
        os.environ.update(server.env())
        try:
            client = server.client()
            client.create_bucket(Bucket=BUCKET)
            for n in (int(s) for s in args.sizes.split(",")):
                _populate(client, n)
                row = {"partitions": n, **_child("plan", n, server.endpoint_url, env)}
                if n > args.resume_max:
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                row["markers"], put_s = _commit_markers(n, server.endpoint_url, row.pop("root"),
                                                        row.pop("fingerprint"))
                row["markers_put_s"] = round(put_s, 1)
                row.update(_child("resume", n, server.endpoint_url, env))
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            server.stop()
    prev = None
    for r in rows:  # the slope: bytes per partition added from one size to the next
        if prev is not None and "driver_peak_rss_mib" in r:
            r["marginal_bytes_per_partition"] = round(
                (r["driver_peak_rss_mib"] - r["driver_rss_after_plan_mib"]
                 - prev["driver_peak_rss_mib"] + prev["driver_rss_after_plan_mib"])
                * 2**20 / (r["partitions"] - prev["partitions"]), 1)
        if "driver_peak_rss_mib" in r:
            prev = r
    print("\n| partitions | plan s | plan peak RSS MiB | resume: first dispatch s | driver peak "
          "RSS MiB | RSS after plan MiB | bytes/partition beyond plan | marginal bytes/partition | "
          "driver CPU ms/partition "
          "| Ray calls per partition run | resume wall s (1% run) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        r = {**dict.fromkeys(("first_dispatch_s", "driver_peak_rss_mib", "driver_rss_after_plan_mib",
                              "bytes_beyond_plan_per_partition", "marginal_bytes_per_partition",
                              "driver_cpu_ms_per_partition",
                              "ray_calls_per_partition_run", "resume_wall_s"), "-"), **r}
        print(f"| {r['partitions']:,} | {r['plan_s']} | {r['plan_peak_rss_mib']} | "
              f"{r['first_dispatch_s']} | {r['driver_peak_rss_mib']} | "
              f"{r['driver_rss_after_plan_mib']} | {r['bytes_beyond_plan_per_partition']} | "
              f"{r['marginal_bytes_per_partition']} | "
              f"{r['driver_cpu_ms_per_partition']} | {r['ray_calls_per_partition_run']} | "
              f"{r['resume_wall_s']} |")


if __name__ == "__main__":
    main()
