"""The WebDataset datasink: each ``ok`` row as a sample in ``.tar`` shards.

Members per sample: ``<key>.jpg`` (or ``.webp``: the resized ``image``; video: also
``<key>.<n>.jpg`` per sampled frame), ``<key>.json`` (every scalar output column, the
original key included) and ``<key>.txt`` (the caption, if the row has one). Shards go to
``wds/<pid>/a-<attempt>/<pid>-000000.tar`` (``WebDatasetWriter``, rolled by bytes and
samples) and are named by the commit marker like every other output file.

Keys come from the input (manifest cells, file names), so a member name is made safe
first (``safe_member_key``): relative, no ``.``/``..`` or empty parts, no control
characters; the JSON member keeps the original key.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.columns import CAPTION, FRAMES_ENCODED, IMAGE, KEY, STATUS, Batch
from pipeline.io.datasink import Datasink, WriteResult
from pipeline.io.webdataset import WebDatasetWriter
from pipeline.records import Status
from pipeline.spec import WebDatasetSinkSpec


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def safe_member_key(key: str) -> str:
    """``key`` as a relative tar member name: ``\\`` read as ``/``; empty, ``.`` and ``..``
    parts dropped (so never an absolute name or a ``..`` escape when extracted); control
    characters (NUL included) replaced by ``_``; ``_`` if nothing is left."""
    parts = [p for p in str(key).replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return _CONTROL.sub("_", "/".join(parts)) or "_"


class WebDatasetDatasink(Datasink):
    """``ok`` rows as WebDataset samples (the data schema's scalar columns go to the JSON
    member); ``image_format`` ``jpeg`` or ``webp``."""

    name = "webdataset"

    def __init__(self, output_uri: str, spec: WebDatasetSinkSpec, image_format: str = "jpeg"):
        super().__init__(output_uri)
        self.spec = spec
        self.image_ext = "webp" if image_format == "webp" else "jpg"
        self.json_columns: list[str] = []
        self.writer: WebDatasetWriter | None = None
        self.keys: set[str] = set()

    def settings(self) -> dict[str, Any]:
        return {"shard_max_bytes": self.spec.shard_max_bytes,
                "shard_max_samples": self.spec.shard_max_samples}

    def on_write_start(self, partition_id: str, attempt_id: str, schema: pa.Schema) -> None:
        super().on_write_start(partition_id, attempt_id, schema)
        # the scalar columns of a sample's JSON member: no bytes, no vectors, no lists of them
        self.json_columns = [f.name for f in schema if not (
            pa.types.is_binary(f.type) or pa.types.is_fixed_size_list(f.type)
            or (pa.types.is_list(f.type) and (pa.types.is_binary(f.type.value_type) or
                                              pa.types.is_fixed_size_list(f.type.value_type))))]
        self.writer = WebDatasetWriter(self.layout.root, partition_id, attempt_id, self.spec)
        self.keys = set()

    def write(self, batch: Batch) -> None:
        for i, status in enumerate(batch[STATUS]):
            if status == Status.OK.value:
                self.writer.write(self._unique_key(batch[KEY][i]), self._sample(batch, i))

    def _unique_key(self, key: str) -> str:
        """A key not used before in this attempt: ``key``, else ``key_1``, ... (a manifest
        may repeat a key; the JSON member keeps the original)."""
        base = name = WebDatasetWriter.member_key(safe_member_key(key))
        n = 0
        while name in self.keys:
            n += 1
            name = f"{base}_{n}"
        self.keys.add(name)
        return name

    def _sample(self, batch: Batch, i: int) -> dict[str, bytes]:
        members: dict[str, bytes] = {}
        if batch.get(IMAGE) and batch[IMAGE][i] is not None:
            members[self.image_ext] = batch[IMAGE][i]
        frames = batch.get(FRAMES_ENCODED)
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

    def _close(self) -> WriteResult:
        files, sha, size = self.writer.close()
        return WriteResult(tuple(files), len(self.keys), size, sha)

    def on_write_failed(self, error: BaseException | None = None) -> None:
        if self.writer is not None:
            self.writer.abort()  # stops writing and deletes wds/<pid>/a-<attempt>
