"""The exception tree of mmpipe.

Broad exceptions are caught at two boundaries only: the step runner turns them into
record errors, and the partition worker turns them into partition failures.
"""

from __future__ import annotations

import reprlib

from pipeline.records import ErrorReason

#: The most characters one value takes in an error message (``short_repr``), and the most
#: a whole ``SpecError`` message takes: a spec's values can be anything its author (or
#: a YAML alias expanding) put there, and a message must stay readable and small.
MAX_VALUE_CHARS = 200
MAX_MESSAGE_CHARS = 4000

_REPR = reprlib.Repr()   # attributes, not keywords: those came in Python 3.12
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring = _REPR.maxother = MAX_VALUE_CHARS
_REPR.maxlong = 60


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to at most about ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def short_repr(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """A ``repr`` of ``value`` for messages: ``reprlib`` (the standard library's bounded
    repr: nested containers cut after 6 items and 3 levels, long strings shortened), then
    cut to ``limit`` characters. Never walks more of ``value`` than it prints."""
    return clip(_REPR.repr(value), limit)


def error_text(e: BaseException) -> str:
    """``e`` as an error row's text: ``<Type>: <message>``. A PyAV (FFmpeg) error gives its
    message without PyAV's ``[Errno <AVERROR code>]`` prefix and the name the file was
    opened under (``InvalidDataError: Invalid data found when processing input``): the code
    is FFmpeg's, not an OS errno a reader could look up."""
    strerror = getattr(e, "strerror", None)
    if strerror and type(e).__module__.split(".")[0] == "av":
        return f"{type(e).__name__}: {strerror}"
    return f"{type(e).__name__}: {e}"


class MmpipeError(Exception):
    """Base class of every error raised on purpose by mmpipe."""


class SpecError(MmpipeError):
    """A job spec is invalid. ``field`` is the dotted field name, ``value`` the bad value.
    The message is cut to ``MAX_MESSAGE_CHARS`` (``clip``)."""

    def __init__(self, message: str, field: str = "", value: object = None):
        super().__init__(clip(message))   # a bounded message, whatever the value was
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
