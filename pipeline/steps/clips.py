"""Video clips (``video.clips``): one video row fans out into one row per clip.

``ClipSplitStep`` runs on each read batch before it is cut by decoded bytes
(``runtime.partition``): for every ``ok`` video row it finds the clip spans
(``media.clips.detect_spans``: shot detection or fixed lengths, no frames kept) and
yields clip rows in sub-batches of at most ``max_rows`` rows, so the steps after it
decode one clip span per row (``VideoDecodeStep`` reads ``clip_start_s``/``clip_end_s``)
and never a whole long video at once. A clip row is a copy of its video row (metadata,
caption, staged file) with ``key`` ``<video key>/<clip index>``, ``parent_key``,
``clip_index``, ``clip_start_s``/``clip_end_s`` (presentation time, seconds,
``[start, end)``), ``clip_frames`` and ``_clip_span`` (the ``ClipSpan``). A video with
no clip stays one row: ``rejected`` with ``no_clips`` (too short for ``min_clip_s``) or
``error`` with ``detect_spans``'s reason (undecodable); a row that was not ``ok`` passes
through as it is, and so does a still image (``images``: a video job that lists image
extensions, ``media.video.still_image``): one row, no clip columns. ``split`` appends,
per input row, how many rows it became (the partition's fan-out accounting).

Keys: every row ``split`` yields goes through the attempt's ``keys.PartitionKeys`` in row
order, so a clip key ``<video key>/<i>`` and the key of another input that is literally
``<video key>/<i>`` (a file ``a/0.mp4`` beside ``a.mp4``) stay distinct: the later of the
two gets the suffix ``%2A<n>``.

``ClipEncodeStep`` writes each ``ok`` clip row's span as an H.264 MP4
(``media.clip_encode.encode_clip``; with ``libx264`` a job hands it to ``VideoDecodeStep``
instead, which encodes the clip in the pass that samples its frames: ``encoder``/``finish``,
one decode of each clip) into a temporary file (``_clip_file``; the worker's
scratch directory, ``runtime.scratch``): ``clip_bytes`` and ``sha256`` (of the clip
file, so exact dedup compares clips, not their shared video). The clip datasink
(``output.sinks.clips``) copies it under the attempt directory and sets ``clip_path``;
the runner deletes the temporary file once the batch is written. A row without a clip
span (a still image) keeps its ``sha256`` and gets no clip file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pipeline.columns import (
    CLIP_BYTES,
    CLIP_END_S,
    CLIP_FILE,
    CLIP_FRAMES,
    CLIP_INDEX,
    CLIP_PATH,
    CLIP_SPAN,
    CLIP_START_S,
    KEY,
    PARENT_KEY,
    REJECT_REASON,
    SHA256,
    SOURCE_PATH,
    STATUS,
    Batch,
)
from pipeline.errors import RecordError
from pipeline.keys import PartitionKeys
from pipeline.media.video import still_image
from pipeline.records import ErrorReason, RejectReason, RowError, Status
from pipeline.spec import ClipsSpec
from pipeline.steps.base import RowStep, Step, mark_error

if TYPE_CHECKING:
    from pipeline.media.clip_encode import ClipEncoder
    from pipeline.media.clips import ClipSpan

#: Columns a clip row sets from its span.
_SPAN_COLUMNS = (PARENT_KEY, CLIP_INDEX, CLIP_START_S, CLIP_END_S, CLIP_FRAMES, CLIP_SPAN)


class ClipSplitStep(Step):
    """Video rows -> clip rows (module docstring). ``spec``: ``video.clips``;
    ``allow_playlists``: ``video.allow_playlists``; ``max_rows``: most rows per yielded
    sub-batch (``runtime.batch_size``); ``images``: still images pass through as one row
    (the job lists image extensions). Raises ``ValueError`` for ``max_rows`` < 1."""

    reads = (SOURCE_PATH,)
    writes = _SPAN_COLUMNS + (REJECT_REASON,)

    def __init__(self, spec: ClipsSpec, allow_playlists: bool = False, max_rows: int = 64,
                 images: bool = False):
        if max_rows < 1:
            raise ValueError(f"ClipSplitStep: max_rows must be >= 1, got {max_rows}")
        self.spec = spec
        self.allow_playlists = allow_playlists
        self.max_rows = max_rows
        self.images = images

    def settings(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json", exclude={"transcode"})

    def spans(self, path: str) -> list[ClipSpan]:
        """The clip spans of the local video ``path`` (``detect_spans`` with this spec).
        Raises ``RecordError`` for an undecodable file."""
        from pipeline.media.clips import detect_spans  # PySceneDetect: clip jobs only

        s = self.spec
        return detect_spans(path, method=s.method, detector=s.detector, threshold=s.threshold,
                            clip_s=s.clip_s, overlap_s=s.overlap_s, min_clip_s=s.min_clip_s,
                            max_clip_s=s.max_clip_s, max_clips=s.max_clips,
                            allow_playlists=self.allow_playlists)

    def split(self, batch: Batch, counts: list[int],
              keys: PartitionKeys | None = None) -> Iterator[Batch]:
        """Yield ``batch``'s rows as clip rows, in input order, in sub-batches of at most
        ``max_rows`` rows; append to ``counts`` each input row's number of rows (>= 1).
        ``keys``: the attempt's keys (one per partition attempt, shared by all its
        batches; None: a fresh one, for this batch alone) that make every yielded key
        unique (module docstring, "Keys")."""
        keys = keys if keys is not None else PartitionKeys()
        columns = list(dict.fromkeys(list(batch) + list(self.writes)))
        out: Batch = {c: [] for c in columns}
        for i in range(len(batch[STATUS])):
            rows = self._rows_of(batch, i)
            counts.append(len(rows))
            for row in rows:
                row[KEY] = keys.unique(row[KEY])
                for c in columns:
                    out[c].append(row.get(c))
                if len(out[STATUS]) >= self.max_rows:
                    yield out
                    out = {c: [] for c in columns}
        if out[STATUS]:
            yield out

    def __call__(self, batch: Batch) -> Batch:
        """All clip rows of ``batch`` as one batch (tests, plain loops; the runner uses
        ``split`` to stream)."""
        parts = list(self.split(batch, []))
        return {c: [v for p in parts for v in p[c]] for c in parts[0]} if parts else batch

    def _rows_of(self, batch: Batch, i: int) -> list[dict[str, Any]]:
        """Input row ``i`` as its clip rows (or as itself: not ok, no clip, an error)."""
        row = {c: column[i] for c, column in batch.items()}
        if row[STATUS] != Status.OK.value:
            return [row]
        try:
            if not row[SOURCE_PATH]:
                raise RecordError(ErrorReason.READ_FAILED.value, "no local video file")
            if self.images and still_image(row[SOURCE_PATH]):
                return [row]
            spans = self.spans(row[SOURCE_PATH])
        except RecordError as e:
            one = {c: [v] for c, v in row.items()}
            mark_error(one, 0, RowError(e.reason, e.message))
            return [{c: v[0] for c, v in one.items()}]
        if not spans:
            return [{**row, STATUS: Status.REJECTED.value,
                     REJECT_REASON: RejectReason.NO_CLIPS.value}]
        return [{**row, KEY: f"{row[KEY]}/{span.index}", PARENT_KEY: row[KEY],
                 CLIP_INDEX: span.index, CLIP_START_S: span.start_s, CLIP_END_S: span.end_s,
                 CLIP_FRAMES: span.end_frame - span.start_frame, CLIP_SPAN: span}
                for span in spans]


class ClipEncodeStep(RowStep):
    """Each ``ok`` clip row's span -> an MP4 file in a temporary file (module docstring).

    ``spec``: ``video.clips``; ``temp_dir``: where the files go (None: the process's temp
    dir, a worker's scratch directory). Writes ``_clip_file`` (local path), ``clip_bytes``
    (bytes), ``sha256`` (hex, of the clip file) and ``clip_path`` (None here: the clip
    datasink sets it); a row without ``_clip_span`` (a still image) keeps its ``sha256``
    and gets nulls. Raises (as the row's error) ``RecordError`` from ``encode_clip``."""

    reads = (SOURCE_PATH, CLIP_SPAN, SHA256)
    writes = (CLIP_FILE, CLIP_BYTES, CLIP_PATH, SHA256)

    def __init__(self, spec: ClipsSpec, temp_dir: str | None = None,
                 allow_playlists: bool = False):
        self.spec = spec
        self.temp_dir = temp_dir
        self.allow_playlists = allow_playlists

    def settings(self) -> dict[str, Any]:
        return self.spec.transcode.model_dump(mode="json", exclude={"enabled"})

    def process_row(self, batch: Batch, i: int) -> dict[str, Any]:
        from pipeline.media.clip_encode import (
            encode_clip,  # PyAV encoder: clip jobs only
        )

        if batch[CLIP_SPAN][i] is None:   # a still image: no clip
            return {SHA256: batch[SHA256][i]}
        out = self._temp_file()
        t = self.spec.transcode
        try:
            clip = encode_clip(batch[SOURCE_PATH][i], batch[CLIP_SPAN][i], out, codec=t.codec,
                               crf=t.crf, bitrate=t.bitrate, max_size_px=t.max_size_px,
                               fps=t.fps, threads=1, allow_playlists=self.allow_playlists)
            return self._columns(out, clip.bytes)
        except BaseException:
            if os.path.exists(out):
                os.unlink(out)
            raise

    @property
    def one_pass(self) -> bool:
        """True when the clip is re-encoded (``libx264``), so the pass that samples the
        clip's frames can encode it too (``encoder``; ``copy`` never decodes)."""
        return self.spec.transcode.codec == "libx264"

    def encoder(self, batch: Batch, i: int) -> ClipEncoder | None:
        """A ``ClipEncoder`` of row ``i``'s span into a new temporary file, for a decode
        pass of that span (``VideoDecodeStep``): ``decode_video(frame_sink=...)``, then
        ``finish`` (or ``ClipEncoder.discard`` on an error). None for a row without a
        span (a still image)."""
        from pipeline.media.clip_encode import (
            ClipEncoder,  # PyAV encoder: clip jobs only
        )

        if batch[CLIP_SPAN][i] is None:
            return None
        t = self.spec.transcode
        return ClipEncoder(self._temp_file(), batch[CLIP_SPAN][i], crf=t.crf,
                           bitrate=t.bitrate, max_size_px=t.max_size_px, fps=t.fps, threads=1)

    def finish(self, encoder: ClipEncoder) -> dict[str, Any]:
        """The columns of ``encoder``'s clip (``process_row``'s) once every frame of the
        span was fed. Raises ``RecordError`` (``no_frames``) as ``ClipEncoder.finish``."""
        clip = encoder.finish()
        return self._columns(encoder.out_path, clip.bytes)

    def _temp_file(self) -> str:
        fd, out = tempfile.mkstemp(prefix="mmpipe-clip-", suffix=".mp4", dir=self.temp_dir)
        os.close(fd)
        return out

    @staticmethod
    def _columns(path: str, size: int) -> dict[str, Any]:
        return {CLIP_FILE: path, CLIP_BYTES: size, CLIP_PATH: None, SHA256: file_digest(path)}


def file_digest(path: str) -> str:
    """sha256 (hex) of the local file ``path``. Raises ``OSError``."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def remove_clip_files(batch: Batch) -> None:
    """Delete the temporary clip files of ``batch`` (``_clip_file``; once every datasink
    has written the batch) and clear the column."""
    paths = batch.get(CLIP_FILE) or []
    for n, path in enumerate(paths):
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            paths[n] = None
