"""The WebDataset datasink: each ``ok`` row as a sample in ``.tar`` shards.

Members per sample: ``<key>.jpg`` (or ``.webp``: the resized ``image``; video: also
``<key>.<n>.jpg`` per sampled frame; video clips: ``<key>.mp4``, the clip file),
``<key>.json`` (every scalar output column, the original key included) and
``<key>.txt`` (the caption, if the row has one). Shards go to
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

from pipeline.columns import CAPTION, CLIP_FILE, FRAMES_ENCODED, IMAGE, KEY, STATUS, Batch
from pipeline.output.sinks.base import FileDatasink
from pipeline.storage.tar import BLOCK, ENCODING, ERRORS, FORMAT, RECORD, padded
from pipeline.records import Status
from pipeline.spec import WebDatasetSinkSpec
import contextlib
import io
import tarfile
from pipeline.storage import fs
from pipeline.output.layout import OutputLayout


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def safe_member_key(key: str) -> str:
    """``key`` as a relative tar member name: ``\\`` read as ``/``; empty, ``.`` and ``..``
    parts dropped (so never an absolute name or a ``..`` escape when extracted); control
    characters (NUL included) replaced by ``_``; ``_`` if nothing is left."""
    parts = [p for p in str(key).replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return _CONTROL.sub("_", "/".join(parts)) or "_"


class WebDatasetDatasink(FileDatasink):
    """``ok`` rows as WebDataset samples (the data schema's scalar columns go to the JSON
    member); ``image_format`` ``jpeg`` or ``webp``."""

    name = "webdataset"
    directory = "wds"

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
        self.writer = WebDatasetWriter(self.layout.root, partition_id, attempt_id, self.spec,
                                       open_out=self.open_file)
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
        clip = batch.get(CLIP_FILE)
        if clip is not None and clip[i]:
            with open(clip[i], "rb") as f:   # video.clips: the clip file, as `<key>.mp4`
                members["mp4"] = f.read()
        meta = {}
        for name in self.json_columns:
            column = batch.get(name)
            value = column[i] if column is not None else None
            meta[name] = value.item() if isinstance(value, np.generic) else value
        members["json"] = json.dumps(meta, ensure_ascii=False, default=str).encode()
        if batch[CAPTION][i] is not None:
            members["txt"] = batch[CAPTION][i].encode()
        return members

    def _finish(self) -> None:
        self.writer.close()
        for rel in self.writer.files:
            self.finish_file(rel, self.writer.samples[rel])

    def on_write_failed(self, error: BaseException | None = None) -> None:
        if self.writer is not None:
            self.writer.abort()  # stops writing and deletes wds/<pid>/a-<attempt>
        super().on_write_failed(error)


class WebDatasetWriter:
    """Writes one partition attempt's samples to tar shards under
    ``wds/<partition_id>/a-<attempt_id>/<partition_id>-<n:06d>.tar`` (relative to
    ``output_uri``; ``n`` from 0), local or ``s3://``.

    Each shard is streamed (never whole in memory) through ``fs.resolve`` +
    ``open_output_stream`` with ``tarfile`` mode ``"w|"`` (PAX format, UTF-8), headers
    deterministic (mtime 0, uid/gid 0, mode 0o444, empty uname/gname). A new shard is
    started before a sample that would make the shard's final file size (bytes,
    including tar padding and end-of-archive marker) exceed ``spec.shard_max_bytes`` -
    a single bigger sample goes alone into one shard - and after ``spec.shard_max_samples``
    samples. No empty shard is written. sha256 and size are computed while writing.

    Stream writes are not retried (a stream cannot be replayed): a storage error
    propagates (``OSError``/``StorageError``) and the caller should ``abort()`` and retry
    the attempt.
    """

    def __init__(self, output_uri: str, partition_id: str, attempt_id: str,
                 spec: WebDatasetSinkSpec, open_out=None):
        self.layout = OutputLayout(output_uri)
        # a datasink's FileDatasink.open_file (it then owns the streams), else a stream here
        self._open_out = open_out or (lambda rel: fs.HashingOutput(self.layout.uri(rel)))
        self.samples: dict[str, int] = {}   # samples per shard (relative path)
        self.partition_id, self.attempt_id = partition_id, attempt_id
        self.rel_dir = OutputLayout.rel_attempt_dir("webdataset", partition_id, attempt_id)
        self.spec = spec
        self.files: list[str] = []
        self.sha256: dict[str, str] = {}
        self.total_bytes = 0
        self._out: fs.HashingOutput | None = None
        self._tar: tarfile.TarFile | None = None
        self._shard_bytes = 0       # tar bytes written to the open shard, before the end marker
        self._shard_samples = 0
        self._shard_keys: dict[str, str] = {}
        self._closed = False

    @staticmethod
    def member_key(key: str) -> str:
        """The key as written: ``.`` in its base name replaced by ``_`` (a ``.`` there would
        move WebDataset's key/extension split, which is the first ``.`` of the base name);
        a ``.`` in a folder part (``dir.v2/0004``) moves nothing and is kept. The caller
        keeps the original key in its JSON member."""
        head, sep, base = key.rpartition("/")
        return head + sep + base.replace(".", "_")

    @staticmethod
    def _final_size(content_bytes: int) -> int:
        """File size of a shard with ``content_bytes`` of members: end marker + record pad."""
        return -(-(content_bytes + 2 * BLOCK) // RECORD) * RECORD

    def write(self, key: str, members: dict[str, bytes]) -> None:
        """Append one sample: ``members`` = extension -> bytes, written in the order given
        as ``<key>.<ext>`` (the key's base name with ``.`` -> ``_``, see ``member_key``).

        Raises ``ValueError`` for an empty key, no members, an empty extension or one with
        ``/``, a key that (after ``member_key``) repeats one already in this shard,
        or after ``close``/``abort``; ``OSError``/``StorageError`` on storage failure.
        """
        if self._closed:
            raise ValueError(f"{self.rel_dir}: writer already closed")
        safe = self.member_key(key)
        if not safe or safe.endswith("/"):
            raise ValueError(f"sample key {key!r}: empty key")
        if not members:
            raise ValueError(f"sample key {key!r}: no members")
        infos = []
        size = 0
        for ext, data in members.items():
            if not ext or "/" in ext or ext.startswith("."):
                raise ValueError(f"sample key {key!r}: bad extension {ext!r}")
            info = tarfile.TarInfo(f"{safe}.{ext}")
            info.size = len(data)
            info.mtime, info.mode, info.uid, info.gid = 0, 0o444, 0, 0
            info.uname = info.gname = ""
            infos.append((info, data))
            size += len(info.tobuf(FORMAT, ENCODING, ERRORS)) + padded(info.size)
        if self._tar is not None and (
                self._shard_samples >= self.spec.shard_max_samples
                or self._final_size(self._shard_bytes + size) > self.spec.shard_max_bytes):
            self._finish_shard()
        if self._tar is not None and safe in self._shard_keys:
            raise ValueError(f"sample key {key!r} repeats key {self._shard_keys[safe]!r} "
                             f"(written as {safe!r}) in shard {self.files[-1]}")
        if self._tar is None:
            self._open_shard()
        for info, data in infos:
            self._tar.addfile(info, io.BytesIO(data))
        self._shard_bytes += size
        self._shard_samples += 1
        self._shard_keys[safe] = key

    def _open_shard(self) -> None:
        rel = OutputLayout.rel_shard(self.partition_id, self.attempt_id, len(self.files))
        self.files.append(rel)
        self._out = self._open_out(rel)
        self._tar = tarfile.open(fileobj=self._out, mode="w|", format=FORMAT,
                                 encoding=ENCODING, errors=ERRORS)
        self._shard_bytes = self._shard_samples = 0
        self._shard_keys = {}

    def _finish_shard(self) -> None:
        self._tar.close()             # end-of-archive marker + record padding
        self._out.close()
        rel = self.files[-1]
        self.sha256[rel] = self._out.sha256
        self.samples[rel] = self._shard_samples
        self.total_bytes += self._out.size
        self._tar = self._out = None

    def close(self) -> tuple[list[str], dict[str, str], int]:
        """Finish the open shard; return ``(files relative to output_uri, sha256 hex per
        relative file, total bytes of all shards)``. No samples -> ``([], {}, 0)``.
        Raises ``OSError``/``StorageError`` if the last shard cannot be completed."""
        if not self._closed:
            if self._tar is not None:
                self._finish_shard()
            self._closed = True
        return list(self.files), dict(self.sha256), self.total_bytes

    def abort(self) -> None:
        """Stop writing and delete everything this attempt wrote (``fs.delete_tree`` of
        ``wds/<partition_id>/a-<attempt_id>``). Safe to call more than once."""
        self._closed = True
        if self._tar is not None:
            self._out.discard()
            with contextlib.suppress(Exception):
                self._tar.close()
        if self._out is not None:
            with contextlib.suppress(Exception):
                self._out.close()
        self._tar = self._out = None
        fs.delete_tree(self.layout.uri(self.rel_dir))
