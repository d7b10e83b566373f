"""Hash index files written with each partition (``IndexDatasink``), and the bucket rules.

Per committed attempt and per kind, one small Parquet file per non-empty bucket::

    _index/exact/b-0003/p-000042.a-<attempt>.parquet   key, partition_id, row, sha256
    _index/near/b-0011/p-000042.a-<attempt>.parquet    key, partition_id, row, phash, block,
                                                       frame

Only ``status == "ok"`` rows are indexed (in-partition duplicates are already rejected);
rows flagged ``low_detail`` (flat images: ``media.transform.low_detail``) only in the exact
index.
Video rows with frame hashes (``frame_phashes``, ``steps.clip_signals``; when the job's
``frame_index`` is on) are also indexed once per sampled frame that is not flat: its pHash,
with ``frame`` the frame's index in the row's sample; ``frame`` is null for a row's own
``phash`` (an image's, a video's mosaic), so an image and a video frame, or frames of two
videos, meet in the same buckets (``tasks.bucket_pairs`` drops the pairs of a row with
itself). Index files written before ``frame`` existed read it as null.
``row`` is the row's position in the partition's data file, so ``(partition_id, row)`` is
the row's place in plan order (partition ids sort in plan order).

Buckets: exact rows go to bucket ``int(sha256[:16], 16) % buckets``. Near rows: the 64
pHash bits are split into ``d + 1`` contiguous blocks (``d``: ``max_hamming_distance``);
two hashes at most ``d`` bits apart agree on at least one whole block (pigeonhole; the
block scheme of Manku, Jain and Das Sarma, "Detecting near-duplicates for web crawling",
WWW 2007), so each row is indexed once per block, in the bucket of ``(block index, block
value)``, and every near pair meets in some bucket without an all-pairs comparison.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.columns import FRAME_PHASHES, KEY, LOW_DETAIL, PHASH, SHA256, STATUS, Batch
from pipeline.output.sinks.base import FileDatasink
from pipeline.output.layout import INDEX_DIR
from pipeline.records import Status
from pipeline.spec import DatasetDedupSpec

log = logging.getLogger(__name__)

INDEX_ROOT = INDEX_DIR
KINDS = ("exact", "near")   # written at commit; semantic assignments are made by the pass

SCHEMAS = {
    "exact": pa.schema([("key", pa.string()), ("partition_id", pa.string()),
                        ("row", pa.int32()), ("sha256", pa.string())]),
    "near": pa.schema([("key", pa.string()), ("partition_id", pa.string()),
                       ("row", pa.int32()), ("phash", pa.int64()), ("block", pa.int8()),
                       ("frame", pa.int32())]),
}


def bucket_dir(kind: str, bucket: int) -> str:
    """``_index/<kind>/b-0003`` (relative to the output root)."""
    return f"{INDEX_ROOT}/{kind}/b-{bucket:04d}"


def index_file(kind: str, bucket: int, partition_id: str, attempt_id: str) -> str:
    """``_index/<kind>/b-0003/<pid>.a-<attempt>.parquet`` (attempt-unique)."""
    return f"{bucket_dir(kind, bucket)}/{partition_id}.a-{attempt_id}.parquet"


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output mix (Steele, Lea, Flood, "Fast splittable pseudorandom number
    generators", OOPSLA 2014) over a uint64 array: a fixed, platform-independent hash."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def exact_buckets(sha256_hex: list[str], buckets: int) -> np.ndarray:
    """Bucket of each sha256 (hex strings, n) -> int64 (n,): its first 64 bits mod
    ``buckets`` (sha256 is already uniform)."""
    return np.array([int(h[:16], 16) % buckets for h in sha256_hex], dtype=np.int64)


def block_bounds(max_hamming_distance: int) -> list[tuple[int, int]]:
    """``(shift, width)`` of each of the ``d + 1`` blocks of the 64 bits, most significant
    first, widths as equal as possible (d=4: 13, 13, 13, 13, 12 bits)."""
    n = max_hamming_distance + 1
    widths = [64 // n + (1 if i < 64 % n else 0) for i in range(n)]
    bounds, top = [], 64
    for w in widths:
        top -= w
        bounds.append((top, w))
    return bounds


def near_blocks(phash: np.ndarray, max_hamming_distance: int) -> np.ndarray:
    """Block values of each hash: ``phash`` int64 or uint64 (n,) -> uint64 (n, d + 1)."""
    bits = np.asarray(phash).astype(np.int64).view(np.uint64)
    return np.stack([(bits >> np.uint64(shift)) & np.uint64((1 << width) - 1)
                     for shift, width in block_bounds(max_hamming_distance)], axis=1)


def near_buckets(blocks: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket of each (row, block) of ``near_blocks`` -> int64 (n, d + 1): a hash of the
    block index and value, mod ``buckets``."""
    index = np.arange(blocks.shape[1], dtype=np.uint64)[None, :]
    mixed = _splitmix64(_splitmix64(blocks) ^ index)
    return (mixed % np.uint64(buckets)).astype(np.int64)


