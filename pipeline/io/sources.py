"""Datasources: list the input for planning, and read one partition as batches.

``FilesDatasource``: media files under a prefix, each with an optional sidecar caption of
the same stem (``.txt``: the caption; ``.json``: an object whose ``caption_column`` key is
the caption and whose other keys go to ``metadata_json``) - the WebDataset/img2dataset
convention. ``ManifestDatasource``: Parquet/CSV/JSONL rows that name the media by ``url``
(http(s) URLs are downloaded) or ``path``; other columns are carried to the output.
``WebDatasetDatasource``: ``.tar`` shards, a partition being whole shards, samples grouped
by key (``pipeline.io.webdataset``).

Three pieces, as Ray Data splits them: ``list_inputs`` enumerates the input (the planner,
``pipeline.io.plan``, cuts it into partitions); ``read_partition`` reads one partition;
a ``Fetcher`` (``pipeline.io.fetch``), one per partition read and closed when it ends,
gets the bytes (local, object store, HTTP) and stages local files.

``read_partition`` yields batches with the columns ``key``, ``source_uri``,
``_source_bytes`` (bytes or None), ``_raw_caption`` (any JSON value or bytes),
``_read_error`` (a ``RowError``, else None) and the datasource's own columns
(``metadata_json``, or a manifest's carried columns). For ``source.media: video`` the
media are not read into memory: each batch also has ``_source_path``, a local file per row
(a local input as is; an object-store object or downloaded/tar-member bytes in a
temporary file that is deleted when the next batch is requested, so disk use is one batch
of videos).
"""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from pipeline.columns import (KEY, METADATA_JSON, RAW_CAPTION, READ_ERROR, RESERVED, SOURCE_BYTES,
                              SOURCE_PATH, SOURCE_URI, Batch)
from pipeline.errors import PartitionError, PlanError
from pipeline.io import fs, manifest, webdataset
from pipeline.io.fetch import Fetcher, is_url, too_large
from pipeline.io.stats import AttemptStats
from pipeline.records import ErrorReason, InputItem, Partition, RowError
from pipeline.spec import DecodeSpec, DownloadSpec, SourceSpec, VideoSpec

log = logging.getLogger(__name__)

SIDECAR_EXTENSIONS = (".txt", ".json")


class Datasource:
    """Base of the datasources.

    Subclasses implement ``list_inputs`` and ``_read`` (batches with ``_source_bytes``
    or, for video read in place, None), and may override ``extra_fields`` (carried
    columns). ``writes``: the declared columns its batches carry; ``settings()``: what
    changes its rows (hashed into the fingerprint).
    """

    writes: tuple[str, ...] = (KEY, SOURCE_URI, SOURCE_BYTES, RAW_CAPTION, READ_ERROR)

    def __init__(self, spec: SourceSpec, decode: DecodeSpec, download: DownloadSpec | None = None,
                 video: VideoSpec | None = None):
        self.spec = spec
        self.max_bytes = decode.max_bytes
        self.download = download or DownloadSpec()
        self.temp_dir = (video or VideoSpec()).temp_dir
        self.video = spec.media == "video"
        if self.video:
            self.writes = self.writes + (SOURCE_PATH,)

    def settings(self) -> dict[str, Any]:
        """The source spec and ``decode.max_bytes`` (records over it are errors)."""
        return {"source": self.spec.model_dump(mode="json"), "max_bytes": self.max_bytes}

    def list_inputs(self) -> Iterator[InputItem]:
        """Yield every input item in a deterministic order. Raises ``PlanError``."""
        raise NotImplementedError

    def extra_fields(self, partition: Partition) -> list[pa.Field]:
        """Arrow fields of carried (undeclared, per-input) columns; default none."""
        return []

    @property
    def items_per_partition(self) -> int:
        """Planned items per partition (``source.partition_size``): records here."""
        return self.spec.partition_size

    def rows_planned(self, partition: Partition) -> int | None:
        """Records ``partition`` is planned to yield (None: known only once read)."""
        return partition.rows_planned

    def read_partition(self, partition: Partition, batch_size: int, pool: ThreadPoolExecutor,
                       stats: AttemptStats | None = None) -> Iterator[Batch]:
        """Yield the partition's records as batches of at most ``batch_size`` rows.

        A ``Fetcher`` is made for this read and closed when it ends (also on error or
        when the generator is closed); its download counters go to ``stats``. Video: a
        batch's staged files live until the next batch is requested. Raises
        ``PartitionError`` for an unreadable partition input (e.g. a corrupt manifest); a
        bad record is a row with ``_read_error`` instead.
        """
        fetcher = Fetcher(self.max_bytes, self.download, self.temp_dir, self.video)
        try:
            for batch in self._read(partition, batch_size, pool, fetcher):
                if not self.video:
                    yield batch
                    continue
                with contextlib.ExitStack() as stack:
                    self._stage(batch, fetcher, pool, stack)
                    yield batch
        finally:
            if stats is not None:
                stats.add_downloads(fetcher.stats())
            fetcher.close()

    def _read(self, partition: Partition, batch_size: int, pool: ThreadPoolExecutor,
              fetcher: Fetcher) -> Iterator[Batch]:
        raise NotImplementedError

    @staticmethod
    def _stage(batch: Batch, fetcher: Fetcher, pool: ThreadPoolExecutor,
               stack: contextlib.ExitStack) -> None:
        """Set ``_source_path`` for every row without a read error (bytes in memory are
        moved to the staged file)."""
        def one(i: int) -> tuple[str | None, RowError | None]:
            if batch[READ_ERROR][i] is not None:
                return None, None
            return fetcher.stage(batch[SOURCE_URI][i], batch[SOURCE_BYTES][i], stack)
        staged = list(pool.map(one, range(len(batch[KEY]))))
        batch[SOURCE_PATH] = [path for path, _ in staged]
        for i, (path, error) in enumerate(staged):
            batch[SOURCE_BYTES][i] = None  # the file holds them now
            if error is not None:
                batch[READ_ERROR][i] = error


