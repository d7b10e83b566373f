"""The job spec: one YAML file validated by pydantic (``extra="forbid"``), one module per
family of sections:

  base.py     ``_Strict`` (every section's base), ``FieldNotApplicable``, ``PluginSpec``
              and its ``uses`` check, the default media extensions (``image_extensions()``)
  source.py   ``source`` (``SOURCE_FIELD_KINDS``: fields by ``source.kind``), ``storage``,
              ``download``
  media.py    ``captions``, ``decode``, ``video`` (``video.clips``, their files), ``resize``
  filters.py  ``filters`` (``filters.signals``, ``filters.clips``) and ``signals``
  dedup.py    ``dedup`` (inside a partition, and ``dedup.dataset``)
  models.py   the model sections (``MODEL_SECTIONS``) and their serving (``SERVING_FIELDS``)
  output.py   ``sink``
  runtime.py  ``runtime`` (and ``runtime.prices``)
  job.py      ``JobSpec``: every section, and the rules across sections
  load.py     ``load_spec(path, overrides)`` / ``parse_spec``: bounded YAML, overrides,
              validation into a ``SpecError`` naming the dotted field and the bad value

Every public name is re-exported here (``from pipeline.spec import JobSpec``).
``pipeline.spec_doc`` renders these models as ``docs/spec.md`` and a JSON Schema. The
fingerprint of a spec is computed from the assembled pipeline (``pipeline.assembly``): each
part declares which of its settings change output rows.
"""

from __future__ import annotations

from pipeline.errors import SpecError
from pipeline.spec.base import (DECODED_IMAGE_FORMATS, HEIF_EXTENSIONS, SIDECAR_EXTENSIONS,
                                VIDEO_EXTENSIONS, FieldNotApplicable, PluginSpec, Uses,
                                image_extensions)
from pipeline.spec.dedup import DatasetDedupSpec, DedupSpec
from pipeline.spec.filters import (SIGNAL_PRESETS, SIGNAL_REASONS, CalibratedThreshold,
                                   CaptionSignalsSpec, ClipFilterSpec, FilterSpec,
                                   ImageSignalsSpec, OcrSpec, SignalFilterSpec, SignalPreset,
                                   SignalReason, SignalsSpec)
from pipeline.spec.job import JobSpec
from pipeline.spec.load import (MAX_SPEC_BYTES, MAX_SPEC_NODES, apply_override, load_spec,
                                load_yaml, parse_spec)
from pipeline.spec.media import (CaptionSpec, ClipsSpec, ClipTranscodeSpec, DecodeSpec,
                                 ResizeSpec, VideoSpec)
from pipeline.spec.models import (HEAD_PRESETS, MODEL_SECTIONS, SERVING_FIELDS,
                                  CaptionModelSpec, HeadSpec, ImageClassificationSpec,
                                  ImageEmbedSpec, ModelServingSpec, ReplicasSpec, TextEmbedSpec,
                                  ZeroShotSpec)
from pipeline.spec.output import SinkSpec, WebDatasetSinkSpec
from pipeline.spec.runtime import PricesSpec, RuntimeSpec
from pipeline.spec.source import (SOURCE_FIELD_KINDS, SOURCE_KINDS, DownloadSpec, SourceKind,
                                  SourceSpec, StorageSpec, WebDatasetSourceSpec)

__all__ = [
    "SpecError",
    # base
    "DECODED_IMAGE_FORMATS", "HEIF_EXTENSIONS", "SIDECAR_EXTENSIONS", "VIDEO_EXTENSIONS",
    "FieldNotApplicable", "PluginSpec", "Uses", "image_extensions",
    # source
    "SOURCE_FIELD_KINDS", "SOURCE_KINDS", "DownloadSpec", "SourceKind", "SourceSpec",
    "StorageSpec", "WebDatasetSourceSpec",
    # media
    "CaptionSpec", "ClipsSpec", "ClipTranscodeSpec", "DecodeSpec", "ResizeSpec", "VideoSpec",
    # filters
    "SIGNAL_PRESETS", "SIGNAL_REASONS", "CalibratedThreshold", "CaptionSignalsSpec",
    "ClipFilterSpec", "FilterSpec", "ImageSignalsSpec", "OcrSpec", "SignalFilterSpec",
    "SignalPreset", "SignalReason", "SignalsSpec",
    # dedup
    "DatasetDedupSpec", "DedupSpec",
    # models
    "HEAD_PRESETS", "MODEL_SECTIONS", "SERVING_FIELDS", "CaptionModelSpec", "HeadSpec",
    "ImageClassificationSpec", "ImageEmbedSpec", "ModelServingSpec", "ReplicasSpec",
    "TextEmbedSpec", "ZeroShotSpec",
    # output
    "SinkSpec", "WebDatasetSinkSpec",
    # runtime
    "PricesSpec", "RuntimeSpec",
    # job
    "JobSpec",
    # load
    "MAX_SPEC_BYTES", "MAX_SPEC_NODES", "apply_override", "load_spec", "load_yaml",
    "parse_spec",
]
