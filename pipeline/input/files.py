"""The files datasource: media files under a prefix, each with an optional sidecar
caption of the same stem (``.txt``: the caption; ``.json``: an object whose
``caption_column`` key is the caption and whose other keys go to ``metadata_json``), the
WebDataset/img2dataset convention.
"""

from __future__ import annotations
import heapq
import posixpath
import unicodedata
from collections.abc import Iterator
from typing import Any
from pipeline.columns import (KEY, METADATA_JSON, RAW_CAPTION, READ_ERROR, SOURCE_BYTES,
                              SOURCE_URI, Batch)
from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.input.confine import read_bounded
from pipeline.input.fetch import Fetcher
from pipeline.keys import stem_key
from pipeline.records import ErrorReason, InputItem, RowError
from pipeline.spec import SIDECAR_EXTENSIONS
from pipeline.input.base import Datasource, relative_to_root, split_json_caption


class FilesDatasource(Datasource):
    """Media files under ``spec.uri`` with sidecar captions of the same stem."""

    writes = Datasource.writes + (METADATA_JSON,)

    def list_inputs(self) -> Iterator[InputItem]:
        """Stream the sorted listing, pairing each media file with its sidecar.

        All keys of one stem ``s`` start with ``s.`` and so are contiguous in a sorted
        listing: a stem is complete (and emitted) once a key outside ``s.`` arrives, so
        only a handful of stems are ever pending, whatever the listing's size.

        Stems are paired after Unicode normalisation (NFC, UAX #15): macOS writes names
        decomposed (NFD), most other tools composed (NFC), so ``café.png`` (NFD) pairs with
        ``café.txt`` (NFC). A name that is not NFC sorts elsewhere than its NFC form, so
        its group waits (``odd``, a heap by NFC stem) until the listing has passed the NFC
        stem ``s.``; it is merged into that stem's group if there is one. Non-regular
        local entries (FIFOs, sockets, devices, dangling links) are counted as not read
        by kind (``Datasource._skip_kind``).
        """
        exts = self.spec.media_extensions
        root = fs.normalize(self.spec.uri)
        self.unread.clear()
        pending: dict[str, dict] = {}
        odd: dict[str, dict] = {}           # NFC stem -> the group of its non-NFC names
        waiting: list[str] = []             # heap of the NFC stems in ``odd``
        found = 0
        last = ""

        def emit(stem: str, group: dict | None) -> Iterator[InputItem]:
            other = odd.pop(stem, None)
            if other is not None:
                group = other if group is None else {
                    "media": group["media"] + other["media"],
                    "side": {**other["side"], **group["side"]}}
            if group is not None:
                yield from self._group_items(group, root)

        for entry in fs.list_files(self.spec.uri, self._skip_kind):
            if entry.uri < last:
                raise PlanError(f"source.uri {self.spec.uri!r}: listing is not in key order")
            last = entry.uri
            for stem in [s for s in pending if not entry.uri.startswith(s + ".")]:
                for item in emit(stem, pending.pop(stem)):
                    found += 1
                    yield item
            while waiting and entry.uri > waiting[0] + "." and \
                    not entry.uri.startswith(waiting[0] + ".") and waiting[0] not in pending:
                for item in emit(heapq.heappop(waiting), None):
                    found += 1
                    yield item
            stem, ext = posixpath.splitext(entry.uri)
            if unicodedata.is_normalized("NFC", stem):
                group = pending.setdefault(stem, {"media": [], "side": {}})
            else:
                stem = unicodedata.normalize("NFC", stem)
                if stem not in odd:
                    heapq.heappush(waiting, stem)
                group = odd.setdefault(stem, {"media": [], "side": {}})
            if ext.lower() in SIDECAR_EXTENSIONS:
                group["side"][ext.lower()] = entry.uri
            elif ext.lower() in exts:
                group["media"].append(entry)
            else:
                self._skip(entry.uri)
        for stem in sorted({*pending, *odd}):
            for item in emit(stem, pending.pop(stem, None)):
                found += 1
                yield item
        if not found:
            raise PlanError(f"source.uri {self.spec.uri!r}: no files with extensions {list(exts)}"
                            f" (not read, by extension: {dict(self.unread)})")

    def _group_items(self, group: dict, root: str) -> Iterator[InputItem]:
        """The media of one stem with their sidecar; keys keep the extension when several
        media share the stem (``pipeline.keys``). A sidecar without media is unread, as
        ``"<ext> (unpaired sidecar)"``."""
        caption = group["side"].get(".txt") or group["side"].get(".json")
        if not group["media"]:
            for uri in group["side"].values():
                self._skip(uri, "unpaired sidecar")
        elif caption and ".txt" in group["side"] and ".json" in group["side"]:
            self._skip(group["side"][".json"])  # the .txt is the caption
        shared = len(group["media"]) > 1
        for entry in group["media"]:
            yield InputItem(uri=entry.uri, size_bytes=entry.size_bytes, caption_uri=caption,
                            key=stem_key(relative_to_root(entry.uri, root), keep_extension=shared))

    def _read(self, partition, batch_size, pool, fetcher):
        root = fs.normalize(self.spec.uri)
        for start in range(0, len(partition.inputs), batch_size):
            items = partition.inputs[start:start + batch_size]
            rows = list(pool.map(lambda item: self._read_item(item, fetcher), items))
            batch: Batch = {k: [r[k] for r in rows] for k in rows[0]}
            batch[KEY] = [i.key or stem_key(relative_to_root(i.uri, root)) for i in items]
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
