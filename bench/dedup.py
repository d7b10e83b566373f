"""The dataset-wide dedup pass at scale: synthetic hash indexes of N rows, then
``run_dedup`` on a local Ray with 2 ``DedupWorker`` actors.

Each size gets an output whose partitions (10,000 rows each) carry index files written by
the real ``IndexDatasink`` rules (``index.index_tables``) and real commit markers, with
10% exact copies (same sha256 and pHash) and 10% near copies (1-4 pHash bits flipped) of
earlier rows. Reported per run, side by side: index rows per second of the pass (bucket
tasks + union step, wall), the union step's share, duplicates found, and the largest peak
RSS of any actor (each task marker records its process's peak, ``peak_rss_bytes``). Runs
with the same rows per bucket (buckets scaled with N) show that an actor's memory follows
its bucket, not the dataset.

    .venv/bin/python bench/dedup.py --sizes 100000,1000000 --rows-per-bucket 6250
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTITION_ROWS = 10_000


def synthesize(out: str, n: int, buckets: int, seed: int = 0) -> None:
    """Write the index files and commit markers of n synthetic rows under ``out``."""
    import pyarrow.parquet as pq

    from pipeline.dedup import index
    from pipeline.storage import fs
    from pipeline.output.checkpoint import CheckpointStore, CommitMarker
    from pipeline.spec import DatasetDedupSpec

    rng = np.random.default_rng(seed)
    spec = DatasetDedupSpec(enabled=True, buckets=buckets)
    phash = rng.integers(-2**63, 2**63 - 1, size=n, dtype=np.int64)
    sha = np.array([hashlib.sha256(i.to_bytes(8, "little")).hexdigest() for i in range(n)],
                   dtype=object)
    kind = rng.random(n)
    src = (rng.random(n) * np.arange(n)).astype(np.int64)     # an earlier row
    exact = (kind < 0.1) & (np.arange(n) > 0)
    phash[exact], sha[exact] = phash[src[exact]], sha[src[exact]]
    near = (kind >= 0.1) & (kind < 0.2) & (np.arange(n) > 0)
    flips = np.zeros(n, np.uint64)
    for _ in range(4):
        bit = rng.integers(0, 64, size=n).astype(np.uint64)
        flips |= np.where(rng.random(n) < 0.6, np.uint64(1) << bit, np.uint64(0))
    phash[near] = (phash[src[near]].view(np.uint64) ^ (flips[near] | np.uint64(1))).view(np.int64)
    store = CheckpointStore(out)
    settings = {"datasinks": {"index": {"buckets": buckets, "exact": True, "near": True,
                                        "max_hamming_distance": 4}}}
    for p in range(n // PARTITION_ROWS):
        pid, lo = f"p-{p:06d}", p * PARTITION_ROWS
        rows = list(range(PARTITION_ROWS))
        tables = index.index_tables([f"k{lo + r:09d}" for r in rows], pid, rows,
                                    list(sha[lo:lo + PARTITION_ROWS]),
                                    phash[lo:lo + PARTITION_ROWS].tolist(), spec)
        files = []
        for (k, b), t in sorted(tables.items()):
            rel = index.index_file(k, b, pid, "bench")
            out_stream = fs.HashingOutput(f"{out}/{rel}")
            pq.write_table(t, out_stream)
            out_stream.close()
            files.append(rel)
        store.commit(CommitMarker(partition_id=pid, attempt_id="bench", fingerprint="bench",
                                  files=files, rows_in=PARTITION_ROWS,
                                  rows_by_status={"ok": PARTITION_ROWS}, settings=settings))


def measure(n: int, buckets: int) -> dict:
    from pipeline.dedup.store import DedupStore
    from pipeline.runtime.dedup_pass import run_dedup, union
    from pipeline.spec import DatasetDedupSpec

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/out"
        t0 = time.time()
        synthesize(out, n, buckets)
        made = time.time() - t0
        report = run_dedup(out, DatasetDedupSpec(enabled=True, workers=2))
        store = DedupStore(out)
        markers = store.markers(1)
        rows = sum(m.rows_in for t, m in markers.items() if "-b-" in t)
        t1 = time.time()
        union(store, store.generations()[0])   # again, timed alone (commits nothing new)
        union_s = time.time() - t1
        peak = max(m.peak_rss_bytes for t, m in markers.items() if "-b-" in t)
    return {"rows": n, "buckets": buckets, "index_rows": rows, "synth_s": round(made, 1),
            "pass_s": report.wall_s, "rows_per_s": round(n / report.wall_s),
            "union_s": round(union_s, 2), "duplicates": report.duplicates,
            "peak_actor_rss_mib": round(peak / 2**20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--rows-per-bucket", type=int, default=6250,
                    help="buckets = rows / this (memory per actor follows the bucket)")
    ap.add_argument("--fixed-buckets", type=int, default=16,
                    help="also run every size with this many buckets")
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")

    @ray.remote(num_cpus=1)
    def baseline() -> int:   # an actor process's RSS with the dedup modules imported
        from pipeline.dedup import tasks
        from pipeline.runtime import dedup_pass  # noqa: F401
        return tasks.peak_rss_bytes()

    print(f"baseline worker RSS (dedup modules imported, no task run): "
          f"{ray.get(baseline.remote()) / 2**20:.0f} MiB", flush=True)
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        for buckets in sorted({max(1, n // args.rows_per_bucket), args.fixed_buckets}):
            r = measure(n, buckets)
            results.append(r)
            print(r, flush=True)
    print("\n| rows | buckets | index rows read | pass s | rows/s | union s | duplicates "
          "| peak actor RSS MiB |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['rows']:,} | {r['buckets']} | {r['index_rows']:,} | {r['pass_s']} | "
              f"{r['rows_per_s']:,} | {r['union_s']} | {r['duplicates']:,} | "
              f"{r['peak_actor_rss_mib']} |")
    ray.shutdown()


if __name__ == "__main__":
    main()
