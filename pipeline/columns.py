"""Every column of a batch and of the output, declared once: name, Arrow type, meaning.

A ``Batch`` is a dict of equal-length Python lists, one per column. Steps, datasources,
datasinks and model backends name columns only through the constants of this module;
``declare`` registers a column and returns its name, so the constant and its declaration
are one line. The output schema of a job is derived from the columns its assembled
pipeline writes (``pipeline.assembly``); a step that declares a column not declared here
fails when the pipeline is assembled, never silently at write.

Kinds:

* ``output``: written to the data files (``Column.arrow_type``; ``None`` means the type is
  set by the step that writes it when the pipeline is assembled, e.g. a model's
  ``fixed_size_list<float32>[D]`` whose D comes from the loaded checkpoint).
* ``quarantine``: written to quarantine files only (the source bytes of error rows).
* ``internal``: lives in batches only (decoded pixels, staged paths); never written.
  ``family=True`` declares a prefix: e.g. one internal column per model input geometry.

Internal names start with ``_``; output names never do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import pyarrow as pa

Batch = dict[str, list[Any]]
Kind = Literal["output", "quarantine", "internal"]


@dataclasses.dataclass(frozen=True)
class Column:
    """One declared column (see the module docstring for ``kind`` and ``family``)."""

    name: str
    arrow_type: pa.DataType | None
    description: str
    kind: Kind = "output"
    family: bool = False

    def field(self, arrow_type: pa.DataType | None = None) -> pa.Field:
        """The Arrow field; ``arrow_type`` is required (and only allowed) for columns
        typed at assembly. Raises ``ValueError`` otherwise."""
        if (arrow_type is None) == (self.arrow_type is None):
            raise ValueError(f"column {self.name!r}: "
                             + ("its type is set at assembly" if arrow_type is None else
                                f"declared as {self.arrow_type}; cannot retype it"))
        return pa.field(self.name, arrow_type or self.arrow_type)


COLUMNS: dict[str, Column] = {}


def declare(name: str, arrow_type: pa.DataType | None, description: str,
            kind: Kind = "output", family: bool = False) -> str:
    """Register a column and return its name. Raises ``ValueError`` on a second
    declaration of ``name`` or an internal/output name mismatch."""
    if name in COLUMNS:
        raise ValueError(f"column {name!r} is declared twice")
    if (kind == "internal") != name.startswith("_"):
        raise ValueError(f"column {name!r}: internal names, and only they, start with '_'")
    COLUMNS[name] = Column(name, arrow_type, description, kind, family)
    return name


def lookup(name: str) -> Column:
    """The declaration of ``name`` (a family member resolves to its family).
    Raises ``KeyError`` naming the column if it was never declared."""
    if name in COLUMNS:
        return COLUMNS[name]
    for col in COLUMNS.values():
        if col.family and name.startswith(col.name):
            return col
    raise KeyError(f"column {name!r} is not declared in pipeline.columns")


def output_order(names: set[str]) -> list[str]:
    """``names`` in declaration order (the output schema's column order); members of a
    family (e.g. ``score_<name>``) at their family's place, by name. Raises ``KeyError``
    for an undeclared name (``lookup``)."""
    rank = {n: i for i, n in enumerate(COLUMNS)}
    return sorted(names, key=lambda n: (rank[n] if n in rank else rank[lookup(n).name], n))


# --- identity and outcome (every row) -----------------------------------------------
KEY = declare("key", pa.string(), "Record key: file stem, manifest key or WebDataset __key__.")
PARTITION_ID = declare("partition_id", pa.string(), "Partition that produced the row.")
SOURCE_URI = declare("source_uri", pa.string(), "Where the record's media came from, as a URI: "
                     "s3://, http(s)://, file:// or relative to the working directory "
                     "(pipeline.input.source_uri).")
STATUS = declare("status", pa.string(), "ok | rejected | error (records.Status).")
REJECT_REASON = declare("reject_reason", pa.string(), "records.RejectReason when rejected.")
ERROR_REASON = declare("error_reason", pa.string(), "records.ErrorReason when status=error.")
ERROR = declare("error", pa.string(), "'<error_reason>: <message>' when status=error.")
# --- decoded media ---------------------------------------------------------------------
WIDTH = declare("width", pa.int32(), "Upright full-resolution width (pixels).")
HEIGHT = declare("height", pa.int32(), "Upright full-resolution height (pixels).")
MIME = declare("mime", pa.string(), "MIME type sniffed from the bytes.")
FORMAT = declare("format", pa.string(), "Pillow format name (images) or container (video).")
N_FRAMES = declare("n_frames", pa.int32(), "Animation frames or TIFF pages (images).")
IS_ANIMATED = declare("is_animated", pa.bool_(), "Multi-frame GIF/APNG/WebP/AVIF/HEIF.")
DECODE_FLAGS = declare("decode_flags", pa.list_(pa.string()), "Decoder flags (images, e.g. "
                       "float_scaled: float pixels scaled to 8 bits, see media/decode.py; "
                       "videos: mirrored, display_matrix_unsupported, frames_downscaled, see "
                       "media/video.py).")
HAS_ALPHA = declare("has_alpha", pa.bool_(), "The source had transparency.")
SHA256 = declare("sha256", pa.string(), "sha256 (hex) of the source bytes.")
PHASH = declare("phash", pa.int64(), "64-bit DCT perceptual hash (imagehash.phash): its 64 "
                "bits (most significant first, as imagehash's hex) read as a two's-complement "
                "int64 (Spark/BigQuery have no uint64); unsigned value: "
                "np.asarray(phash, np.int64).view(np.uint64). Hamming distance is unchanged.")
LOW_DETAIL = declare("low_detail", pa.bool_(), "The image is too flat for its pHash to mean "
                     "anything (solid colour, 1x1, plain gradient: media.transform.low_detail); "
                     "near dedup skips the row (exact dedup still applies).")
DUPLICATE_OF = declare("duplicate_of", pa.string(), "Key of the kept row this duplicates.")
DUPLICATE_HAMMING = declare("duplicate_hamming", pa.int32(), "pHash distance (bits) to it.")
CAPTION = declare("caption", pa.large_string(), "Normalised caption (None if missing).")
CAPTIONS = declare("captions", pa.list_(pa.large_string()), "Every caption the input gave, "
                   "normalised like caption, in order ([] if none); caption is the first.")
CAPTION_FLAGS = declare("caption_flags", pa.list_(pa.string()), "Caption normalisation flags.")
IMAGE = declare("image", pa.binary(), "Resized, re-encoded image (video: middle frame).")
IMAGE_WIDTH = declare("image_width", pa.int32(), "Width of `image` (pixels).")
IMAGE_HEIGHT = declare("image_height", pa.int32(), "Height of `image` (pixels).")
# --- video ----------------------------------------------------------------------------------
DURATION_S = declare("duration_s", pa.float64(), "Decoded duration (seconds).")
FPS = declare("fps", pa.float64(), "Measured mean frame rate (Hz).")
FRAME_COUNT = declare("frame_count", pa.int32(), "Frames decoded.")
FRAME_TIMESTAMPS_S = declare("frame_timestamps_s", pa.list_(pa.float64()),
                             "Presentation times of the sampled frames (seconds).")
PARTIAL = declare("partial", pa.bool_(), "Some packets did not decode.")
DECODE_ERRORS = declare("decode_errors", pa.int32(), "Packets that failed to decode.")
ROTATION_DEG = declare("rotation_deg", pa.int32(), "Clockwise rotation applied (degrees).")
VIDEO_CODEC = declare("video_codec", pa.string(), "FFmpeg decoder name.")
FRAMES_ENCODED = declare("frames", pa.list_(pa.binary()), "Sampled frames, encoded like image.")
# --- video clips (video.clips; steps/clips.py) -------------------------------------------
PARENT_KEY = declare("parent_key", pa.string(), "Clip rows: the key of the video the clip is "
                     "from (the row's key is `<parent_key>/<clip_index>`).")
CLIP_INDEX = declare("clip_index", pa.int32(), "Clip rows: the clip's index in its video "
                     "(0-based, in time order).")
CLIP_START_S = declare("clip_start_s", pa.float64(), "Clip rows: start of the clip in the "
                       "video's presentation time (seconds, inclusive).")
CLIP_END_S = declare("clip_end_s", pa.float64(), "Clip rows: end of the clip in the video's "
                     "presentation time (seconds, exclusive).")
CLIP_FRAMES = declare("clip_frames", pa.int32(), "Clip rows: frames of the source video in "
                      "the clip span.")
CLIP_PATH = declare("clip_path", pa.string(), "Clip rows: the clip file (H.264 MP4), relative "
                    "to the output root (`clips/<partition>/a-<attempt>/...`).")
CLIP_BYTES = declare("clip_bytes", pa.int64(), "Clip rows: size of the clip file (bytes).")
# --- frame signals of video and clip rows (filters.clips, video.clips; steps/clip_signals.py)
MOTION_SCORE = declare("motion_score", pa.float32(), "Mean Farneback optical-flow magnitude "
                       "between consecutive sampled frames (pixels at 160 px wide per step; "
                       "media.motion).")
STATIC_FRACTION = declare("static_fraction", pa.float32(), "Fraction (0..1) of consecutive "
                          "sampled frames whose pHashes are near identical (media.motion).")
FRAME_PHASHES = declare("frame_phashes", pa.list_(pa.int64()), "pHash (like `phash`) of each "
                        "sampled frame in time order; null for a flat (low-detail) frame.")
BITRATE = declare("bitrate", pa.int64(), "Bits per second: the clip file's (clip rows with "
                  "a file) or the source file's size over its duration.")
# --- model outputs (typed by the model at assembly) -----------------------------------------
TEXT_EMBEDDING = declare("text_embedding", None, "Caption embedding, L2-normalised.")
IMAGE_EMBEDDING = declare("image_embedding", None, "Image (video: pooled) embedding.")
CLIP_SCORE = declare("clip_score", None, "Cosine of image and caption embeddings.")
FRAME_EMBEDDINGS = declare("frame_embeddings", None, "Video: one embedding per sampled frame.")
GENERATED_CAPTION = declare("generated_caption", None, "Caption generated by a model.")
# --- quality signals ---------------------------------------------------------------------
# measured image signals (steps/image_signals.py; videos: mean over the sampled frames)
SHARPNESS = declare("sharpness", pa.float32(), "Variance of the Laplacian of the greyscale at "
                    "signals.image.analysis_px (Pech-Pacheco et al. 2000); higher is sharper.")
BRIGHTNESS = declare("brightness", pa.float32(), "Mean luma (Rec. 601, 0..255).")
CONTRAST = declare("contrast", pa.float32(), "Standard deviation of the luma (0..127.5).")
CLIPPED_FRACTION = declare("clipped_fraction", pa.float32(), "Fraction of pixels whose luma is "
                           "<= 5 or >= 250 (0..1).")
# text in the image (steps/ocr.py, RapidOCR; videos: the middle sampled frame)
TEXT_AREA_FRACTION = declare("text_area_fraction", pa.float32(), "Area of the union of the "
                             "detected text boxes / image area (0..1).")
TEXT_BOX_COUNT = declare("text_box_count", pa.int32(), "Text boxes detected.")
OCR_TEXT = declare("ocr_text", pa.large_string(), "Recognised text of the boxes, one line each "
                   "in reading order (signals.ocr.text only).")
# heads and zero-shot classifiers on the image embedding (models/heads.py, models/zero_shot.py;
# videos: mean over the sampled frames)
AESTHETIC_SCORE = declare("aesthetic_score", None, "LAION improved-aesthetic-predictor score "
                          "(image_embedding.heads preset laion-aesthetic; about 1..10).")
NSFW_SCORE = declare("nsfw_score", None, "LAION CLIP-based NSFW detector probability (0..1; "
                     "image_embedding.heads preset laion-nsfw).")
SCORE_ = declare("score_", None, "`score_<name>`: a named head, zero-shot classifier or image "
                 "classifier score (float32).", family=True)
# image classifier (models/image_classifier.py, image_classification; videos: middle frame)
WATERMARK_SCORE = declare("watermark_score", None, "Probability (0..1) of the classifier's "
                          "positive labels (image_classification.positive_labels).")
# caption text signals (steps/caption_signals.py, signals.caption; None: no caption)
CAPTION_LANGUAGE = declare("caption_language", pa.string(), "Detected caption language, ISO "
                           "639-1 lower-case (lingua); None when undecided.")
CAPTION_LANGUAGE_CONFIDENCE = declare("caption_language_confidence", pa.float32(), "lingua's "
                                      "confidence in caption_language (0..1).")
CAPTION_WORDS = declare("caption_words", pa.int32(), "Words in the caption (runs of word "
                        "characters; each Han/kana character is one word).")
CAPTION_CHARS = declare("caption_chars", pa.int32(), "Unicode code points in the caption.")
CAPTION_REPETITION = declare("caption_repetition", pa.float32(), "Fraction of word characters "
                             "in repeated word n-grams (Gopher, Rae et al. 2021; 0..1).")
CAPTION_FLAGGED_WORDS = declare("caption_flagged_words", pa.int32(), "Matches of "
                                "signals.caption.flagged_words_file terms in the caption.")
# signal filters (steps/signal_filter.py, filters.signals)
SIGNAL_FLAGS = declare("signal_flags", pa.list_(pa.string()), "Signal filters' flags on a row "
                       "they saw: `unscored:<column>` for a null/NaN value and, with "
                       "filters.score_only, the reason of each filter that would reject it.")
# --- datasource metadata --------------------------------------------------------------------
METADATA_JSON = declare("metadata_json", pa.string(), "Sidecar/member JSON minus the caption.")
# --- quarantine -----------------------------------------------------------------------------
SOURCE_BYTES_OUT = declare("source_bytes", pa.binary(), "Original bytes of an error row.",
                           kind="quarantine")
SOURCE_SHA256_OUT = declare("source_sha256", pa.string(), "sha256 (hex) of an error row's "
                            "bytes as read, kept or not.", kind="quarantine")
SOURCE_SIZE_OUT = declare("source_size", pa.int64(), "Size of an error row's bytes as read "
                          "(bytes), kept or not.", kind="quarantine")
# --- internal -------------------------------------------------------------------------------
SOURCE_BYTES = declare("_source_bytes", None, "Media bytes as read.", kind="internal")
RAW_CAPTION = declare("_raw_caption", None, "Caption as read (any JSON value or bytes).",
                      kind="internal")
READ_ERROR = declare("_read_error", None, "records.RowError from the datasource, or None.",
                     kind="internal")
PIXELS = declare("_pixels", None, "Decoded (H, W, 3) uint8 RGB.", kind="internal")
SOURCE_PATH = declare("_source_path", None, "Video: a local file holding the media.",
                      kind="internal")
FRAMES = declare("_frames", None, "Video: sampled (H, W, 3) uint8 RGB frames.", kind="internal")
CLIP_SPAN = declare("_clip_span", None, "Clip rows: the media.clips.ClipSpan of the clip.",
                    kind="internal")
CLIP_FILE = declare("_clip_file", None, "Clip rows: local temporary path of the encoded clip "
                    "(the worker's scratch dir; deleted once written).", kind="internal")
MODEL_PIXELS = declare("_model_pixels_", None, "A model's (h, w, 3) uint8 input (video: "
                       "(F, h, w, 3)), one column per ImageGeometry.", kind="internal",
                       family=True)
DEVICE_INPUT = declare("_device_input", None, "decode.device cuda: the steps.device_media."
                       "JpegInput the image-embedding actor decodes, or why the row is "
                       "decoded on the worker (str).", kind="internal")



def reserved() -> frozenset[str]:
    """Output names a carried manifest column may not take (it becomes ``meta_<name>``):
    every non-internal column declared so far, by this module or any step or datasink
    module imported later (read when asked, never cached)."""
    return frozenset(n for n, c in COLUMNS.items() if c.kind != "internal")
