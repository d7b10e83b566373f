"""Column names, status and reason codes, and the small frozen records of a job.

A ``Batch`` is a dict of equal-length Python lists (one list per column); steps read and
write columns of it. Decoded pixels travel in the ``pixels`` column as ``np.ndarray`` of
shape (H, W, 3), dtype uint8, RGB; they never reach the output.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

Batch = dict[str, list[Any]]


class Status(str, enum.Enum):
    """Final status of a row; ``rows_in == ok + rejected + error`` per partition."""

    OK = "ok"
    REJECTED = "rejected"
    ERROR = "error"


class ErrorReason(str, enum.Enum):
    """Why a record has ``status="error"`` (the prefix of its ``error`` column)."""

    EMPTY_FILE = "empty_file"
    NOT_AN_IMAGE = "not_an_image"
    UNSUPPORTED_FORMAT = "unsupported_format"
    TRUNCATED = "truncated"
    CORRUPT = "corrupt"
    TOO_LARGE = "too_large"
    READ_FAILED = "read_failed"
    STEP_FAILED = "step_failed"
    FAILED_TO_DOWNLOAD = "failed_to_download"  # img2dataset's status name
    NO_FRAMES = "no_frames"            # a video container without one decodable frame
    CORRUPT_CONTAINER = "corrupt_container"  # a video container FFmpeg cannot open
    BAD_SAMPLE = "bad_sample"          # WebDataset: duplicate/non-contiguous key, no media
    TRUNCATED_SHARD = "truncated_shard"  # WebDataset: shard cut short (shard-level row)


class RejectReason(str, enum.Enum):
    """Why a filter set ``status="rejected"`` (the ``reject_reason`` column)."""

    TOO_SMALL = "too_small"
    ASPECT_RATIO = "aspect_ratio"
    DUPLICATE = "duplicate"
    LOW_CLIP_SCORE = "low_clip_score"


# Reserved output columns (DESIGN.md "Output layout and schema").
KEY = "key"
PARTITION_ID = "partition_id"
SOURCE_URI = "source_uri"
STATUS = "status"
REJECT_REASON = "reject_reason"
ERROR = "error"
WIDTH = "width"
HEIGHT = "height"
MIME = "mime"
SHA256 = "sha256"
PHASH = "phash"
IMAGE = "image"
CAPTION = "caption"
TEXT_EMBEDDING = "text_embedding"
IMAGE_EMBEDDING = "image_embedding"
CLIP_SCORE = "clip_score"
GENERATED_CAPTION = "generated_caption"
FRAME_EMBEDDINGS = "frame_embeddings"

# Internal columns: present in batches, never written to the data output.
SOURCE_BYTES = "_source_bytes"
RAW_CAPTION = "_raw_caption"
PIXELS = "_pixels"
SOURCE_PATH = "_source_path"  # video: a local file holding the media (staged if remote)
FRAMES = "_frames"            # video: sampled frames, list of (H, W, 3) uint8 RGB arrays

RESERVED = frozenset(
    {KEY, PARTITION_ID, SOURCE_URI, STATUS, REJECT_REASON, ERROR, WIDTH, HEIGHT, MIME,
     SHA256, PHASH, IMAGE, CAPTION, TEXT_EMBEDDING, IMAGE_EMBEDDING, CLIP_SCORE,
     GENERATED_CAPTION, "format", "n_frames", "is_animated",
     "has_alpha", "caption_flags", "duplicate_of", "duplicate_hamming", "image_width",
     "image_height", "metadata_json", "duration_s", "fps", "frame_count",
     "frame_timestamps_s", "partial", "rotation_deg", "video_codec", "decode_errors", "frames",
     "frame_embeddings"}
)


def partition_name(index: int) -> str:
    """Return the stable partition id for ``index``: ``p-000042`` (zero-padded to 6)."""
    return f"p-{index:06d}"


@dataclasses.dataclass(frozen=True)
class InputItem:
    """One planned input: a media file, or a row range of a manifest.

    ``uri`` is the media file (files datasource) or the manifest file (manifest
    datasource). ``caption_uri`` is the sidecar caption file, if any. ``row_start`` and
    ``row_stop`` bound the manifest rows (half-open) and are -1 for media files.
    ``size_bytes`` is the listed object size.
    """

    uri: str
    size_bytes: int
    caption_uri: str | None = None
    row_start: int = -1
    row_stop: int = -1


@dataclasses.dataclass(frozen=True)
class Partition:
    """A fixed unit of work: ``partition_id`` and the inputs it covers, in order."""

    partition_id: str
    inputs: tuple[InputItem, ...]

    @property
    def rows_planned(self) -> int:
        """Records the partition is planned to yield (manifest rows or media files)."""
        return sum(i.row_stop - i.row_start if i.row_start >= 0 else 1 for i in self.inputs)


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What a ``Datasink`` wrote for one partition attempt.

    ``files`` are URIs relative to the output root; ``rows_by_status`` maps status to row
    count; ``bytes_written`` is the total size in bytes; ``sha256`` maps file to checksum.
    """

    files: tuple[str, ...]
    rows: int
    rows_by_status: dict[str, int]
    rows_by_reason: dict[str, int]
    bytes_written: int
    sha256: dict[str, str]
