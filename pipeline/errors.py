"""The exception tree of mmpipe.

Broad exceptions are caught at two boundaries only: the step runner turns them into
record errors, and the partition worker turns them into partition failures.
"""

from __future__ import annotations

from pipeline.records import ErrorReason


class MmpipeError(Exception):
    """Base class of every error raised on purpose by mmpipe."""


class SpecError(MmpipeError):
    """A job spec is invalid. ``field`` is the dotted field name, ``value`` the bad value."""

    def __init__(self, message: str, field: str = "", value: object = None):
        super().__init__(message)
        self.field = field
        self.value = value


class RecordError(MmpipeError):
    """One record cannot be processed; it becomes a row with ``status="error"``.

    ``reason`` is a short machine-readable code (see ``records.ErrorReason``) and the
    message carries the decoder's or reader's own text.
    """

    def __init__(self, reason: ErrorReason | str, message: str):
        self.reason = ErrorReason(reason)
        super().__init__(f"{self.reason.value}: {message}")
        self.message = message


class PartitionError(MmpipeError):
    """A whole partition failed (unreadable input, write failure); it is retried."""


class CommitError(MmpipeError):
    """A commit marker could not be written or read."""


class PlanError(MmpipeError):
    """The input cannot be listed or planned (no files, unreadable manifest)."""


class ModelLoadError(MmpipeError):
    """A model cannot be used: weights missing or partial, unknown backend, missing library.

    Raised at job start (on the driver) naming the spec field and the model location.
    """


class AssemblyError(MmpipeError):
    """The pipeline cannot be assembled: a step, datasource or model writes a column not
    declared in ``pipeline.columns`` (or declares it with a conflicting type)."""
