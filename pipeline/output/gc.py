"""``mmpipe gc``: delete what no commit marker names, by liveness, not age.

In every generation of an output (``pipeline.output.generations``) an attempt file
(``data/``, ``quarantine/``, ``wds/``, ``_index/``) is garbage when no commit marker names
it and its attempt holds no live lease (``pipeline.output.lease``: none, or expired more than
``margin_s`` seconds ago). The order of the listings makes this safe against a running
job: attempt files first, then attempt leases, then markers. An attempt writes its lease
before its first file and removes it only after its marker exists (or after deleting its
own files), so a file listed without a lease belongs to an attempt that has ended, and
its marker, if any, is in the later listing. A zombie whose lease expired may still be
running: it refuses to commit once its lease has run out (``AttemptLease.check``), and a
commit verifies every file it names (``checkpoint.verify_files``).

Only files of mmpipe's own layout are candidates (``layout.owned_files``:
``<root>/<pid>/a-<attempt>/...`` and ``_index/<kind>/b-<n>/<pid>.a-<attempt>.parquet``): a
user's ``data/labels.csv`` or ``data/raw/notes.txt``, a complete output nested under
``data/``, and whatever a symbolic link under ``data/`` points at are never listed, so
never deleted.

Leases are judged by the storage's clock (``lease.StorageClock``, measured once per
``collect`` with a probe file in ``_job/``; a lease lasts from its file's mtime /
``Last-Modified``): a gc host whose clock runs ahead does not see a live attempt's lease
as expired. ``min_age_s`` is measured on the same clock.

Generations older than the newest complete one are deleted (``generations.
delete_generation``: their own files only; a job that completed an overwrite does this
itself; gc finishes it if that job was interrupted). A location that is not an mmpipe
output is refused (``NotAnOutputError``) before anything is listed for deletion.
"""

from __future__ import annotations

import dataclasses

from pipeline.errors import PlanError
from pipeline.output import generations, lease
from pipeline.output.checkpoint import CheckpointStore
from pipeline.output.layout import (
    JOB_LEASE_DIR,
    OutputLayout,
    attempt_of,
    attempt_root_names,
    is_output,
    owned_files,
)
from pipeline.storage import fs

#: Seconds an attempt lease must have been expired before gc deletes the attempt's files
#: (covers a renewal in flight and a store's whole-second Last-Modified; leases are judged
#: by the storage's clock, so host clock skew needs no margin).
LEASE_MARGIN_S = 60.0


class NotAnOutputError(PlanError):
    """The location holds no mmpipe output (no ``_plan/``, ``_checkpoints/`` or
    ``_generations/``): gc refuses to delete anything there."""


@dataclasses.dataclass
class Collected:
    """What gc found: ``garbage`` (file URIs to delete), ``live`` (unreferenced files of
    attempts whose lease is live: kept), ``young`` (unreferenced files kept by
    ``min_age_s``), ``stale_leases`` (expired attempt leases, deleted after their files),
    ``old_generations`` (generations older than the newest complete one)."""

    garbage: list[str] = dataclasses.field(default_factory=list)
    live: list[str] = dataclasses.field(default_factory=list)
    young: list[str] = dataclasses.field(default_factory=list)
    stale_leases: list[str] = dataclasses.field(default_factory=list)
    old_generations: list[generations.Generation] = dataclasses.field(default_factory=list)


def storage_clock(output: str) -> lease.StorageClock:
    """The storage's clock of ``output`` (a probe file in ``_job/``, deleted at once)."""
    return lease.StorageClock.measure(fs.join(fs.normalize(output), JOB_LEASE_DIR))


def collect_root(root: str, margin_s: float = LEASE_MARGIN_S, min_age_s: float = 0.0,
                 into: Collected | None = None, clock: lease.StorageClock | None = None
                 ) -> Collected:
    """Sort the unreferenced attempt files of the generation root ``root`` (see the
    module docstring; ``min_age_s``: also keep files modified less than that many
    seconds ago; ``clock``: the storage's, measured here if None). Raises ``CommitError``
    for an unreadable marker."""
    out = into or Collected()
    layout = OutputLayout(root)
    roots = generations.attempt_roots_of(layout.root)
    files = owned_files(layout.root, roots, tops=attempt_root_names(roots))      # 1. files
    clock = clock or storage_clock(generations.output_of(layout.root))
    now = clock.now()               # the storage's, taken before the leases are listed
    leases = lease.attempt_leases(layout.root)                                    # 2. leases
    named = {layout.uri(f) for m in CheckpointStore(layout.root).markers().values()
             for f in m.files}                                                     # 3. markers
    prefix = layout.root.rstrip("/") + "/"
    for e in files:
        if e.uri in named:
            continue
        key = attempt_of(e.uri[len(prefix):], roots) if e.uri.startswith(prefix) else None
        if key is None:             # owned_files lists attempt files only: never reached
            continue
        held = key in leases and (leases[key] is None or not leases[key].expired_by(now,
                                                                                   margin_s))
        if held:
            out.live.append(e.uri)
        elif min_age_s and e.mtime_s is not None and e.mtime_s > now - min_age_s:
            out.young.append(e.uri)
        else:
            out.garbage.append(e.uri)
    out.stale_leases += [fs.join(layout.root, lease.attempt_lease_rel(*k))
                         for k, rec in leases.items()
                         if rec is not None and rec.expired_by(now, margin_s)]
    return out


def collect(output: str, margin_s: float = LEASE_MARGIN_S, min_age_s: float = 0.0
            ) -> Collected:
    """``collect_root`` over every generation of ``output``, plus the generations older
    than its newest complete one. Raises ``NotAnOutputError`` if ``output`` is not an
    mmpipe output."""
    if not is_output(output):
        raise NotAnOutputError(f"{output} is not an mmpipe output (no _plan/, _checkpoints/ "
                               "or _generations/): gc deletes nothing there")
    gens = generations.list_generations(output)
    done = generations.newest_complete(gens)
    found = Collected()
    clock = storage_clock(output)
    for g in gens:
        if done is not None and g.number < done.number:
            found.old_generations.append(g)
        else:
            collect_root(g.root, margin_s, min_age_s, found, clock)
    if not gens:                 # markers without a plan (an output from before plans)
        collect_root(output, margin_s, min_age_s, found, clock)
    return found


def delete(output: str, found: Collected) -> None:
    """Delete ``found.garbage``, then the stale leases, then the old generations."""
    for uri in found.garbage:
        fs.delete_file(uri)
    for uri in found.stale_leases:
        fs.delete_file(uri)
    for g in found.old_generations:
        generations.delete_generation(output, g)


def unreferenced_files(output_uri: str, min_age_s: float = 0.0,
                       margin_s: float | None = None) -> list[str]:
    """URIs of the attempt files ``mmpipe gc`` would delete (``pipeline.output.gc``): named by
    no commit marker, of attempts without a live lease (expired more than ``margin_s``
    seconds ago; default ``gc.LEASE_MARGIN_S``), last modified at least ``min_age_s``
    seconds ago. Raises ``NotAnOutputError`` if ``output_uri`` is not an mmpipe output."""
    return unreferenced_by_age(output_uri, min_age_s, margin_s)[0]


def unreferenced_by_age(output_uri: str, min_age_s: float, margin_s: float | None = None
                        ) -> tuple[list[str], list[str]]:
    """``(garbage, kept)``: ``unreferenced_files`` and the unreferenced files kept
    (a live lease, or younger than ``min_age_s``)."""
    found = collect(output_uri, LEASE_MARGIN_S if margin_s is None else margin_s, min_age_s)
    return found.garbage, found.live + found.young
