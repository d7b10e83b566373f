"""Where the seconds of a small local run on Ray go (issue 30, point 5): phase by phase, for
Ray's start-up options as they were and as ``pipeline/runtime/local_ray.py`` sets them now.

Each run is a fresh Python process (so imports count) that does what ``mmpipe run
--executor ray`` does, timed per phase:
- ``import``: ``ray`` and ``pipeline.runtime.driver``;
- ``ray.init``: ``local_ray.start("local")`` (a new local Ray, no dashboard);
- ``actor``: the first actor answering a call (a worker process started and connected);
- ``job``: ``run_job`` of the 57 bundled photos (``examples/images.yaml`` without its model
  step and dataset pass) in one partition on one PartitionWorker: plan, worker start,
  read, decode, resize, write, the commit;
- ``shutdown``: ``local_ray.shutdown``.
Variants, alternated ``--reps`` times: ``before`` (``local_ray.SYSTEM_CONFIG = {}``: Ray's
defaults) and ``now`` (``local_ray.SYSTEM_CONFIG`` as shipped). The table gives medians and
the ratio now/before per phase; the load average of the machine is printed with it.

    .venv/bin/python bench/startup.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("import", "ray.init", "actor", "job", "shutdown", "total")


def child(variant: str, out: str) -> None:
    """One run (module docstring), printing its phases as one JSON line."""
    t0 = time.perf_counter()
    marks = {}
    from pipeline.runtime import local_ray

    local_ray.quiet_env(local=True)
    import ray

    from pipeline.runtime.driver import run_job
    from pipeline.spec import load_spec

    marks["import"] = time.perf_counter()
    if variant == "before":
        local_ray.SYSTEM_CONFIG = {}
    session = local_ray.start("local")
    marks["ray.init"] = time.perf_counter()

    @ray.remote(num_cpus=0)
    class Ping:
        def ping(self) -> int:
            return 1

    assert ray.get(Ping.remote().ping.remote()) == 1
    marks["actor"] = time.perf_counter()
    spec = load_spec(REPO / "examples" / "images.yaml",
                     ["text_embedding.enabled=false", "dedup.dataset.enabled=false",
                      "source.partition_size=57", "runtime.num_workers=1"], output_uri=out)
    report = run_job(spec)
    assert report.complete and report.rows_out == 57, report
    marks["job"] = time.perf_counter()
    local_ray.shutdown(session)
    marks["shutdown"] = time.perf_counter()
    last, phases = t0, {}
    for name in PHASES[:-1]:
        phases[name] = round(marks[name] - last, 2)
        last = marks[name]
    phases["total"] = round(last - t0, 2)
    print(json.dumps(phases))


def run_once(variant: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, __file__, "--child", variant,
                               "--out", str(Path(tmp) / "out")], cwd=REPO,
                              capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if done.returncode != 0:
        raise RuntimeError(f"{variant}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", choices=["before", "now"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.out)
        return
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"before": [], "now": []}
    for _ in range(args.reps):
        for variant in runs:
            runs[variant].append(run_once(variant))
    med = {v: {p: statistics.median(r[p] for r in rs) for p in PHASES} for v, rs in runs.items()}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}, after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs; "
          f"medians of {args.reps} runs each (s)")
    print("| phase | before | now | now/before |")
    print("|---|---|---|---|")
    for p in PHASES:
        ratio = med["now"][p] / med["before"][p] if med["before"][p] else float("nan")
        print(f"| {p} | {med['before'][p]:.2f} | {med['now'][p]:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
