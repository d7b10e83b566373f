"""Planning at scale: list N objects in a local S3 server (SeaweedFS) and write the plan.

Measures, in one process per size (so peak RSS is that size's own): wall seconds for the
streaming listing + incremental plan write, and the peak RSS growth over the process's
RSS before planning. Objects are tiny (the listing, not the bytes, is what is measured).

    .venv/bin/python bench/plan_scale.py --sizes 20000,100000
"""

from __future__ import annotations

import argparse
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


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def plan_once(bucket: str, prefix: str) -> dict:
    """Child process: plan s3://bucket/prefix and report time and memory."""
    from pipeline.output import plan as planning
    from pipeline.input import make_datasource
    from pipeline.spec import DecodeSpec, SourceSpec

    spec = SourceSpec(kind="files", uri=f"s3://{bucket}/{prefix}", partition_size=1000)
    source = make_datasource(spec, DecodeSpec())
    base = _rss_mib()
    t0 = time.perf_counter()
    plan, how = planning.load_or_create(f"s3://{bucket}/plans/{prefix}", spec, source.list_inputs)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"objects": sum(plan.rows_planned), "partitions": len(plan), "plan": how,
            "wall_s": round(wall, 2), "objects_per_s": round(sum(plan.rows_planned) / wall),
            "rss_before_mib": round(base, 1), "peak_rss_mib": round(peak, 1)}


def populate(client, bucket: str, prefix: str, n: int) -> None:
    def put(i: int) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{i // 1000:04d}/{i:08d}.jpg", Body=b"x")
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(put, range(n)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument("--child", nargs=2, metavar=("BUCKET", "PREFIX"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(plan_once(*args.child)))
        return
    from pipeline.testing.seaweedfs import SeaweedS3

    with tempfile.TemporaryDirectory(prefix="mmpipe-plan-bench-") as tmp:
        server = SeaweedS3(Path(tmp))
        try:
            client = server.client()
            client.create_bucket(Bucket="bench")
            rows = []
            for n in (int(s) for s in args.sizes.split(",")):
                t0 = time.perf_counter()
                populate(client, "bench", f"n{n}", n)
                put_s = time.perf_counter() - t0
                out = subprocess.run([sys.executable, __file__, "--child", "bench", f"n{n}"],
                                     env=dict(os.environ, **server.env()), capture_output=True,
                                     text=True, check=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["upload_s"] = round(put_s, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            server.stop()
    print("\n| objects | partitions | plan wall s | objects/s | RSS before MiB | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['objects']} | {r['partitions']} | {r['wall_s']} | {r['objects_per_s']} | "
              f"{r['rss_before_mib']} | {r['peak_rss_mib']} |")


if __name__ == "__main__":
    main()
