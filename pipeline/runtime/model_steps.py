"""Model steps inside a partition: one mechanism for every served model (no Ray here).

A ``ModelTask`` is one model step as a worker sees it: a client (``submit(inputs) ->
handle``, ``result(handle) -> outputs``, optionally ``ready(handle) -> bool``) and the
model's ``ModelInfo`` (which inputs, which output columns). A ``ModelPlan`` orders the
tasks in stages: stage 0 runs every model whose input is known after the CPU steps (text
and image embeddings, in parallel); a later stage runs only on rows still ``ok`` after the
previous stage's filters (captioning after the ``min_clip_score`` filter, so no GPU time
is spent captioning rejected images).

Video rows carry an (F, h, w, 3) stack of their F sampled frames instead of one image:
an embedding model gets every frame (the caption repeated per frame) and the row gets the
mean-pooled, L2-normalised ``image_embedding`` (the clip embedding), the per-frame vectors
in ``frame_embeddings`` and the mean of the per-frame scalar outputs (``clip_score``); a
captioner gets the middle sampled frame.

Per batch, the worker submits the stage's tasks (whole columns: a (n, H, W, 3) uint8
array, a list of captions) and moves on to the next batch; at most ``max_in_flight``
batches wait for models (the smallest K of the tasks). The oldest batch is completed
(remaining stages waited for in order) and written when the bound is reached, so rows are
written in input order and memory stays bounded. A batch whose stage finished early is
advanced to its next stage without waiting (``promote``), when the client can say so.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from pipeline.models.base import ModelInfo, OutputField
from pipeline.records import (CAPTION, FRAME_EMBEDDINGS, IMAGE_EMBEDDING, STATUS, TEXT_EMBEDDING,
                              Batch, Status)
from pipeline.spec import JobSpec
from pipeline.steps.base import Step
from pipeline.steps.model_input import ScoreFilterStep


@dataclasses.dataclass
class ModelTask:
    """A model step: ``section`` (spec section), its client, what it takes and gives.

    ``video``: rows are videos (image inputs are (F, h, w, 3) frame stacks).
    """

    section: str
    client: Any
    info: ModelInfo
    max_in_flight: int = 2
    video: bool = False

    @property
    def per_frame(self) -> bool:
        """Video: every frame goes to the model (embeddings), not just the middle one."""
        return self.video and self.info.image is not None and any(
            f.kind == "vector" for f in self.info.outputs)

    @property
    def fields(self) -> list[OutputField]:
        """Output columns: the model's, plus ``frame_embeddings`` for video embeddings."""
        out = list(self.info.outputs)
        if self.per_frame:
            out += [OutputField(FRAME_EMBEDDINGS, "vectors", f.dim, f.dtype)
                    for f in self.info.outputs if f.name == IMAGE_EMBEDDING]
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
        out: dict[str, Any] = {}
        counts = self._counts(batch, rows)
        if self.info.image is not None:
            col = batch[self.info.image.column]
            if self.per_frame:
                out["pixels"] = np.concatenate([col[i] for i in rows])
            elif self.video:
                out["pixels"] = np.stack([col[i][len(col[i]) // 2] for i in rows])
            else:
                out["pixels"] = np.stack([col[i] for i in rows])
        if self.info.text is not None:
            out["text"] = [batch[CAPTION][i] for i, c in zip(rows, counts) for _ in range(c)]
        return out

    def apply(self, batch: Batch, rows: list[int], outputs: dict[str, Any]) -> None:
        counts = self._counts(batch, rows)
        bounds = np.cumsum([0] + counts)
        for field in self.fields:
            column = batch[field.name]
            source = outputs[IMAGE_EMBEDDING if field.kind == "vectors" else field.name]
            for j, i in enumerate(rows):
                values = source[bounds[j]:bounds[j + 1]]
                column[i] = _pool(values, field.kind) if self.per_frame else values[0]
                if field.kind == "float":
                    v = column[i]
                    column[i] = None if v is None or math.isnan(v) else float(v)


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


class LocalModelClient:
    """An in-process client over a backend or a ``BatchServer`` (plain loops, tests).

    With a ``BatchServer`` the model computes in its own threads while the caller goes on.
    """

    def __init__(self, server):
        self.server = server

    def submit(self, inputs: dict[str, Any]):
        if hasattr(self.server, "submit"):
            return self.server.submit(inputs)
        return self.server(inputs)

    def result(self, handle):
        return handle.result() if hasattr(handle, "result") else handle

    def ready(self, handle) -> bool:
        return handle.done() if hasattr(handle, "done") else True


@dataclasses.dataclass
class _InFlight:
    batch: Batch
    stage: int = -1
    calls: list = dataclasses.field(default_factory=list)  # (task, rows, handle)


class ModelPlan:
    """The model tasks of a job in stages, with the filters that run after each stage."""

    def __init__(self, stages: list[list[ModelTask]], filters: list[list[Step]]):
        self.stages, self.filters = stages, filters
        tasks = [t for stage in stages for t in stage]
        self.max_in_flight = min((t.max_in_flight for t in tasks), default=1)

    @classmethod
    def build(cls, spec: JobSpec, tasks: list[ModelTask]) -> "ModelPlan":
        """Stage 0: every task but a captioner that must wait for the score filter."""
        for task in tasks:
            task.video = spec.source.media == "video"
        gate = spec.image_embedding.enabled and spec.image_embedding.min_clip_score is not None
        later = [t for t in tasks if gate and t.section == "captioning"]
        first = [t for t in tasks if t not in later]
        score_filter = [ScoreFilterStep(spec.image_embedding.min_clip_score)] if gate else []
        stages, filters = [first], [score_filter]
        if later:
            stages.append(later)
            filters.append([])
        return cls(stages, filters)

    @property
    def fields(self) -> list[OutputField]:
        return [f for stage in self.stages for t in stage for f in t.fields]

    @property
    def geometries(self) -> list:
        return [t.info.image for stage in self.stages for t in stage if t.info.image is not None]

    def start(self, batch: Batch) -> _InFlight:
        """Set every output column to None and submit the first stage."""
        n = len(batch[STATUS])
        for field in self.fields:
            batch[field.name] = [None] * n
        entry = _InFlight(batch)
        self._advance(entry)
        return entry

    def _advance(self, entry: _InFlight) -> None:
        """Collect the current stage (blocking), run its filters, submit the next stage
        that has rows to send; ``entry.stage`` ends at ``len(stages)`` when done."""
        if entry.stage >= 0:
            for task, rows, handle in entry.calls:
                task.apply(entry.batch, rows, task.client.result(handle))
            for step in self.filters[entry.stage]:
                entry.batch = step(entry.batch)
        entry.calls = []
        while not entry.calls and entry.stage < len(self.stages):
            entry.stage += 1
            for task in self.stages[entry.stage] if entry.stage < len(self.stages) else []:
                rows = task.rows(entry.batch)
                if rows:
                    entry.calls.append((task, rows, task.client.submit(task.inputs(entry.batch, rows))))

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
            if all(_ready(task.client, handle) for task, _, handle in entry.calls):
                self._advance(entry)


def _ready(client, handle) -> bool:
    ready = getattr(type(client), "ready", None)  # a wrapper's __getattr__ does not count
    return bool(ready(client, handle)) if ready is not None else False


def text_task(client, embedding_dim: int, max_in_flight: int) -> ModelTask:
    """A caption embedder as a task, for in-process callers (plain loops, tests): ``client``
    has ``submit({"text": [...]})`` and ``result(handle) -> {"text_embedding": (n, D)}``."""
    info = ModelInfo("sentence-transformers",
                     (OutputField(TEXT_EMBEDDING, "vector", embedding_dim),), text="required")
    return ModelTask("text_embedding", client, info, max_in_flight)


def as_model_plan(spec: JobSpec, models: Any) -> ModelPlan:
    """``models``: None (no model step), a ``ModelPlan``, or a list of ``ModelTask``."""
    if models is None:
        return ModelPlan([[]], [[]])
    if isinstance(models, ModelPlan):
        return models
    return ModelPlan.build(spec, list(models))
