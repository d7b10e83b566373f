"""Video steps: PyAV (FFmpeg) decode with frames sampled by presentation timestamp.

``decode_video(path, spec)`` opens a local file with PyAV, decodes every frame of the
best video stream (so the frame count, duration and rate are measured, never read from
the header) and keeps only the frames chosen by ``spec.sampling``:

- ``fps``: targets ``t0, t0 + 1/fps, ...`` (seconds of presentation time, ``t0`` = the
  first frame's pts); each target takes the first decoded frame whose pts >= target (one
  frame serves all the targets it covers, so a frame is never sampled twice).
- ``uniform``: ``num_frames`` targets evenly spaced over [first pts, last pts]. The span is
  read first by a demux-only pass over the packets (no decoding; packet pts sorted are
  the presentation order), then a decode pass takes for each target the frame nearest in
  pts (ties go to the earlier frame).
- ``keyframes``: the frames with ``frame.key_frame`` set.
- ``scene``: the first frame and every frame whose mean absolute difference (0..1) to
  the previous frame, both reformatted to 64x36 grey, exceeds ``scene_threshold``. This
  is the idea of PySceneDetect's ``ContentDetector`` (a per-frame difference score
  against a threshold) but simpler: grey level only, no HSV, no minimum scene length.

Any mode keeps at most ``spec.max_frames`` frames: more candidates are thinned evenly
(by candidate index; while streaming every other candidate is dropped whenever twice
``max_frames`` are held, so memory stays bounded by 2 * max_frames frames).

Frames are PTS-timed: ``frame.time`` (= pts * time_base). A frame without pts gets the
previous frame's time plus its duration. Only the chosen frames are converted to RGB.

Display matrix: FFmpeg exports the container's display matrix (MP4/MOV ``tkhd`` matrix,
the old ``rotate`` tag) as frame side data (``AV_FRAME_DATA_DISPLAYMATRIX``). The whole
matrix is applied, mirrors included (``media.video.orientation_of``): any of the 8
symmetries of the rectangle - quarter turns, a left-right or top-bottom mirror, a
transpose - gives the frames a player shows, and ``rotation_deg`` the CLOCKWISE angle
(0/90/180/270) applied after a left-right mirror when ``decode_flags`` has ``mirrored``
(a top-bottom mirror is ``mirrored`` + 180). A phone clip tagged ``rotate=90`` is turned
90 degrees clockwise, as ffmpeg's CLI autorotate does. A matrix that is none of the 8
(45 degrees, a shear, a perspective) is not applied: the frames stay as coded and
``decode_flags`` has ``display_matrix_unsupported``. The matrix of the first decoded
frame is applied to every frame.

Confinement: FFmpeg reads the one file and nothing else (``media.video._Input``):
containers that name other files (HLS, DASH, ffconcat, image sequences) are an
``unsupported_format`` error row unless ``video.allow_playlists``.

Frame budget: the sampled frames of one row never hold more than ``runtime.max_batch_bytes``
(``media.video._FrameStore``): frames that would are halved in width and height until they
fit (``decode_flags``: ``frames_downscaled``; ``width``/``height`` stay the full size); a
video that would need frames under 16 pixels a side is a ``too_large`` error row naming
the budget.

Near hash: ``phash`` is the pHash of a 2 x 2 mosaic of 4 frames spread over the sample
(``media.video.near_hash``), never of one frame, so videos that share a black middle frame
are not near duplicates; ``low_detail`` when every tiled frame is flat.

Video stream: FFmpeg's best video stream (``av_find_best_stream``) among the streams
that are not an attached picture. A stream with ``AV_DISPOSITION_ATTACHED_PIC``
(libavformat/avformat.h; PyAV ``stream.disposition & Disposition.attached_pic``) is the
cover art of an audio file (ID3 APIC in MP3, ``covr`` in M4A, METADATA_BLOCK_PICTURE in
FLAC, a Matroska attachment): one still image, never a one-frame video. A file with
real video plus cover art uses the real video.

Still images in a video job (``images``: the job's ``source.extensions`` list image
extensions too, ``SourceSpec.holds_images``): a file whose first bytes sniff as a raster
image (``media.video.still_image``) is decoded by the image decoder
(``media.decode.decode_image``, ``decode.max_pixels``) into a one-frame row:
``_frames=[pixels]``, ``frame_count`` 1, ``duration_s`` 0, ``fps``/``video_codec`` null,
``frame_timestamps_s`` [0], ``sha256`` of the file and ``phash`` of its one frame (as
an image job's), so its frame pHash meets the videos' frames in the dataset-wide near
index (cross-modal duplicates). An animated image gives its first frame.

Errors (``pipeline.errors.RecordError`` with a ``records.ErrorReason`` value):
``empty_file`` (0 bytes), ``read_failed`` (the file cannot be stat'ed),
``corrupt_container`` (FFmpeg cannot open it), ``no_video_stream`` (no video stream but
an attached picture: audio only, cover art only; the message lists the streams there
are), ``no_frames`` (not one frame decodes). A packet that fails to demux or decode is counted
in ``decode_errors`` and skipped; a result with errors and >= 1 frame has
``partial=True``. Decoding stops after ``MAX_PACKETS`` packets or ``DECODE_BUDGET_S``
seconds (counted as one decode error, so the result is partial), so a broken file can
never loop forever.

Bounds per video (``VideoSpec``): ``too_large`` when the stream's coded size or any decoded
frame has more than ``max_frame_pixels`` pixels (checked on the stream header before the
first packet is decoded, and on every frame); ``decode_timeout`` when decoding (all passes
together) takes more than ``max_decode_s`` seconds.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import TYPE_CHECKING

from pipeline.columns import (
    CLIP_END_S,
    CLIP_START_S,
    DECODE_ERRORS,
    DECODE_FLAGS,
    DURATION_S,
    FORMAT,
    FPS,
    FRAME_COUNT,
    FRAME_TIMESTAMPS_S,
    FRAMES,
    FRAMES_ENCODED,
    HEIGHT,
    IMAGE,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    LOW_DETAIL,
    MIME,
    PARTIAL,
    PHASH,
    ROTATION_DEG,
    SHA256,
    SOURCE_PATH,
    STATUS,
    VIDEO_CODEC,
    WIDTH,
    Batch,
)
from pipeline.errors import RecordError
from pipeline.media.decode import decode_image, decoded_size
from pipeline.media.transform import resize_pixels
from pipeline.media.video import (
    av_module,
    decode_video,
    decoded_frames_bytes,
    file_sha256,
    near_hash,
    still_image,
)
from pipeline.records import ErrorReason
from pipeline.spec import DecodeSpec, ResizeSpec, VideoSpec
from pipeline.steps.base import RowStep

if TYPE_CHECKING:
    from pipeline.steps.clips import ClipEncodeStep


class VideoDecodeStep(RowStep):
    """``_source_path`` (a local file path) -> ``_frames`` and the video's metadata.

    Columns: ``_frames`` (list of (H, W, 3) uint8 RGB, internal), ``width``/``height``
    (display pixels), ``mime``, ``format`` (container), ``duration_s``, ``fps`` (measured),
    ``frame_count`` (decoded), ``frame_timestamps_s`` (seconds), ``partial``,
    ``rotation_deg``, ``video_codec``, ``sha256`` (hex, of the file), ``phash`` (64-bit
    pHash of a mosaic of 4 sampled frames, ``media.video.near_hash``), ``low_detail``
    (every hashed frame flat: near dedup skips the row), ``decode_flags`` (``mirrored``,
    ``display_matrix_unsupported``, ``frames_downscaled``: ``media.video.VideoInfo``),
    ``decode_errors``.

    ``frame_budget_bytes``: the most bytes one row's sampled frames hold
    (``runtime.max_batch_bytes``; None: unbounded; module doc, "Frame budget").
    ``images``: the job's ``decode`` spec when it holds still images too (module doc,
    "Still images in a video job"); None: every file is decoded as a video.
    ``clip_encoder``: clip rows whose files are re-encoded (``ClipEncodeStep.one_pass``):
    the decode pass that samples a clip's frames also feeds its encoder, so each clip is
    decoded once, and the row gets ``ClipEncodeStep``'s columns (an error of either is
    the row's; the clip file is then removed). Raises ``ValueError`` for a
    ``clip_encoder`` that copies (``codec: copy`` never decodes).
    """

    reads = (SOURCE_PATH,)
    writes = (FRAMES, WIDTH, HEIGHT, MIME, FORMAT, DURATION_S, FPS, FRAME_COUNT,
              FRAME_TIMESTAMPS_S, PARTIAL, ROTATION_DEG, VIDEO_CODEC, SHA256, PHASH,
              LOW_DETAIL, DECODE_FLAGS, DECODE_ERRORS)

    def __init__(self, spec: VideoSpec, frame_budget_bytes: int | None = None,
                 images: DecodeSpec | None = None,
                 clip_encoder: ClipEncodeStep | None = None):
        if clip_encoder is not None and not clip_encoder.one_pass:
            raise ValueError(f"VideoDecodeStep: clip_encoder must re-encode (libx264), got "
                             f"codec {clip_encoder.spec.transcode.codec!r}")
        self.spec = spec
        self.frame_budget_bytes = frame_budget_bytes
        self.images = images
        self.clip_encoder = clip_encoder
        if spec.clips.enabled:   # clip rows: frames of the clip span, sha256 by ClipEncodeStep
            self.reads = (SOURCE_PATH, CLIP_START_S, CLIP_END_S)
        if clip_encoder is not None:
            self.reads = tuple(dict.fromkeys(  # sha256: a still image's, written here
                self.reads + tuple(c for c in clip_encoder.reads if c not in self.writes)))
            self.writes = tuple(dict.fromkeys(self.writes + clip_encoder.writes))

    def setup(self) -> None:
        """Import PyAV (FFmpeg) now, once: without it a video job fails at assembly, not
        row by row; image jobs never construct this step, so never load it."""
        av_module()

    def settings(self):
        # temp_dir: where, not what; clips: ClipSplitStep's and ClipEncodeStep's settings
        images = ({"image_max_pixels": self.images.max_pixels}
                  if self.images is not None else {})
        clip = {} if self.clip_encoder is None else {"clip": self.clip_encoder.settings()}
        return {**self.spec.model_dump(mode="json", exclude={"temp_dir", "clips"}),
                "frame_budget_bytes": self.frame_budget_bytes, **images, **clip}

    def decoded_bytes(self, batch, i):
        """Header estimate of row ``i``'s ``_frames`` (bytes; ``decoded_frames_bytes``),
        at most the frame budget."""
        path = batch[SOURCE_PATH][i]
        if not path:
            return 0
        if self.images is not None and still_image(path):
            with open(path, "rb") as f:
                return decoded_size(f.read(), ext=os.path.splitext(path)[1])
        return decoded_frames_bytes(path, self.spec, self.frame_budget_bytes)

    def process_row(self, batch, i):
        path = batch[SOURCE_PATH][i]
        if not path:
            raise RecordError(ErrorReason.READ_FAILED.value, "no local video file")
        if self.images is not None and still_image(path):
            return self._image_row(path)
        clip = self.spec.clips.enabled
        window = ({"start_s": batch[CLIP_START_S][i], "end_s": batch[CLIP_END_S][i]}
                  if clip else {})
        encoder = self.clip_encoder.encoder(batch, i) if self.clip_encoder else None
        try:
            info = decode_video(path, self.spec, frame_budget_bytes=self.frame_budget_bytes,
                                frame_sink=encoder, **window)
            clip_columns = self.clip_encoder.finish(encoder) if encoder else {}
        except BaseException:
            if encoder is not None:
                encoder.discard()
            raise
        phash, low = near_hash(info.frames)
        return {**clip_columns, FRAMES: info.frames, WIDTH: info.width, HEIGHT: info.height, MIME: info.mime,
                FORMAT: info.container, DURATION_S: info.duration_s, FPS: info.fps,
                FRAME_COUNT: info.frame_count, FRAME_TIMESTAMPS_S: info.timestamps_s,
                PARTIAL: info.partial, ROTATION_DEG: info.rotation_deg,
                VIDEO_CODEC: info.codec,
                SHA256: clip_columns.get(SHA256) if clip else file_sha256(path),
                PHASH: phash, LOW_DETAIL: low, DECODE_FLAGS: list(info.flags),
                DECODE_ERRORS: info.decode_errors}

    def _image_row(self, path: str) -> dict:
        """The still image at ``path`` as a one-frame row (module doc). Raises
        ``RecordError`` from ``decode_image``."""
        with open(path, "rb") as f:
            data = f.read()
        img = decode_image(data, max_pixels=self.images.max_pixels,
                           ext=os.path.splitext(path)[1])
        phash, low = near_hash([img.pixels])
        return {FRAMES: [img.pixels], WIDTH: img.width, HEIGHT: img.height, MIME: img.mime,
                FORMAT: img.format, DURATION_S: 0.0, FPS: None, FRAME_COUNT: 1,
                FRAME_TIMESTAMPS_S: [0.0], PARTIAL: False, ROTATION_DEG: 0, VIDEO_CODEC: None,
                SHA256: hashlib.sha256(data).hexdigest(), PHASH: phash, LOW_DETAIL: low,
                DECODE_FLAGS: list(img.flags), DECODE_ERRORS: 0}


class VideoFramesStep(RowStep):
    """``_frames`` -> ``frames`` (list of JPEG/WebP bytes), ``image`` (the middle frame,
    the row's thumbnail), ``image_width``/``image_height`` (pixels, of the encoded frames).

    Frames are resized with ``resize_pixels`` and encoded per ``resize.encode_format``
    and ``resize.quality``. ``_frames`` is then set to None on every row unless
    ``keep_frames`` (steps that need the frames, e.g. model inputs, run before this one).
    """

    reads = (FRAMES,)
    writes = (FRAMES_ENCODED, IMAGE, IMAGE_WIDTH, IMAGE_HEIGHT)

    def __init__(self, resize: ResizeSpec, keep_frames: bool = False):
        self.resize = resize
        self.keep_frames = keep_frames

    def settings(self):
        return self.resize.model_dump(mode="json")

    def process_row(self, batch, i):
        fmt = "JPEG" if self.resize.encode_format == "jpeg" else "WEBP"
        encoded, sizes = [], []
        for frame in batch[FRAMES][i]:
            img = resize_pixels(frame, self.resize)
            buf = io.BytesIO()
            img.save(buf, format=fmt, quality=self.resize.quality)
            encoded.append(buf.getvalue())
            sizes.append(img.size)
        if not encoded:
            raise RecordError(ErrorReason.NO_FRAMES.value, "no sampled frames to encode")
        mid = len(encoded) // 2
        return {FRAMES_ENCODED: encoded, IMAGE: encoded[mid],
                IMAGE_WIDTH: sizes[mid][0], IMAGE_HEIGHT: sizes[mid][1]}

    def __call__(self, batch: Batch) -> Batch:
        batch = super().__call__(batch)
        if not self.keep_frames:
            batch[FRAMES] = [None] * len(batch[STATUS])
        return batch
