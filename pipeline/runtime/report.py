"""``JobReport``: what a run did, built from partition outcomes (commit markers)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from pipeline.output.checkpoint import CommitMarker
from pipeline.runtime.cost import format_cost


@dataclasses.dataclass
class JobReport:
    """Partitions done/skipped/failed, rows by status, reason and signal-filter flag
    (``rows_by_flag``, the markers'), throughput, wall time.

    ``records_per_s`` counts rows processed in this run (skipped partitions excluded)
    over ``wall_s`` seconds (planning and model start-up included). ``inputs``: the plan's
    input totals (``PartitionPlan.totals``: inputs and records planned, objects not read
    by extension); ``rows_out``: rows of every committed partition; ``inputs_read``: the
    records (inputs) they read and ``clips``: their clip rows (``video.clips``: one input,
    several rows, so ``rows_out`` may exceed ``inputs_read``). The job is complete
    only when every partition committed and, where the plan knows its records,
    ``inputs_read`` equals them. ``run_id``: this run's id (``executors.new_run_id``), also in
    its actors' Ray namespace (``metrics.job_namespace``) and in the markers' ``ran_on``.
    ``attempt_s``: wall seconds of this run's partition attempts, summed; ``cost``: CPU-
    and GPU-seconds per stage and, with ``runtime.prices``, the cost (``runtime.cost``).
    ``admission_wait_s``: seconds the run waited for its minimum (``admission.admit``);
    ``model_pools``: per model stage its replica count over time and busy fraction
    (``pool_scaler.PoolScaler.report``).
    """

    job: str
    output_uri: str
    fingerprint: str
    plan: str
    partitions_total: int = 0
    partitions_committed: list[str] = dataclasses.field(default_factory=list)
    partitions_skipped: list[str] = dataclasses.field(default_factory=list)
    partitions_failed: dict[str, str] = dataclasses.field(default_factory=dict)
    attempts: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    rows_by_status: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rows_by_reason: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rows_by_flag: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rows_processed: int = 0
    bytes_written: int = 0
    throttled_requests: int = 0
    retried_requests: int = 0
    downloads: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    wall_s: float = 0.0
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    rows_out: int = 0
    inputs_read: int = 0
    clips: int = 0
    model_actors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    model_pools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    admission_wait_s: float = 0.0
    run_id: str = ""
    attempt_s: float = 0.0
    cost: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add_marker(self, marker: CommitMarker, this_run: bool) -> None:
        """Count a committed partition's marker (``this_run``: committed by this run)."""
        self.rows_by_status.update(marker.rows_by_status)
        self.rows_out += marker.rows_in
        self.inputs_read += marker.inputs
        self.clips += marker.clips
        self.rows_by_reason.update(marker.rows_by_reason)
        self.rows_by_flag.update(marker.rows_by_flag)
        if this_run:
            self.partitions_committed.append(marker.partition_id)
            self.rows_processed += marker.rows_in
            self.bytes_written += marker.bytes_written
            self.throttled_requests += marker.throttled_requests
            self.retried_requests += marker.retried_requests
            self.downloads.update(marker.downloads)
        else:
            self.partitions_skipped.append(marker.partition_id)

    @property
    def records_per_s(self) -> float:
        return self.rows_processed / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def complete(self) -> bool:
        planned = self.inputs.get("rows")
        return not self.partitions_failed and (
            len(self.partitions_committed) + len(self.partitions_skipped) == self.partitions_total
        ) and (planned is None or planned == self.inputs_read)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rows_by_status"] = dict(self.rows_by_status)
        d["rows_by_reason"] = dict(sorted(self.rows_by_reason.items()))
        d["rows_by_flag"] = dict(sorted(self.rows_by_flag.items()))
        d["downloads"] = dict(sorted(self.downloads.items()))
        d["partitions_committed"] = sorted(self.partitions_committed)
        d["partitions_skipped"] = sorted(self.partitions_skipped)
        d["records_per_s"] = round(self.records_per_s, 2)
        d["complete"] = self.complete
        return d

    def format(self) -> str:
        """A human-readable summary, a few lines."""
        s = self.rows_by_status
        lines = [
            f"job {self.job!r}: {'complete' if self.complete else 'INCOMPLETE'} "
            f"(fingerprint {self.fingerprint}, plan {self.plan}"
            + (f", run {self.run_id})" if self.run_id else ")"),
            f"  partitions: {self.partitions_total} total, {len(self.partitions_committed)} "
            f"committed now, {len(self.partitions_skipped)} skipped (already committed), "
            f"{len(self.partitions_failed)} failed",
            self._format_inputs(),
            f"  rows: ok={s.get('ok', 0)} rejected={s.get('rejected', 0)} error={s.get('error', 0)}",
        ]
        if self.inputs.get("unread"):
            lines.append("  not read (unlisted extension or container, unpaired sidecar, not a file): "
                         + ", ".join(f"{ext or '(none)'}={n}" for ext, n in
                                     sorted(self.inputs["unread_by_extension"].items())))
        lines += [f"  warning: {w}" for w in self.inputs.get("warnings", [])]
        lines += format_listing(self.inputs)
        if self.rows_by_reason:
            lines.append("  reasons: " + ", ".join(f"{k}={v}" for k, v in
                                                   sorted(self.rows_by_reason.items())))
        if self.rows_by_flag:
            lines.append("  flagged (signal filters): " + ", ".join(
                f"{k}={v}" for k, v in sorted(self.rows_by_flag.items())))
        lines.append(f"  this run: {self.rows_processed} records in {self.wall_s:.1f}s "
                     f"({self.records_per_s:.1f} records/s), {self.bytes_written / 2**20:.1f} MiB written, "
                     f"{self.retried_requests} storage requests retried "
                     f"({self.throttled_requests} throttled)")
        if self.downloads:
            d = self.downloads
            failed = ", ".join(f"{k.split(':', 1)[1]}={v}" for k, v in sorted(d.items())
                               if k.startswith("failed:"))
            lines.append(f"  downloads: {d.get('fetches', 0)} URLs, {d.get('ok', 0)} ok "
                         f"({d.get('bytes', 0) / 2**20:.1f} MiB), {d.get('requests', 0)} requests "
                         f"({d.get('retries', 0)} retries)" + (f"; failed: {failed}" if failed else ""))
        lines += [format_model_actor(a) for a in self.model_actors]
        lines += [format_model_pool(p) for p in self.model_pools]
        if self.admission_wait_s >= 0.05:   # a placement at once takes a few ms
            lines.append(f"  waited {self.admission_wait_s:.1f}s for resources before admission")
        if self.cost:
            lines.append(format_cost(self.cost))
        for pid, err in sorted(self.partitions_failed.items()):
            lines.append(f"  FAILED {pid}: {err}")
        lines.append(f"  output: {self.output_uri}")
        return "\n".join(lines)


    def _format_inputs(self) -> str:
        planned = self.inputs.get("rows")
        return (f"  input: {objects_phrase(self.inputs.get('inputs', 0))}, "
                f"{'?' if planned is None else planned} records planned, "
                + (f"{self.inputs_read} read, {self.clips} clips, " if self.clips else "")
                + f"{self.rows_out} rows out")


def format_listing(inputs: dict[str, Any]) -> list[str]:
    """Report lines on the plan's extensions and on the last listing's comparison with
    the plan (``PartitionPlan.totals``: ``extensions``, ``not_planned``, ``missing``)."""
    lines = [f"  plan extension {e['extension']} ({e['created_at']}): "
             f"{objects_phrase(e['objects'])}, partitions {e['first_partition']}.."
             f"{e['last_partition']}" for e in inputs.get("extensions") or []]
    if inputs.get("not_planned"):
        lines.append(f"  warning: {objects_phrase(inputs['not_planned'])} listed under the "
                     "input are not in the plan and were not read; run again with "
                     "--mode append to plan them as new partitions")
    if inputs.get("missing"):
        lines.append(f"  warning: planned objects no longer listed: {inputs['missing']} "
                     "(read as input_missing error rows)")
    return lines


def objects_phrase(n: int) -> str:
    """``1 object`` / ``57 objects``: the input objects planned (media files, shards or
    manifest files; a manifest's rows are records, not objects)."""
    return f"{n} object{'' if n == 1 else 's'}"


def format_model_pool(pool: dict[str, Any]) -> str:
    """One report line per model stage: its replicas over time (``at_s``: ``n``) and busy
    fraction, e.g. ``model stage captioning (replicas 1..2): 1 at 0s, 2 at 6.1s, 1 at 20.3s;
    busy 71.0% of its replicas' time``."""
    changes = ", ".join(f"{t['replicas']} at {t['at_s']:g}s" for t in pool["timeline"])
    busy = pool.get("busy_fraction")
    return (f"  model stage {pool['stage']} (replicas {pool['min']}..{pool['max']}): "
            f"{changes}" + ("" if busy is None else f"; busy {busy:.1%} of its replicas' time"))


def format_model_actor(stats: dict[str, Any]) -> str:
    """One report line per model actor: throughput, busy share, queue wait."""
    if "busy_fraction" not in stats:  # an actor that predates serving stats
        return f"  model {stats.get('name', '?')}: {stats.get('records', 0)} records"
    idle = stats.get("idle_fraction")
    waited = f", waited for input {idle:.0%} of the time" if idle is not None else ""
    return (f"  model {stats['name']} ({stats.get('description', '')}): {stats['records']} "
            f"records in {stats['batches']} batches (mean {stats['mean_batch_rows']} rows), "
            f"{stats['records_per_s']:.1f} records/s, busy {stats['busy_fraction']:.0%}{waited}, "
            f"queue wait mean {stats['queue_wait_mean_s'] * 1000:.1f} ms" + _media(stats)
            + _windows(stats))


def _windows(stats: dict[str, Any]) -> str:
    """``; 12 frame windows (48 frames)`` for a multi-frame model (``FrameWindows``)."""
    if not stats.get("frame_windows"):
        return ""
    return f"; {stats['frame_windows']} frame windows ({stats['window_frames']} frames)"


def _media(stats: dict[str, Any]) -> str:
    """``; images decoded on the device N, ...`` for an actor that decoded images
    (``decode.device: cuda``; ``models.media`` counters), else empty."""
    keys = ("media_actor_cpu_decoded", "media_worker_decoded", "media_decode_errors",
            "media_images_encoded")
    seen = stats.get("media_device_decoded", 0) + sum(
        sum((stats.get(k) or {}).values()) for k in keys)
    if not seen:  # a ``cpu`` job's actor: the workers sent decoded arrays only
        return ""

    def counts(key: str) -> str:
        by = stats.get(key) or {}
        return f"{sum(by.values())}" + (f" ({', '.join(f'{k} {v}' for k, v in sorted(by.items()))})"
                                        if by else "")

    return (f"; images decoded on the device {stats['media_device_decoded']}, in the actor by "
            f"Pillow {counts('media_actor_cpu_decoded')}, on the workers "
            f"{counts('media_worker_decoded')}, undecodable {counts('media_decode_errors')}, "
            f"output images encoded {counts('media_images_encoded')}")
