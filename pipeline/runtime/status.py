"""``mmpipe status OUTPUT``: what an output holds, from its plan and commit markers alone.

``output_status(uri)`` reads ``_plan/`` (the partitions and input totals), the commit
markers (``_checkpoints/``), the failure records (``_failures/``) and ``_SUCCESS`` if
there is one; no Ray, no data files. ``format_status`` prints it for people,
``exit_code`` maps it to the command's exit code (``EXIT_*``).
"""

from __future__ import annotations

import collections
import json
from typing import Any

from pipeline.calibration import list_calibrations
from pipeline.dedup.store import summary as dedup_summary
from pipeline.errors import MmpipeError
from pipeline.storage import fs
from pipeline.output import generations
from pipeline.output.checkpoint import CheckpointStore
from pipeline.output.job_lease import current_job_lease
from pipeline.output.layout import OutputLayout
from pipeline.output.layout import is_output
from pipeline.output.plan import read_plan
from pipeline.runtime.cost import format_cost
from pipeline.runtime.report import format_listing, objects_phrase

#: Exit codes of ``mmpipe status``: every planned partition committed (and the rows out
#: equal the records planned); some partition failed (``_failures/``); not an mmpipe
#: output; no failure, but partitions still pending (a running or interrupted job); a file
#: the status needs (plan, commit marker, generation record) cannot be read or parsed.
EXIT_COMPLETE, EXIT_FAILED, EXIT_NOT_AN_OUTPUT, EXIT_INCOMPLETE, EXIT_UNREADABLE = 0, 1, 2, 3, 4


class NotAnOutput(MmpipeError):
    """The location holds neither ``_plan/`` nor ``_checkpoints/``."""


def output_status(output_uri: str) -> dict[str, Any]:
    """The status of an output as a JSON-ready dict.

    Keys: ``output``; ``job`` (the spec's ``name``, from ``_SUCCESS`` or the commit
    markers; None if neither says); ``fingerprint`` (of the committed partitions; None if
    none is committed, a comma-separated list if they disagree); ``complete``;
    ``inputs`` (the plan's totals: ``inputs``, ``rows`` planned, ``unread_by_extension``,
    ..., ``extensions``: the plan's append records; ``not_planned`` and ``missing``: what the
    run that wrote ``_SUCCESS`` for this plan found listing the input: objects not in the
    plan, to add with ``--mode append``, and planned ones gone); ``rows_out``; ``inputs_read`` (records the committed partitions read) and
    ``clips`` (their clip rows; ``video.clips`` makes several rows of one input);
    ``partitions_planned``, ``partitions_committed``,
    ``partitions_failed`` (partition id -> last error), ``partitions_pending``;
    ``rows_by_status``; ``rows_by_flag`` (signal-filter flags, the markers' sum);
    ``dedup`` (``pipeline.dedup.store.summary``: the newest dedup
    generation and the duplicates of the newest complete one; None if the pass never
    ran). All of these describe the newest generation (``pipeline.output.generations``: the
    one a running ``--mode overwrite`` job writes); ``generation`` is its number,
    ``generations`` all numbers present, ``readable_generation`` the newest complete one
    (what ``read_output``/``ls``/``export`` read; None if none is complete); ``runs``:
    committed partitions by the run id that committed them (``""``: not recorded);
    ``writer``: the run that holds the output's job lease now (None if none; its
    ``state``: ``waiting for resources: needs {...}; the cluster has {...} free`` while it
    waits for admission, else "");
    ``calibrations``: the threshold calibrations under ``_calibration/``
    (``pipeline.calibration.list_calibrations``, each with ``stale``: measured on another
    generation than the one readers read); ``table``: the Delta table's version and
    whether it lists every committed partition (``output.table.state``; None if none);
    ``cost``: that run's CPU/GPU-seconds per stage and cost (``runtime.cost``; None if
    not recorded); ``problems``: files read past because they are damaged (``_SUCCESS``; a damaged
    ``_failures/`` record shows as that partition's error). Raises
    ``NotAnOutput`` if there is no ``_plan/``, ``_checkpoints/`` or ``_generations/`` at
    ``output_uri``.
    """
    if not is_output(output_uri):
        raise NotAnOutput(f"{output_uri} is not an mmpipe output (no _plan/ or _checkpoints/)")
    gens = generations.list_generations(output_uri)
    root = gens[-1].root if gens else output_uri      # the newest generation
    readable = generations.newest_complete(gens)
    layout = OutputLayout(root)
    plan = read_plan(root)
    store = CheckpointStore(root)
    markers = store.markers()
    failures = store.failures()
    problems: list[str] = []
    success = _read_json(layout.success, problems)
    total = len(plan) if plan else 0
    rows: dict[str, int] = {}
    flags: collections.Counter = collections.Counter()
    for m in markers.values():
        for k, v in m.rows_by_status.items():
            rows[k] = rows.get(k, 0) + v
        flags.update(m.rows_by_flag)
    inputs = plan.totals() if plan else {}
    last = success if plan and success.get("partitions_total") == total else {}  # this plan's
    inputs.update({k: v for k, v in (last.get("inputs") or {}).items()
                   if k in ("not_planned", "missing")})
    rows_out = sum(m.rows_in for m in markers.values())
    inputs_read = sum(m.inputs for m in markers.values())
    planned_rows = inputs.get("rows")
    fingerprints = sorted({m.fingerprint for m in markers.values()})
    names = sorted({m.job for m in markers.values() if m.job})
    return {
        "output": output_uri,
        "job": success.get("job") or (", ".join(names) if names else None),
        "fingerprint": ", ".join(fingerprints) or success.get("fingerprint"),
        "complete": bool(plan) and not failures and len(markers) == total
        and (planned_rows is None or planned_rows == inputs_read),
        "inputs": inputs,
        "rows_out": rows_out,
        "inputs_read": inputs_read,
        "clips": sum(m.clips for m in markers.values()),
        "partitions_planned": total,
        "partitions_committed": len(markers),
        "partitions_failed": {p: f.get("error", "") for p, f in sorted(failures.items())},
        "partitions_pending": max(0, total - len(markers) - len(failures)),
        "rows_by_status": rows,
        "rows_by_flag": dict(sorted(flags.items())),
        "dedup": dedup_summary(root),
        "generation": gens[-1].number if gens else None,
        "generations": [g.number for g in gens],
        "readable_generation": readable.number if readable else None,
        "runs": dict(sorted(collections.Counter(
            m.ran_on.get("run_id", "") for m in markers.values()).items())),
        "writer": _writer(output_uri),
        "calibrations": _calibrations(output_uri, readable or (gens[-1] if gens else None),
                                      problems),
        "table": _table(output_uri, problems),
        "cost": last.get("cost"),
        "problems": problems,
    }


