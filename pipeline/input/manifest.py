"""The manifest datasource: Parquet/CSV/JSONL rows that name the media by ``url`` (http(s)
URLs are downloaded) or ``path``; other columns are carried to the output (renamed
``meta_<name>`` when a declared column has their name: ``base.carried_name``). Reading the
formats is ``manifest_rows``; their types ``manifest_types``.
"""

from __future__ import annotations
import json
import posixpath
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
import pyarrow as pa
from pipeline.columns import (KEY, RAW_CAPTION, READ_ERROR, SOURCE_BYTES,
                              SOURCE_URI, Batch)
from pipeline.errors import PartitionError, PlanError
from pipeline.storage import fs
from pipeline.input import manifest_rows as manifest, manifest_types
from pipeline.input.confine import InputRoots, manifest_root
from pipeline.input.fetch import Fetcher, is_url, too_large
from pipeline.keys import escape_key, given_key, row_key
from pipeline.records import ErrorReason, InputItem, Partition, RowError
from pipeline.input.base import Datasource, as_text, carried_name, log, relative_to_root, resolve_media


class ManifestDatasource(Datasource):
    """Rows of Parquet/CSV/JSONL manifests naming media by path or URL.

    Planning profiles every manifest in one streaming pass (``manifest.profile``: its rows,
    counted by the reader that reads them, and its carried columns typed from all rows);
    the carried columns of all files are united (``manifest.union_columns``: a conflict
    becomes text, with a warning in the plan and the report) and stored in the plan. A
    manifest that cannot be read at all is planned as one record, read as one error row
    naming it. A row that cannot be parsed is one error row; every planned row is one
    output row. A path column that is a Hugging Face ``Image()`` struct
    (``struct<bytes: binary, path: string>``) gives its embedded bytes (over
    ``decode.max_bytes``: ``too_large``), else its path.
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
        hint = " (e.g. 'image')" if "image" in names else ""
        raise PartitionError(f"manifest {fs.display_uri(uri)} has neither a 'url' nor a 'path' "
                             f"column (columns: {names}); set source.path_column{hint}")

    def settings(self) -> dict[str, Any]:
        """Also the download settings that change which rows fail (not threads or
        max_per_host: how fast, not what)."""
        return dict(super().settings(), download=self.download.model_dump(
            mode="json", exclude={"threads", "max_per_host"}))

    def _read(self, partition, batch_size, pool, fetcher):
        carried = self._carried(partition)
        root = fs.normalize(self.spec.uri)
        for item in partition.inputs:
            stem = posixpath.splitext(relative_to_root(item.uri, root))[0]
            if item.error is not None:
                yield self._unreadable(item, stem, carried)
                continue
            if fs.file_size(item.uri) is None:     # planned, deleted since
                yield from self._gone(item, stem, carried, batch_size)
                continue
            base = posixpath.dirname(item.uri)
            # the manifest's folder is a root only for the manifest source.uri names
            # (never a bucket root or /): pipeline.input.confine
            folder = manifest_root(item.uri, self.spec.uri)
            roots = self.roots.with_root(folder) if folder else self.roots
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

    def _gone(self, item: InputItem, stem: str, carried: dict, batch_size: int) -> Iterator[Batch]:
        """The planned rows of a manifest file deleted since planning: one
        ``input_missing`` error row each (keys ``<stem>/<row>``: the key column cannot
        be read)."""
        error = RowError(ErrorReason.INPUT_MISSING, f"manifest {fs.display_uri(item.uri)}: "
                         "not found (planned, deleted since)")
        for start in range(item.row_start, item.row_stop, batch_size):
            n = min(batch_size, item.row_stop - start)
            batch: Batch = {KEY: [row_key(stem, start + j) for j in range(n)],
                            SOURCE_URI: [item.uri] * n, SOURCE_BYTES: [None] * n,
                            RAW_CAPTION: [None] * n, READ_ERROR: [error] * n}
            for name in carried:
                batch[carried_name(name)] = [None] * n
            yield batch

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
        cells = rows.values[path_col]
        # A Hugging Face ``Image()`` cell (struct<bytes, path>): embedded bytes are the
        # media, else its path is (https://huggingface.co/docs/datasets/image_load).
        embedded = {j: bytes(c["bytes"]) for j, c in enumerate(cells)
                    if isinstance(c, dict) and isinstance(c.get("bytes"), (bytes, bytearray))}
        cells = [c.get("path") if isinstance(c, dict) else c for c in cells]
        uris = [resolve_media(as_text(p), base) for p in cells]
        errors: list[RowError | None] = [
            RowError(ErrorReason.READ_FAILED, f"{where}: {e}") if e is not None
            else None if u or j in embedded else RowError(
                ErrorReason.READ_FAILED, f"{where} row {rows.first_row + j}: no {path_col!r} value")
            for j, (u, e) in enumerate(zip(uris, rows.errors))]
        fetched: dict[int, tuple[bytes | None, RowError | None]] = {
            j: (None, too_large(len(data), self.max_bytes)) if len(data) > self.max_bytes
            else (data, None) for j, data in embedded.items() if errors[j] is None}
        todo = [j for j in range(n) if errors[j] is None and j not in fetched]
        executor = fetcher.downloads() if any(is_url(uris[j]) for j in todo) else pool
        fetched.update(zip(todo, executor.map(lambda j: fetcher.fetch(uris[j], None, roots),
                                              todo)))
        given = (rows.values[self.spec.key_column] if self.spec.key_column else [None] * n)
        batch: Batch = {
            KEY: [given_key(as_text(k)) or row_key(stem, rows.first_row + j)
                  for j, k in enumerate(given)],
            SOURCE_URI: [u or uri for u in uris],
            SOURCE_BYTES: [fetched[j][0] if j in fetched else None for j in range(n)],
            READ_ERROR: [fetched[j][1] if j in fetched else errors[j] for j in range(n)],
            RAW_CAPTION: rows.values.get(self.spec.caption_column, [None] * n)}
        for name in carried:
            batch[carried_name(name)] = rows.values.get(name, [None] * n)
        return batch
