"""Model steps inside a partition: one mechanism for every served model (no Ray here).

A ``ModelStep`` is one model section (``text_embedding``, ``image_embedding``,
``image_classification``, ``captioning``) as the assembler declares it: the columns it
writes and the settings that change them, known from the spec alone. A worker binds it
to a client (``submit(inputs) -> handle``, ``result(handle) -> outputs``, optionally
``ready(handle) -> bool``) and the loaded model's ``ModelInfo`` (which inputs, which
output columns and their types). The assembler orders model steps in ``ModelStages``:
stage 0 runs every model whose input is known after the CPU steps (text and image
embeddings, image classifiers, in parallel); a later stage runs only on rows still
``ok`` after the previous stage's filters (captioning after the ``min_clip_score``
filter, so no GPU time is spent captioning rejected images).

Video rows carry an (F, h, w, 3) stack of their F sampled frames instead of one image:
an embedding model gets every frame (the caption repeated per frame) and the row gets the
mean-pooled, L2-normalised ``image_embedding`` (the clip embedding), the per-frame vectors
in ``frame_embeddings`` and the mean of the per-frame scalar outputs (``clip_score``,
the heads' and zero-shot scores); a
captioner or an image classifier (no vector output) gets the middle sampled frame. A model
whose ``ModelInfo.frames`` is F > 1 (a multi-frame VLM captioner, an X-CLIP video
embedding) gets a window of F frames per row instead (``frame_window``) and returns the
row's value itself. A clip row is a video row whose frames come from its span: the same
code serves it.

Per batch, the worker submits the stage's steps (whole columns: a (n, H, W, 3) uint8
array, a list of captions) and moves on to the next batch; at most ``max_in_flight``
batches wait for models (the smallest K of the steps). The oldest batch is completed
(remaining stages waited for in order) and written when the bound is reached, so rows are
written in input order and memory stays bounded. A batch whose stage finished early is
advanced to its next stage without waiting (``promote``), when the client can say so.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.columns import (CAPTION, CLIP_SCORE, FRAME_EMBEDDINGS, GENERATED_CAPTION, IMAGE,
                              IMAGE_EMBEDDING, IMAGE_HEIGHT, IMAGE_WIDTH, STATUS, TEXT_EMBEDDING,
                              Batch, lookup)
from pipeline.errors import ModelLoadError
from pipeline.records import RowError, Status
from pipeline.spec import SERVING_FIELDS
from pipeline.steps.base import Step, mark_error
from pipeline.media.device import MEDIA_ERRORS, MEDIA_IMAGES

if TYPE_CHECKING:  # steps do not import models at run time (import direction)
    from pipeline.contracts import ModelInfo


#: Section fields that add output columns when set and change nothing when empty
#: (``image_embedding.heads``, ``.zero_shot``; ``captioning.frames`` unset is one frame, as
#: before the field existed): left out of ``settings()`` while empty.
UNSET_WHEN_EMPTY = frozenset({"heads", "zero_shot", "frames"})


def frame_window(frames: np.ndarray, count: int) -> np.ndarray:
    """``count`` frames spread evenly over an (F, H, W, 3) stack, first and last included
    (indices ``round(linspace(0, F - 1, count))``; frames repeat when F < count):
    (count, H, W, 3), same dtype."""
    index = np.linspace(0, len(frames) - 1, count).round().astype(int)
    return frames[index]


def section_writes(section: str, section_spec: Any, video: bool) -> tuple[str, ...]:
    """The columns a model section writes, from its spec alone (before any model loads)."""
    if section == "text_embedding":
        return (TEXT_EMBEDDING,)
    if section == "image_embedding":
        return ((IMAGE_EMBEDDING,) + ((CLIP_SCORE,) if section_spec.score else ())
                + ((FRAME_EMBEDDINGS,) if video and section_spec.backend != "xclip" else ())
                + section_spec.quality_columns)
    if section == "image_classification":
        return (section_spec.column,)
    return (GENERATED_CAPTION,)


class ModelStep(Step):
    """One served model as a step of the pipeline (see the module docstring); it is run
    by ``ModelStages`` (submit, then apply), not called batch by batch.

    ``section``: the spec section; ``section_spec``: its settings (the serving fields,
    ``spec.SERVING_FIELDS``, change where and how fast, not what, and are left out of
    ``settings()``); ``video``: rows are videos (image inputs are (F, h, w, 3) frame
    stacks); ``media_entries``: image inputs are ``device_media`` entries (``decode.device:
    cuda``), sent as a list; the model returns the ``image``, ``image_width`` and
    ``image_height`` (columns ``ResizeStep`` declares) of the rows it decoded
    (``MEDIA_IMAGES``), and rows it could not decode (``MEDIA_ERRORS``) become error
    rows. ``bind(client, info)`` attaches the model; ``fields()`` then gives the Arrow
    types. Raises ``ModelLoadError`` at bind if the model returns an undeclared column.
    """

    def __init__(self, section: str, section_spec: Any, video: bool = False,
                 media_entries: bool = False):
        self.section = section
        self.section_spec = section_spec
        self.video = video
        self.media_entries = media_entries
        self.writes = section_writes(section, section_spec, video)
        self.max_in_flight = section_spec.max_in_flight
        self.client: Any = None
        self.info: ModelInfo | None = None
        self.per_frame = False  # set by bind: every video frame goes to the model
        self.kinds: list[tuple[str, str]] = []  # set by bind: (column, OutputField kind)

    @property
    def name(self) -> str:
        return f"ModelStep[{self.section}]"

    @property
    def reads(self) -> tuple[str, ...]:
        """``caption`` if the bound model takes text, its geometry's input column if it
        takes images (written by ``ModelInputStep``); nothing before ``bind``."""
        if self.info is None:
            return ()
        return ((CAPTION,) if self.info.text is not None else ()) + (
            (self.info.image.column,) if self.info.image is not None else ())

    def settings(self) -> dict[str, Any]:
        """The section's fields but the serving ones; fields added after outputs existed
        (``UNSET_WHEN_EMPTY``) are left out while empty, so their arrival does not change
        the fingerprint of a job that does not use them (its committed output resumes)."""
        out = self.section_spec.model_dump(mode="json", exclude=set(SERVING_FIELDS))
        return {k: v for k, v in out.items() if not (k in UNSET_WHEN_EMPTY and not v)}

    def bind(self, client: Any, info: "ModelInfo") -> "ModelStep":
        """Attach a client and the loaded model's ``info``; return self.

        Sets ``per_frame`` (video embeddings: every frame goes to the model, not just the
        middle one) and ``kinds``: (column, kind) per output column, kinds as
        ``OutputField``'s, ``vectors`` for the per-frame embeddings."""
        per_frame = self.video and info.image is not None and info.frames == 1 and any(
            f.kind == "vector" for f in info.outputs)
        kinds = [(f.name, f.kind) for f in info.outputs]
        kinds += [(FRAME_EMBEDDINGS, "vectors")] if per_frame else []
        written = {name for name, _ in kinds}
        if not written <= set(self.writes):
            raise ModelLoadError(f"{self.section}: the model returns {sorted(written)}, the "
                                 f"step declares {sorted(self.writes)}")
        self.client, self.info, self.per_frame, self.kinds = client, info, per_frame, kinds
        return self

    def fields(self) -> list[pa.Field]:
        """Arrow fields of the model's columns (``frame_embeddings`` for video embeddings:
        list<fixed_size_list>); needs ``bind``."""
        if self.info is None:
            raise ModelLoadError(f"{self.section}: not bound to a model; column types unknown")
        out = [lookup(f.name).field(f.arrow().type).with_name(f.name)  # family: score_<name>
               for f in self.info.outputs]
        if self.per_frame:
            emb = next(f for f in out if f.name == IMAGE_EMBEDDING)
            out.append(lookup(FRAME_EMBEDDINGS).field(pa.list_(emb.type)))
        return out

    def rows(self, batch: Batch) -> list[int]:
        """Rows to send: ``ok`` rows that have this model's required inputs."""
        rows = [i for i, s in enumerate(batch[STATUS]) if s == Status.OK.value]
        if self.info.text == "required":
            rows = [i for i in rows if batch[CAPTION][i] is not None]
        if self.info.image is not None:
            col = batch.get(self.info.image.column)
            rows = [i for i in rows if col is not None and col[i] is not None]
        return rows

    def _counts(self, batch: Batch, rows: list[int]) -> list[int]:
        """Model inputs per row: frames for per-frame video rows, else 1."""
        if not self.per_frame:
            return [1] * len(rows)
        col = batch[self.info.image.column]
        return [col[i].shape[0] for i in rows]

    def inputs(self, batch: Batch, rows: list[int]) -> dict[str, Any]:
        """The model's inputs for ``rows``: ``pixels`` (n, H, W, 3) uint8 (a list of n
        entries with ``media_entries``; (n, F, H, W, 3) for video rows to a model of
        ``info.frames`` F > 1), ``text``."""
        out: dict[str, Any] = {}
        counts = self._counts(batch, rows)
        if self.info.image is not None:
            col = batch[self.info.image.column]
            if self.media_entries:
                out["pixels"] = [col[i] for i in rows]
            elif self.per_frame:
                out["pixels"] = np.concatenate([col[i] for i in rows])
            elif self.video and self.info.frames > 1:
                out["pixels"] = np.stack([frame_window(col[i], self.info.frames) for i in rows])
            elif self.video:
                out["pixels"] = np.stack([col[i][len(col[i]) // 2] for i in rows])
            else:
                out["pixels"] = np.stack([col[i] for i in rows])
        if self.info.text is not None:
            out["text"] = [batch[CAPTION][i] for i, c in zip(rows, counts) for _ in range(c)]
        return out

    def apply(self, batch: Batch, rows: list[int], outputs: dict[str, Any]) -> None:
        """Set the model's columns on ``rows`` from its ``outputs`` (pooled per video)."""
        counts = self._counts(batch, rows)
        bounds = np.cumsum([0] + counts)
        for name, kind in self.kinds:
            column = batch[name]
            source = outputs[IMAGE_EMBEDDING if kind == "vectors" else name]
            for j, i in enumerate(rows):
                values = source[bounds[j]:bounds[j + 1]]
                column[i] = _pool(values, kind) if self.per_frame else values[0]
                if kind == "float":
                    v = column[i]
                    column[i] = None if v is None or math.isnan(v) else float(v)
        for j, image in enumerate(outputs.get(MEDIA_IMAGES) or ()):
            if image is not None:
                for name, value in zip((IMAGE, IMAGE_WIDTH, IMAGE_HEIGHT), image):
                    batch[name][rows[j]] = value
        for j, error in enumerate(outputs.get(MEDIA_ERRORS) or ()):
            if error is not None:
                self._undecodable(batch, rows[j], RowError(*error))

    def _undecodable(self, batch: Batch, i: int, error: RowError) -> None:
        """Row ``i``'s image could not be decoded by the model: an error row without this
        model's columns or the re-encoded image."""
        mark_error(batch, i, error)
        for name in [n for n, _ in self.kinds] + [IMAGE, IMAGE_WIDTH, IMAGE_HEIGHT]:
            if name in batch:
                batch[name][i] = None


def _pool(values: Any, kind: str) -> Any:
    """One video row's per-frame outputs -> its value: ``vectors``: the (F, D) array as
    is; ``vector``: the L2-normalised mean (F, D) -> (D,); ``float``: the mean (NaN-aware;
    None if every frame is NaN)."""
    if kind == "vectors":
        return np.asarray(values)
    if kind == "vector":
        mean = np.asarray(values, dtype=np.float32).mean(axis=0)
        norm = float(np.linalg.norm(mean))
        return (mean / norm if norm > 0 else mean).astype(np.asarray(values).dtype)
    if kind == "float":
        arr = np.asarray(values, dtype=np.float64)
        return None if np.isnan(arr).all() else float(np.nanmean(arr))
    return values[0]


@dataclasses.dataclass
class _InFlight:
    batch: Batch
    stage: int = -1
    calls: list = dataclasses.field(default_factory=list)  # (step, rows, handle)


class ModelStages:
    """The model steps of a job in stages, with the filters that run after each stage.

    ``start(batch)`` submits a batch's first stage; ``promote`` advances entries whose
    stage finished (without blocking); ``finish`` waits for the rest. ``max_in_flight``:
    the smallest bound of the steps (batches a worker keeps waiting on the models).
    """

    def __init__(self, stages: list[list[ModelStep]], filters: list[list[Step]]):
        self.stages, self.filters = stages, filters
        steps = self.steps
        self.max_in_flight = min((t.max_in_flight for t in steps), default=1)

    @property
    def steps(self) -> list[ModelStep]:
        return [t for stage in self.stages for t in stage]

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(c for t in self.steps for c in t.writes)

    def start(self, batch: Batch) -> _InFlight:
        """Set every output column to None and submit the first stage."""
        n = len(batch[STATUS])
        for name in self.writes:
            batch[name] = [None] * n
        entry = _InFlight(batch)
        self._advance(entry)
        return entry

    def _advance(self, entry: _InFlight) -> None:
        """Collect the current stage (blocking), run its filters, submit the next stage
        that has rows to send; ``entry.stage`` ends at ``len(stages)`` when done."""
        if entry.stage >= 0:
            for step, rows, handle in entry.calls:
                step.apply(entry.batch, rows, step.client.result(handle))
            for f in self.filters[entry.stage]:
                entry.batch = f(entry.batch)
        entry.calls = []
        while not entry.calls and entry.stage < len(self.stages):
            entry.stage += 1
            for step in self.stages[entry.stage] if entry.stage < len(self.stages) else []:
                rows = step.rows(entry.batch)
                if rows:
                    entry.calls.append((step, rows, step.client.submit(step.inputs(entry.batch, rows))))
            if not entry.calls and entry.stage < len(self.stages):
                # nothing to send: the stage's filters still see its (unscored) rows
                for f in self.filters[entry.stage]:
                    entry.batch = f(entry.batch)

    def done(self, entry: _InFlight) -> bool:
        return entry.stage >= len(self.stages)

    def finish(self, entry: _InFlight) -> Batch:
        """Wait for every remaining stage of ``entry``; return its batch."""
        while not self.done(entry):
            self._advance(entry)
        return entry.batch

    def promote(self, pending) -> None:
        """Move entries whose current (non-final) stage has finished on to their next
        stage, without blocking; needs clients that define ``ready``."""
        for entry in pending:
            if entry.stage + 1 >= len(self.stages) or not entry.calls:
                continue
            if all(_ready(step.client, handle) for step, _, handle in entry.calls):
                self._advance(entry)


def _ready(client, handle) -> bool:
    ready = getattr(type(client), "ready", None)  # a wrapper's __getattr__ does not count
    return bool(ready(client, handle)) if ready is not None else False
