"""``JobSpec``: a whole job, every section of the spec, and the rules that span sections
(the input and output locations differ, video-only settings need ``source.media: video``,
``decode.device: cuda`` needs an image job whose one image model is ``image_embedding``).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.spec.base import FieldNotApplicable, PluginSpec, _Strict
from pipeline.spec.dedup import DedupSpec
from pipeline.spec.filters import FilterSpec, SignalsSpec
from pipeline.spec.media import CaptionSpec, DecodeSpec, ResizeSpec, VideoSpec
from pipeline.spec.models import (CaptionModelSpec, ImageClassificationSpec, ImageEmbedSpec,
                                  TextEmbedSpec)
from pipeline.spec.output import SinkSpec
from pipeline.spec.runtime import RuntimeSpec
from pipeline.spec.source import DownloadSpec, SourceSpec, StorageSpec


class JobSpec(_Strict):
    """A whole job: source, steps, sink and runtime."""

    name: str = Field("mmpipe-job", description="Job name, used in logs and the report.")
    source: SourceSpec = Field(description="The input: kind, location, partitioning.")
    sink: SinkSpec = Field(description="The output: location, Parquet settings, quarantine, "
                           "WebDataset shards.")
    captions: CaptionSpec = Field(CaptionSpec(), description="Caption normalisation flags.")
    decode: DecodeSpec = Field(DecodeSpec(), description="Decoding limits (pixels, bytes).")
    download: DownloadSpec = Field(DownloadSpec(), description="HTTP(S) downloads of manifest "
                                   "URLs.")
    video: VideoSpec = Field(VideoSpec(), description="Video decoding and frame sampling "
                             "(`source.media: video`).")
    resize: ResizeSpec = Field(ResizeSpec(), description="Resize and re-encode of `image`.")
    filters: FilterSpec = Field(FilterSpec(), description="Size and aspect-ratio filters, "
                                "and filters on signal columns (`signals`, `score_only`).")
    dedup: DedupSpec = Field(DedupSpec(), description="Exact and near dedup inside a partition.")
    text_embedding: TextEmbedSpec = Field(TextEmbedSpec(), description="Caption embeddings "
                                          "(model actors).")
    image_embedding: ImageEmbedSpec = Field(ImageEmbedSpec(), description="Image embeddings, "
                                            "CLIP score and its filter (model actors).")
    captioning: CaptionModelSpec = Field(CaptionModelSpec(), description="Generated captions "
                                         "(model actors).")
    image_classification: ImageClassificationSpec = Field(
        ImageClassificationSpec(), description="An image classifier's score, e.g. "
        "`watermark_score` (model actors).")
    runtime: RuntimeSpec = Field(RuntimeSpec(), description="Workers, batches, retries, "
                                 "resume mode; never changes the output.")
    storage: StorageSpec = Field(StorageSpec(), description="S3 endpoint, region, retries.")
    signals: SignalsSpec = Field(SignalsSpec(), description="Quality signals measured on the "
                                 "CPU workers (sharpness, exposure, text in the image, ...).")
    steps: tuple[PluginSpec, ...] = Field(
        (), description="Steps from the user's own package (`Step` subclasses, built as "
        "`Class(**with)`), run in this order after the built-in CPU steps (decode, "
        "filters, hashes, dedup, signals) and before the model inputs and the resize, so "
        "an image job gives them `_pixels`.")

    @model_validator(mode="after")
    def _distinct_locations(self) -> "JobSpec":
        """`sink.uri` must differ from `source.uri`; semantic dedup needs image embeddings."""
        if self.source.uri.rstrip("/") == self.sink.uri.rstrip("/"):
            raise ValueError("sink.uri must differ from source.uri")
        if self.dedup.dataset.semantic and not self.image_embedding.enabled:
            raise FieldNotApplicable([("dedup.dataset.semantic", True, "needs image "
                                       "embeddings: set image_embedding.enabled (and "
                                       "image_embedding.model)")])
        return self

    @model_validator(mode="after")
    def _clips_need_video(self) -> "JobSpec":
        """`video.clips.method` other than `none` needs `source.media: video`."""
        if self.video.clips.enabled and self.source.media != "video":
            raise FieldNotApplicable([("video.clips.method", self.video.clips.method,
                                       f"{self.video.clips.method!r} needs source.media: "
                                       f"video (got {self.source.media!r})")])
        return self

    @model_validator(mode="after")
    def _frame_signals_need_video(self) -> "JobSpec":
        """`filters.clips` (enabled, a bound or score_only) and `dedup.dataset.frames` need
        `source.media: video`."""
        if self.source.media == "video":
            return self
        problems = []
        if self.filters.clips.on:
            problems.append(("filters.clips", "set", "frame signals need source.media: "
                             f"video (got {self.source.media!r})"))
        if self.dedup.dataset.frames:
            problems.append(("dedup.dataset.frames", True, "frame hashes need source.media: "
                             f"video (got {self.source.media!r})"))
        if problems:
            raise FieldNotApplicable(problems)
        return self

    @property
    def frame_signals(self) -> bool:
        """Whether video rows get the frame signals (`steps.clip_signals`): a video job
        with `filters.clips` on, `video.clips` splitting, or `dedup.dataset.frames`."""
        return self.source.media == "video" and (
            self.filters.clips.on or self.video.clips.enabled
            or bool(self.dedup.dataset.frames))

    @property
    def frame_index(self) -> bool:
        """Whether the near index gets a row per sampled frame (`dedup.dataset.frames`,
        default: `frame_signals`), with dataset dedup's near index on."""
        ds = self.dedup.dataset
        wanted = self.frame_signals if ds.frames is None else ds.frames
        return bool(wanted) and ds.enabled and ds.near and self.source.media == "video"

    @model_validator(mode="after")
    def _decode_device(self) -> "JobSpec":
        """`decode.device: cuda` needs an image job whose only image model is
        `image_embedding` (the actor that decodes)."""
        if self.decode.device == "cpu":
            return self
        problems = []
        if self.source.media != "image":
            problems.append(f"source.media is {self.source.media!r} (images only)")
        if not self.image_embedding.enabled:
            problems.append("image_embedding is not enabled (its model actors decode)")
        if self.image_embedding.backend == "xclip":
            problems.append("image_embedding.backend is xclip (it takes decoded frames)")
        if self.captioning.enabled:
            problems.append("captioning is enabled (its model actors take decoded pixels)")
        if self.signals.image.enabled or self.signals.ocr.enabled:
            problems.append("signals.image or signals.ocr is enabled (they measure the "
                            "worker's pixels, then only a 32-pixel draft)")
        if self.image_classification.enabled:
            problems.append("image_classification is enabled (its model actors take decoded "
                            "pixels)")
        if problems:
            raise FieldNotApplicable([("decode.device", self.decode.device,
                                       f"{self.decode.device!r} does not apply: "
                                       + "; ".join(problems) + "; use decode.device: cpu")])
        return self