class FilesDatasource(Datasource):
    """Media files under ``spec.uri`` with sidecar captions of the same stem."""

    writes = Datasource.writes + (METADATA_JSON,)

    def list_inputs(self) -> Iterator[InputItem]:
        """Stream the sorted listing, pairing each media file with its sidecar.

        All keys of one stem ``s`` start with ``s.`` and so are contiguous in a sorted
        listing: a stem is complete (and emitted) once a key outside ``s.`` arrives, so
        only a handful of stems are ever pending, whatever the listing's size.
        """
        exts = self.spec.media_extensions
        pending: dict[str, dict] = {}
        found = 0
        last = ""
        for entry in fs.list_files(self.spec.uri):
            if entry.uri < last:
                raise PlanError(f"source.uri {self.spec.uri!r}: listing is not in key order")
            last = entry.uri
            for stem in [s for s in pending if not entry.uri.startswith(s + ".")]:
                for item in _group_items(pending.pop(stem)):
                    found += 1
                    yield item
            stem, ext = posixpath.splitext(entry.uri)
            group = pending.setdefault(stem, {"media": [], "side": {}})
            if ext.lower() in SIDECAR_EXTENSIONS:
                group["side"][ext.lower()] = entry.uri
            elif ext.lower() in exts:
                group["media"].append(entry)
        for group in pending.values():
            for item in _group_items(group):
                found += 1
                yield item
        if not found:
            raise PlanError(f"source.uri {self.spec.uri!r}: no files with extensions {list(exts)}")

    def _read(self, partition, batch_size, pool, fetcher):
        root = fs.normalize(self.spec.uri)
        for start in range(0, len(partition.inputs), batch_size):
            items = partition.inputs[start:start + batch_size]
            rows = list(pool.map(lambda item: self._read_item(item, fetcher), items))
            batch: Batch = {k: [r[k] for r in rows] for k in rows[0]}
            batch[KEY] = [_key_from_uri(i.uri, root) for i in items]
            yield batch

    def _read_item(self, item: InputItem, fetcher: Fetcher) -> dict[str, Any]:
        data, error = fetcher.fetch(item.uri, item.size_bytes)
        caption, meta = None, None
        if item.caption_uri:
            try:
                raw = fs.read_bytes(item.caption_uri)
                if item.caption_uri.endswith(".json"):
                    caption, meta = split_json_caption(raw, self.spec.caption_column)
                else:
                    caption = raw
            except Exception as e:  # noqa: BLE001 - a bad sidecar is this record's error
                error = error or RowError(ErrorReason.READ_FAILED, f"{item.caption_uri}: {e}")
        return {SOURCE_URI: item.uri, SOURCE_BYTES: data, RAW_CAPTION: caption,
                READ_ERROR: error, METADATA_JSON: meta}


