"""Command line: ``mmpipe validate | run | status``.

Exit codes: 0 success; 1 the job ran but some partition failed (named in the report);
2 a bad job spec or unusable input/output, reported before anything runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from pipeline.errors import MmpipeError, SpecError
from pipeline.spec import fingerprint, load_spec

log = logging.getLogger("pipeline")


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="job spec YAML file")
    p.add_argument("--input", help="override source.uri")
    p.add_argument("--output", help="override sink.uri")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any field, e.g. --set source.partition_size=8 (repeatable)")
    p.add_argument("--mode", choices=["resume", "overwrite", "error-if-exists"],
                   help="override runtime.mode")


def _load(args):
    overrides = list(args.set) + ([f"runtime.mode={args.mode}"] if args.mode else [])
    return load_spec(args.spec, overrides, args.input, args.output)


def cmd_validate(args) -> int:
    spec = _load(args)
    print(f"{args.spec}: valid (fingerprint {fingerprint(spec)})")
    return 0


def cmd_run(args) -> int:
    spec = _load(args)
    import ray  # heavy: only for commands that need a cluster

    from pipeline.runtime.driver import run_job

    address = args.address or os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}},
             include_dashboard=None if address else False)
    try:
        report = run_job(spec)
    finally:
        ray.shutdown()
    print(report.format())
    if args.report_json:
        with open(args.report_json, "w") as f:
            json.dump(report.to_dict(), f, indent=1, sort_keys=True)
    return 0 if report.complete else 1


def cmd_status(args) -> int:
    from pipeline.io.checkpoint import CheckpointStore
    from pipeline.io.plan import read_plan

    plan = read_plan(args.output)
    markers = CheckpointStore(args.output).markers()
    total = len(plan.partitions) if plan else 0
    rows: dict[str, int] = {}
    for m in markers.values():
        for k, v in m["rows_by_status"].items():
            rows[k] = rows.get(k, 0) + v
    print(json.dumps({"output": args.output, "partitions_planned": total,
                      "partitions_committed": len(markers),
                      "partitions_pending": max(0, total - len(markers)),
                      "rows_by_status": rows}, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmpipe", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a job spec; exit 2 naming the bad field")
    _spec_args(p)
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("run", help="run a job on Ray (local, or --address / RAY_ADDRESS)")
    _spec_args(p)
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a new local Ray)")
    p.add_argument("--report-json", help="also write the job report to this file")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("status", help="committed/pending partitions of an output, from markers")
    p.add_argument("output", help="output location (sink.uri)")
    p.set_defaults(func=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MmpipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
