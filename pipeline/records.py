"""Status and reason codes, and the small frozen records of a job.

Columns are declared in ``pipeline.columns``. A row's outcome is typed end to end: the
step that decides sets ``status`` and a ``RejectReason`` or a ``RowError`` (an
``ErrorReason`` and a message); the datasinks write them as the ``reject_reason``,
``error_reason`` and ``error`` columns, and the per-attempt statistics count them by
``"<status>:<reason>"`` for the commit marker and the metrics.
"""

from __future__ import annotations

import dataclasses
import enum


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
    NO_VIDEO_STREAM = "no_video_stream"  # only audio, or only an attached picture (cover art)
    DECODE_TIMEOUT = "decode_timeout"  # a video took longer than video.max_decode_s
    BAD_SAMPLE = "bad_sample"          # WebDataset: duplicate/non-contiguous key, no media
    TRUNCATED_SHARD = "truncated_shard"  # WebDataset: shard cut short (shard-level row)
    OUTSIDE_INPUT_ROOT = "outside_input_root"  # a path/object outside source roots
    NOT_A_FILE = "not_a_file"          # a FIFO, device, directory: only regular files
    EGRESS_REFUSED = "egress_refused"  # a URL resolving to a refused network address
    INPUT_MISSING = "input_missing"    # a planned (or manifest-named) object that is not there


@dataclasses.dataclass(frozen=True)
class RowError:
    """Why one record failed: a typed ``reason`` and the reader's or decoder's ``message``.

    ``str(error)`` is ``"<reason>: <message>"``, the text of the ``error`` column.
    """

    reason: ErrorReason
    message: str

    def __post_init__(self):
        object.__setattr__(self, "reason", ErrorReason(self.reason))

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.message}"


@dataclasses.dataclass(frozen=True)
class CaptionKeyMissing:
    """The raw caption of a `.json` sidecar or member whose object lacks ``key`` (the
    configured ``source.caption_column``): the caption step makes it no caption with the
    flags ``caption_key_missing`` and ``missing_caption``, so a misnamed key (``captions``
    for files whose key is ``caption``) is told apart from a sample without a caption."""

    key: str


class RejectReason(str, enum.Enum):
    """Why a filter set ``status="rejected"`` (the ``reject_reason`` column)."""

    TOO_SMALL = "too_small"
    ASPECT_RATIO = "aspect_ratio"
    DUPLICATE = "duplicate"
    LOW_CLIP_SCORE = "low_clip_score"
    # quality-signal filters (``filters.signals``, ``steps/signal_filter.py``)
    LOW_AESTHETIC = "low_aesthetic"
    NSFW = "nsfw"
    WATERMARK = "watermark"
    TEXT_HEAVY = "text_heavy"
    BLURRY = "blurry"
    LANGUAGE = "language"
    FLAGGED_WORDS = "flagged_words"
    LOW_CAPTION_QUALITY = "low_caption_quality"
    SIGNAL = "signal"                  # a filter on any other column
    NO_CLIPS = "no_clips"              # video.clips: the video yields no clip (too short)
    # clip filters (``filters.clips``, ``steps/clip_signals.py``)
    LOW_MOTION = "low_motion"
    CLIP_DURATION = "clip_duration"    # shorter than min_duration_s or longer than max
    LOW_FPS = "low_fps"
    LOW_RESOLUTION = "low_resolution"
    LOW_BITRATE = "low_bitrate"
    STATIC = "static"


def partition_name(index: int) -> str:
    """Return the stable partition id for ``index``: ``p-000042`` (zero-padded to 6)."""
    return f"p-{index:06d}"


@dataclasses.dataclass(frozen=True)
class InputItem:
    """One planned input: a media file, or a row range of a manifest.

    ``uri`` is the media file (files datasource) or the manifest file (manifest
    datasource). ``caption_uri`` is the sidecar caption file, if any. ``row_start`` and
    ``row_stop`` bound the manifest rows (half-open) and are -1 for media files.
    ``size_bytes`` is the listed object size. ``key``: the record key decided at planning
    (files datasource, ``pipeline.keys``), else None. ``error``: why the input could not be
    read at planning (e.g. a corrupt manifest); such an item is planned as one record,
    which is read as one error row naming it. ``byte_start``/``line_start``: where row
    ``row_start`` of a CSV/JSONL manifest starts (byte offset, lines before it; -1: read
    from the start), so a partition's read seeks there.
    """

    uri: str
    size_bytes: int
    caption_uri: str | None = None
    row_start: int = -1
    row_stop: int = -1
    key: str | None = None
    error: str | None = None
    byte_start: int = -1
    line_start: int = -1


@dataclasses.dataclass(frozen=True)
class Partition:
    """A fixed unit of work: ``partition_id`` and the inputs it covers, in order.

    ``plan_metadata``: what the datasource recorded for the whole job at planning
    (``Datasource.plan_metadata``, stored in the plan), e.g. a manifest's carried columns.
    """

    partition_id: str
    inputs: tuple[InputItem, ...]
    plan_metadata: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def rows_planned(self) -> int:
        """Records the partition is planned to yield (manifest rows or media files)."""
        return sum(i.row_stop - i.row_start if i.row_start >= 0 else 1 for i in self.inputs)
