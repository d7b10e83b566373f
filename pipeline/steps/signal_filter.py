"""Filters on any signal column (``filters.signals``), and where the assembler puts them.

A ``SignalRule`` is one ``SignalFilterSpec`` resolved: its column, its bounds as numbers
(a ``CalibratedThreshold`` is read through ``pipeline.calibration.threshold_for`` when the
rule is made, i.e. when the driver assembles the pipeline, so a bad reference fails
before Ray starts), the allowed strings and the reject reason. A row's value decides:

* ``None`` or NaN: *unscored*: the row gets the flag ``unscored:<column>`` and is kept
  (``missing: keep``, the default) or rejected with the rule's reason (``missing: reject``);
* a number below ``min`` or above ``max`` (both inclusive bounds), or a string not in
  ``allow``: rejected with the rule's reason;
* otherwise kept.

``SignalFilterStep`` applies the rules of one place in the pipeline in spec order; the
first rule that rejects a row decides its ``reject_reason``. With ``filters.score_only``
no row is rejected: every rule is applied and each one that would reject the row adds its
reason to the row's ``signal_flags`` (list<string>); the partition statistics count the
flags (``rows_by_flag`` of the commit marker and the report).

``SignalFilters`` places the rules (``pipeline.assembly``): a rule on a column the CPU
steps write becomes part of one CPU step after the added CPU steps (``STEP_FACTORIES``),
before the model inputs; a rule on a model column runs in the model-stage filters right
after the stage that writes it. A rule on a column that is undeclared, internal, not
written by this pipeline (or only after that point), or of the wrong type (min/max on a
non-numeric column, ``allow`` on a non-string one) raises ``SpecError`` naming
``filters.signals[i].column`` and the value.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.columns import (
    FRAME_EMBEDDINGS,
    GENERATED_CAPTION,
    IMAGE,
    IMAGE_EMBEDDING,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    REJECT_REASON,
    SIGNAL_FLAGS,
    TEXT_EMBEDDING,
    Batch,
    lookup,
)
from pipeline.errors import MmpipeError, SpecError, short_repr
from pipeline.records import RejectReason
from pipeline.spec import CalibratedThreshold, FilterSpec, SignalFilterSpec
from pipeline.steps.base import Filter

if TYPE_CHECKING:  # steps do not import models at run time (import direction)
    from pipeline.steps.model import ModelStep

#: The flag of a row whose value of ``column`` is null or NaN.
UNSCORED = "unscored:"

#: Kinds of the model columns, whose Arrow type is known only once a model is bound:
#: every other model column (clip_score, aesthetic_score, nsfw_score, watermark_score,
#: score_<name>) is a float scalar (issue 26's contract); a bound model's real type is
#: checked again (``SignalFilters.after_models``).
MODEL_COLUMN_KINDS = {TEXT_EMBEDDING: "vector", IMAGE_EMBEDDING: "vector",
                      FRAME_EMBEDDINGS: "vector", GENERATED_CAPTION: "string"}


def arrow_kind(arrow_type: pa.DataType) -> str:
    """``numeric`` (integers, floats), ``string`` (string, large_string) or ``other``."""
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return "numeric"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    return "other"


def column_kind(name: str) -> str:
    """The kind of declared column ``name`` from its declaration: ``arrow_kind`` of its
    Arrow type, ``MODEL_COLUMN_KINDS`` (default ``numeric``) for a model-typed output
    column, ``internal`` for a batch-only one. Raises ``KeyError`` if undeclared."""
    col = lookup(name)
    if col.kind != "output":
        return "internal"
    if col.arrow_type is None:
        return MODEL_COLUMN_KINDS.get(name, "numeric")
    return arrow_kind(col.arrow_type)


def resolve_threshold(bound: float | CalibratedThreshold | None, column: str, field: str
                      ) -> tuple[float | None, dict[str, Any] | None]:
    """``(number, reference)`` of one bound: a number is itself (no reference); a
    ``CalibratedThreshold`` is ``pipeline.calibration.threshold_for(calibration, column,
    precision)`` and its reference ``{"calibration", "precision"}``. Raises ``SpecError``
    naming ``field`` (e.g. ``filters.signals[0].min``) when it cannot be resolved."""
    if not isinstance(bound, CalibratedThreshold):
        return bound, None
    ref = {"calibration": bound.calibration, "precision": bound.precision}
    try:
        # imported lazily: the calibration room reads files, and only here is one needed
        from pipeline.calibration import threshold_for
        value = float(threshold_for(bound.calibration, column, bound.precision))
    except (ImportError, MmpipeError, OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, SpecError) and e.field:
            raise SpecError(f"{field}: {e}", field, bound.calibration) from e
        raise SpecError(f"{field}: cannot resolve the calibrated threshold of {column!r} at "
                        f"precision {bound.precision} from {bound.calibration!r}: "
                        f"{type(e).__name__}: {e}", field, bound.calibration) from e
    if math.isnan(value):
        raise SpecError(f"{field}: the calibration {bound.calibration!r} gives no threshold "
                        f"for {column!r} at precision {bound.precision}", field,
                        bound.calibration)
    return value, ref


@dataclasses.dataclass(frozen=True)
class SignalRule:
    """One resolved ``filters.signals[index]``: keep rows with ``low <= value <= high``
    (None: unbounded) or, with ``allow``, ``value in allow``; ``reason``: the
    ``RejectReason`` of the rows it rejects; ``missing``: ``keep``/``reject`` a null or
    NaN value; ``references``: bound (``min``/``max``) -> its calibration reference."""

    index: int
    column: str
    low: float | None
    high: float | None
    allow: tuple[str, ...] | None
    reason: RejectReason
    missing: str = "keep"
    references: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def field(self) -> str:
        """``filters.signals[<index>].column``: how errors name this rule."""
        return f"filters.signals[{self.index}].column"

    @classmethod
    def from_spec(cls, index: int, spec: SignalFilterSpec) -> SignalRule:
        """Resolve ``spec`` (a validated ``SignalFilterSpec``: column and reason filled);
        calibrated bounds are read here (``resolve_threshold``; raises ``SpecError``)."""
        where = f"filters.signals[{index}]"
        low, low_ref = resolve_threshold(spec.min, spec.column, f"{where}.min")
        high, high_ref = resolve_threshold(spec.max, spec.column, f"{where}.max")
        if low is not None and high is not None and low > high:
            raise SpecError(f"{where}: min resolves to {low}, above max {high}: every row "
                            "would be rejected", f"{where}.min", low)
        refs = {k: v for k, v in (("min", low_ref), ("max", high_ref)) if v is not None}
        return cls(index, spec.column, low, high, spec.allow, RejectReason(spec.reason),
                   spec.missing, refs)

    @property
    def needs(self) -> str:
        """The column kind this rule needs: ``string`` (allow) or ``numeric``."""
        return "string" if self.allow is not None else "numeric"

    def check_kind(self, kind: str, type_name: str) -> None:
        """Raise ``SpecError`` naming ``field`` unless a column of ``kind`` suits."""
        if kind == self.needs:
            return
        what = "allow needs a string column" if self.allow is not None else \
            "min/max need a numeric column" + ("; use allow" if kind == "string" else "")
        raise SpecError(f"{self.field}: {self.column!r} is a column of type {type_name}; {what}",
                        self.field, self.column)

    def verdict(self, value: Any) -> str:
        """``keep``, ``reject`` or ``unscored`` for one row's ``value``."""
        if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
            return "unscored"
        if self.allow is not None:
            return "keep" if value in self.allow else "reject"
        if (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high):
            return "reject"
        return "keep"

    def settings(self) -> dict[str, Any]:
        """What changes the rows: the resolved bounds (and where calibrated ones came
        from), the allowed values, the reason and the missing-value policy."""
        return {"column": self.column, "min": self.low, "max": self.high,
                "allow": list(self.allow) if self.allow is not None else None,
                "reason": self.reason.value, "missing": self.missing,
                "calibrated": self.references}


