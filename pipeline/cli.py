"""Command line: ``mmpipe validate | run | metrics | status | ls | gc | spec | dedup |
export | calibrate | submit | logs | stop``.

Exit codes: 0 success; 1 the job ran but some partition failed (named in the report);
2 a bad job spec or unusable input/output, reported before anything runs (``mmpipe run``
checks the input, the output and the models before Ray starts: ``runtime/preflight.py``);
3 the run stopped on a runtime failure, not on the spec: storage kept failing past
``storage.outage_s`` (``EXIT_RUNTIME``; the message names the request; run it again to
resume); ``mmpipe status``: 0 complete, 1 a partition failed, 2 not an output, 3 partitions
pending, 4 a file it needs is damaged. A complete ``resume`` whose input listing grew exits 0
with a warning naming ``--mode append`` (``inputs.not_planned`` in the report and status):
its plan is done, and a non-zero code would make a RayJob or script retry it for ever;
a cron job runs ``--mode append``, which exits 0 when nothing is new.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from pipeline import package_version
from pipeline.errors import MmpipeError, SpecError
from pipeline.spec import load_spec

log = logging.getLogger("pipeline")

EXIT_RUNTIME = 3  # a runtime failure (storage out past storage.outage_s): see the docstring


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="job spec YAML file")
    p.add_argument("--input", help="override source.uri")
    p.add_argument("--output", help="override sink.uri")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any field, e.g. --set source.partition_size=8 (repeatable)")
    p.add_argument("--mode", choices=["resume", "append", "overwrite", "error-if-exists"],
                   help="override runtime.mode")


def _load(args):
    overrides = list(args.set) + ([f"runtime.mode={args.mode}"] if args.mode else [])
    return load_spec(args.spec, overrides, args.input, args.output)


def cmd_validate(args) -> int:
    spec = _load(args)
    from pipeline.assembly import assemble

    pipeline = assemble(spec)
    if args.explain:
        sys.stdout.write(pipeline.explain())
    print(f"{args.spec}: valid (fingerprint {pipeline.fingerprint})")
    return 0


def cmd_run(args) -> int:
    from pipeline.runtime import job_env

    job_env.apply()  # a submitted job's --env values (before anything reads the environment)
    spec = _load(args)
    # models come from local copies only, here as in every worker (runtime_env below)
    os.environ["HF_HUB_OFFLINE"] = "1"
    # no address: a Ray of our own ("local"), never a `ray start` cluster joined unasked
    address = args.address or os.environ.get("RAY_ADDRESS") or "local"
    from pipeline.runtime import local_ray

    # before Ray is imported: it reads some settings then (a local Ray: loopback only)
    local_ray.quiet_env(local=address == "local")
    processes = _processes(args, spec, address)   # started now: they load while we plan
    try:
        return _run(args, spec, address, processes)
    finally:
        if processes is not None:
            processes.close()


def _run(args, spec, address: str, processes) -> int:
    from pipeline.runtime.preflight import preflight

    checked = preflight(spec)  # input, output and models checked before Ray starts (exit 2)
    from pipeline.runtime import local_ray, stops
    from pipeline.runtime.driver import run_job  # heavy (ray): only for commands that need it
    session = report = dedup = None
    try:
        if checked.nothing_to_run and not _dedup_pending(spec):  # all done: no Ray
            return _print_report(run_job(spec), args)
        if processes is not None:
            with stops.on_signals():
                report = run_job(spec, processes=processes)
            return _print_report(report, args)
        from pipeline.assembly import fingerprint
        from pipeline.runtime.executors import new_run_id

        run_id, fp = args.run_id or new_run_id(), fingerprint(spec)
        if address == "local" and (args.dashboard or args.keep_dashboard):
            from pipeline.runtime import local_job   # the driver as a job on a head of its own

            return local_job.run(_local_job_argv(args), job=spec.name, fingerprint=fp,
                                 run_id=run_id, keep=args.keep_dashboard)
        session = local_ray.start(address, dashboard=args.dashboard, verbose=args.verbose,
                                  env_vars={"HF_HUB_OFFLINE": "1"},
                                  metadata={"mmpipe_job": spec.name, "fingerprint": fp,
                                            "run_id": run_id})
        with stops.on_signals():  # after ray.init, whose SIGTERM handler prints a stack dump
            try:
                report = run_job(spec, run_id=run_id)
                if report.complete and spec.dedup.dataset.enabled:  # the dedup pass follows
                    from pipeline.runtime.dedup_pass import run_dedup

                    dedup = run_dedup(spec.sink.uri, spec.dedup.dataset, spec.storage,
                                      lease_s=spec.runtime.lease_s,
                                      lease_renew_s=spec.runtime.lease_renew_s)
            finally:
                local_ray.shutdown(session)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: one line, no traceback, 130/143
        local_ray.shutdown(session)
        if report is not None:  # the stop came after the job had finished: nothing was lost
            return _print_report(report, args)
        print(stops.summary(e), file=sys.stderr)
        return stops.exit_code()
    code = _print_report(report, args)
    if dedup is not None:
        print(dedup.format())
        code = code or (0 if dedup.complete else 1)
    return code


def _local_job_argv(args) -> list[str]:
    """``mmpipe run``'s arguments for ``local_job.run``: the spec's absolute path and the
    options as given, without ``--dashboard``/``--keep-dashboard``."""
    argv = [os.path.abspath(args.spec)]
    for flag, value in (("--input", args.input), ("--output", args.output),
                        ("--mode", args.mode), ("--report-json", args.report_json and
                                                os.path.abspath(args.report_json))):
        argv += [flag, value] if value else []
    argv += [a for s in args.set for a in ("--set", s)]
    return argv + (["--verbose"] if args.verbose else [])


def _processes(args, spec, address: str):
    """``--executor``: ``auto`` is ``processes`` for a local run with no model stage on
    GPUs, no dataset-wide dedup pass and no ``--dashboard`` (Ray's start-up and shutdown,
    4-7 s, would be most of a small job; CPU models load in each worker process), else
    ``ray``. For ``processes``, the worker processes (``executors.ProcessWorkers``),
    already spawning; None for Ray. An explicit ``processes`` that the run cannot honour
    is a ``SpecError`` naming what needs Ray."""
    from pipeline.runtime.executors import ProcessWorkers, needs_ray, new_run_id, planned_workers

    ray_only = [*needs_ray(spec),
                *(["--dashboard"] if args.dashboard or args.keep_dashboard else []),
                *([f"--address {address}"] if address != "local" else [])]
    if args.executor == "processes" and ray_only:
        raise SpecError(f"--executor processes runs partition workers without Ray; this run "
                        f"needs Ray for {', '.join(ray_only)}", "--executor", "processes")
    if args.executor == "ray" or (args.executor == "auto" and ray_only):
        return None

    processes = ProcessWorkers(spec.name, new_run_id(), verbose=getattr(args, "verbose", False))
    processes.prestart(planned_workers(spec, processes))   # at most one per CPU
    return processes


def _dedup_pending(spec) -> bool:
    """True if the spec asks for the dedup pass and no complete generation of it covers
    every committed partition."""
    if not spec.dedup.dataset.enabled:
        return False
    from pipeline.dedup.store import DedupStore
    from pipeline.output.checkpoint import CheckpointStore
    from pipeline.output.generations import read_root

    root = read_root(spec.sink.uri)
    done = DedupStore(root).complete()
    return done is None or CheckpointStore(root).committed_ids() - set(done[0].partitions)


def cmd_dedup(args) -> int:
    """Run or resume the dataset-wide dedup pass over OUTPUT (settings from the job spec
    stored in the output); exit 0 complete, 1 a task failed, 2 no hash index."""
    from pipeline.read import stored_spec
    from pipeline.runtime import local_ray, stops

    try:
        spec = stored_spec(args.output)
    except FileNotFoundError as e:    # not an output, or nothing committed
        print(f"error: {e}", file=sys.stderr)
        return 2
    dataset = spec.dedup.dataset
    if not dataset.enabled:   # before Ray starts
        raise SpecError(f"{args.output}: no hash index: the job ran without "
                        "dedup.dataset.enabled (run it with that set, into a new output)",
                        "dedup.dataset.enabled", False)
    if args.workers:
        dataset = dataset.model_copy(update={"workers": args.workers})
    address = args.address or os.environ.get("RAY_ADDRESS") or "local"
    local_ray.quiet_env(local=address == "local")
    from pipeline.runtime.dedup_pass import run_dedup
    session = local_ray.start(address, verbose=args.verbose)
    try:
        with stops.on_signals():
            report = run_dedup(args.output, dataset, spec.storage,
                               lease_s=spec.runtime.lease_s,
                               lease_renew_s=spec.runtime.lease_renew_s)
    except KeyboardInterrupt:
        local_ray.shutdown(session)
        print("dedup stopped; run `mmpipe dedup` again to resume", file=sys.stderr)
        return stops.exit_code()
    local_ray.shutdown(session)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.format())
    return 0 if report.complete else 1


def cmd_export(args) -> int:
    """Write the committed output (with ``--deduplicated``: its ok rows that survive the
    newest complete dedup pass) as Parquet files under DEST."""
    import pyarrow.dataset as ds

    from pipeline.storage import fs
    from pipeline.read import read_output

    try:
        view = read_output(args.output, deduplicated=args.deduplicated)
    except FileNotFoundError as e:    # not an output, nothing committed, no dedup pass
        print(f"error: {e}", file=sys.stderr)
        return 2
    fsys, path = fs.resolve(args.dest)
    if fs.is_local(args.dest):   # owner-only like the output (storage.local_permissions)
        fs.make_dirs(path)
    ds.write_dataset(view, path, filesystem=fsys, format="parquet",
                     basename_template="part-{i}.parquet",
                     existing_data_behavior="error")
    if fs.is_local(args.dest):
        fs.restrict_local_tree(path)
    print(f"{view.count_rows()} rows written to {args.dest}")
    return 0


def cmd_calibrate(args) -> int:
    """Calibrate signal thresholds on OUTPUT's committed rows against a labels file
    (``pipeline.calibration``): print the table, write ``_calibration/<name>/``. Exit 2
    (nothing written) for a bad labels file, target or name, a signal that is not a numeric
    column, or a location with nothing committed."""
    import pyarrow.compute as pc

    from pipeline import calibration
    from pipeline.read import read_output

    calibration.check_target(args.target_precision)
    labels = calibration.read_labels(args.labels)      # CalibrationError: exit 2, one line
    name = calibration.check_name(args.name) if args.name else \
        calibration.default_name(args.labels)
    signals = list(dict.fromkeys(args.signal or labels.signals()))
    try:    # only the key and the signals, only the labelled rows
        view = read_output(args.output, columns=["key", *(s for s in signals if s != "key")])
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:   # a signal that is not a column of the output
        print(f"error: signals of {args.labels}: {e}", file=sys.stderr)
        return 2
    table = view.to_table(filter=pc.field("key").isin(labels.keys()))
    doc = calibration.calibrate(table, labels, signals, args.target_precision, name,
                                calibration.output_identity(args.output, view.schema))
    uri = calibration.write(args.output, doc)
    print(calibration.format_table(doc))
    print(f"calibration {name!r} written to {uri} (plot: {calibration.PLOT_FILE})")
    return 0


def _print_report(report, args) -> int:
    """Print the job report (and write ``--report-json``); the exit code of ``run``."""
    print(report.format())
    if args.report_json:
        with open(args.report_json, "w") as f:
            json.dump(report.to_dict(), f, indent=1, sort_keys=True)
    return 0 if report.complete else 1


def cmd_metrics(args) -> int:
    from pipeline.runtime import metrics_text

    url = args.url or metrics_text.default_url()
    sys.stdout.write(metrics_text.format_samples(metrics_text.scrape(url)) or
                     f"no mmpipe series at {url} yet (Ray exports every few seconds)\n")
    return 0


def cmd_status(args) -> int:
    from pipeline.runtime import status

    try:
        state = status.output_status(args.output)
    except status.NotAnOutput as e:
        print(f"error: {e}", file=sys.stderr)
        return status.EXIT_NOT_AN_OUTPUT
    except (MmpipeError, OSError, ValueError) as e:  # a damaged marker, plan, record...
        print(f"error: {args.output}: cannot read its status: {type(e).__name__}: "
              f"{str(e)[:1000]}", file=sys.stderr)
        return status.EXIT_UNREADABLE
    print(json.dumps(state, indent=1) if args.json else status.format_status(state))
    return status.exit_code(state)


def cmd_gc(args) -> int:
    """Delete the files no commit marker names, by liveness (``pipeline.output.gc``); exit 2
    (nothing deleted) if OUTPUT is not an mmpipe output."""
    from pipeline.dedup.store import stale_leases as dedup_stale_leases
    from pipeline.dedup.store import unreferenced as dedup_unreferenced
    from pipeline.storage import fs
    from pipeline.output import gc, generations

    min_age_s = args.min_age_s or 0.0
    found = gc.collect(args.output, args.lease_margin_s, min_age_s)  # NotAnOutputError: 2
    old_roots = {g.root for g in found.old_generations}
    roots = [g.root for g in generations.list_generations(args.output)
             if g.root not in old_roots] or [fs.normalize(args.output)]
    clock = gc.storage_clock(args.output)
    for root in roots:   # the dedup pass's files: by its task leases, like attempt files
        garbage, live, young = dedup_unreferenced(root, min_age_s, args.lease_margin_s, clock)
        found.garbage += garbage
        found.live += live
        found.young += young
        found.stale_leases += dedup_stale_leases(root, args.lease_margin_s, clock)
    verb = "would delete" if args.dry_run else "delete"
    for uri in found.garbage:
        print(f"{verb} {uri}")
    for g in found.old_generations:
        print(f"{verb} generation {g.number} ({g.root}): older than the newest complete one")
    if not args.dry_run:
        gc.delete(args.output, found)
    print(f"{len(found.garbage)} unreferenced files{' (dry run)' if args.dry_run else ' deleted'}")
    if found.live:
        print(f"{len(found.live)} unreferenced files of running attempts kept (their lease "
              f"is live or expired less than {args.lease_margin_s:g} s ago)")
    if found.young:
        print(f"{len(found.young)} unreferenced files kept by age (younger than --min-age-s)")
    return 0


def cmd_ls(args) -> int:
    """Print the committed files of an output (named by commit markers), one URI per line;
    exit 2 if OUTPUT is not an mmpipe output."""
    from pipeline.read import committed_files
    from pipeline.output.layout import is_output

    if not is_output(args.output):
        print(f"error: {args.output} is not an mmpipe output (no _plan/ or _checkpoints/)",
              file=sys.stderr)
        return 2
    try:
        files = committed_files(args.output, args.kind)
    except ValueError as e:
        print(f"error: --kind: {e}", file=sys.stderr)
        return 2
    for uri in files:
        print(uri)
    return 0


def cmd_table(args) -> int:
    """Bring OUTPUT's Delta tables in step with its commit markers (``--rebuild``: their
    logs deleted and written again from the markers; ``pipeline.output.table``), under the
    job lease (exit 2 if a run holds it, or OUTPUT is not an mmpipe output)."""
    import uuid

    from pipeline.output import table
    from pipeline.output.job_lease import JobLease
    from pipeline.output.layout import is_output

    if not is_output(args.output):
        print(f"error: {args.output} is not an mmpipe output (no _plan/ or _checkpoints/)",
              file=sys.stderr)
        return 2
    held = JobLease.acquire(args.output, 60.0, 10.0, f"table-{uuid.uuid4().hex[:8]}")
    try:
        done = (table.rebuild if args.rebuild else table.sync)(args.output)
    finally:
        held.release()
    print(f"generation {done['generation']}: {done['partitions']} committed partitions, "
          f"{done['added']} published now (versions: {done['versions'] or 'unchanged'})")
    for kind in table.KINDS:
        uri = table.table_uri(args.output, kind)
        found = table.open_table(uri)
        print(f"  {kind}: {uri} " + (f"(version {found.version()})" if found is not None
                                     else "(none yet)"))
    return 0


def cmd_spec(args) -> int:
    """Print the job spec reference: Markdown (``docs/spec.md``) or, with ``--schema``, the
    JSON Schema of a job spec (``pipeline.spec_doc``)."""
    from pipeline import spec_doc

    if args.schema:
        print(json.dumps(spec_doc.json_schema(), indent=2))
    else:
        sys.stdout.write(spec_doc.markdown())
    return 0


def cmd_submit(args) -> int:
    spec = _load(args)  # a bad spec fails here, before anything is uploaded
    from pipeline.assembly import fingerprint
    from pipeline.runtime import submit

    out = spec.sink.uri
    if "://" not in out and not os.path.isabs(out):
        log.warning("sink.uri %r is relative: on the cluster it resolves inside the job's "
                    "working_dir, which Ray deletes; use an absolute path or s3:// for "
                    "output you keep", out)
    if args.installed and "://" not in spec.source.uri and not os.path.isabs(spec.source.uri):
        log.warning("source.uri %r is relative and --installed uploads only the spec: use an "
                    "absolute path or s3://", spec.source.uri)
    from pipeline.runtime.preflight import submit_checks

    # local paths that the job will see as they are here (exit 2 before any upload)
    submit_checks(spec, head_is_local=submit.is_loopback(args.address) and not args.installed)
    bad = [item for item in args.env if "=" not in item or item.startswith("=")]
    if bad:
        raise submit.SubmitError(f"--env {bad[0]!r}: expected KEY=VALUE")
    env = dict(item.split("=", 1) for item in args.env)
    run_argv = [a for flag, v in (("--input", args.input), ("--output", args.output),
                                  ("--mode", args.mode)) if v for a in (flag, v)]
    run_argv += [a for s in args.set for a in ("--set", s)]
    sub = submit.submit(args.spec, run_argv, address=args.address, working_dir=args.working_dir,
                        installed=args.installed, env=env, job_name=spec.name,
                        submission_id=args.submission_id, output_uri=spec.sink.uri,
                        metadata={"mmpipe_job": spec.name, "fingerprint": fingerprint(spec)},
                        exclude=args.exclude, out=sys.stdout)   # prints what it uploads
    print(f"submitted {sub.submission_id}")
    if env:
        print(f"  env:       {submit.job_env.describe(env)}")
    print(f"  dashboard: {sub.dashboard_url}")
    print(f"  logs:      mmpipe logs {sub.submission_id} --address {sub.address}")
    print(f"  stop:      mmpipe stop {sub.submission_id} --address {sub.address}")
    sys.stdout.flush()
    if not args.wait:
        return 0
    status = submit.wait(submit.client(args.address), sub.submission_id, follow=True,
                         out=sys.stdout)
    print(f"job {sub.submission_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1


def cmd_logs(args) -> int:
    from pipeline.runtime import submit

    jobs = submit.client(args.address)
    if args.follow:
        status = submit.wait(jobs, args.id, follow=True, out=sys.stdout)
        print(f"job {args.id}: {status}")
    else:
        sys.stdout.write(submit.logs(jobs, args.id))
    return 0


def cmd_stop(args) -> int:
    from pipeline.runtime import submit

    jobs = submit.client(args.address)
    was_running = submit.stop(jobs, args.id)
    print(f"job {args.id}: {'stop requested' if was_running else 'not running'}")
    if args.wait:
        print(f"job {args.id}: {submit.wait(jobs, args.id, follow=False)}")
    return 0


def cmd_head(args) -> int:
    from pipeline.runtime import head

    if args.action == "stop":
        print(f"stopped {head.stop(args.temp_dir)} processes of the head of {args.temp_dir}")
        return 0
    if args.action == "address":
        running = head.running(args.temp_dir)
        if running is None:
            raise head.HeadError(f"no head of {args.temp_dir} is running (mmpipe head start)")
        print(running.dashboard_url)
        return 0
    ports = {o: p for o, p in (("dashboard-port", args.dashboard_port),
                               ("dashboard-agent-listen-port", args.agent_port)) if p}
    h = head.start(args.temp_dir, num_cpus=args.num_cpus, ports=ports)
    stop = "mmpipe head stop" + ("" if args.temp_dir == str(head.DEFAULT_DIR)
                                 else f" --temp-dir {args.temp_dir}")
    print(f"head started: --address {h.dashboard_url} (GCS {h.gcs_address}, {args.temp_dir})")
    print(f"  stop it (and no other Ray): {stop}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmpipe", description="mmpipe: multimodal ETL on Ray (images, videos, captions -> "
        "Parquet/WebDataset). Exit codes: 0 ok, 1 a partition failed, 2 bad spec or input/output, "
        "3 stopped on a runtime failure (storage out past storage.outage_s).")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"mmpipe {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a job spec; exit 2 naming the bad field")
    _spec_args(p)
    p.add_argument("--explain", action="store_true", help="print the assembled pipeline: "
                   "datasource, steps with their reads/writes/settings, model stages, "
                   "datasinks, output columns and the fingerprint")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("run", help="run a job on Ray (local, or --address / RAY_ADDRESS)")
    _spec_args(p)
    p.add_argument("--address", help="Ray cluster to join: `auto` (the one this machine is "
                   "part of) or HOST:PORT; `local` starts a new local Ray (default: "
                   "RAY_ADDRESS, else a new local Ray); the log says which")
    p.add_argument("--report-json", help="also write the job report to this file")
    p.add_argument("--dashboard", action="store_true", help="with a local Ray: run the "
                   "driver as a Ray job on a local head with the dashboard (127.0.0.1), so "
                   "its Jobs page shows the job, its metadata and log; prints the job's URL, "
                   "the sign-in token command and the metrics endpoint")
    p.add_argument("--keep-dashboard", action="store_true", help="--dashboard, and keep "
                   "the local head and dashboard up after the job until Ctrl-C")
    p.add_argument("--run-id", help=argparse.SUPPRESS)   # local_job: the run id it chose
    p.add_argument("--executor", choices=["auto", "ray", "processes"], default="auto",
                   help="where partition workers run: `ray` actors, or `processes` of this "
                   "machine without starting Ray (each loads its own CPU copy of the job's "
                   "models; no model on GPUs, no dataset-wide dedup pass, no --dashboard); "
                   "`auto` (default) takes processes for a local run that allows them, "
                   "else Ray")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="debug logging, and worker log lines shown here (else only in the "
                   "log directory printed at start)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("metrics", help="print mmpipe's metrics (ray_mmpipe_*, summed over "
                       "Ray's labels) from a Ray metrics endpoint: the running local Ray's "
                       "of `mmpipe run` by default")
    p.add_argument("url", nargs="?", help="metrics endpoint, e.g. http://127.0.0.1:PORT/metrics "
                   "(the `metrics:` line of `mmpipe run`)")
    p.set_defaults(func=cmd_metrics)
    p = sub.add_parser("status", help="job, fingerprint, committed/failed/pending partitions "
                       "of an output, from its plan and markers; exit 0 complete, 1 a partition "
                       "failed, 2 not an mmpipe output, 3 partitions pending, 4 a file it needs is "
                       "damaged (named)")
    p.add_argument("output", help="output location (sink.uri)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("gc", help="delete output files no commit marker names (failed, lost "
                       "and zombie attempts whose lease expired, older generations); refuses "
                       "a location that is not an mmpipe output (exit 2)")
    p.add_argument("output", help="output location (sink.uri)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    p.add_argument("--lease-margin-s", type=float, default=60.0,
                   help="delete a running attempt's files only once its lease expired this "
                   "many seconds ago (covers clock skew; default 60)")
    p.add_argument("--min-age-s", type=float, default=None,
                   help="also keep unreferenced files modified less than this many seconds "
                   "ago (default 0: leases decide, for attempt files and for the dedup "
                   "pass's _dedup/ files alike)")
    p.set_defaults(func=cmd_gc)
    p = sub.add_parser("ls", help="list the committed output files (named by commit "
                       "markers), one URI per line")
    p.add_argument("output", help="output location (sink.uri)")
    p.add_argument("--kind", help="only the files of one attempt directory: data (Parquet "
                   "data files), quarantine, wds (WebDataset shards), or any other "
                   "datasink's directory (output/layout.py; default: all)")
    p.set_defaults(func=cmd_ls)
    p = sub.add_parser("table", help="bring the output's Delta Lake tables (data, "
                       "quarantine, duplicates) in step with its commit markers")
    p.add_argument("output", help="output location (sink.uri)")
    p.add_argument("--rebuild", action="store_true", help="delete the tables' _delta_log/ "
                   "and write them again from the commit markers")
    p.set_defaults(func=cmd_table)
    p = sub.add_parser("spec", help="print the job spec reference (Markdown, as in "
                       "docs/spec.md) or its JSON Schema")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="the Markdown reference (default)")
    fmt.add_argument("--schema", action="store_true", help="the JSON Schema of a job spec")
    p.set_defaults(func=cmd_spec)
    p = sub.add_parser("dedup", help="run or resume the dataset-wide dedup pass over an "
                       "output written with dedup.dataset.enabled (exact, near, semantic)")
    p.add_argument("output", help="output location (sink.uri)")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a new "
                   "local Ray)")
    p.add_argument("--workers", type=int, help="dedup actors (default: the spec's "
                   "dedup.dataset.workers, else the cluster's CPUs)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="debug logging, and worker log lines shown here")
    p.set_defaults(func=cmd_dedup)
    p = sub.add_parser("export", help="write the committed output as Parquet files "
                       "(--deduplicated: only ok rows that survive the dedup pass)")
    p.add_argument("output", help="output location (sink.uri)")
    p.add_argument("dest", help="directory or s3:// prefix to write (must not hold files)")
    p.add_argument("--deduplicated", action="store_true", help="drop rows the newest "
                   "complete dedup pass found duplicate, and rows whose status is not ok")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("calibrate", help="signal thresholds from labelled rows: precision, "
                       "recall, F1 per threshold, best F1, threshold at a target precision; "
                       "writes OUTPUT/_calibration/NAME/calibration.json and .png")
    p.add_argument("output", help="output location (sink.uri)")
    p.add_argument("--labels", required=True, help="CSV or JSONL file (local or s3://) of "
                   "rows key,signal,label: label true/1/yes = the row has the property the "
                   "signal measures (higher score = more of it; positive iff score >= t)")
    p.add_argument("--target-precision", type=float, default=0.9,
                   help="precision the reported threshold must reach (default 0.9)")
    p.add_argument("--signal", action="extend", nargs="+", metavar="COL",
                   help="calibrate only these signals (default: every signal the labels name)")
    p.add_argument("--name", help="calibration name (default: the labels file's stem; the "
                   "same name replaces that calibration)")
    p.set_defaults(func=cmd_calibrate)
    _job_commands(sub)
    return parser


def _job_commands(sub) -> None:
    address_help = ("Ray dashboard/job API URL, e.g. http://HEAD:8265 (default: "
                    "RAY_API_SERVER_ADDRESS, else http://127.0.0.1:8265); the auth token comes "
                    "from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token")
    p = sub.add_parser("submit", help="submit `mmpipe run SPEC` as a Ray job to a cluster")
    _spec_args(p)
    p.add_argument("--address", help=address_help)
    p.add_argument("--working-dir", help="directory uploaded as the job's working_dir "
                   "(default: the mmpipe checkout holding the current directory)")
    p.add_argument("--installed", action="store_true", help="the cluster image has mmpipe "
                   "installed: upload only the spec (inputs/outputs must be absolute or s3://)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable for the job (repeatable)")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="also leave files matching PATTERN (gitignore syntax) out of the "
                   "working_dir upload (repeatable); credential-looking files (.aws/, .ssh/, "
                   ".ray/, *.pem, *.key, id_rsa*, credentials*, .netrc, *token, ...: "
                   "submit.CREDENTIAL_EXCLUDES) are always left out")
    p.add_argument("--submission-id", help="job id to use (default: mmpipe-<job>-<random>)")
    p.add_argument("--wait", action="store_true",
                   help="follow the logs until the job ends; exit 0 only if it succeeded")
    p.set_defaults(func=cmd_submit)
    p = sub.add_parser("logs", help="print a submitted job's logs (its driver output)")
    p.add_argument("id", help="submission id printed by `mmpipe submit`")
    p.add_argument("--address", help=address_help)
    p.add_argument("--follow", "-f", action="store_true", help="follow until the job ends")
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("stop", help="stop a submitted job (resubmit the spec to resume it)")
    p.add_argument("id", help="submission id printed by `mmpipe submit`")
    p.add_argument("--address", help=address_help)
    p.add_argument("--wait", action="store_true", help="wait until it has stopped")
    p.set_defaults(func=cmd_stop)
    from pipeline.runtime.head import DEFAULT_DIR  # light: no ray

    p = sub.add_parser("head", help="start a Ray head on 127.0.0.1 on free ports for "
                       "`mmpipe submit`, print its --address, or stop it (only it)")
    p.add_argument("action", choices=["start", "address", "stop"])
    p.add_argument("--temp-dir", default=str(DEFAULT_DIR),
                   help=f"the head's Ray temp dir, which names it (default {DEFAULT_DIR})")
    p.add_argument("--num-cpus", type=int, help="CPUs the head offers (default: all)")
    p.add_argument("--dashboard-port", type=int, help="job API port (default: a free one)")
    p.add_argument("--agent-port", type=int,
                   help="dashboard agent HTTP port (default: a free one; Ray's is 52365)")
    p.set_defaults(func=cmd_head)


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
        outage = _storage_gave_up(e)
        if outage is not None:   # the store was out: nothing is wrong with the spec
            print(f"error: the run stopped: storage unavailable past storage.outage_s: "
                  f"{outage}" + ("" if outage is e else f" ({e})"), file=sys.stderr)
            return EXIT_RUNTIME
        print(f"error: {e}", file=sys.stderr)
        return 2


def _storage_gave_up(e: BaseException):
    """The ``StorageError`` that gave up on a storage outage (``gave_up``) among ``e`` and
    the exceptions it was raised from, or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if getattr(e, "gave_up", False):
            return e
        e = e.__cause__ or e.__context__
    return None
