"""``CheckpointStore``: commit markers in the output store (DESIGN.md commit protocol).

A partition is done when ``_checkpoints/<pid>.json`` exists. The marker is created
exclusively (local: ``os.link``; object stores: conditional PUT), so of two attempts of
one partition exactly one commits; the loser deletes its own files.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from typing import Any

from pipeline.errors import CommitError
from pipeline.io import fs

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "_checkpoints"
FAILURE_DIR = "_failures"
SUCCESS_FILE = "_SUCCESS"


class CheckpointStore:
    """Reads and writes the commit markers under ``<output>/_checkpoints/``."""

    def __init__(self, output_uri: str):
        self.output_uri = output_uri

    def marker_uri(self, partition_id: str) -> str:
        """URI of the marker of ``partition_id``."""
        return fs.join(self.output_uri, CHECKPOINT_DIR, f"{partition_id}.json")

    def commit(self, partition_id: str, marker: dict[str, Any]) -> bool:
        """Create the marker; return False if another attempt committed first.

        Raises ``CommitError`` if the store fails (not if the marker exists).
        """
        blob = json.dumps(marker, indent=1, sort_keys=True).encode()
        uri = self.marker_uri(partition_id)
        try:
            if fs.create_exclusive(uri, blob):
                return True
            # 412: a marker exists. It may be our own, if the store applied an earlier try
            # of this request but its response was lost and the retry saw the result.
            existing = json.loads(fs.read_bytes(uri))
        except (OSError, ValueError) as e:
            raise CommitError(f"cannot write marker for {partition_id} in {self.output_uri}: {e}") from e
        return existing.get("attempt_id") == marker["attempt_id"]

    def marker(self, partition_id: str) -> dict[str, Any] | None:
        """The marker of one partition, or None if it is not committed."""
        try:
            return json.loads(fs.read_bytes(self.marker_uri(partition_id)))
        except FileNotFoundError:
            return None

    def markers(self) -> dict[str, dict[str, Any]]:
        """All markers, keyed by partition id (one listing, one read per marker)."""
        out = {}
        for entry in fs.list_files(fs.join(self.output_uri, CHECKPOINT_DIR)):
            uri = entry.uri
            name = posixpath.basename(uri)
            if not name.endswith(".json") or ".tmp-" in name:
                continue
            try:
                out[name[:-len(".json")]] = json.loads(fs.read_bytes(uri))
            except (OSError, ValueError) as e:
                raise CommitError(f"unreadable commit marker {uri}: {e}") from e
        return out

    def committed(self, fingerprint: str) -> tuple[dict[str, dict], dict[str, dict]]:
        """Split markers into ``(matching, foreign)`` by spec fingerprint."""
        matching, foreign = {}, {}
        for pid, m in self.markers().items():
            (matching if m.get("fingerprint") == fingerprint else foreign)[pid] = m
        return matching, foreign

    def record_failure(self, partition_id: str, info: dict[str, Any]) -> None:
        """Write ``_failures/<pid>.json`` (the last error, attempts) for a failed partition."""
        fs.write_bytes(fs.join(self.output_uri, FAILURE_DIR, f"{partition_id}.json"),
                       json.dumps(info, indent=1, sort_keys=True).encode())

    def failures(self) -> dict[str, dict[str, Any]]:
        """Failure records of partitions that have no commit marker (yet)."""
        done = set(self.markers())
        out = {}
        for entry in fs.list_files(fs.join(self.output_uri, FAILURE_DIR)):
            pid = posixpath.basename(entry.uri).removesuffix(".json")
            if pid not in done:
                out[pid] = json.loads(fs.read_bytes(entry.uri))
        return out

    def write_success(self, report: dict[str, Any]) -> None:
        """Write ``_SUCCESS`` holding the job report (JSON)."""
        fs.write_bytes(fs.join(self.output_uri, SUCCESS_FILE),
                       json.dumps(report, indent=1, sort_keys=True).encode())


def unreferenced_files(output_uri: str, min_age_s: float = 0.0) -> list[str]:
    """URIs under ``data/``, ``quarantine/`` and ``wds/`` that no commit marker names: the
    files of failed, lost or zombie attempts - and of attempts still running, so only
    files last modified at least ``min_age_s`` seconds ago are returned (a file without
    a modification time counts as old)."""
    output_uri = fs.normalize(output_uri)  # listings give absolute paths: compare like with like
    named = {fs.join(output_uri, f) for m in CheckpointStore(output_uri).markers().values()
             for f in m.get("files", [])}
    cutoff = time.time() - min_age_s
    out = []
    for top in ("data", "quarantine", "wds"):
        out += [e.uri for e in fs.list_files(fs.join(output_uri, top))
                if e.uri not in named and (e.mtime_s is None or e.mtime_s <= cutoff)]
    return out


def committed_files(output_uri: str) -> list[str]:
    """URIs of the Parquet data files named by commit markers (what readers should trust);
    WebDataset shards are named by the markers too, under ``wds/``."""
    output_uri = fs.normalize(output_uri)
    store = CheckpointStore(output_uri)
    return [fs.join(output_uri, f) for pid, m in sorted(store.markers().items())
            for f in m.get("files", []) if f.startswith("data/")]