class SignalFilterStep(Filter):
    """Applies ``rules`` (one place's ``SignalRule``s, spec order) to each ``ok`` row (see
    the module docstring); ``score_only``: flag, never reject. ``where`` names the place
    (``cpu``, ``model stage 0``) in the step's name, unique in a pipeline."""

    dropped = (IMAGE, IMAGE_WIDTH, IMAGE_HEIGHT)

    def __init__(self, rules: list[SignalRule], score_only: bool, where: str):
        super().__init__()
        self.rules, self.score_only, self.where = list(rules), score_only, where
        self.reads = tuple(dict.fromkeys(r.column for r in self.rules))
        self.writes = (REJECT_REASON, SIGNAL_FLAGS)

    @property
    def name(self) -> str:
        return f"SignalFilterStep[{self.where}]"

    def settings(self) -> dict[str, Any]:
        return {"score_only": self.score_only,
                "filters": {str(r.index): r.settings() for r in self.rules}}

    def reject_reason(self, batch: Batch, i: int) -> RejectReason | None:
        flags = list(batch[SIGNAL_FLAGS][i] or [])
        reason = None
        for rule in self.rules:
            verdict = rule.verdict(batch[rule.column][i])
            if verdict == "unscored":
                flags.append(UNSCORED + rule.column)
                verdict = "reject" if rule.missing == "reject" else "keep"
            if verdict == "reject":
                if not self.score_only:
                    reason = rule.reason
                    break
                flags.append(rule.reason.value)
        batch[SIGNAL_FLAGS][i] = list(dict.fromkeys(flags))  # each flag once per row
        return reason


