"""Commit markers: the typed ``CommitMarker`` and the ``CheckpointStore`` (DESIGN.md
commit protocol).

A partition is done when ``_checkpoints/<pid>.json`` exists. The marker is created
exclusively (local: ``os.link``; object stores: conditional PUT), so of two attempts of
one partition exactly one commits; the loser deletes its own files. Markers are
versioned (``MARKER_VERSION``); a version-1 marker (written before the version field
existed) parses with the fields it has.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.errors import CommitError
from pipeline.storage import fs
from pipeline.output.layout import OutputLayout
from pipeline.records import Status

log = logging.getLogger(__name__)

MARKER_VERSION = 2


class CommitMarker(BaseModel):
    """What one committed attempt of a partition wrote (``_checkpoints/<pid>.json``).

    ``files``: output files relative to the output root (data, quarantine, WebDataset
    shards), each with its ``sha256`` (hex, computed while streaming). ``rows_in`` equals
    the sum of ``rows_by_status`` (``ok``/``rejected``/``error``); ``rows_by_reason`` is
    keyed ``"<status>:<reason>"``; ``rows_by_flag``: rows by each signal-filter flag
    they carry (``signal_flags``: the reasons ``filters.score_only`` filters would reject
    them for, ``unscored:<column>``; empty in markers written before it was recorded).
    ``rows_planned``: records the plan expected (None for
    WebDataset, whose samples are known only once read). ``bytes_written``: bytes of all
    ``files``. Times are Unix seconds; ``duration_s`` seconds. ``retried_requests`` /
    ``throttled_requests``: storage requests this attempt retried / was throttled on.
    ``downloads``: HTTP counters (URL manifests). ``settings``: the output-affecting
    settings the ``fingerprint`` hashes, so a refused resume can say what changed.
    ``job``: the spec's ``name`` (empty in markers written before it was recorded).
    Fan-out (``video.clips``: one input, several rows): ``inputs_read``: the inputs (plan
    records) read, ``rows_per_input``: how many rows each input became, in input order
    (empty when every input is one row), ``clips``: rows that are clips; markers written
    before fan-out have none of them (``inputs``: then ``rows_in``).
    """

    model_config = ConfigDict(extra="ignore")

    version: int = 1
    job: str = ""
    partition_id: str
    attempt_id: str
    fingerprint: str
    files: list[str]
    sha256: dict[str, str] = Field(default_factory=dict)
    rows_in: int
    rows_planned: int | None = None
    rows_by_status: dict[str, int]
    rows_by_reason: dict[str, int] = Field(default_factory=dict)
    rows_by_flag: dict[str, int] = Field(default_factory=dict)
    bytes_written: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0
    duration_s: float = 0.0
    mmpipe_version: str = ""
    ran_on: dict[str, str] = Field(default_factory=dict)
    retried_requests: int = 0
    throttled_requests: int = 0
    downloads: dict[str, int] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)
    inputs_read: int | None = None
    rows_per_input: list[int] = Field(default_factory=list)
    clips: int = 0

    @property
    def inputs(self) -> int:
        """Inputs this attempt read (``rows_in`` in markers written before fan-out)."""
        return self.rows_in if self.inputs_read is None else self.inputs_read

    @field_validator("rows_by_status")
    @classmethod
    def _every_status(cls, value: dict[str, int]) -> dict[str, int]:
        """Every ``Status`` value, 0 where no row had it (and nothing else)."""
        return {s.value: value.get(s.value, 0) for s in Status}

    def to_json(self) -> bytes:
        """The marker file's bytes (sorted keys)."""
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, blob: bytes | str, where: str = "") -> "CommitMarker":
        """Parse a marker file. Raises ``CommitError`` naming ``where`` if it is not one."""
        try:
            return cls.model_validate_json(blob)
        except ValueError as e:
            raise CommitError(f"unreadable commit marker {where}: {e}") from e


