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

Confinement (``pipeline.io.confine``): every local or object-store read - media, sidecars,
manifest rows (against the roots plus the manifest's own directory), shards - is checked
against ``Datasource.roots``; a refused one is an ``outside_input_root`` (or
``not_a_file``) row without bytes. A ``.json`` sidecar/member over ``MAX_JSON_BYTES`` or
nested deeper than ``MAX_JSON_DEPTH`` is one error row.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import posixpath
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from pipeline.columns import (KEY, METADATA_JSON, RAW_CAPTION, READ_ERROR, RESERVED, SOURCE_BYTES,
                              SOURCE_PATH, SOURCE_URI, Batch)
from pipeline.errors import PartitionError, PlanError
from pipeline.io import fs, manifest, manifest_types, webdataset
from pipeline.io.confine import InputRoots, manifest_root, read_bounded
from pipeline.io.fetch import Fetcher, is_url, normalize_url, too_large
from pipeline.io.source_uri import SourceUris
from pipeline.io.stats import AttemptStats
from pipeline.keys import PartitionKeys, escape_key, given_key, row_key, stem_key
from pipeline.records import CaptionKeyMissing, ErrorReason, InputItem, Partition, RowError
from pipeline.spec import SIDECAR_EXTENSIONS, DecodeSpec, DownloadSpec, SourceSpec, VideoSpec
from pipeline.text import clean_text, decode_text

log = logging.getLogger(__name__)


class Datasource:
    """Base of the datasources.

    Subclasses implement ``list_inputs`` and ``_read`` (batches with ``_source_bytes``
    or, for video read in place, None), and may override ``extra_fields`` (carried
    columns). ``writes``: the declared columns its batches carry; ``settings()``: what
    changes its rows (hashed into the fingerprint).

    Accounting: ``list_inputs`` counts the objects under the input it does not read, by
    extension (``unread``), recorded in the plan through ``plan_metadata``; every planned
    record comes out of ``read_partition`` as exactly one row (a bad one as an error row),
    which ``pipeline.runtime.partition`` checks against ``rows_planned`` before commit.
    Keys: ``read_partition`` makes a partition's keys unique (``pipeline.keys``) and
    turns every ``source_uri`` into URI text (``pipeline.io.source_uri.SourceUris``: the
    one place; a datasource yields the URIs it read).
    """

    rows_known = True  # records known at planning (False: only once read)
    member_uris = False  # source_uri is <input uri>#<member> (WebDataset shards)

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
        self.unread: collections.Counter[str] = collections.Counter()
        self._roots: InputRoots | None = None

    @property
    def roots(self) -> InputRoots:
        """What this source may read (``pipeline.io.confine``): ``source.uri`` and
        ``source.allowed_roots`` (resolved on first use, on the reading worker)."""
        if self._roots is None:
            self._roots = InputRoots.of_source(self.spec.uri, self.spec.allowed_roots)
        return self._roots

    def settings(self) -> dict[str, Any]:
        """The source spec and ``decode.max_bytes`` (records over it are errors)."""
        return {"source": self.spec.model_dump(mode="json"), "max_bytes": self.max_bytes}

    def list_inputs(self) -> Iterator[InputItem]:
        """Yield every input item in a deterministic order. Raises ``PlanError``."""
        raise NotImplementedError

    def plan_metadata(self) -> dict[str, str]:
        """What planning learned, stored in the plan once ``list_inputs`` is exhausted and
        handed to every ``Partition.plan_metadata``: ``unread_by_extension`` (JSON object,
        extension -> objects under the input not read; ``""`` for no extension) and, for a
        local input, ``input_root`` (the absolute ``source.uri`` at planning, which a
        relative ``source_uri`` is computed from: ``pipeline.io.source_uri``)."""
        meta = {"unread_by_extension": json.dumps(dict(sorted(self.unread.items())))}
        if fs.is_local(self.spec.uri):
            meta["input_root"] = fs.normalize(self.spec.uri)
        return meta

    def _skip(self, uri: str) -> None:
        self.unread[fs.display_uri(posixpath.splitext(uri)[1].lower())] += 1

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
        fetcher = Fetcher(self.max_bytes, self.download, self.temp_dir, self.video, self.roots)
        keys = PartitionKeys()
        uris = SourceUris(self.spec.uri, partition.plan_metadata.get("input_root"),
                          [i.uri for i in partition.inputs] if self.member_uris else ())
        try:
            for batch in self._read(partition, batch_size, pool, fetcher):
                batch[KEY] = [keys.unique(k) for k in batch[KEY]]
                if not self.video:
                    batch[SOURCE_URI] = [uris(u) for u in batch[SOURCE_URI]]
                    yield batch
                    continue
                with contextlib.ExitStack() as stack:
                    self._stage(batch, fetcher, pool, stack)
                    batch[SOURCE_URI] = [uris(u) for u in batch[SOURCE_URI]]
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
        root = fs.normalize(self.spec.uri)
        self.unread.clear()
        pending: dict[str, dict] = {}
        found = 0
        last = ""
        for entry in fs.list_files(self.spec.uri):
            if entry.uri < last:
                raise PlanError(f"source.uri {self.spec.uri!r}: listing is not in key order")
            last = entry.uri
            for stem in [s for s in pending if not entry.uri.startswith(s + ".")]:
                for item in self._group_items(pending.pop(stem), root):
                    found += 1
                    yield item
            stem, ext = posixpath.splitext(entry.uri)
            group = pending.setdefault(stem, {"media": [], "side": {}})
            if ext.lower() in SIDECAR_EXTENSIONS:
                group["side"][ext.lower()] = entry.uri
            elif ext.lower() in exts:
                group["media"].append(entry)
            else:
                self._skip(entry.uri)
        for group in pending.values():
            for item in self._group_items(group, root):
                found += 1
                yield item
        if not found:
            raise PlanError(f"source.uri {self.spec.uri!r}: no files with extensions {list(exts)}"
                            f" (not read, by extension: {dict(self.unread)})")

    def _group_items(self, group: dict, root: str) -> Iterator[InputItem]:
        """The media of one stem with their sidecar; keys keep the extension when several
        media share the stem (``pipeline.keys``). A sidecar without media is unread."""
        caption = group["side"].get(".txt") or group["side"].get(".json")
        if not group["media"]:
            for uri in group["side"].values():
                self._skip(uri)
        elif caption and ".txt" in group["side"] and ".json" in group["side"]:
            self._skip(group["side"][".json"])  # the .txt is the caption
        shared = len(group["media"]) > 1
        for entry in group["media"]:
            yield InputItem(uri=entry.uri, size_bytes=entry.size_bytes, caption_uri=caption,
                            key=stem_key(_relative(entry.uri, root), keep_extension=shared))

    def _read(self, partition, batch_size, pool, fetcher):
        root = fs.normalize(self.spec.uri)
        for start in range(0, len(partition.inputs), batch_size):
            items = partition.inputs[start:start + batch_size]
            rows = list(pool.map(lambda item: self._read_item(item, fetcher), items))
            batch: Batch = {k: [r[k] for r in rows] for k in rows[0]}
            batch[KEY] = [i.key or stem_key(_relative(i.uri, root)) for i in items]
            yield batch

    def _read_item(self, item: InputItem, fetcher: Fetcher) -> dict[str, Any]:
        data, error = fetcher.fetch(item.uri, item.size_bytes)
        caption, meta = None, None
        if item.caption_uri:
            raw, refused = read_bounded(item.caption_uri, self.max_bytes, self.roots)
            try:
                if refused is not None:
                    error = error or refused
                elif item.caption_uri.endswith(".json"):
                    caption, meta = split_json_caption(raw, self.spec.caption_column)
                else:
                    caption = raw
            except Exception as e:  # noqa: BLE001 - a bad sidecar is this record's error
                error = error or RowError(ErrorReason.READ_FAILED, f"{item.caption_uri}: {e}")
        if error is not None:
            data = None  # a refused row keeps no bytes
        return {SOURCE_URI: item.uri, SOURCE_BYTES: data, RAW_CAPTION: caption,
                READ_ERROR: error, METADATA_JSON: meta}


class ManifestDatasource(Datasource):
    """Rows of Parquet/CSV/JSONL manifests naming media by path or URL.

    Planning profiles every manifest in one streaming pass (``manifest.profile``: its rows,
    counted by the reader that reads them, and its carried columns typed from all rows);
    the carried columns of all files are united (``manifest.union_columns``: a conflict
    becomes text, with a warning in the plan and the report) and stored in the plan. A
    manifest that cannot be read at all is planned as one record, read as one error row
    naming it. A row that cannot be parsed is one error row; every planned row is one
    output row.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._profiles: list[dict[str, pa.DataType]] = []

    def _used(self) -> tuple[str, ...]:
        """The columns mmpipe interprets (not carried): path/url, caption, key."""
        return tuple(dict.fromkeys(c for c in ("url", "path", self.spec.path_column,
                                               self.spec.caption_column, self.spec.key_column)
                                   if c))

    def list_inputs(self) -> Iterator[InputItem]:
        files = manifest.list_manifests(self.spec.uri, self.spec.manifest_format)
        if not files:
            raise PlanError(f"source.uri {self.spec.uri!r}: no manifest files found")
        self._profiles = []
        step = self.spec.partition_size
        for uri, size in files:
            try:
                found = manifest.profile(uri, self.spec.manifest_format, self._used(),
                                         every=step)
                if found.rows:
                    self._path_column(found.names, uri)
            except (PlanError, PartitionError) as e:
                # A corrupt manifest (T11, T12) must not stop the job, nor vanish: it is one
                # record, read as one error row naming the file.
                log.warning("%s; planned as one error row", e)
                yield InputItem(uri=uri, size_bytes=size, row_start=0, row_stop=1,
                                error=str(e))
                continue
            self._profiles.append(found.columns)
            # Row ranges are cut at partition_size (the planner packs them into partitions),
            # each with where it starts in the file, so its read seeks there.
            offsets = {o.row: o for o in found.offsets}
            for start in range(0, found.rows, step):
                at = offsets.get(start)
                yield InputItem(uri=uri, size_bytes=size, row_start=start,
                                row_stop=min(found.rows, start + step),
                                byte_start=at.byte if at else -1,
                                line_start=at.line if at else -1)

    def plan_metadata(self) -> dict[str, str]:
        """Also ``carried_columns`` (``manifest.columns_to_text`` of the united carried
        columns) and ``warnings`` (JSON list: type conflicts turned to text)."""
        columns, warnings = manifest_types.union_columns(self._profiles)
        for w in warnings:
            log.warning("%s", w)
        return dict(super().plan_metadata(), carried_columns=manifest_types.columns_to_text(columns),
                    warnings=json.dumps(warnings))

    def _carried(self, partition: Partition) -> dict[str, pa.DataType]:
        """The job's carried columns: from the plan, else from this instance's listing,
        else from profiling the partition's own files."""
        text = partition.plan_metadata.get("carried_columns")
        if text is not None:
            return manifest_types.columns_from_text(text)
        if not self._profiles:
            self._profiles = [manifest.profile(u, self.spec.manifest_format, self._used()).columns
                              for u in dict.fromkeys(i.uri for i in partition.inputs
                                                     if i.error is None)]
        return manifest_types.union_columns(self._profiles)[0]

    def extra_fields(self, partition: Partition) -> list[pa.Field]:
        return [pa.field(carried_name(n), t) for n, t in self._carried(partition).items()]

    def _path_column(self, names: Iterable[str], uri: str) -> str:
        names = list(names)
        if self.spec.path_column:
            if self.spec.path_column not in names:
                raise PartitionError(f"manifest {fs.display_uri(uri)}: column "
                                     f"{self.spec.path_column!r} not found (columns: {names})")
            return self.spec.path_column
        for name in ("url", "path"):
            if name in names:
                return name
        raise PartitionError(f"manifest {fs.display_uri(uri)} has neither a 'url' nor a 'path' "
                             f"column (columns: {names}); set source.path_column")

    def settings(self) -> dict[str, Any]:
        """Also the download settings that change which rows fail (not threads or
        max_per_host: how fast, not what)."""
        return dict(super().settings(), download=self.download.model_dump(
            mode="json", exclude={"threads", "max_per_host"}))

    def _read(self, partition, batch_size, pool, fetcher):
        carried = self._carried(partition)
        root = fs.normalize(self.spec.uri)
        for item in partition.inputs:
            stem = posixpath.splitext(_relative(item.uri, root))[0]
            if item.error is not None:
                yield self._unreadable(item, stem, carried)
                continue
            base = posixpath.dirname(item.uri)
            roots = self.roots.with_root(manifest_root(item.uri))
            read = 0
            seek = (manifest.RowOffset(item.row_start, item.byte_start, item.line_start)
                    if item.byte_start >= 0 else None)
            for rows in manifest.read_rows(item.uri, self.spec.manifest_format, item.row_start,
                                           item.row_stop, self._used(), carried, batch_size,
                                           seek):
                path_col = self._path_column(rows.names or self._used(), item.uri)
                read += rows.num_rows
                yield self._batch(rows, item.uri, path_col, base, stem, carried, fetcher, pool,
                                  roots)
            if read != item.row_stop - item.row_start:
                raise PartitionError(
                    f"manifest {fs.display_uri(item.uri)}: rows [{item.row_start}, "
                    f"{item.row_stop}) were planned, {read} read: the file changed since "
                    f"planning (use --mode overwrite to plan again)")

    def _unreadable(self, item: InputItem, stem: str, carried: dict) -> Batch:
        """The one error row of a manifest that could not be read at planning."""
        batch: Batch = {KEY: [escape_key(stem) + "#manifest"], SOURCE_URI: [item.uri],
                        SOURCE_BYTES: [None], RAW_CAPTION: [None],
                        READ_ERROR: [RowError(ErrorReason.READ_FAILED, item.error)]}
        for name in carried:
            batch[carried_name(name)] = [None]
        return batch

    def _batch(self, rows: manifest.ManifestRows, uri: str, path_col: str, base: str,
               stem: str, carried: dict, fetcher: Fetcher, pool: ThreadPoolExecutor,
               roots: InputRoots) -> Batch:
        n = rows.num_rows
        where = f"manifest {fs.display_uri(uri)}"
        uris = [_resolve_media(_as_text(p), base) for p in rows.values[path_col]]
        errors: list[RowError | None] = [
            RowError(ErrorReason.READ_FAILED, f"{where}: {e}") if e is not None
            else None if u else RowError(ErrorReason.READ_FAILED,
                                         f"{where} row {rows.first_row + j}: no {path_col!r} value")
            for j, (u, e) in enumerate(zip(uris, rows.errors))]
        todo = [j for j in range(n) if errors[j] is None]
        executor = fetcher.downloads() if any(is_url(uris[j]) for j in todo) else pool
        fetched = dict(zip(todo, executor.map(lambda j: fetcher.fetch(uris[j], None, roots),
                                              todo)))
        given = (rows.values[self.spec.key_column] if self.spec.key_column else [None] * n)
        batch: Batch = {
            KEY: [given_key(_as_text(k)) or row_key(stem, rows.first_row + j)
                  for j, k in enumerate(given)],
            SOURCE_URI: [u or uri for u in uris],
            SOURCE_BYTES: [fetched[j][0] if j in fetched else None for j in range(n)],
            READ_ERROR: [fetched[j][1] if j in fetched else errors[j] for j in range(n)],
            RAW_CAPTION: rows.values.get(self.spec.caption_column, [None] * n)}
        for name in carried:
            batch[carried_name(name)] = rows.values.get(name, [None] * n)
        return batch


class WebDatasetDatasource(Datasource):
    """WebDataset ``.tar`` shards: the shard file ``uri`` or the shards under it; a
    partition is ``shards_per_partition`` whole shards. Per sample, the first member whose
    extension is a media extension is the media, ``txt`` the caption (else
    ``json[caption_column]``), the rest of ``json`` goes to ``metadata_json``. ``key`` is
    the sample's key in its shard (WebDataset's ``__key__``; unique across shards only if
    the shards' keys are, as img2dataset writes them); ``source_uri`` is
    ``<shard>#<key>.<ext>`` (the shard as ``pipeline.io.source_uri`` writes a URI). Bad
    samples and truncated shards become error rows (``pipeline.io.webdataset.read_shard``)."""

    writes = Datasource.writes + (METADATA_JSON,)
    member_uris = True

    @property
    def items_per_partition(self) -> int:
        """Whole shards per partition (``source.shards_per_partition``)."""
        return self.spec.shards_per_partition

    rows_known = False

    def rows_planned(self, partition: Partition) -> int | None:
        """None: a shard's samples are known only once it is read."""
        return None

    def list_inputs(self) -> Iterator[InputItem]:
        """The shard ``source.uri``, or every ``.tar``/``.tar.gz``/``.tgz`` under it (others
        are counted as unread)."""
        self.unread.clear()
        size = fs.file_size(self.spec.uri)
        if size is not None:
            yield InputItem(uri=fs.normalize(self.spec.uri), size_bytes=size)
            return
        found = 0
        for entry in fs.list_files(self.spec.uri):
            if webdataset.is_shard_name(entry.uri):
                found += 1
                yield InputItem(uri=entry.uri, size_bytes=entry.size_bytes)
            else:
                self._skip(entry.uri)
        if not found:
            raise PlanError(f"source.uri {self.spec.uri!r}: no .tar, .tar.gz or .tgz shards "
                            f"found (not read, by extension: {dict(self.unread)})")

    def _read(self, partition, batch_size, pool, fetcher):
        rows: list[dict[str, Any]] = []
        for item in partition.inputs:
            refused = self.roots.check(item.uri)
            samples = ([webdataset.ShardSample(webdataset.shard_error_key(item.uri), item.uri,
                                               {}, refused)] if refused is not None else
                       webdataset.read_shard(item.uri, self.temp_dir, self.max_bytes))
            for sample in samples:
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
            except (ValueError, RecursionError) as e:
                error = error or RowError(ErrorReason.BAD_SAMPLE, f"key {sample.key!r} in "
                                          f"shard {sample.shard_uri}: bad json member: {e}")
        uri = f"{sample.shard_uri}#{sample.key}" + (f".{media}" if media else "")
        return {KEY: escape_key(sample.key), SOURCE_URI: uri, SOURCE_BYTES: None if error else data,
                RAW_CAPTION: caption, READ_ERROR: error, METADATA_JSON: meta}


def _to_batch(rows: list[dict[str, Any]]) -> Batch:
    return {k: [r[k] for r in rows] for k in rows[0]}


def split_json_caption(raw: bytes | str, caption_column: str) -> tuple[Any, str | None]:
    """A JSON sidecar or member -> ``(caption, metadata_json)``: an object gives its
    ``caption_column`` value and its other keys as sorted JSON (an object without that key
    gives ``records.CaptionKeyMissing`` as the caption, and all its keys as metadata); any
    other JSON value is the caption itself, with no metadata (None). Bytes are decoded by
    ``pipeline.text.decode_text`` (BOMs, UTF-16, the 8-bit fallback) first; the metadata
    text is cleaned (lone surrogates from ``\\ud83c`` escapes -> U+FFFD); the caption is
    left for the caption step to clean and flag. Raises ``ValueError`` for invalid JSON,
    JSON over ``MAX_JSON_BYTES`` bytes (characters for ``str``) or nested deeper than
    ``MAX_JSON_DEPTH`` arrays/objects (checked before parsing: ``json_depth``)."""
    if len(raw) > MAX_JSON_BYTES:
        raise ValueError(f"{len(raw)} bytes > the JSON limit of {MAX_JSON_BYTES} bytes")
    text = decode_text(bytes(raw))[0] if isinstance(raw, (bytes, bytearray)) else raw
    depth = json_depth(text, MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} arrays/objects")
    obj = json.loads(text)
    if not isinstance(obj, dict):
        return obj, None
    caption = (obj.pop(caption_column) if caption_column in obj
               else CaptionKeyMissing(caption_column))
    return caption, clean_text(json.dumps(obj, sort_keys=True, ensure_ascii=False))[0]


#: Largest ``.json`` sidecar or member parsed (bytes), and deepest nesting accepted.
MAX_JSON_BYTES = 4 * 2**20
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKETS = re.compile(r"[\[\]{}]")


def json_depth(text: str, stop: int) -> int:
    """The deepest nesting of arrays/objects in JSON ``text`` (strings skipped; counting
    stops past ``stop``). Linear in ``len(text)``, no recursion, so a deeply nested
    document is measured without ``json``'s recursion."""
    depth = deepest = 0
    for m in _JSON_BRACKETS.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > stop:
                break
    return deepest


def carried_name(name: str) -> str:
    """Output name of a carried manifest column: ``meta_<name>`` if ``name`` is reserved."""
    return f"meta_{name}" if name in RESERVED or name.startswith("_") else name


def _as_text(value: Any) -> Any:
    """A path or key cell the manifest reader gave as bytes (not valid UTF-8) as text
    (``pipeline.text.decode_text``); other values as they are."""
    return decode_text(bytes(value))[0] if isinstance(value, (bytes, bytearray)) else value


def _resolve_media(value: Any, base: str) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    url = normalize_url(value)  # http/https/data in any case; //host/p -> https://host/p
    if url is not None:
        return url
    if "://" in value or value.startswith("/"):
        return value
    return fs.join(base, value)


def _relative(uri: str, root: str) -> str:
    """``uri`` relative to the input root ``root`` (its base name if outside it, or if it
    is the root itself: ``source.uri`` names one file)."""
    if uri.startswith(root.rstrip("/") + "/"):
        return uri[len(root.rstrip("/")) + 1:]
    return posixpath.basename(uri)


def make_datasource(spec: SourceSpec, decode: DecodeSpec, download: DownloadSpec | None = None,
                    video: VideoSpec | None = None) -> Datasource:
    """Return the datasource for ``spec.kind``."""
    kinds = {"files": FilesDatasource, "manifest": ManifestDatasource,
             "webdataset": WebDatasetDatasource}
    return kinds[spec.kind](spec, decode, download, video)
