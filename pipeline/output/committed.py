"""Which partitions of a generation are committed, from marker names alone.

``Committed`` maps partition id -> ``CommitMarker`` like a dict, but its keys come from
one paginated listing of ``_checkpoints/`` (``CheckpointStore.committed_ids``) and a
marker is read only when asked for: a resume of 100k committed partitions starts its
first remaining partition after one listing, not 100k reads. ``count_in_background``
reads the markers on a thread (the rows by status of the skipped partitions, for the
job report) while the job runs.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

from pipeline.errors import CommitError
from pipeline.output.checkpoint import CheckpointStore, CommitMarker
from pipeline.output.layout import attempt_of

#: Threads reading markers in ``count_in_background``.
READ_THREADS = 4
#: Markers handed to the threads at a time.
READ_CHUNK = 256


def bad_file_name(marker: CommitMarker, rel: object,
                  attempt_roots: tuple[str, ...] | list[str] = ()) -> str | None:
    """Why the file name ``rel`` of ``marker`` is not one its attempt wrote, else None.

    A committed file is a relative POSIX path below one of the generation's attempt roots
    (``layout.attempt_root_names(attempt_roots)``; ``attempt_roots``: those the generation
    record names) inside the marker's own partition and attempt directory
    (``layout.attempt_of(rel) == (marker.partition_id, marker.attempt_id)``), with no
    empty, ``.`` or ``..`` component, no leading ``/``, no backslash, no NUL and no URI
    scheme: a marker naming ``data/../../private/x.parquet`` or ``/etc/passwd`` would
    otherwise make readers open a file outside the output."""
    if not isinstance(rel, str) or not rel:
        return "not a file name"
    if rel.startswith("/") or "\\" in rel or "\0" in rel or "://" in rel:
        return "not a relative path inside the output"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "an empty, '.' or '..' path component"
    if attempt_of(rel, tuple(attempt_roots)) != (marker.partition_id, marker.attempt_id):
        return (f"not under the attempt directories of partition {marker.partition_id} "
                f"attempt {marker.attempt_id}")
    return None


def check_file_names(marker: CommitMarker, where: str,
                     attempt_roots: tuple[str, ...] | list[str] = ()) -> None:
    """Raise ``CommitError`` naming the marker (``where``) and the file name if a file
    name of ``marker`` is not one its attempt wrote (``bad_file_name``)."""
    for rel in marker.files:
        why = bad_file_name(marker, rel, attempt_roots)
        if why is not None:
            raise CommitError(f"commit marker {where} names the file {rel!r}: {why}; "
                              "refusing to read it (the marker was not written by mmpipe, "
                              "or was changed since)")


class Committed(Mapping):
    """The committed partitions of one generation root: ``ids`` from a listing,
    ``markers`` read lazily (or given, for outputs whose markers were read anyway)."""

    def __init__(self, store: CheckpointStore, ids: Iterable[str],
                 markers: dict[str, CommitMarker] | None = None):
        self.store = store
        self.ids = frozenset(ids)
        self._markers = dict(markers or {})
        self._lock = threading.Lock()

    def __contains__(self, pid: object) -> bool:
        return pid in self.ids

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.ids))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, pid: str) -> CommitMarker:
        if pid not in self.ids:
            raise KeyError(pid)
        with self._lock:
            if pid in self._markers:
                return self._markers[pid]
        marker = self.read(pid)
        with self._lock:
            self._markers[pid] = marker
        return marker

    def read(self, pid: str) -> CommitMarker:
        """Read the marker of the listed partition ``pid`` without keeping it. Raises
        ``KeyError`` if it is gone since the listing, ``CommitError`` if unreadable."""
        marker = self.store.marker(pid)
        if marker is None:
            raise KeyError(f"{pid}: its marker was listed but is gone")
        return marker

    def count_in_background(self) -> "SkippedRows":
        """Start reading every marker on a thread; ``SkippedRows.add_to(report)`` waits
        for it and adds the rows (by status, reason and flag, ``rows_out``, ``inputs_read``, ``clips``) to a
        ``JobReport``."""
        return SkippedRows(self)


class SkippedRows:
    """Rows of the skipped (already committed) partitions, summed on a thread."""

    def __init__(self, committed: Committed):
        self.rows_by_status: collections.Counter = collections.Counter()
        self.rows_by_reason: collections.Counter = collections.Counter()
        self.rows_by_flag: collections.Counter = collections.Counter()
        self.rows_out = 0
        self.inputs_read = 0
        self.clips = 0
        self.error: BaseException | None = None
        self._committed = committed
        self._thread = threading.Thread(target=self._run, name="skipped-markers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            ids = sorted(self._committed.ids)
            with ThreadPoolExecutor(READ_THREADS) as pool:
                # read, count, forget, a chunk at a time: neither markers nor futures pile
                # up (Executor.map submits all it is given at once)
                for start in range(0, len(ids), READ_CHUNK):
                    for m in pool.map(self._committed.read, ids[start:start + READ_CHUNK]):
                        self.rows_by_status.update(m.rows_by_status)
                        self.rows_by_reason.update(m.rows_by_reason)
                        self.rows_by_flag.update(m.rows_by_flag)
                        self.rows_out += m.rows_in
                        self.inputs_read += m.inputs
                        self.clips += m.clips
        except BaseException as e:  # noqa: BLE001 - re-raised by add_to on the caller's thread
            self.error = e

    def add_to(self, report) -> None:
        """Wait for the markers, then add their rows to ``report`` (a ``JobReport``);
        raises what reading a marker raised (``CommitError``, ``StorageError``)."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        report.rows_by_status.update(self.rows_by_status)
        report.rows_by_reason.update(self.rows_by_reason)
        report.rows_by_flag.update(self.rows_by_flag)
        report.rows_out += self.rows_out
        report.inputs_read += self.inputs_read
        report.clips += self.clips
