"""Image steps over batches: decode, filter, hash, resize + re-encode.

Decoded pixels live in the internal ``_pixels`` column as (H, W, 3) uint8 RGB arrays
and are dropped by ``ResizeStep`` once the output ``image`` bytes are made.
"""

from __future__ import annotations

import hashlib
import posixpath
from urllib.parse import unquote

from pipeline.columns import (
    DECODE_FLAGS,
    DEVICE_INPUT,
    FORMAT,
    HAS_ALPHA,
    HEIGHT,
    IMAGE,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    IS_ANIMATED,
    LOW_DETAIL,
    MIME,
    N_FRAMES,
    PHASH,
    PIXELS,
    SHA256,
    SOURCE_BYTES,
    SOURCE_URI,
    STATUS,
    WIDTH,
    Batch,
)
from pipeline.media.decode import decode_image, decoded_size
from pipeline.media.device import PHASH_DRAFT_PX, JpegInput, device_input
from pipeline.media.transform import encode, phash_and_low_detail, resize_pixels
from pipeline.records import RejectReason
from pipeline.spec import DecodeSpec, FilterSpec, JobSpec, ResizeSpec
from pipeline.steps.base import Filter, RowStep, Step


def source_extension(batch: Batch, i: int) -> str | None:
    """The extension (".tga", lower case) of row ``i``'s media name in ``source_uri``: the
    WebDataset member after ``#``, else the path without a query; None if it has none.
    ``decode_image`` uses it only for bytes without a known signature."""
    uri = (batch.get(SOURCE_URI) or [None] * (i + 1))[i]
    if not isinstance(uri, str):
        return None
    name = uri.rsplit("#", 1)[1] if "#" in uri else uri.split("?", 1)[0]
    return posixpath.splitext(unquote(name.rsplit("/", 1)[-1]))[1].lower() or None


class DecodeStep(RowStep):
    """``_source_bytes`` -> ``_pixels`` and image metadata (see ``decode_image``).

    ``decode_flags`` is a list of str on every decoded row (``[]`` for ordinary images;
    ``float_scaled``, ``minmax_scaled``, ``nonfinite_samples``: see ``media/decode.py``)
    and None on error rows, like the other columns this step writes.

    With ``decode.device: cuda`` it also writes ``_device_input``: the
    ``device_media.JpegInput`` (carrying ``resize``) of a JPEG the image-embedding actor
    decodes, whose ``_pixels`` are then only a ``PHASH_DRAFT_PX`` draft, or the reason
    (str) the row is decoded here as usual.
    """

    reads = (SOURCE_BYTES, SOURCE_URI)
    writes = (PIXELS, WIDTH, HEIGHT, MIME, FORMAT, N_FRAMES, IS_ANIMATED, HAS_ALPHA,
              DECODE_FLAGS)

    def __init__(self, spec: DecodeSpec, draft_min_side_px: int | None = None,
                 resize: ResizeSpec | None = None):
        self.spec = spec
        self.draft_min_side_px = draft_min_side_px
        self.resize = resize
        if spec.device == "cuda":
            self.writes = DecodeStep.writes + (DEVICE_INPUT,)

    def settings(self):
        # draft_min_side_px is derived from resize and the models, both hashed already
        device = {"device": self.spec.device} if self.spec.device == "cuda" else {}
        return {"max_pixels": self.spec.max_pixels, **device}

    def decoded_bytes(self, batch, i):
        """Header estimate of row ``i``'s ``_pixels`` (bytes; ``decode.decoded_size``): a
        JPEG the model actor will decode (``decode.device: cuda``) is held here only as its
        ``PHASH_DRAFT_PX`` draft."""
        return decoded_size(batch[SOURCE_BYTES][i] or b"", self._draft(batch, i),
                            source_extension(batch, i))

    def process_row(self, batch, i):
        draft = self._draft(batch, i)
        img = decode_image(batch[SOURCE_BYTES][i], max_pixels=self.spec.max_pixels,
                           draft_min_side_px=draft, ext=source_extension(batch, i))
        device = {DEVICE_INPUT: batch[DEVICE_INPUT][i]} if self.spec.device == "cuda" else {}
        return {PIXELS: img.pixels, WIDTH: img.width, HEIGHT: img.height, MIME: img.mime,
                FORMAT: img.format, N_FRAMES: img.n_frames, IS_ANIMATED: img.is_animated,
                HAS_ALPHA: img.has_alpha, DECODE_FLAGS: list(img.flags), **device}

    def _draft(self, batch, i) -> int | None:
        """The JPEG draft size row ``i`` is decoded at here: ``PHASH_DRAFT_PX`` for a JPEG
        sent to the model actor, else ``draft_min_side_px``. With ``decode.device: cuda``
        the row's ``device_input`` is made once, by whichever of ``decoded_bytes`` (the
        batch byte budget) and ``process_row`` asks first, and kept in ``_device_input``."""
        if self.spec.device != "cuda":
            return self.draft_min_side_px
        column = batch.setdefault(DEVICE_INPUT, [None] * len(batch[SOURCE_BYTES]))
        if column[i] is None:
            column[i] = device_input(batch[SOURCE_BYTES][i] or b"", self.spec.max_pixels,
                                     self.draft_min_side_px, self.resize)
        return PHASH_DRAFT_PX if isinstance(column[i], JpegInput) else self.draft_min_side_px


