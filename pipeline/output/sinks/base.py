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
(``fs.HashingOutput``), never by reading a file back. A datasink declares the settings
that change what it writes (part of the fingerprint) and its top-level directory
(``directory``: registered with ``output.layout`` when the class is defined, so gc,
generations, ``mmpipe ls --kind`` and the readers know it without another edit).

``FileDatasink`` is the base of every datasink that writes files (Ray Data's
``FileDatasink`` idea): it owns the attempt directory, the hashing streams, the
``WriteResult`` and the discard/delete of a failed attempt; a subclass only opens files
(``open_file``), writes rows or blocks into them, and finishes them (``finish_file``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pyarrow as pa

from pipeline.columns import Batch
from pipeline.output.layout import OutputLayout, register_attempt_root
from pipeline.storage import fs

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
    """Base class: subclasses set ``name`` (the datasink's name) and ``directory`` (its
    top-level attempt directory; a subclass that sets it registers it with
    ``layout.register_attempt_root``, which raises ``ValueError`` for a name another
    datasink owns) and implement ``write`` and ``_close`` (finish files, return a
    ``WriteResult``)."""

    name: str = ""
    directory: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "directory" in cls.__dict__ and cls.directory:
            register_attempt_root(cls.name, cls.directory)

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


class FileDatasink(Datasink):
    """A datasink whose attempt writes files. The base owns their paths (``attempt_dir``:
    ``<directory>/<pid>/a-<attempt>``), the hashing streams (``open_file``), the
    ``WriteResult`` (from the files finished with ``finish_file``) and a failed attempt's
    cleanup (open streams discarded; the attempt directory and every file it opened
    deleted). A subclass implements ``write`` and, if it holds files open until the end,
    ``_finish`` (write what is buffered, then ``finish_file`` each)."""

    def on_write_start(self, partition_id: str, attempt_id: str, schema: pa.Schema) -> None:
        super().on_write_start(partition_id, attempt_id, schema)
        self._open: dict[str, fs.HashingOutput] = {}
        self._opened: list[str] = []
        self._result = WriteResult()

    @property
    def attempt_dir(self) -> str:
        """``<directory>/<pid>/a-<attempt>`` relative to the output root."""
        return OutputLayout.rel_attempt_dir(self.name, self.partition_id, self.attempt_id)

    def open_file(self, rel: str) -> fs.HashingOutput:
        """A new hashing output stream for ``rel`` (relative to the output root; under
        ``attempt_dir`` unless the datasink's layout says otherwise, as the dedup index's
        bucket files). Raises ``OSError``/``StorageError``."""
        out = fs.HashingOutput(self.layout.uri(rel))
        self._open[rel] = out
        self._opened.append(rel)
        return out

    def finish_file(self, rel: str, rows: int) -> None:
        """Close the stream of ``rel`` (if its writer has not) and count it, with ``rows``
        rows, in this attempt's ``WriteResult``."""
        out = self._open.pop(rel)
        out.close()
        self._result += WriteResult((rel,), rows, out.size, {rel: out.sha256})

    def _finish(self) -> None:
        """Finish the files still open (default: none are held open)."""

    def _close(self) -> WriteResult:
        self._finish()
        if self._open:
            raise RuntimeError(f"{self.name}: files left open: {sorted(self._open)}")
        return self._result

    def _discard(self) -> None:
        for out in getattr(self, "_open", {}).values():
            out.discard()
            try:
                out.close()
            except OSError:
                log.warning("could not close %s", out, exc_info=True)
        self._open = {}

    def on_write_failed(self, error: BaseException | None = None) -> None:
        """Discard open streams, delete the attempt directory and any file opened outside
        it (failures logged: ``mmpipe gc`` collects what remains)."""
        super().on_write_failed(error)
        inside = self.attempt_dir + "/"
        for rel in getattr(self, "_opened", []):
            if not rel.startswith(inside):
                try:
                    fs.delete_file(self.layout.uri(rel))
                except OSError:
                    log.warning("could not delete %s", rel, exc_info=True)
        self._opened = []