class SignalFilters:
    """The rules of a spec (``filters.signals``, resolved when made) and their places in
    one pipeline being assembled. ``cpu_step``, then ``delays_captioning`` /
    ``after_models`` per model stage, then ``check_placed``; each placed rule is placed
    once."""

    def __init__(self, filters: FilterSpec):
        self.rules = [SignalRule.from_spec(i, s) for i, s in enumerate(filters.signals)]
        self.score_only = filters.score_only
        self.placed: set[int] = set()

    def _take(self, columns: set[str]) -> list[SignalRule]:
        rules = [r for r in self.rules if r.index not in self.placed and r.column in columns]
        self.placed |= {r.index for r in rules}
        return rules

    def cpu_step(self, written: set[str]) -> SignalFilterStep | None:
        """The CPU step of the rules whose column is in ``written`` (the columns the
        runner, the datasource and the CPU steps so far write), or None. Raises
        ``SpecError`` for a rule on an internal or ill-typed column."""
        rules = self._take({c for c in written if _declared(c)})
        for r in rules:
            kind = column_kind(r.column)
            if kind == "internal":
                raise SpecError(f"{r.field}: {r.column!r} is an internal column (never "
                                "output); filter on an output column", r.field, r.column)
            r.check_kind(kind, str(lookup(r.column).arrow_type))
        return SignalFilterStep(rules, self.score_only, "cpu") if rules else None

    def delays_captioning(self, steps: list[ModelStep]) -> bool:
        """Whether a rule filters on a column one of ``steps`` (the non-captioning model
        steps) writes: then captioning waits for that filter (a later stage)."""
        written = {c for t in steps for c in t.writes}
        return any(r.column in written for r in self.rules if r.index not in self.placed)

    def after_models(self, stage: list[ModelStep], index: int) -> SignalFilterStep | None:
        """The filter step after model stage ``index`` for the rules on the columns its
        steps write, or None. A bound step's Arrow types are checked (``fields()``);
        unbound, ``column_kind``. Raises ``SpecError`` for an ill-typed column."""
        rules = self._take({c for t in stage for c in t.writes})
        typed = {f.name: f.type for t in stage if t.info is not None for f in t.fields()}
        for r in rules:
            if r.column in typed:
                r.check_kind(arrow_kind(typed[r.column]), str(typed[r.column]))
            else:
                r.check_kind(column_kind(r.column), "model-typed ("
                             + MODEL_COLUMN_KINDS.get(r.column, "numeric") + ")")
        return SignalFilterStep(rules, self.score_only, f"model stage {index}") if rules \
            else None

    def check_placed(self, written: set[str]) -> None:
        """Raise ``SpecError`` for the first rule not placed: its column is undeclared,
        not written by this pipeline (``written``: every column it writes), or written
        only after the point where signal filters run."""
        for r in self.rules:
            if r.index in self.placed:
                continue
            if not _declared(r.column):
                raise SpecError(f"{r.field}: {short_repr(r.column)} is not a declared column "
                                "(pipeline.columns)", r.field, r.column)
            if r.column in written:
                why = ("is written only after the signal filters run (by the resize/encode "
                       "step at the end of the CPU steps)")
            else:
                why = ("is not written by this pipeline: enable the step or model that "
                       "writes it (e.g. signals.image for sharpness, image_embedding with "
                       "score for clip_score)")
            raise SpecError(f"{r.field}: {r.column!r} {why}", r.field, r.column)


def _declared(name: str) -> bool:
    try:
        lookup(name)
    except KeyError:
        return False
    return True
