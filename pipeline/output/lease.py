"""Leases in the output store: who is alive, without a coordinator.

Two kinds, both small JSON files (``LeaseRecord``) that their holder renews from a
background thread (``Renewer``) every ``renew_s`` seconds, each renewal pushing
``expires_at`` to ``now + lease_s``:

- an **attempt lease**, ``<generation>/_leases/<pid>.<attempt>.json``: a running partition
  attempt (``AttemptLease``, written before its first output file, deleted after its
  commit or its clean-up). ``mmpipe gc`` deletes an attempt's files only once its lease
  expired more than a margin ago (``pipeline.output.gc``); the attempt itself commits only
  while its lease still has time left (``AttemptLease.check``), so a zombie never names a
  file that gc may have deleted.
- the **job lease**, ``<output>/_job/lease-000001.json``: one writer per output
  (``pipeline.output.job_lease.JobLease``). Taken with an exclusive create of the next number (S3
  ``If-None-Match: *``, local ``os.link``: the commit marker's mechanism), so of two jobs
  exactly one holds it; the holder is the newest number. A live lease (not released, not
  expired, its process not known dead) refuses every other job, naming the holder. A
  worker's commit checks that the newest job lease is its run's
  (``job_lease.check_job_lease``).

A holder on this host whose process is gone (pid not running, or a pid reused by another
process) is dead at once: a resume right after ``kill -9`` of the driver does not wait
for the lease to expire.

**Whose clock.** ``started_at``/``renewed_at``/``expires_at`` are Unix seconds of the
writer's clock, shown in messages; nobody else compares them with their own clock. A
lease is judged against the storage's clock (``StorageClock``): it lasts
``duration_s()`` (``expires_at - renewed_at``, one clock's difference, so skew-free) from
its ``stored_at`` (the file's mtime, the object's ``Last-Modified``: the storage's time of
the last renewal), and ``expired_by(storage_now)`` compares that with the storage's now
(the mtime of a probe file this host just wrote, carried forward by this host's elapsed
time). A host whose clock is more than ``MAX_CLOCK_SKEW_S`` off the storage's is refused
the job lease (``ClockSkewError``). (Skewed clocks made a driver 300 s ahead take over a
live job's output, and a gc host 120 s ahead delete every running attempt's files.)
"""

from __future__ import annotations

import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import CommitError, PlanError
from pipeline.output import layout
from pipeline.storage import fs

log = logging.getLogger(__name__)

ATTEMPT_LEASE_DIR = layout.ATTEMPT_LEASE_DIR
#: Most seconds this host's clock may be off the storage's before it is refused the job
#: lease (``StorageClock.measure``). Leases are judged by the storage's clock, so skew
#: does not decide who holds what; a host this far off has a broken clock (NTP keeps
#: hosts within milliseconds), and its own times (messages, ``--min-age-s``) would mislead.
MAX_CLOCK_SKEW_S = 30.0
#: Clock probes (``StorageClock.measure``): ``<dir>/clock-<hex>.probe``, deleted at once.
PROBE_SUFFIX = ".probe"


class ClockSkewError(PlanError):
    """This host's clock is more than the allowed skew off the storage's (the message
    gives both and the difference)."""


def _mtime_s(uri: str) -> float | None:
    """Last-modified time of the file at ``uri`` in Unix seconds as the storage records it
    (local: ``st_mtime`` set by the file system; S3: ``Last-Modified``, whole seconds);
    None if there is no file. Raises ``StorageError``."""
    if fs.is_local(uri):
        try:
            return os.stat(fs.uri_to_bytes(fs.resolve(uri)[1])).st_mtime
        except (FileNotFoundError, NotADirectoryError):
            return None
    import pyarrow.fs as pafs

    fsys, path = fs.resolve(uri)
    info = fs.with_retries(uri, "stat", lambda: fsys.get_file_info(path))
    if info.type != pafs.FileType.File or info.mtime_ns is None:
        return None
    return info.mtime_ns / 1e9


