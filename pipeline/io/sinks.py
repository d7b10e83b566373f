"""The Parquet ``Datasink``: streams one partition attempt's rows to Parquet row groups.

Files go to attempt-unique paths (``data/<pid>/a-<attempt>/part-00000.parquet`` and the
same under ``quarantine/``), so an attempt never overwrites another's output; the commit
marker decides which attempt is visible. Rows are buffered up to ``rows_per_row_group``
and written as a row group, so a partition is never held in memory whole.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import fs
from pipeline.io.webdataset import WebDatasetWriter
from pipeline.records import (CAPTION, ERROR, IMAGE, KEY, REJECT_REASON, SOURCE_BYTES, STATUS,
                              TEXT_EMBEDDING, Batch, Status, WriteResult)
from pipeline.spec import SinkSpec

log = logging.getLogger(__name__)

BASE_FIELDS = [
    pa.field("key", pa.string()), pa.field("partition_id", pa.string()),
    pa.field("source_uri", pa.string()), pa.field("status", pa.string()),
    pa.field("reject_reason", pa.string()), pa.field("error", pa.string()),
    pa.field("width", pa.int32()), pa.field("height", pa.int32()),
    pa.field("mime", pa.string()), pa.field("format", pa.string()),
    pa.field("n_frames", pa.int32()), pa.field("is_animated", pa.bool_()),
    pa.field("has_alpha", pa.bool_()), pa.field("sha256", pa.string()),
    pa.field("phash", pa.uint64()), pa.field("duplicate_of", pa.string()),
    pa.field("duplicate_hamming", pa.int32()), pa.field("caption", pa.large_string()),
    pa.field("caption_flags", pa.list_(pa.string())), pa.field("image", pa.binary()),
    pa.field("image_width", pa.int32()), pa.field("image_height", pa.int32()),
]


VIDEO_FIELDS = [
    pa.field("duration_s", pa.float64()), pa.field("fps", pa.float64()),
    pa.field("frame_count", pa.int32()), pa.field("frame_timestamps_s", pa.list_(pa.float64())),
    pa.field("partial", pa.bool_()), pa.field("decode_errors", pa.int32()),
    pa.field("rotation_deg", pa.int32()), pa.field("video_codec", pa.string()),
    pa.field("frames", pa.list_(pa.binary())),
]


def output_schema(extra: list[pa.Field], embedding_dim: int | None = None,
                  model_fields: list[pa.Field] | tuple = (), media: str = "image") -> pa.Schema:
    """Schema of data files: reserved columns, for ``media="video"`` the video columns
    (``duration_s``/``fps`` float64 seconds/Hz, ``frame_count``, ``frame_timestamps_s``
    list<float64> seconds, ``partial``, ``frames`` list<binary> encoded frames; ``image``
    is then the middle sampled frame), ``text_embedding`` (``fixed_size_list<float32>[D]``)
    if ``embedding_dim``, the model steps' columns (``model_fields``: ``text_embedding``,
    ``image_embedding`` ``fixed_size_list<float32|float16>[D]``, ``clip_score`` float32,
    ``generated_caption`` large_string, for video also ``frame_embeddings``
    list<fixed_size_list>, in pipeline order), then the carried columns."""
    fields = list(BASE_FIELDS) + (VIDEO_FIELDS if media == "video" else [])
    if embedding_dim:
        fields.append(pa.field(TEXT_EMBEDDING, pa.list_(pa.float32(), embedding_dim)))
    return pa.schema(fields + list(model_fields) + extra)


def quarantine_schema(data_schema: pa.Schema) -> pa.Schema:
    """Data schema plus ``source_bytes`` (the original, undecoded bytes)."""
    return data_schema.append(pa.field("source_bytes", pa.binary()))


def _column(values: list[Any], field: pa.Field) -> pa.Array:
    if pa.types.is_list(field.type) and pa.types.is_fixed_size_list(field.type.value_type):
        values = [None if v is None else [np.asarray(x).tolist() for x in v] for v in values]
        return pa.array(values, type=field.type)
    if pa.types.is_fixed_size_list(field.type):
        dim = field.type.list_size
        mask = np.array([v is None for v in values], dtype=bool)
        flat = np.zeros((len(values), dim), dtype=field.type.value_type.to_pandas_dtype())
        for i, v in enumerate(values):
            if v is not None:
                flat[i] = v
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), dim,
                                                 mask=pa.array(mask))
    return pa.array(values, type=field.type)


def to_table(batch: Batch, schema: pa.Schema, rows: list[int]) -> pa.Table:
    """Rows ``rows`` of ``batch`` as a table of ``schema`` (missing columns become null)."""
    n = len(rows)
    cols = []
    for field in schema:
        src = batch.get(field.name)
        values = [src[i] for i in rows] if src is not None else [None] * n
        cols.append(_column(values, field))
    return pa.Table.from_arrays(cols, schema=schema)


class _StreamingFile:
    """One Parquet file written row group by row group."""

    def __init__(self, uri: str, schema: pa.Schema, spec: SinkSpec):
        self.uri, self.schema, self.spec = uri, schema, spec
        self.writer: pq.ParquetWriter | None = None
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= self.spec.rows_per_row_group:
            self._flush()

    def _flush(self) -> None:
        if not self.buffered:
            return
        if self.writer is None:
            fsys, path = fs.resolve(self.uri)
            fsys.create_dir(path.rsplit("/", 1)[0], recursive=True)
            codec = None if self.spec.compression == "none" else self.spec.compression
            self.writer = pq.ParquetWriter(path, self.schema, filesystem=fsys, compression=codec)
        self.writer.write_table(pa.concat_tables(self.buffer),
                                row_group_size=self.spec.rows_per_row_group)
        self.rows += self.buffered
        self.buffer, self.buffered = [], 0

    def close(self) -> bool:
        """Flush and close; return True if a file was written."""
        self._flush()
        if self.writer is None:
            return False
        self.writer.close()
        return True


class ParquetDatasink:
    """Writes one partition attempt: data rows, error rows to quarantine, and with
    ``sink.webdataset.enabled`` the ``ok`` samples as WebDataset shards.

    ``write(batch)`` appends a batch; ``close()`` returns the ``WriteResult`` (files
    relative to the output root, rows by status and reason, bytes, sha256 per file);
    ``abort()`` deletes whatever this attempt wrote.
    """

    def __init__(self, output_uri: str, partition_id: str, attempt_id: str, spec: SinkSpec,
                 schema: pa.Schema, image_format: str = "jpeg"):
        self.output_uri = output_uri
        self.rel_data = f"data/{partition_id}/a-{attempt_id}/part-00000.parquet"
        self.rel_quarantine = f"quarantine/{partition_id}/a-{attempt_id}/part-00000.parquet"
        self.rel_dirs = (f"data/{partition_id}/a-{attempt_id}",
                         f"quarantine/{partition_id}/a-{attempt_id}")
        self.data = _StreamingFile(fs.join(output_uri, self.rel_data), schema, spec)
        self.quarantine = (_StreamingFile(fs.join(output_uri, self.rel_quarantine),
                                          quarantine_schema(schema), spec)
                           if spec.quarantine else None)
        self.wds = (WebDatasetWriter(output_uri, partition_id, attempt_id, spec.webdataset)
                     if spec.webdataset.enabled else None)
        self.image_ext = "webp" if image_format == "webp" else "jpg"
        # the scalar columns of a sample's JSON member: no bytes, no vectors
        self.json_columns = [f.name for f in schema if not (
            pa.types.is_binary(f.type) or pa.types.is_fixed_size_list(f.type)
            or f.name in (IMAGE, "frames", "frame_embeddings"))]
        self.wds_keys: set[str] = set()
        self.by_status: collections.Counter = collections.Counter()
        self.by_reason: collections.Counter = collections.Counter()

    def write(self, batch: Batch) -> None:
        n = len(batch[STATUS])
        self.data.write(to_table(batch, self.data.schema, list(range(n))))
        for i in range(n):
            status = batch[STATUS][i]
            self.by_status[status] += 1
            if status == "rejected":
                self.by_reason[f"rejected:{batch[REJECT_REASON][i]}"] += 1
            elif status == "error":
                self.by_reason[f"error:{batch[ERROR][i].split(':', 1)[0]}"] += 1
        errors = [i for i in range(n) if batch[STATUS][i] == "error"]
        if self.quarantine and errors:
            batch["source_bytes"] = batch[SOURCE_BYTES]
            self.quarantine.write(to_table(batch, self.quarantine.schema, errors))
        if self.wds:
            for i in range(n):
                if batch[STATUS][i] == Status.OK.value:
                    self.wds.write(self._unique_key(batch[KEY][i]), self._sample(batch, i))

    def _unique_key(self, key: str) -> str:
        """A WebDataset key not used before in this attempt: ``key``, else ``key_1``, ...
        (a manifest may repeat a key; the JSON member keeps the original)."""
        base = name = WebDatasetWriter.member_key(key)
        n = 0
        while name in self.wds_keys:
            n += 1
            name = f"{base}_{n}"
        self.wds_keys.add(name)
        return name

    def _sample(self, batch: Batch, i: int) -> dict[str, bytes]:
        """WebDataset members of row ``i``: the image (video: also each sampled frame as
        ``<n>.jpg``), ``json`` (every scalar output column, the original key included),
        and ``txt`` (the caption) if there is one."""
        members: dict[str, bytes] = {}
        if batch.get(IMAGE) and batch[IMAGE][i] is not None:
            members[self.image_ext] = batch[IMAGE][i]
        frames = batch.get("frames")
        for n, frame in enumerate(frames[i] if frames is not None and frames[i] else []):
            members[f"{n}.{self.image_ext}"] = frame
        meta = {}
        for name in self.json_columns:
            column = batch.get(name)
            value = column[i] if column is not None else None
            meta[name] = value.item() if isinstance(value, np.generic) else value
        members["json"] = json.dumps(meta, ensure_ascii=False, default=str).encode()
        if batch[CAPTION][i] is not None:
            members["txt"] = batch[CAPTION][i].encode()
        return members

    def close(self) -> WriteResult:
        files = []
        if self.data.close():
            files.append(self.rel_data)
        if self.quarantine and self.quarantine.close():
            files.append(self.rel_quarantine)
        sha, size = {}, 0
        for rel in files:
            blob = fs.read_bytes(fs.join(self.output_uri, rel))
            sha[rel] = hashlib.sha256(blob).hexdigest()
            size += len(blob)
        if self.wds:
            shards, shard_sha, shard_bytes = self.wds.close()
            files += shards
            sha.update(shard_sha)
            size += shard_bytes
        return WriteResult(tuple(files), self.data.rows, dict(self.by_status),
                           dict(self.by_reason), size, sha)

    def abort(self) -> None:
        if self.wds:
            self.wds.abort()
        for rel in self.rel_dirs:
            try:
                fs.delete_tree(fs.join(self.output_uri, rel))
            except OSError:
                log.warning("could not delete %s", rel, exc_info=True)