def _table(output_uri: str, problems: list[str]) -> dict[str, Any] | None:
    """The data table's ``output.table.state`` (version, partitions it lists, committed,
    ``in_step``); None if there is none; an unreadable one is a problem."""
    from pipeline.output.table import state

    try:
        return state(output_uri)
    except Exception as e:  # noqa: BLE001 - a damaged log: named, status goes on
        problems.append(f"Delta table of {output_uri}: {type(e).__name__}: {str(e)[:300]}")
        return None


def _calibrations(output_uri: str, read_gen, problems: list[str]) -> list[dict[str, Any]]:
    """``list_calibrations``, each marked ``stale`` if its generation is not ``read_gen``'s
    (the generation readers read; a calibration of a later overwrite's data is not)."""
    found = list_calibrations(output_uri, problems)
    for c in found:
        c["stale"] = read_gen is not None and c["generation"] != read_gen.number
    return found


def _writer(output_uri: str) -> dict[str, Any] | None:
    """The run holding the output's job lease now (``LeaseRecord`` fields, ``describe``
    as ``holder``), or None when no live run writes it."""
    _, record = current_job_lease(output_uri)
    if record is None or not record.live():
        return None
    return {"run_id": record.run_id, "job": record.job, "host": record.host,
            "pid": record.pid, "holder": record.describe(), "state": record.state}


def _read_json(uri: str, problems: list[str]) -> dict[str, Any]:
    """The JSON object at ``uri``; ``{}`` if there is none, or (with a line added to
    ``problems``) if it is not a JSON object: empty, cut short, damaged."""
    try:
        value = json.loads(fs.read_bytes(uri))
    except FileNotFoundError:
        return {}
    except ValueError as e:          # JSONDecodeError, UnicodeDecodeError
        problems.append(f"unreadable {uri}: {e}"[:500])
        return {}
    if not isinstance(value, dict):
        problems.append(f"unreadable {uri}: a JSON {type(value).__name__}, not an object")
        return {}
    return value


def exit_code(status: dict[str, Any]) -> int:
    """``EXIT_FAILED`` if a partition failed, else ``EXIT_COMPLETE`` when complete, else
    ``EXIT_INCOMPLETE``."""
    if status["partitions_failed"]:
        return EXIT_FAILED
    return EXIT_COMPLETE if status["complete"] else EXIT_INCOMPLETE


