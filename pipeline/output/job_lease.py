"""The job lease: one writer per output (``<output>/_job/lease-<n>.json``).

A job takes the lease by creating the next number exclusively (S3 ``If-None-Match: *``,
local ``os.link``: the commit marker's mechanism), so of two jobs exactly one holds it;
the holder is the newest number. A live lease (``LeaseRecord.live``: not released, not
expired, its process not known dead) refuses every other job, a resume of the same spec
included, naming the holder (``OutputBusy``). The driver renews it every
``runtime.lease_renew_s``; a newer lease means it was taken over (``JobLease.lost``). A
worker commits only while its run holds it (``check_job_lease``), so no other run's
marker can enter the output while a job writes. See ``pipeline.output.lease``.

Liveness is judged by the storage's clock (``lease.StorageClock``, probed in ``_job/``):
the holder's last renewal is the lease file's mtime / ``Last-Modified``, so a driver whose
clock runs ahead cannot see a live lease as expired; a driver more than
``lease.MAX_CLOCK_SKEW_S`` off the storage's clock is refused (``ClockSkewError``).
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
import time

from pipeline.errors import CommitError, PlanError
from pipeline.output import layout
from pipeline.storage import fs
from pipeline.output.lease import (MAX_CLOCK_SKEW_S, LeaseRecord, Renewer, StorageClock,
                                   holder_record, put_atomic, read_lease)

log = logging.getLogger(__name__)

JOB_LEASE_DIR = layout.JOB_LEASE_DIR
_JOB_NAME = re.compile(r"lease-(\d{6,})\.json$")


class OutputBusy(PlanError):
    """Another job holds the output's job lease (the message names it)."""


def _job_lease_entries(output: str) -> list[tuple[int, fs.FileEntry]]:
    """``(number, listed file)`` of every job lease file of ``output``, oldest first."""
    found = []
    for e in fs.list_files(fs.join(fs.normalize(output), JOB_LEASE_DIR)):
        m = _JOB_NAME.search(posixpath.basename(e.uri))
        if m and ".tmp-" not in e.uri:
            found.append((int(m.group(1)), e))
    return sorted(found, key=lambda x: x[0])


def _job_leases(output: str) -> list[tuple[int, str]]:
    """``(number, uri)`` of every job lease file of ``output``, oldest first."""
    return [(n, e.uri) for n, e in _job_lease_entries(output)]


def current_job_lease(output: str) -> tuple[int, LeaseRecord | None]:
    """``(number, record)`` of the newest job lease of ``output``; ``(0, None)`` if none.
    The record's ``stored_at`` is the file's mtime / ``Last-Modified`` from the listing
    (judge it with ``LeaseRecord.live_by``)."""
    leases = _job_lease_entries(output)
    if not leases:
        return 0, None
    n, entry = leases[-1]
    record = read_lease(entry.uri)
    if record is not None:
        record.stored_at = entry.mtime_s
    return n, record


def storage_clock(output: str, max_skew_s: float | None = MAX_CLOCK_SKEW_S) -> StorageClock:
    """The storage's clock of ``output`` (a probe in ``_job/``); ``ClockSkewError`` if this
    host's is more than ``max_skew_s`` off (None: not checked)."""
    return StorageClock.measure(fs.join(fs.normalize(output), JOB_LEASE_DIR), max_skew_s)


def busy_message(output: str, holder: LeaseRecord) -> str:
    """Why ``output`` is refused while ``holder`` holds its job lease."""
    return (f"{output}: another job writes to this output ({holder.describe()}); one writer "
            "per output: wait for it to finish, stop it, or (if it crashed on another host) "
            "wait until its lease expires")


def check_free(output: str) -> None:
    """Raise ``OutputBusy`` naming the holder if a live job lease holds ``output`` (judged
    by the storage's clock; ``ClockSkewError`` if this host's is too far off it). Writes
    nothing when no lease is held."""
    _, holder = current_job_lease(output)
    if holder is None or holder.released or holder.holder_gone():
        return
    if holder.live_by(storage_clock(output).now()):
        raise OutputBusy(busy_message(output, holder))


