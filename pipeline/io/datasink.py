"""The ``Datasink`` contract: one partition attempt's output, with Ray Data's lifecycle.

A datasink is built once per job by the assembler (``pipeline.assembly``) and used by one
partition worker for one attempt at a time:

    sink.on_write_start(partition_id, attempt_id, schema)   # per attempt: nothing written yet
    sink.write(batch)                               # every finished batch, in input order
    result = sink.on_write_complete()               # close files -> WriteResult
    sink.on_write_failed(error)                     # instead of complete, or after losing
                                                    #   the commit race: delete this
                                                    #   attempt's files

Files go to attempt-unique paths from ``OutputLayout`` (never overwritten by another
attempt); the commit marker names them. Checksums are computed while streaming
(``fs.HashingOutput``), never by reading a file back. A datasink declares the columns it
needs and the settings that change what it writes (part of the fingerprint).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pyarrow as pa

from pipeline.columns import Batch
from pipeline.io import fs
from pipeline.io.layout import OutputLayout

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What a datasink wrote for one attempt: ``files`` relative to the output root,
    ``rows`` written, ``bytes_written`` (bytes) and ``sha256`` (hex) per file."""

    files: tuple[str, ...] = ()
    rows: int = 0
    bytes_written: int = 0
    sha256: dict[str, str] = dataclasses.field(default_factory=dict)

    def __add__(self, other: "WriteResult") -> "WriteResult":
        return WriteResult(self.files + other.files, self.rows + other.rows,
                           self.bytes_written + other.bytes_written,
                           {**self.sha256, **other.sha256})


class Datasink:
    """Base class: subclasses set ``name`` (a key of ``layout.ATTEMPT_ROOTS``) and
    implement ``write`` and ``_close`` (finish files, return a ``WriteResult``)."""

    name: str = ""

    def __init__(self, output_uri: str):
        self.layout = OutputLayout(output_uri)
        self.partition_id = self.attempt_id = ""

    def settings(self) -> dict[str, Any]:
        """Settings that change what this datasink writes (hashed into the fingerprint)."""
        return {}

    def on_write_start(self, partition_id: str, attempt_id: str, schema: pa.Schema) -> None:
        """Begin an attempt whose data files have ``schema`` (the pipeline's output schema
        for this partition). Files are opened lazily, on the first row."""
        self.partition_id, self.attempt_id = partition_id, attempt_id

    def write(self, batch: Batch) -> None:
        raise NotImplementedError

    def on_write_complete(self) -> WriteResult:
        """Finish this attempt's files. Raises ``OSError``/``StorageError`` on failure."""
        return self._close()

    def _close(self) -> WriteResult:
        raise NotImplementedError

    def on_write_failed(self, error: BaseException | None = None) -> None:
        """Drop this attempt's output: stop writing and delete its directory. Safe to
        call more than once; a deletion failure is logged (``mmpipe gc`` collects it)."""
        self._discard()
        rel = OutputLayout.rel_attempt_dir(self.name, self.partition_id, self.attempt_id)
        try:
            fs.delete_tree(self.layout.uri(rel))
        except OSError:
            log.warning("could not delete %s", rel, exc_info=True)

    def _discard(self) -> None:
        """Stop writing without finishing files (the default: nothing open)."""
