"""The WebDataset datasource: ``.tar``/``.tar.gz`` shards, a partition being whole shards,
samples grouped by key (the shard reader: ``pipeline.input.shards``).
"""

from __future__ import annotations
from collections.abc import Iterator
from typing import Any
from pipeline.columns import (KEY, METADATA_JSON, RAW_CAPTION, READ_ERROR, SOURCE_BYTES,
                              SOURCE_URI)
from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.input import shards as webdataset
from pipeline.input.fetch import too_large
from pipeline.keys import escape_key
from pipeline.records import ErrorReason, InputItem, Partition, RowError
from pipeline.input.base import Datasource, split_json_caption, to_batch


class WebDatasetDatasource(Datasource):
    """WebDataset ``.tar`` shards: the shard file ``uri`` or the shards under it; a
    partition is ``shards_per_partition`` whole shards. A member's extension is what
    follows the first ``.`` of its base name (WebDataset's rule: ``0003.left.png`` is key
    ``0003``, extension ``left.png``); a member is media when its extension's last part is
    a media extension (``jpg``, ``left.png``, ``seg.PNG``). ``txt`` is the caption (else
    ``json[caption_column]``), the rest of ``json`` goes to ``metadata_json``. A sample
    with one media member is one row keyed by the sample's key (WebDataset's ``__key__``;
    unique across shards only if the shards' keys are, as img2dataset writes them); one
    with several gives a row per media member, in member order, keyed
    ``<key>.<extension>`` (escaped: ``0003%2Eleft%2Epng``, as the files datasource keys
    two media files of one stem), each with the sample's caption and metadata.
    ``source_uri`` is ``<shard>#<key>.<ext>`` (the shard as ``pipeline.input.source_uri``
    writes a URI). Bad
    samples and truncated shards become error rows (``pipeline.input.shards.read_shard``);
    so does the rest of a shard past ``source.webdataset.max_members``/``max_bytes`` (one
    ``too_large`` row after the samples read before the cap)."""

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
        for entry in fs.list_files(self.spec.uri, self._skip_kind):
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
        caps = webdataset.ShardCaps(self.spec.webdataset.max_members,
                                    self.spec.webdataset.max_bytes)
        for item in partition.inputs:
            refused = self.roots.check(item.uri)
            samples = ([webdataset.ShardSample(webdataset.shard_error_key(item.uri), item.uri,
                                               {}, refused)] if refused is not None else
                       webdataset.read_shard(item.uri, self.temp_dir, self.max_bytes, caps))
            for sample in samples:
                for row in self._rows(sample):
                    rows.append(row)
                    if len(rows) == batch_size:
                        yield to_batch(rows)
                        rows = []
        if rows:
            yield to_batch(rows)

    def _rows(self, sample: webdataset.ShardSample) -> list[dict[str, Any]]:
        """The sample's rows: one per media member (one, keyed by the sample's key, when it
        has none or one), or one error row."""
        exts = {e.lstrip(".").lower() for e in self.spec.media_extensions}
        media = [e for e in sample.members if e.rsplit(".", 1)[-1] in exts]
        error = sample.error
        if error is None and not media:
            error = RowError(ErrorReason.BAD_SAMPLE, f"key {sample.key!r} in shard "
                             f"{sample.shard_uri}: no media member (members: "
                             f"{sorted(sample.members)}; media extensions: "
                             f"{sorted(exts)})")
        caption, meta = sample.members.get("txt"), None
        if "json" in sample.members:
            try:
                found, meta = split_json_caption(sample.members["json"], self.spec.caption_column)
                if meta is not None and caption is None:  # an object; txt first, as sidecars
                    caption = found
            except (ValueError, RecursionError) as e:
                error = error or RowError(ErrorReason.BAD_SAMPLE, f"key {sample.key!r} in "
                                          f"shard {sample.shard_uri}: bad json member: {e}")
        if error is not None or len(media) == 1:
            named = [(sample.key, media[0] if media else None)]
        else:
            named = [(f"{sample.key}.{ext}", ext) for ext in media]
        rows = []
        for key, ext in named:
            data = sample.members.get(ext) if ext and error is None else None
            row_error = error
            if row_error is None and data is not None and len(data) > self.max_bytes:
                row_error, data = too_large(len(data), self.max_bytes), None
            uri = f"{sample.shard_uri}#{sample.key}" + (f".{ext}" if ext else "")
            rows.append({KEY: escape_key(key), SOURCE_URI: uri, SOURCE_BYTES: data,
                         RAW_CAPTION: caption, READ_ERROR: row_error, METADATA_JSON: meta})
        return rows