class JobLease:
    """The job lease of one output, held by this process (``acquire``)."""

    def __init__(self, output: str, number: int, record: LeaseRecord, lease_s: float):
        self.output = fs.normalize(output)
        self.number, self.record, self.lease_s = number, record, lease_s
        self.uri = fs.join(self.output, JOB_LEASE_DIR, f"lease-{number:06d}.json")
        self.lost = threading.Event()
        self._renewer: Renewer | None = None

    @classmethod
    def acquire(cls, output: str, lease_s: float, renew_s: float, run_id: str,
                fingerprint: str = "", job: str = "") -> "JobLease":
        """Take the job lease of ``output`` and start renewing it every ``renew_s``
        seconds. Raises ``OutputBusy`` naming the holder if a live lease exists (a resume
        of the same spec included; judged by the storage's clock), or another job took it
        at the same moment; ``ClockSkewError`` if this host's clock is more than
        ``MAX_CLOCK_SKEW_S`` off the storage's (measured before anything is decided)."""
        clock = storage_clock(output)
        n, holder = current_job_lease(output)
        if holder is not None and holder.live_by(clock.now()):
            raise OutputBusy(busy_message(output, holder))
        record = holder_record("job", lease_s, run_id=run_id, fingerprint=fingerprint, job=job)
        lease = cls(output, n + 1, record, lease_s)
        if not fs.create_exclusive(lease.uri, record.to_json()):
            _, winner = current_job_lease(output)
            raise OutputBusy(busy_message(output, winner or record))
        for old, uri in _job_leases(output):
            if old < n:                                   # keep the last holder's record
                fs.delete_file(uri)
        lease._renewer = Renewer(lease.renew, renew_s, f"job-lease-{run_id}")
        return lease

    def renew(self) -> None:
        """Push the expiry on; if a newer lease exists (this one expired and another job
        took over), stop and set ``lost``."""
        newest, _ = current_job_lease(self.output)
        if newest != self.number:
            if not self.lost.is_set():
                log.error("%s: the job lease was taken over (lease %d is newer than ours, "
                          "%d): this run's commits are refused", self.output, newest, self.number)
            self.lost.set()
            return
        now = time.time()
        self.record = self.record.model_copy(update={"renewed_at": now,
                                                     "expires_at": now + self.lease_s})
        put_atomic(self.uri, self.record.to_json())

    def set_generation(self, generation: int) -> None:
        """Record the generation this job writes (shown when another job is refused)."""
        self.record = self.record.model_copy(update={"generation": generation})
        put_atomic(self.uri, self.record.to_json())

    def set_state(self, state: str) -> None:
        """Record what the run waits for (``""``: nothing), shown by ``mmpipe status``;
        written only when it changes."""
        if state != self.record.state:
            self.record = self.record.model_copy(update={"state": state})
            put_atomic(self.uri, self.record.to_json())

    def held(self) -> bool:
        """True if this lease is still the newest, not released and not expired (by the
        storage's clock)."""
        n, rec = current_job_lease(self.output)
        if n != self.number or rec is None:
            return False
        return not rec.expired_by(storage_clock(self.output, max_skew_s=None).now())

    def release(self) -> None:
        """Stop renewing; mark the lease released (it stays as the last holder's record)."""
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        if self.lost.is_set():
            return
        now = time.time()
        self.record = self.record.model_copy(update={"released": True, "renewed_at": now,
                                                     "expires_at": now})
        try:
            put_atomic(self.uri, self.record.to_json())
        except OSError as e:   # one line: an outage is no bug (it expires by itself)
            log.warning("could not release the job lease %s: %s", self.uri, e)


def check_job_lease(output: str, run_id: str, fingerprint: str) -> None:
    """Raise ``CommitError`` unless the newest job lease of ``output`` is held by
    ``run_id`` with ``fingerprint`` and not released (a worker checks before it commits:
    no run but the lease holder adds a marker)."""
    _, rec = current_job_lease(output)
    if rec is None or rec.run_id != run_id or rec.released:
        who = "nobody" if rec is None else rec.describe() + (" (released)" if rec.released else "")
        raise CommitError(f"{output}: run {run_id} does not hold the job lease (holder: "
                          f"{who}); not committing")
    if rec.fingerprint and rec.fingerprint != fingerprint:
        raise CommitError(f"{output}: the job lease is for fingerprint {rec.fingerprint}, "
                          f"this attempt has {fingerprint}; not committing")
