"""The one assembler: ``JobSpec`` -> ``Pipeline`` (datasource, steps, model stages,
datasinks, output schema, fingerprint).

Every way of running a job uses the same ``Pipeline``: the ``PartitionWorker`` actor, the
plain-loop baseline in ``bench/``, and the tests. The media (image or video) and the
input kind are decided here and nowhere else: the assembler picks the datasource and the
step classes, each of which then does one thing.

    pipeline = assemble(spec)                       # driver: fingerprint, listing, checks
    pipeline = assemble(spec, models, executor)     # worker: models bound, steps set up
    outcome = run_partition(pipeline, partition, attempt_id, pool)   # runtime.partition

The output schema is derived: the columns the datasource, the steps and the model steps
declare (``writes``), those of kind ``output`` in ``pipeline.columns`` order, typed by
their declaration or - for model columns - by the bound model; then the datasource's
carried columns. A column that is not declared fails here (``AssemblyError``), not at
write. The fingerprint is the sha256 of the settings every part declares as changing
output rows (``settings()``), so moving a temp directory or resizing the worker pool
never invalidates committed output, while any setting that changes rows does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import pyarrow as pa

from pipeline import package_version, plugins
from pipeline.columns import (
    COLUMNS,
    ERROR,
    ERROR_REASON,
    KEY,
    PARTITION_ID,
    REJECT_REASON,
    SOURCE_URI,
    STATUS,
    lookup,
    output_order,
)
from pipeline.dedup.index import IndexDatasink
from pipeline.errors import AssemblyError
from pipeline.input import make_datasource
from pipeline.input.base import Datasource
from pipeline.output.sinks.base import Datasink, FileDatasink
from pipeline.output.sinks.clips import ClipDatasink
from pipeline.output.sinks.parquet import ParquetDatasink
from pipeline.output.sinks.quarantine import QuarantineDatasink
from pipeline.output.sinks.webdataset import WebDatasetDatasink
from pipeline.records import Partition
from pipeline.spec import MODEL_SECTIONS, JobSpec
from pipeline.steps import caption_signals, clip_signals
from pipeline.steps.base import RowStep, Step
from pipeline.steps.caption import CaptionStep
from pipeline.steps.clips import ClipEncodeStep, ClipSplitStep
from pipeline.steps.dedup import DedupStep
from pipeline.steps.image import (
    DecodeStep,
    FilterStep,
    HashStep,
    ResizeStep,
    needed_hashes,
)
from pipeline.steps.image_signals import image_signals_step
from pipeline.steps.model import ModelStages, ModelStep
from pipeline.steps.model_input import ModelInputStep, ScoreFilterStep
from pipeline.steps.ocr import ocr_step
from pipeline.steps.signal_filter import SignalFilters
from pipeline.steps.video import VideoDecodeStep, VideoFramesStep
from pipeline.storage import fs

#: Columns the runner sets on every batch it reads (identity and outcome).
RUNNER_WRITES = (KEY, PARTITION_ID, SOURCE_URI, STATUS, REJECT_REASON, ERROR_REASON, ERROR)

#: Added CPU steps: ``factory(spec) -> Step | None`` (None: not enabled by this spec), run
#: in this order after the built-in decode/filter/hash/dedup steps and before the model
#: inputs and the resize/encode step, so they see the decoded ``_pixels``. Adding a step
#: is one new module under ``pipeline/steps/`` plus one line here (DESIGN.md).
STEP_FACTORIES: list[Callable[[JobSpec], Step | None]] = [
    lambda spec: caption_signals.from_spec(spec, fs.read_bytes),  # signals.caption
    image_signals_step,  # signals.image
    ocr_step,  # signals.ocr
    clip_signals.signals_step,  # video: filters.clips, video.clips, dedup.dataset.frames
    clip_signals.filter_step,  # video: filters.clips bounds
]
#: Added datasinks: ``factory(spec) -> Datasink | None`` (None: not enabled by this spec),
#: after the built-in ones. Adding a datasink is one new module under
#: ``pipeline/output/sinks/`` (its class sets ``name`` and ``directory``) plus one line here.
DATASINK_FACTORIES: list[Callable[[JobSpec], Datasink | None]] = []


@dataclasses.dataclass
class Pipeline:
    """An assembled job: see the module docstring. ``steps`` are the CPU steps in order;
    ``models`` the model steps in stages (with the filters between stages)."""

    spec: JobSpec
    datasource: Datasource
    steps: list[Step]
    models: ModelStages
    datasinks: list[Datasink]
    plugins: list[plugins.Plugin] = dataclasses.field(default_factory=list)
    #: ``video.clips``: turns each read batch's video rows into clip rows before the steps
    splitter: ClipSplitStep | None = None

    @property
    def parts(self) -> list[Step]:
        """Every step (the clip splitter first), CPU and model, with the filters between
        model stages."""
        first = [self.splitter] if self.splitter is not None else []
        return first + self.steps + [p for stage, filters in zip(self.models.stages,
                                                                 self.models.filters)
                                     for p in stage + filters]

    @property
    def writes(self) -> set[str]:
        """Every declared column a batch of this pipeline can hold."""
        return set(RUNNER_WRITES) | set(self.datasource.writes) | {
            c for p in self.parts for c in p.writes}

    def fields(self) -> list[pa.Field]:
        """The output fields in declaration order (model columns need bound models)."""
        typed = {f.name: f for p in self.parts for f in p.fields()}
        names = {n for n in self.writes if lookup(n).kind == "output"}
        return [typed[n] if n in typed else COLUMNS[n].field() for n in output_order(names)]

    def schema(self, partition: Partition) -> pa.Schema:
        """Schema of the data files of ``partition``: ``fields()`` + carried columns; its
        metadata is ``file_metadata()`` (the files' Parquet key-value metadata, to which
        each datasink adds ``mmpipe.partition_id`` and ``mmpipe.attempt_id``)."""
        return pa.schema(self.fields() + self.datasource.extra_fields(partition),
                         metadata=self.file_metadata())

    def file_metadata(self) -> dict[str, str]:
        """Key-value metadata of every output Parquet file: ``mmpipe.version`` (the
        installed package's version, ``importlib.metadata``), ``mmpipe.fingerprint``
        (the commit markers' fingerprint) and ``mmpipe.spec`` (the resolved ``JobSpec``,
        overrides applied, as JSON)."""
        return {"mmpipe.version": package_version(), "mmpipe.fingerprint": self.fingerprint,
                "mmpipe.spec": self.spec.model_dump_json()}

    def settings(self) -> dict[str, Any]:
        """The output-affecting settings of every part, in pipeline order; with plugins,
        also ``plugins``: spec field -> ``Plugin.identity()`` (class, package version,
        ``with``)."""
        out = {"datasource": self.datasource.settings(),
               "steps": {p.name: p.settings() for p in self.parts},
               "datasinks": {s.name: s.settings() for s in self.datasinks}}
        if self.plugins:
            out["plugins"] = {p.field: p.identity() for p in self.plugins}
        return out

    def label(self, part: Any) -> str:
        """A part's name for messages; a plugin's adds its spec field and class:
        ``WordCountStep (steps[0]: my_pkg:WordCountStep)``."""
        name = getattr(part, "name", type(part).__name__)
        found = next((p for p in self.plugins if type(part) is p.cls), None)
        return f"{name} ({found.field}: {found.path})" if found else name

    def explain(self) -> str:
        """The assembled pipeline as text (``mmpipe validate --explain``): the datasource,
        each CPU step and model stage with its reads, writes and output-affecting settings,
        the datasinks with their directories, the output columns (a model column's type is
        the bound model's: ``model-typed`` when unbound) and the fingerprint."""
        def show(v: Any) -> str:
            return json.dumps(v, sort_keys=True, default=str)

        ds = self.datasource
        lines = [f"job {self.spec.name}: fingerprint {self.fingerprint}",
                 f"datasource {type(ds).__name__} (source.kind {self.spec.source.kind}, "
                 f"media {self.spec.source.media})",
                 f"  writes {', '.join(ds.writes)}", f"  settings {show(ds.settings())}",
                 "steps (in order)"]
        if self.splitter is not None:
            sp = self.splitter
            lines += [f"  {sp.name} (one row per clip, before the batches are cut)",
                      f"    reads {', '.join(sp.reads)}", f"    writes {', '.join(sp.writes)}",
                      f"    settings {show(sp.settings())}"]
        for p in self.steps:
            lines += [f"  {p.name}", f"    reads {', '.join(p.reads) or '-'}",
                      f"    writes {', '.join(p.writes) or '-'}",
                      f"    settings {show(p.settings())}"]
            lines += [f"    {c} needed by {why}" for c, why in getattr(p, "reasons", {}).items()]
        if self.spec.source.media == "image" and not any(isinstance(p, HashStep)
                                                         for p in self.steps):
            lines.append("  (no hash step: no dedup, dedup index, signal filter or "
                         "sink.hash_columns needs sha256 or phash)")
        for n, (stage, filters) in enumerate(zip(self.models.stages, self.models.filters)):
            lines.append(f"model stage {n}")
            for p in stage + filters:
                reads = ", ".join(p.reads) if not isinstance(p, ModelStep) or p.info else (
                    "caption and/or the model's image input (known once the model is bound)")
                lines += [f"  {p.name}", f"    reads {reads or '-'}",
                          f"    writes {', '.join(p.writes) or '-'}",
                          f"    settings {show(p.settings())}"]
        lines.append("datasinks")
        for s in self.datasinks:
            lines.append(f"  {s.name} -> {s.directory}/  settings {show(s.settings())}")
        if self.plugins:
            lines += ["plugins"] + [f"  {p.field}: {p.describe()}" for p in self.plugins]
        lines.append("output columns (then the datasource's carried columns)")
        typed = {}
        for p in self.parts:
            if not isinstance(p, ModelStep) or p.info is not None:
                typed.update({f.name: f for f in p.fields()})
        for n in output_order({n for n in self.writes if lookup(n).kind == "output"}):
            field = typed.get(n) or (COLUMNS[n].field() if lookup(n).arrow_type is not None
                                     else None)
            lines.append(f"  {n}: {field.type if field is not None else 'model-typed'}")
        return "\n".join(lines) + "\n"

    @property
    def fingerprint(self) -> str:
        """16 hex digits of the sha256 of ``settings()`` (sorted-key JSON)."""
        blob = json.dumps(self.settings(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _cpu_steps(spec: JobSpec, geometries: list, signals: SignalFilters | None = None,
               source_writes: tuple[str, ...] = (), user: list[Step] = ()) -> list[Step]:
    """Images: caption, decode, filter, hash, dedup, added steps, the ``user`` (plugin)
    steps, signal filters on CPU
    columns, model inputs (if a model takes images), resize. Video: caption, video decode
    (sha256 of the file, pHash of a mosaic of frames, frames within
    runtime.max_batch_bytes), filter, dedup, added steps, signal filters, model inputs (an
    (F, h, w, 3) stack per record), frame encoding."""
    takes_images = (spec.image_embedding.enabled or spec.captioning.enabled
                    or spec.image_classification.enabled)
    added = [s for s in (factory(spec) for factory in STEP_FACTORIES) if s is not None]
    added += user
    inputs = [ModelInputStep(geometries)] if takes_images else []
    if spec.source.media == "video":
        clip = (ClipEncodeStep(spec.video.clips, spec.video.temp_dir,
                               spec.video.allow_playlists)
                if spec.video.clips.writes_files else None)
        one_pass = clip is not None and clip.one_pass   # libx264: encoded while decoded
        head: list[Step] = [CaptionStep(spec.captions),
                            VideoDecodeStep(spec.video, spec.runtime.max_batch_bytes,
                                            spec.decode if spec.source.holds_images
                                            else None, clip if one_pass else None)]
        if clip is not None and not one_pass:
            head.append(clip)
        head += [FilterStep(spec.filters), DedupStep(spec.dedup)] + added
        return (head + _cpu_signal_filter(signals, source_writes, head) + inputs
                + [VideoFramesStep(spec.resize)])
    # JPEG draft decoding keeps the pixels large enough for every consumer
    draft = spec.resize.size_px if spec.resize.mode != "none" else None
    if draft is not None and geometries:
        draft = max([draft] + [g.min_side_px for g in geometries])
    if draft is not None and spec.signals.image.enabled:  # steps/image_signals.py
        draft = max(draft, 2 * spec.signals.image.analysis_px)
    hashes = needed_hashes(spec)     # none: no HashStep, no sha256/phash columns
    head = [CaptionStep(spec.captions), DecodeStep(spec.decode, draft, spec.resize),
            FilterStep(spec.filters)] + ([HashStep(hashes)] if hashes else []) + [
            DedupStep(spec.dedup)] + added
    return (head + _cpu_signal_filter(signals, source_writes, head) + inputs
            + [ResizeStep(spec.resize)])


def _cpu_signal_filter(signals: SignalFilters | None, source_writes: tuple[str, ...],
                       head: list[Step]) -> list[Step]:
    """The signal filters on the columns the runner, the datasource and the CPU steps
    ``head`` (all before the model inputs) write (``SignalFilters.cpu_step``)."""
    if signals is None or not signals.rules:
        return []
    step = signals.cpu_step(set(RUNNER_WRITES) | set(source_writes)
                            | {c for s in head for c in s.writes})
    return [step] if step is not None else []


def _model_stages(spec: JobSpec, models: dict[str, tuple] | None,
                  signals: SignalFilters | None = None) -> ModelStages:
    """Stage 0: every model but a captioner that must wait for a filter (the score filter,
    a signal filter on a stage-0 model column); each stage's signal filters after it."""
    video = spec.source.media == "video"
    encoded = spec.decode.device == "cuda"  # JpegInput entries go to image_embedding
    steps = [ModelStep(s, getattr(spec, s), video, encoded and s == "image_embedding")
             for s in MODEL_SECTIONS if getattr(spec, s).enabled]
    if models is not None:
        for step in steps:
            if step.section not in models:
                raise AssemblyError(f"{step.section} is enabled but no model was given for it")
            step.bind(*models[step.section])
    gate = spec.image_embedding.enabled and spec.image_embedding.min_clip_score is not None
    early = [t for t in steps if t.section != "captioning"]
    wait = gate or (signals is not None and signals.delays_captioning(early))
    later = [t for t in steps if wait and t.section == "captioning"]
    first = [t for t in steps if t not in later]
    stages, filters = [first], [[ScoreFilterStep(spec.image_embedding.min_clip_score)] if gate
                                else []]
    if later:
        stages.append(later)
        filters.append([])
    for n, stage in enumerate(stages):
        step = signals.after_models(stage, n) if signals is not None else None
        filters[n] += [step] if step is not None else []
    return ModelStages(stages, filters)


def _datasinks(spec: JobSpec) -> list[Datasink]:
    # the clip files first: ClipDatasink sets clip_path, which the others write
    sinks: list[Datasink] = ([ClipDatasink(spec.sink.uri)] if spec.video.clips.writes_files
                             else [])
    sinks.append(ParquetDatasink(spec.sink.uri, spec.sink))
    if spec.sink.quarantine:
        sinks.append(QuarantineDatasink(spec.sink.uri, spec.sink))
    if spec.dedup.dataset.enabled:
        sinks.append(IndexDatasink(spec.sink.uri, spec.dedup.dataset, spec.frame_index))
    if spec.sink.webdataset.enabled:
        sinks.append(WebDatasetDatasink(spec.sink.uri, spec.sink.webdataset,
                                        spec.resize.encode_format))
    return sinks + [s for s in (factory(spec) for factory in DATASINK_FACTORIES)
                    if s is not None]


def _load_plugins(spec: JobSpec) -> list[plugins.Plugin]:
    """The plugin classes ``spec`` names (``pipeline.plugins``), imported: the datasource
    (``source``), the steps (``steps[i]``), the datasinks (``sink.datasinks[i]``). Raises
    ``SpecError`` naming the field and the value when one cannot be loaded."""
    found = []
    if spec.source.kind == "plugin":
        found.append(plugins.load(spec.source.uses, plugins.DATASOURCES, Datasource, "source",
                                  spec.source.with_))
    found += [plugins.load(s.uses, plugins.STEPS, Step, f"steps[{i}]", s.with_)
              for i, s in enumerate(spec.steps)]
    return found + [plugins.load(s.uses, plugins.DATASINKS, FileDatasink,
                                 f"sink.datasinks[{i}]", s.with_)
                    for i, s in enumerate(spec.sink.datasinks)]


def assemble(spec: JobSpec, models: dict[str, tuple] | None = None,
             executor: Executor | None = None, setup: bool = False) -> Pipeline:
    """Assemble the pipeline of ``spec``.

    ``models``: section -> ``(client, ModelInfo)`` for every enabled model section (a
    worker's pools, or in-process backends); None leaves model steps unbound (enough for
    the fingerprint, the listing and the checks, not to run). ``executor``: threads for
    row steps. ``setup``: call every step's ``setup()``.

    Plugins (``source.kind: plugin``, ``steps``, ``sink.datasinks``) are imported and
    built here, in every process that assembles (driver and workers); one that cannot be
    imported or built is a ``SpecError`` naming its field (``steps[0].uses``).

    Raises ``AssemblyError`` if a part writes or reads an undeclared column, reads a
    column no earlier part writes (``_check_reads``), or a model is missing; ``SpecError``
    naming ``filters.signals[i]`` for a signal filter on a column this pipeline does not
    write (or of the wrong type), or a calibrated threshold that cannot be resolved.
    """
    geometries = [info.image for _, info in (models or {}).values() if info.image is not None]
    signals = SignalFilters(spec.filters)   # calibrated thresholds resolved here (driver first)
    loaded = _load_plugins(spec)
    made = {p.field: p for p in loaded}
    source = (made["source"].make(spec.source, spec.decode, spec.download, spec.video)
              if "source" in made else
              make_datasource(spec.source, spec.decode, spec.download, spec.video))
    user = [p.make() for p in loaded if p.field.startswith("steps[")]
    sinks = [p.make(spec.sink.uri) for p in loaded if p.field.startswith("sink.")]
    pipeline = Pipeline(spec, source, _cpu_steps(spec, geometries, signals, source.writes, user),
                        _model_stages(spec, models, signals), _datasinks(spec) + sinks, loaded,
                        _splitter(spec))
    signals.check_placed(pipeline.writes)
    _check_declared(pipeline)
    _check_reads(pipeline)
    for step in pipeline.steps:
        if isinstance(step, RowStep):
            step.executor = executor
        if setup:
            step.setup()
    return pipeline


def _splitter(spec: JobSpec) -> ClipSplitStep | None:
    """``video.clips`` on a video job: the step that fans video rows out into clip rows."""
    if spec.source.media != "video" or not spec.video.clips.enabled:
        return None
    return ClipSplitStep(spec.video.clips, spec.video.allow_playlists, spec.runtime.batch_size,
                         spec.source.holds_images)


def _check_declared(pipeline: Pipeline) -> None:
    """Every column a part writes or reads is declared (``pipeline.columns``). Raises
    ``AssemblyError`` naming the part and the column."""
    for part in [pipeline.datasource] + pipeline.parts:
        for name in tuple(part.writes) + tuple(getattr(part, "reads", ())):
            try:
                lookup(name)
            except KeyError as e:
                verb = "writes" if name in part.writes else "reads"
                raise AssemblyError(f"{pipeline.label(part)} {verb} {name!r}, which is not "
                                    "declared in pipeline.columns") from e


def _check_reads(pipeline: Pipeline) -> None:
    """Every column a step reads is written before it: by the runner, the datasource or
    an earlier part (NeMo Curator's stage ``inputs()``/``outputs()`` rule). Raises
    ``AssemblyError`` naming the step and the column."""
    written = set(RUNNER_WRITES) | set(pipeline.datasource.writes)
    for part in pipeline.parts:
        for name in part.reads:
            if name not in written:
                where = ("no part writes it" if name not in pipeline.writes else
                         "it is written only by a later part")
                raise AssemblyError(f"{pipeline.label(part)} reads {name!r}, which no earlier "
                                    "part writes "
                                    f"({where}; written before it: {sorted(written)})")
        written |= set(part.writes)


def fingerprint(spec: JobSpec) -> str:
    """The fingerprint of ``spec``'s pipeline (``Pipeline.fingerprint``)."""
    return assemble(spec).fingerprint