class StorageClock:
    """The storage's clock, seen from this host: ``offset_s`` (storage minus host, seconds)
    measured once by ``measure``; ``now()`` is the storage's time now (this host's clock
    plus the offset: elapsed time is measured here, skew-free)."""

    def __init__(self, offset_s: float, where: str = ""):
        self.offset_s, self.where = offset_s, where

    def now(self) -> float:
        """The storage's time now, Unix seconds."""
        return time.time() + self.offset_s

    @classmethod
    def measure(cls, directory: str, max_skew_s: float | None = None) -> StorageClock:
        """Write a probe file under ``directory`` (``clock-<hex>.probe``), read its mtime
        (the storage's time of the write), delete it; the offset is that mtime minus the
        midpoint of this host's clock around the write. On a store whose
        ``Last-Modified`` has whole seconds (S3) both this probe and a lease's
        ``stored_at`` read up to 1 s early, so a judgement is good to about 1 s: keep
        ``gc --lease-margin-s`` above that. ``max_skew_s``: raise ``ClockSkewError`` if the
        host's clock is off by more (plus the write's duration). Raises
        ``StorageError``/``OSError``."""
        uri = fs.join(fs.normalize(directory), f"clock-{uuid.uuid4().hex}{PROBE_SUFFIX}")
        t0 = time.time()
        fs.write_bytes(uri, b"")
        t1 = time.time()
        try:
            stored = _mtime_s(uri)
        finally:
            fs.delete_file(uri)
        offset = 0.0 if stored is None else stored - (t0 + t1) / 2
        clock = cls(offset, directory)
        if max_skew_s is not None and abs(offset) > max_skew_s + (t1 - t0):
            raise ClockSkewError(clock.skew_message(max_skew_s))
        return clock

    def skew_message(self, max_skew_s: float) -> str:
        """Why this host is refused: its clock, the storage's, the difference."""
        def utc(t: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        host = time.time()
        way = "ahead of" if self.offset_s < 0 else "behind"
        return (f"host {socket.gethostname()}: its clock ({utc(host)}) is "
                f"{abs(self.offset_s):.0f} s {way} the storage's ({utc(host + self.offset_s)}, "
                f"measured at {self.where}); more than {max_skew_s:g} s off: refused (leases "
                "are judged by the storage's clock; sync this host's clock, e.g. NTP)")


def _process_started_at(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - no psutil, no such process: unknown
        return None


class LeaseRecord(BaseModel):
    """A lease file. ``kind``: ``job`` or ``attempt``; ``host``, ``pid``,
    ``pid_started_at`` (process start, Unix s): the holder process; ``run_id``: the
    driver's run id (job leases, and attempts run by a driver); ``partition_id`` /
    ``attempt_id`` (attempt leases); ``fingerprint``, ``job``, ``generation``, ``state``
    (job leases; ``state``: what the run waits for, e.g. ``waiting for resources: ...``,
    "" while it runs). ``started_at``, ``renewed_at``, ``expires_at``: Unix seconds; ``released``:
    the holder let it go (a job lease is kept, released, as the last holder's record)."""

    model_config = ConfigDict(extra="ignore")

    kind: str
    host: str = ""
    pid: int = 0
    pid_started_at: float | None = None
    run_id: str = ""
    partition_id: str = ""
    attempt_id: str = ""
    fingerprint: str = ""
    job: str = ""
    generation: int = 0
    state: str = ""
    started_at: float = 0.0
    renewed_at: float = 0.0
    expires_at: float = 0.0
    released: bool = False
    token: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    #: Where it was read: the file's mtime / ``Last-Modified`` (the storage's clock, Unix
    #: s); None when not known. Not stored in the file.
    stored_at: float | None = Field(None, exclude=True)

    def duration_s(self) -> float:
        """Seconds the last renewal lasts (``expires_at - renewed_at``: both of the
        writer's clock, so their difference holds whatever its skew)."""
        return max(0.0, self.expires_at - self.renewed_at)

    def expired_by(self, storage_now: float, margin_s: float = 0.0) -> bool:
        """True if released, or the last renewal (``stored_at + duration_s()``) plus
        ``margin_s`` is before ``storage_now`` (the storage's clock, ``StorageClock.now``).
        Without ``stored_at`` it falls back to ``expired(storage_now, margin_s)``."""
        if self.released:
            return True
        if self.stored_at is None:
            return self.expired(storage_now, margin_s)
        return self.stored_at + self.duration_s() + margin_s < storage_now

    def live_by(self, storage_now: float, margin_s: float = 0.0) -> bool:
        """``live`` judged by the storage's clock: not ``expired_by(storage_now,
        margin_s)`` and not held by a process known to be gone."""
        return not self.expired_by(storage_now, margin_s) and not self.holder_gone()

    def expired(self, now: float | None = None, margin_s: float = 0.0) -> bool:
        """True if released, or ``expires_at + margin_s`` is before ``now`` (default: this
        host's clock). The writer's clock against ``now``'s: judge another host's lease
        with ``expired_by`` (the storage's clock)."""
        return self.released or self.expires_at + margin_s < (time.time() if now is None else now)

    def holder_gone(self) -> bool:
        """True if the holder ran on this host and its process no longer runs (or the pid
        now belongs to a process started later)."""
        if self.host != socket.gethostname() or not self.pid:
            return False
        started = _process_started_at(self.pid)
        if started is None:
            return True
        return self.pid_started_at is not None and abs(started - self.pid_started_at) > 1.0

    def live(self, margin_s: float = 0.0) -> bool:
        """Neither expired (plus ``margin_s``, this host's clock; ``live_by`` judges by the
        storage's) nor held by a process known to be gone."""
        return not self.expired(margin_s=margin_s) and not self.holder_gone()

    def describe(self) -> str:
        """The holder in words: host, pid, run id, start and expiry times (UTC)."""
        def utc(t: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        who = f"host {self.host}, pid {self.pid}"
        if self.run_id:
            who += f", run {self.run_id}"
        if self.job:
            who += f", job {self.job!r}"
        if self.fingerprint:
            who += f", fingerprint {self.fingerprint}"
        return f"{who}, started {utc(self.started_at)}, lease expires {utc(self.expires_at)}"

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()


def holder_record(kind: str, lease_s: float, **fields) -> LeaseRecord:
    """A new ``LeaseRecord`` of ``kind`` held by this process (host, pid, its start time),
    started now and expiring in ``lease_s`` seconds; ``fields``: the other fields."""
    now = time.time()
    return LeaseRecord(kind=kind, host=socket.gethostname(), pid=os.getpid(),
                       pid_started_at=_process_started_at(os.getpid()), started_at=now,
                       renewed_at=now, expires_at=now + lease_s, **fields)


def put_atomic(uri: str, data: bytes) -> None:
    """Replace ``uri`` atomically (local: a temporary file renamed over it; S3: a PUT),
    so a reader never sees a half-written lease."""
    if not fs.is_local(uri):
        fs.write_bytes(uri, data)
        return
    _, path = fs.resolve(uri)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with fs.open_new_local(tmp, exclusive=True) as f:   # storage.local_permissions modes
        f.write(data)
    os.replace(tmp, path)


def read_lease(uri: str, stat: bool = False) -> LeaseRecord | None:
    """The lease at ``uri``; None if there is none. ``stat``: also set ``stored_at`` from
    the file's mtime, read after its bytes (so never older than the renewal read). Raises
    ``CommitError`` if unreadable."""
    try:
        record = LeaseRecord.model_validate_json(fs.read_bytes(uri))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise CommitError(f"unreadable lease {uri}: {e}") from e
    if stat:
        record.stored_at = _mtime_s(uri)
    return record


class Renewer:
    """Calls ``renew()`` every ``every_s`` seconds on a daemon thread until ``stop()``.
    A renewal that raises is logged and tried again at the next tick."""

    def __init__(self, renew: Callable[[], None], every_s: float, name: str):
        self._renew, self._every_s = renew, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._renew()
            except Exception as e:  # noqa: BLE001 - keep renewing; the lease may expire
                log.warning("lease renewal failed (%s): %s", self._thread.name, e)

    def stop(self) -> None:
        """Stop renewing (waits for a renewal in progress)."""
        self._stop.set()
        self._thread.join(timeout=60)


# --- attempt leases ------------------------------------------------------------------
def attempt_lease_rel(partition_id: str, attempt_id: str) -> str:
    """``_leases/<pid>.<attempt>.json`` (relative to a generation root)."""
    return f"{ATTEMPT_LEASE_DIR}/{partition_id}.{attempt_id}.json"


class AttemptLease:
    """The lease of one running partition attempt under the generation root ``root``.

    ``start()`` writes it (before the attempt writes any file) and starts renewing it
    every ``renew_s`` seconds for ``lease_s`` more; ``check(min_left_s)`` raises
    ``CommitError`` unless the last renewal that reached the store leaves at least
    ``min_left_s`` seconds; ``release()`` stops renewing and deletes it."""

    def __init__(self, root: str, partition_id: str, attempt_id: str, lease_s: float,
                 renew_s: float, run_id: str = ""):
        self.uri = fs.join(fs.normalize(root), attempt_lease_rel(partition_id, attempt_id))
        self.lease_s, self.renew_s = lease_s, renew_s
        self.record = holder_record("attempt", lease_s, run_id=run_id, partition_id=partition_id,
                              attempt_id=attempt_id)
        self._renewer: Renewer | None = None
        self._lock = threading.Lock()

    def start(self) -> "AttemptLease":
        """Write the lease and start renewing it. Raises ``OSError``/``StorageError``."""
        put_atomic(self.uri, self.record.to_json())
        self._renewer = Renewer(self.renew, self.renew_s,
                                f"lease-{self.record.partition_id}.{self.record.attempt_id}")
        return self

    def renew(self) -> None:
        """Push the expiry to ``now + lease_s`` (raises if the write fails)."""
        now = time.time()
        record = self.record.model_copy(update={"renewed_at": now, "expires_at": now + self.lease_s})
        put_atomic(self.uri, record.to_json())
        with self._lock:
            self.record = record

    def check(self, min_left_s: float) -> None:
        """Raise ``CommitError`` if fewer than ``min_left_s`` seconds of the lease are left
        (renewals failed or stalled: gc may delete this attempt's files)."""
        with self._lock:
            left = self.record.expires_at - time.time()
        if left < min_left_s:
            raise CommitError(f"partition {self.record.partition_id} attempt "
                              f"{self.record.attempt_id}: its lease has {left:.1f} s left "
                              f"(< {min_left_s:g} s): not committing (mmpipe gc may delete "
                              "its files)")

    def release(self) -> None:
        """Stop renewing and delete the lease (a failed delete is left to gc)."""
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        try:
            fs.delete_file(self.uri)
        except OSError:
            log.warning("could not delete lease %s", self.uri, exc_info=True)


def attempt_leases(root: str) -> dict[tuple[str, str], LeaseRecord | None]:
    """The attempt leases under the generation root ``root``, keyed by ``(partition id,
    attempt id)``, each with ``stored_at`` from the listing (judge them with
    ``expired_by``); None for a lease that cannot be read (being replaced: treat as live)."""
    out: dict[tuple[str, str], LeaseRecord | None] = {}
    for e in fs.list_files(fs.join(fs.normalize(root), ATTEMPT_LEASE_DIR)):
        name = posixpath.basename(e.uri)
        if not name.endswith(".json") or ".tmp-" in name or name.count(".") != 2:
            continue
        pid, attempt, _ = name.split(".")
        try:
            rec = read_lease(e.uri)
        except (CommitError, OSError):
            rec = None
        if rec is not None:
            rec.stored_at = e.mtime_s
        out[(pid, attempt)] = rec
    return out