class ManifestDatasource(Datasource):
    """Rows of Parquet/CSV/JSONL manifests naming media by path or URL."""

    def list_inputs(self) -> Iterator[InputItem]:
        files = manifest.list_manifests(self.spec.uri, self.spec.manifest_format)
        if not files:
            raise PlanError(f"source.uri {self.spec.uri!r}: no manifest files found")
        step = self.spec.partition_size
        for uri, size in files:
            try:
                rows = manifest.count_rows(uri, self.spec.manifest_format)
            except PlanError as e:
                # A corrupt manifest (T11, T12) must not stop the job: it is planned as a
                # partition of its own with no known rows, which fails when read, naming
                # the file, and is reported after its retries.
                log.warning("%s; planned as a partition of its own that will fail", e)
                yield InputItem(uri=uri, size_bytes=size, row_start=0, row_stop=0)
                continue
            # Row ranges are cut at partition_size; the planner packs them into partitions.
            for start in range(0, rows, step):
                yield InputItem(uri=uri, size_bytes=size, row_start=start,
                                row_stop=min(rows, start + step))

    def extra_fields(self, partition: Partition) -> list[pa.Field]:
        schema = manifest.read_schema(partition.inputs[0].uri, self.spec.manifest_format,
                                      self._string_columns())
        skip = {self._path_column(schema), self.spec.caption_column, self.spec.key_column}
        return [pa.field(carried_name(f.name), f.type) for f in schema if f.name not in skip]

    def _string_columns(self) -> tuple[str, ...]:
        return ("url", "path", self.spec.path_column or "", self.spec.caption_column,
                self.spec.key_column or "")

    def _path_column(self, schema: pa.Schema) -> str:
        if self.spec.path_column:
            return self.spec.path_column
        for name in ("url", "path"):
            if name in schema.names:
                return name
        raise PartitionError(f"manifest has neither a 'url' nor a 'path' column "
                             f"(columns: {schema.names}); set source.path_column")

    def settings(self) -> dict[str, Any]:
        """Also the download settings that change which rows fail (not threads or
        max_per_host: how fast, not what)."""
        return dict(super().settings(), download=self.download.model_dump(
            mode="json", exclude={"threads", "max_per_host"}))

    def _read(self, partition, batch_size, pool, fetcher):
        for item in partition.inputs:
            table = manifest.read_rows(item.uri, self.spec.manifest_format, item.row_start,
                                       item.row_stop, self._string_columns())
            path_col = self._path_column(table.schema)
            for col in (path_col, self.spec.key_column):
                if col and col not in table.column_names:
                    raise PartitionError(f"{item.uri}: column {col!r} not found "
                                         f"(columns: {table.column_names})")
            base = posixpath.dirname(item.uri)
            stem = posixpath.splitext(posixpath.basename(item.uri))[0]
            row = item.row_start
            for chunk in table.to_batches(max_chunksize=batch_size):
                yield self._batch(chunk.to_pydict(), path_col, base, f"{stem}/", row, pool,
                                  fetcher)
                row += chunk.num_rows

    def _batch(self, cols: dict[str, list], path_col: str, base: str, key_prefix: str,
               first_row: int, pool: ThreadPoolExecutor, fetcher: Fetcher) -> Batch:
        uris = [_resolve_media(p, base) for p in cols[path_col]]
        executor = fetcher.downloads() if any(is_url(u) for u in uris) else pool
        fetched = list(executor.map(lambda u: fetcher.fetch(u, None) if u else (
            None, RowError(ErrorReason.READ_FAILED, f"empty {path_col!r} value")), uris))
        if self.spec.key_column:
            keys = [str(k) for k in cols[self.spec.key_column]]
        else:  # a file's stem; a URL's row number in its manifest (img2dataset numbering)
            keys = [f"{key_prefix}{first_row + j:09d}" if is_url(u)
                    else posixpath.splitext(posixpath.basename(u or ""))[0]
                    for j, u in enumerate(uris)]
        batch: Batch = {KEY: keys, SOURCE_URI: [u or "" for u in uris],
                        SOURCE_BYTES: [d for d, _ in fetched],
                        READ_ERROR: [e for _, e in fetched],
                        RAW_CAPTION: cols.get(self.spec.caption_column, [None] * len(uris))}
        skip = {path_col, self.spec.caption_column, self.spec.key_column}
        for name, values in cols.items():
            if name not in skip:
                batch[carried_name(name)] = values
        return batch