def format_status(status: dict[str, Any]) -> str:
    """A few lines for people (``mmpipe status`` without ``--json``)."""
    s, inputs = status, status["inputs"]
    if s["complete"]:
        state = "complete"
    elif s["partitions_failed"]:
        state = f"INCOMPLETE: {len(s['partitions_failed'])} partitions failed"
    else:
        state = f"incomplete: {s['partitions_pending']} partitions pending"
    planned = inputs.get("rows")
    by_status = s["rows_by_status"]
    job = repr(s["job"]) if s["job"] else "(name not recorded)"
    lines = [
        f"job {job}: {state} (fingerprint {s['fingerprint'] or '-'})",
        f"  partitions: {s['partitions_planned']} planned, {s['partitions_committed']} "
        f"committed, {len(s['partitions_failed'])} failed, {s['partitions_pending']} pending",
        f"  input: {objects_phrase(inputs.get('inputs', 0))}, {'?' if planned is None else planned} "
        f"records planned, "
        + (f"{s['inputs_read']} read, {s['clips']} clips, " if s.get("clips") else "")
        + f"{s['rows_out']} rows out",
        "  rows: " + " ".join(f"{k}={by_status.get(k, 0)}" for k in ("ok", "rejected", "error")),
    ]
    if s.get("rows_by_flag"):
        lines.append("  flagged (signal filters): " + ", ".join(
            f"{k}={v}" for k, v in s["rows_by_flag"].items()))
    unread = inputs.get("unread_by_extension") or {}
    if unread:
        lines.append("  not read (unlisted extension or container, unpaired sidecar, not a file): "
                     + ", ".join(f"{ext or '(none)'}={n}" for ext, n in sorted(unread.items())))
    lines += [f"  warning: {w}" for w in inputs.get("warnings", [])]
    lines += format_listing(inputs)
    if s.get("cost"):
        lines.append(format_cost(s["cost"]) + " (the run that wrote _SUCCESS)")
    lines += [f"  FAILED {pid}: {err}" for pid, err in s["partitions_failed"].items()]
    lines += [f"  warning: {p}" for p in s.get("problems") or []]
    d = s.get("dedup")
    if d:
        state = "complete" if d["complete"] else \
            f"incomplete ({d['tasks_committed']} of {d['tasks']} bucket tasks committed)"
        line = (f"  dedup: generation {d['generation']} over {d['partitions']} partitions "
                f"{state}")
        if "duplicates" in d:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(d["by_kind"].items())) or "none"
            line += (f"; {d['duplicates']} duplicates ({kinds}) in generation "
                     f"{d['complete_generation']}")
        lines.append(line)
    if len(s.get("generations") or []) > 1 or (s.get("generation") or 1) > 1:
        lines.append(f"  generation {s['generation']} of {s['generations']}; readers see "
                     f"generation {s['readable_generation'] or '(none complete)'}")
    runs = s.get("runs") or {}
    if runs:
        lines.append("  runs: " + ", ".join(f"{r or '(not recorded)'} ({n} partitions)"
                                            for r, n in runs.items()))
    if s.get("writer"):
        lines.append(f"  running now: {s['writer']['holder']}")
        if s["writer"].get("state"):
            lines.append(f"  {s['writer']['state']}")
    t = s.get("table")
    if t:
        lines.append(f"  Delta table: version {t['version']}, {t['partitions']} of "
                     f"{t['committed']} committed partitions" + (
                         "" if t["in_step"] else f" (behind: run `mmpipe table "
                         f"{s.get('output', 'OUTPUT')}`)"))
    for c in s.get("calibrations") or []:
        lines.append(f"  calibration {c['name']!r} (generation {c['generation']}"
                     f"{', STALE: another generation' if c['stale'] else ''}, target precision "
                     f"{c['target_precision']:g}): {c['uri']}")
        for col, v in c["signals"].items():
            at = ("unreachable" if v["threshold_at_target"] is None else
                  f">= {v['threshold_at_target']:.6g} (recall {v['recall_at_target']:.3f})")
            lines.append(f"    {col}: best F1 {v['best_f1']:.3f} at >= "
                         f"{v['best_f1_threshold']:.6g}; at target precision {at}; "
                         f"{v['used']} labelled, {v['positives']} positive")
    lines.append(f"  output: {s['output']}")
    return "\n".join(lines)