def index_tables(keys: list[str], partition_id: str, rows: list[int],
                 sha256: list[str | None], phash: list[int | None], spec: DatasetDedupSpec,
                 frames: list[list[int | None] | None] | None = None
                 ) -> dict[tuple[str, int], pa.Table]:
    """The index rows of one partition's ok rows, by ``(kind, bucket)``. Rows without a
    sha256 are left out of the exact index, rows without a pHash (none computed) out of
    the near index. ``frames``: per row its frame hashes (``frame_phashes``; None entries,
    flat frames, skipped), indexed in the near index with their frame index."""
    out: dict[tuple[str, int], pa.Table] = {}
    n = len(keys)
    if n == 0:
        return out
    key_arr, row_arr = pa.array(keys, pa.string()), pa.array(rows, pa.int32())
    pids = pa.array([partition_id] * n, pa.string())
    exact = [i for i, h in enumerate(sha256) if h is not None]
    if spec.exact and exact:
        table = pa.table([key_arr.take(exact), pids.take(exact), row_arr.take(exact),
                          pa.array([sha256[i] for i in exact], pa.string())],
                         schema=SCHEMAS["exact"])
        _split(out, "exact", table, exact_buckets([sha256[i] for i in exact], spec.buckets))
    # near entries: (record, hash, frame or None): the row's own pHash, then its frames
    entries = [(i, h, None) for i, h in enumerate(phash) if h is not None]
    entries += [(i, h, k) for i, hs in enumerate(frames or []) for k, h in enumerate(hs or [])
                if h is not None]
    if spec.near and entries:
        have = np.array([i for i, _, _ in entries])
        hashes = np.array([h for _, h, _ in entries], dtype=np.int64)
        blocks = near_blocks(hashes, spec.max_hamming_distance)
        where = near_buckets(blocks, spec.buckets)
        nb = blocks.shape[1]
        sel = np.repeat(have, nb)
        frame = pa.array([f for _, _, f in entries], pa.int32()).take(
            np.repeat(np.arange(len(entries)), nb))
        table = pa.table([key_arr.take(sel), pids.take(sel), row_arr.take(sel),
                          pa.array(np.repeat(hashes, nb)),
                          pa.array(np.tile(np.arange(nb, dtype=np.int8), len(entries))),
                          frame], schema=SCHEMAS["near"])
        _split(out, "near", table, where.reshape(-1))
    return out


def _split(out: dict, kind: str, table: pa.Table, buckets: np.ndarray) -> None:
    order = np.argsort(buckets, kind="stable")
    sorted_b = buckets[order]
    starts = np.flatnonzero(np.r_[True, sorted_b[1:] != sorted_b[:-1]])
    ends = np.r_[starts[1:], len(order)]
    for s, e in zip(starts, ends):
        out[(kind, int(sorted_b[s]))] = table.take(order[s:e])


class IndexDatasink(FileDatasink):
    """Writes the partition's hash index files (``index_tables``) when the attempt
    completes: memory is the ok rows' keys and hashes of one partition (~100 bytes a
    row). The commit marker names every file, so gc and readers treat them like data.
    ``frames``: index each video row's ``frame_phashes`` too (``JobSpec.frame_index``)."""

    name = "index"
    directory = INDEX_DIR

    def __init__(self, output_uri: str, spec: DatasetDedupSpec, frames: bool = False):
        super().__init__(output_uri)
        self.spec = spec
        self.frames = frames
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self.keys: list[str] = []
        self.positions: list[int] = []
        self.sha: list[str] = []
        self.phash: list[int | None] = []
        self.frame_hashes: list[list[int | None] | None] = []

    def settings(self) -> dict[str, Any]:
        """What changes the index files: kinds, buckets, the pHash block split and (only
        when on, so image jobs keep their settings) the frame rows."""
        return {"buckets": self.spec.buckets, "exact": self.spec.exact,
                "near": self.spec.near, "max_hamming_distance": self.spec.max_hamming_distance,
                **({"frames": True} if self.frames else {})}

    def on_write_start(self, partition_id: str, attempt_id: str, schema: pa.Schema) -> None:
        super().on_write_start(partition_id, attempt_id, schema)
        self._reset()

    def write(self, batch: Batch) -> None:
        phash, low = batch.get(PHASH), batch.get(LOW_DETAIL)
        frames = batch.get(FRAME_PHASHES) if self.frames else None
        for i, status in enumerate(batch[STATUS]):
            has_frames = frames is not None and bool(frames[i])
            if status == Status.OK.value and (batch[SHA256][i] is not None or has_frames):
                self.keys.append(batch[KEY][i])
                self.positions.append(self.rows + i)
                self.sha.append(batch[SHA256][i])
                flat = low is not None and bool(low[i])       # no near index row
                self.phash.append(None if phash is None or flat else phash[i])
                self.frame_hashes.append(frames[i] if has_frames else None)
        self.rows += len(batch[STATUS])

    def _finish(self) -> None:
        tables = index_tables(self.keys, self.partition_id, self.positions, self.sha,
                              self.phash, self.spec, self.frame_hashes)
        for (kind, bucket), table in sorted(tables.items()):
            rel = index_file(kind, bucket, self.partition_id, self.attempt_id)
            pq.write_table(table, self.open_file(rel))
            self.finish_file(rel, 0)       # index rows are not output rows
