"""A host whose clock is off: ``python -m tests.output.skewed_host SKEW_S ACTION ARGS...``
(from the repository root) runs ACTION with ``time.time`` (the clock the lease module
reads) moved ``SKEW_S`` seconds; the storage's clock (file mtimes, S3 Last-Modified)
stays real. Prints one JSON line.

- ``acquire OUTPUT``: try to take OUTPUT's job lease; ``{"taken": n}`` or
  ``{"refused": type, "message": ...}``.
- ``gc-loop OUTPUT MARGIN_S STOP_FILE``: ``gc.collect`` + ``gc.delete`` every 0.2 s
  while STOP_FILE does not exist (``STOP_FILE.ready`` is created once it loops);
  ``{"runs": n, "deleted": [...], "kept_live": n}``.
- ``cli ARGS...``: ``pipeline.cli.main(ARGS)`` (its exit status is this process's).
- ``cli-when-leased OUTPUT ARGS...``: wait (up to 120 s) until OUTPUT has a job lease, then
  ``cli ARGS...``.
"""

from __future__ import annotations

import json
import os
import sys
import time

_real_time = time.time


def main(argv: list[str]) -> int:
    skew = float(argv[0])
    time.time = lambda: _real_time() + skew
    action, args = argv[1], argv[2:]
    if action == "acquire":
        from pipeline.errors import PlanError
        from pipeline.output import job_lease

        try:
            held = job_lease.JobLease.acquire(args[0], 60.0, 10.0, "skewed-run", "fp-skewed")
        except PlanError as e:
            print(json.dumps({"refused": type(e).__name__, "message": str(e)}))
            return 0
        held.release()
        print(json.dumps({"taken": held.number}))
        return 0
    if action == "gc-loop":
        from pipeline.output import gc, layout

        out, margin, stop = args[0], float(args[1]), args[2]
        runs, deleted, kept = 0, [], 0
        open(f"{stop}.ready", "w").close()               # imported: the caller may start
        while not os.path.exists(stop):
            if layout.is_output(out):
                found = gc.collect(out, margin_s=margin)
                gc.delete(out, found)
                runs, kept = runs + 1, kept + len(found.live)
                deleted += found.garbage
            time.sleep(0.2)
        print(json.dumps({"runs": runs, "deleted": deleted, "kept_live": kept}))
        return 0
    if action == "cli-when-leased":
        from pipeline.output import job_lease

        deadline = _real_time() + 120
        while job_lease.current_job_lease(args[0])[1] is None and _real_time() < deadline:
            time.sleep(0.05)
        action, args = "cli", args[1:]
    if action == "cli":
        from pipeline import cli

        return cli.main(args)
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