class FilterStep(Filter):
    """Rejects rows below ``min_width_px``/``min_height_px`` or above ``max_aspect_ratio``.

    Uses the full-resolution upright ``width``/``height``. Sets ``status="rejected"`` and
    ``reject_reason``; never drops a row.
    """

    reads = (WIDTH, HEIGHT)

    def __init__(self, spec: FilterSpec):
        super().__init__()
        self.spec = spec

    def settings(self):
        # the signal and clip filters are steps of their own (signal_filter, clip_signals)
        return self.spec.model_dump(mode="json", exclude={"signals", "score_only", "clips"})

    def reject_reason(self, batch, i):
        w, h = batch[WIDTH][i], batch[HEIGHT][i]
        if w < self.spec.min_width_px or h < self.spec.min_height_px:
            return RejectReason.TOO_SMALL
        if self.spec.max_aspect_ratio and max(w, h) / max(1, min(w, h)) > self.spec.max_aspect_ratio:
            return RejectReason.ASPECT_RATIO
        return None


def needed_hashes(spec: JobSpec) -> dict[str, str]:
    """Which image hashes the job ``spec`` needs, and why: ``{"sha256" | "phash": reason}``
    (the reason names the spec field, for ``mmpipe validate --explain``). sha256: in-partition
    exact dedup, the dataset dedup index (it lists rows by sha256), a signal filter on it,
    ``sink.hash_columns``; phash: near dedup (in the partition or dataset-wide), a signal
    filter on ``phash``/``low_detail``, ``sink.hash_columns``. Empty: no hash is computed."""
    needs: dict[str, list[str]] = {SHA256: [], PHASH: []}
    dedup, dataset = spec.dedup, spec.dedup.dataset
    if dedup.exact:
        needs[SHA256].append("dedup.exact")
    if dedup.near:
        needs[PHASH].append("dedup.near")
    if dataset.enabled:
        needs[SHA256].append("dedup.dataset.enabled")
        if dataset.near:
            needs[PHASH].append("dedup.dataset.near")
    for n, rule in enumerate(spec.filters.signals):
        column = {LOW_DETAIL: PHASH}.get(rule.column, rule.column)
        if column in needs:
            needs[column].append(f"filters.signals[{n}]")
    for column in spec.sink.hash_columns:
        needs[column].append("sink.hash_columns")
    return {c: ", ".join(why) for c, why in needs.items() if why}


class HashStep(Step):
    """``sha256`` (hex) of the source bytes for every row that has bytes, and ``phash``,
    each only if ``needed_hashes`` names it (``reasons``).

    ``phash`` is the 64-bit DCT perceptual hash of ``imagehash.phash`` (Zauner 2010,
    hash_size=8) of the decoded pixels, as ``phash64`` gives it (int64); None for rows
    without pixels. The pixels are the decoder's: for a JPEG its DCT-scaled draft
    (``DecodeStep.draft_min_side_px``, at least the resize and model sizes), never a full
    decode made for the hash. (A row the model actor decodes, ``decode.device: cuda``, has
    only a JPEG draft of >= ``PHASH_DRAFT_PX`` pixels here: its pHash may differ from a
    ``cpu`` job's by a few bits.) ``low_detail``: ``media.transform.low_detail`` of the
    same DCT (a flat image: its pHash is kept but near dedup does not use it); None
    without pixels.
    """

    reads = (SOURCE_BYTES,)

    def __init__(self, reasons: dict[str, str] | None = None):
        # None: both hashes (a step used on its own, outside an assembled job)
        self.reasons = reasons if reasons is not None else {SHA256: "asked", PHASH: "asked"}
        self.writes = ((SHA256,) if SHA256 in self.reasons else ()) + (
            (PHASH, LOW_DETAIL) if PHASH in self.reasons else ())

    def settings(self):
        # both hashes: the settings every output had before hashes became optional
        return {} if len(self.reasons) == 2 else {"columns": sorted(self.reasons)}

    def __call__(self, batch: Batch) -> Batch:
        if SHA256 in self.reasons:
            batch[SHA256] = [hashlib.sha256(b).hexdigest() if b is not None else None
                             for b in batch[SOURCE_BYTES]]
        if PHASH in self.reasons:
            hashed = [phash_and_low_detail(p) if p is not None else (None, None)
                      for p in batch.get(PIXELS, [None] * len(batch[SOURCE_BYTES]))]
            batch[PHASH] = [h for h, _ in hashed]
            batch[LOW_DETAIL] = [low for _, low in hashed]
        return batch


class ResizeStep(RowStep):
    """``_pixels`` -> ``image`` (JPEG/WebP bytes), ``image_width``, ``image_height``.

    Rows whose ``_device_input`` is a ``JpegInput`` are left to the image-embedding model
    actor, which returns their image (``device_media.MEDIA_IMAGES``)."""

    reads = (PIXELS,)
    writes = (IMAGE, IMAGE_WIDTH, IMAGE_HEIGHT)

    def __init__(self, spec: ResizeSpec):
        self.spec = spec

    def settings(self):
        return self.spec.model_dump(mode="json")

    def process_row(self, batch, i):
        device = batch.get(DEVICE_INPUT)
        if device is not None and isinstance(device[i], JpegInput):
            return {}
        img = resize_pixels(batch[PIXELS][i], self.spec)
        return {IMAGE: encode(img, self.spec), IMAGE_WIDTH: img.width, IMAGE_HEIGHT: img.height}

    def __call__(self, batch: Batch) -> Batch:
        batch = super().__call__(batch)
        batch[PIXELS] = [None] * len(batch[STATUS])
        return batch