class CheckpointStore:
    """Reads and writes the commit markers under ``<output>/_checkpoints/``."""

    def __init__(self, output_uri: str):
        self.output_uri = output_uri
        self.layout = OutputLayout(output_uri)

    def commit(self, marker: CommitMarker) -> bool:
        """Create the marker; return False if another attempt committed first.

        Raises ``CommitError`` if the store fails (not if the marker exists).
        """
        uri = self.layout.marker(marker.partition_id)
        try:
            if fs.create_exclusive(uri, marker.to_json()):
                return True
            # 412: a marker exists. It may be our own, if the store applied an earlier try
            # of this request but its response was lost and the retry saw the result.
            existing = CommitMarker.parse(fs.read_bytes(uri), uri)
        except OSError as e:
            raise CommitError(f"cannot write marker for {marker.partition_id} in "
                              f"{self.output_uri}: {e}") from e
        return existing.attempt_id == marker.attempt_id

    def marker(self, partition_id: str) -> CommitMarker | None:
        """The marker of one partition, or None if it is not committed."""
        uri = self.layout.marker(partition_id)
        try:
            return CommitMarker.parse(fs.read_bytes(uri), uri)
        except FileNotFoundError:
            return None

    def markers(self) -> dict[str, CommitMarker]:
        """All markers, keyed by partition id (one listing, one read per marker).
        Raises ``CommitError`` for a marker that cannot be read or parsed."""
        out = {}
        for entry in fs.list_files(self.layout.checkpoints):
            pid = OutputLayout.partition_of_json(entry.uri)
            if pid is None:
                continue
            try:
                out[pid] = CommitMarker.parse(fs.read_bytes(entry.uri), entry.uri)
            except OSError as e:
                raise CommitError(f"unreadable commit marker {entry.uri}: {e}") from e
        return out

    def committed_ids(self) -> set[str]:
        """The ids of the committed partitions, from one (paginated) listing of the marker
        names: no marker is read."""
        return {pid for e in fs.list_files(self.layout.checkpoints)
                if (pid := OutputLayout.partition_of_json(e.uri)) is not None}

    def committed(self, fingerprint: str) -> tuple[dict[str, CommitMarker],
                                                   dict[str, CommitMarker]]:
        """Split markers into ``(matching, foreign)`` by spec fingerprint."""
        matching, foreign = {}, {}
        for pid, m in self.markers().items():
            (matching if m.fingerprint == fingerprint else foreign)[pid] = m
        return matching, foreign

    def record_failure(self, partition_id: str, info: dict[str, Any]) -> None:
        """Write ``_failures/<pid>.json`` (the last error, attempts) for a failed partition."""
        fs.write_bytes(self.layout.failure(partition_id),
                       json.dumps(info, indent=1, sort_keys=True).encode())

    def failures(self) -> dict[str, dict[str, Any]]:
        """Failure records of partitions that have no commit marker (yet). A record that
        is not a JSON object (empty, cut short, damaged) still says the partition failed:
        ``{"partition_id": pid, "error": "unreadable failure record <uri>: <why>"}``."""
        done = set(self.markers())
        out = {}
        for entry in fs.list_files(self.layout.failures):
            pid = OutputLayout.partition_of_json(entry.uri)
            if pid is not None and pid not in done:
                try:
                    record = json.loads(fs.read_bytes(entry.uri))
                    if not isinstance(record, dict):
                        record = {"partition_id": pid, "error": f"unreadable failure record "
                                  f"{entry.uri}: a JSON {type(record).__name__}, not an object"}
                except ValueError as e:   # JSONDecodeError and UnicodeDecodeError included
                    record = {"partition_id": pid,
                              "error": f"unreadable failure record {entry.uri}: {e}"[:500]}
                out[pid] = record
        return out

    def write_success(self, report: dict[str, Any]) -> None:
        """Write ``_SUCCESS`` holding the job report (JSON)."""
        fs.write_bytes(self.layout.success, json.dumps(report, indent=1, sort_keys=True).encode())


def verify_files(root: str, marker: CommitMarker, chunk_bytes: int = 8 * 2**20) -> None:
    """Check that every file ``marker`` names exists under the generation root ``root``
    with the sha256 it records (read back in ``chunk_bytes`` chunks) and that their sizes
    add up to ``bytes_written``. Raises ``CommitError`` naming the first file missing or
    changed (a commit must never name a file that is gone: the attempt fails and is
    retried)."""
    layout = OutputLayout(root)
    total = 0
    for rel in marker.files:
        total += verify_file(layout.uri(rel), marker.sha256.get(rel),
                             f"partition {marker.partition_id}", chunk_bytes)
    if marker.sha256 and total != marker.bytes_written:
        raise CommitError(f"partition {marker.partition_id}: its files hold {total} bytes, "
                          f"the attempt wrote {marker.bytes_written}; not committing")


def verify_file(uri: str, want: str | None, who: str, chunk_bytes: int = 8 * 2**20) -> int:
    """Read the file at ``uri`` back (streamed, retried by the storage policy) and return
    its size in bytes; ``want`` (sha256 hex, None: not checked) must be its digest.
    ``who`` names the committer in the message. Raises ``CommitError`` when the file is
    gone (deleted by gc?), unreadable, or changed."""
    try:
        size, digest = _hash_file(uri, chunk_bytes)
    except FileNotFoundError as e:
        raise CommitError(f"{who}: {uri} is gone before the commit (deleted by gc?); "
                          "not committing") from e
    except OSError as e:
        raise CommitError(f"{who}: cannot verify {uri}: {e}") from e
    if want is not None and digest != want:
        raise CommitError(f"{who}: {uri} has sha256 {digest}, the attempt wrote {want}; "
                          "not committing")
    return size


def _hash_file(uri: str, chunk_bytes: int) -> tuple[int, str]:
    """``(size in bytes, sha256 hex)`` of the file at ``uri``, streamed."""
    fsys, path = fs.resolve(uri)

    def read() -> tuple[int, str]:
        h, n = hashlib.sha256(), 0
        with fsys.open_input_stream(path) as f:
            while chunk := f.read(chunk_bytes):
                h.update(chunk)
                n += len(chunk)
        return n, h.hexdigest()
    return fs.with_retries(uri, "verify", read)