class WebDatasetDatasource(Datasource):
    """WebDataset ``.tar`` shards: the shard file ``uri`` or the shards under it; a
    partition is ``shards_per_partition`` whole shards. Per sample, the first member whose
    extension is a media extension is the media, ``txt`` the caption (else
    ``json[caption_column]``), the rest of ``json`` goes to ``metadata_json``. ``key`` is
    the sample's key in its shard (WebDataset's ``__key__``; unique across shards only if
    the shards' keys are, as img2dataset writes them); ``source_uri`` is
    ``<shard>#<key>.<ext>``. Bad samples and
    truncated shards become error rows (``pipeline.io.webdataset.read_shard``)."""

    writes = Datasource.writes + (METADATA_JSON,)

    @property
    def items_per_partition(self) -> int:
        """Whole shards per partition (``source.shards_per_partition``)."""
        return self.spec.shards_per_partition

    def rows_planned(self, partition: Partition) -> int | None:
        """None: a shard's samples are known only once it is read."""
        return None

    def list_inputs(self) -> Iterator[InputItem]:
        size = fs.file_size(self.spec.uri)
        if size is not None:
            yield InputItem(uri=fs.normalize(self.spec.uri), size_bytes=size)
            return
        found = 0
        for entry in fs.list_files(self.spec.uri):
            if entry.uri.lower().endswith(".tar"):
                found += 1
                yield InputItem(uri=entry.uri, size_bytes=entry.size_bytes)
        if not found:
            raise PlanError(f"source.uri {self.spec.uri!r}: no .tar shards found")

    def _read(self, partition, batch_size, pool, fetcher):
        rows: list[dict[str, Any]] = []
        for item in partition.inputs:
            for sample in webdataset.read_shard(item.uri, self.temp_dir):
                rows.append(self._row(sample))
                if len(rows) == batch_size:
                    yield _to_batch(rows)
                    rows = []
        if rows:
            yield _to_batch(rows)

    def _row(self, sample: webdataset.ShardSample) -> dict[str, Any]:
        exts = [e.lstrip(".") for e in self.spec.media_extensions]
        media = next((e for e in sample.members if e in exts), None)
        error = sample.error
        if error is None and media is None:
            error = RowError(ErrorReason.BAD_SAMPLE, f"key {sample.key!r} in shard "
                             f"{sample.shard_uri}: no media member (members: "
                             f"{sorted(sample.members)})")
        data = sample.members.get(media) if media else None
        if error is None and data is not None and len(data) > self.max_bytes:
            error, data = too_large(len(data), self.max_bytes), None
        caption, meta = sample.members.get("txt"), None
        if "json" in sample.members:
            try:
                found, meta = split_json_caption(sample.members["json"], self.spec.caption_column)
                if meta is not None and caption is None:  # an object; txt first, as sidecars
                    caption = found
            except ValueError as e:
                error = error or RowError(ErrorReason.BAD_SAMPLE, f"key {sample.key!r} in "
                                          f"shard {sample.shard_uri}: bad json member: {e}")
        uri = f"{sample.shard_uri}#{sample.key}" + (f".{media}" if media else "")
        return {KEY: sample.key, SOURCE_URI: uri, SOURCE_BYTES: None if error else data,
                RAW_CAPTION: caption, READ_ERROR: error, METADATA_JSON: meta}


def _to_batch(rows: list[dict[str, Any]]) -> Batch:
    return {k: [r[k] for r in rows] for k in rows[0]}


def split_json_caption(raw: bytes | str, caption_column: str) -> tuple[Any, str | None]:
    """A JSON sidecar or member -> ``(caption, metadata_json)``: an object gives its
    ``caption_column`` value and its other keys as sorted JSON; any other JSON value is the
    caption itself, with no metadata (None). Raises ``ValueError`` for invalid JSON."""
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        return obj, None
    caption = obj.pop(caption_column, None)
    return caption, json.dumps(obj, sort_keys=True, ensure_ascii=False)


def _group_items(group: dict) -> Iterator[InputItem]:
    caption = group["side"].get(".txt") or group["side"].get(".json")
    for entry in group["media"]:
        yield InputItem(uri=entry.uri, size_bytes=entry.size_bytes, caption_uri=caption)


def carried_name(name: str) -> str:
    """Output name of a carried manifest column: ``meta_<name>`` if ``name`` is reserved."""
    return f"meta_{name}" if name in RESERVED or name.startswith("_") else name


def _resolve_media(value: Any, base: str) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    if "://" in value or value.startswith("/"):
        return value
    return fs.join(base, value)


def _key_from_uri(uri: str, root: str) -> str:
    rel = uri[len(root):].lstrip("/") if uri.startswith(root) else posixpath.basename(uri)
    return posixpath.splitext(rel)[0]


def make_datasource(spec: SourceSpec, decode: DecodeSpec, download: DownloadSpec | None = None,
                    video: VideoSpec | None = None) -> Datasource:
    """Return the datasource for ``spec.kind``."""
    kinds = {"files": FilesDatasource, "manifest": ManifestDatasource,
             "webdataset": WebDatasetDatasource}
    return kinds[spec.kind](spec, decode, download, video)
