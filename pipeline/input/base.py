"""The ``Datasource`` base: list the input for planning, and read one partition as batches.

``FilesDatasource``: media files under a prefix, each with an optional sidecar caption of
the same stem (``.txt``: the caption; ``.json``: an object whose ``caption_column`` key is
the caption and whose other keys go to ``metadata_json``) - the WebDataset/img2dataset
convention. ``ManifestDatasource``: Parquet/CSV/JSONL rows that name the media by ``url``
(http(s) URLs are downloaded) or ``path``; other columns are carried to the output.
``WebDatasetDatasource``: ``.tar`` shards, a partition being whole shards, samples grouped
by key (``pipeline.input.shards``).

Three pieces, as Ray Data splits them: ``list_inputs`` enumerates the input (the planner,
``pipeline.output.plan``, cuts it into partitions); ``read_partition`` reads one partition;
a ``Fetcher`` (``pipeline.input.fetch``), one per partition read and closed when it ends,
gets the bytes (local, object store, HTTP) and stages local files.

``read_partition`` yields batches with the columns ``key``, ``source_uri``,
``_source_bytes`` (bytes or None), ``_raw_caption`` (any JSON value or bytes),
``_read_error`` (a ``RowError``, else None) and the datasource's own columns
(``metadata_json``, or a manifest's carried columns). For ``source.media: video`` the
media are not read into memory: each batch also has ``_source_path``, a local file per row
(a local input as is; an object-store object or downloaded/tar-member bytes in a
temporary file that is deleted when the next batch is requested, so disk use is one batch
of videos).

Confinement (``pipeline.input.confine``): every local or object-store read - media, sidecars,
manifest rows (against the roots, plus the directory of a manifest that ``source.uri``
names itself), shards - is checked against ``Datasource.roots``; a refused one (outside
the roots, or hidden below them: ``source.allow_hidden``) is an ``outside_input_root`` (or
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from pipeline.columns import (reserved, KEY, RAW_CAPTION, READ_ERROR, SOURCE_BYTES,
                              SOURCE_PATH, SOURCE_URI, Batch)
from pipeline.storage import fs
from pipeline.input.confine import InputRoots
from pipeline.input.fetch import Fetcher, normalize_url
from pipeline.input.source_uri import SourceUris
from pipeline.stats import AttemptStats
from pipeline.keys import PartitionKeys
from pipeline.records import CaptionKeyMissing, InputItem, Partition, RowError
from pipeline.spec import DecodeSpec, DownloadSpec, SourceSpec, VideoSpec
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
    turns every ``source_uri`` into URI text (``pipeline.input.source_uri.SourceUris``: the
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
        """What this source may read (``pipeline.input.confine``): ``source.uri`` and
        ``source.allowed_roots`` (resolved on first use, on the reading worker)."""
        if self._roots is None:
            self._roots = InputRoots.of_source(self.spec.uri, self.spec.allowed_roots,
                                               self.spec.allow_hidden)
        return self._roots

    def settings(self) -> dict[str, Any]:
        """The source spec and ``decode.max_bytes`` (records over it are errors). A
        plugin's ``uses``/``with`` are left out: the assembler fingerprints the plugin
        (class, package version, settings), and built-in kinds keep their fingerprint."""
        return {"source": self.spec.model_dump(mode="json", exclude={"uses", "with_"}),
                "max_bytes": self.max_bytes}

    def list_inputs(self) -> Iterator[InputItem]:
        """Yield every input item in a deterministic order. Raises ``PlanError``."""
        raise NotImplementedError

    def plan_metadata(self) -> dict[str, str]:
        """What planning learned, stored in the plan once ``list_inputs`` is exhausted and
        handed to every ``Partition.plan_metadata``: ``unread_by_extension`` (JSON object,
        extension -> objects under the input not read; ``""`` for no extension;
        ``"<ext> (unpaired sidecar)"`` for a sidecar without its media; ``"(fifo)"``,
        ``"(socket)"``, ``"(character device)"``, ``"(block device)"``, ``"(dangling link)"``
        for local entries that are not regular files) and, for a
        local input, ``input_root`` (the absolute ``source.uri`` at planning, which a
        relative ``source_uri`` is computed from: ``pipeline.input.source_uri``)."""
        meta = {"unread_by_extension": json.dumps(dict(sorted(self.unread.items())))}
        if fs.is_local(self.spec.uri):
            meta["input_root"] = fs.normalize(self.spec.uri)
        return meta

    def _skip(self, uri: str, why: str | None = None) -> None:
        """Count ``uri`` as not read: by its extension, or ``"<ext> (<why>)"`` when it was
        not read for another reason than its extension (an unpaired sidecar)."""
        ext = fs.display_uri(posixpath.splitext(uri)[1].lower())
        self.unread[f"{ext} ({why})" if why else ext] += 1

    def _skip_kind(self, uri: str, kind: str) -> None:
        """Count a listed entry that is not a regular file (``fs.list_files``'s
        ``skipped``: a FIFO, socket, device, dangling link) as ``"(<kind>)"``."""
        self.unread[f"({kind})"] += 1

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


def to_batch(rows: list[dict[str, Any]]) -> Batch:
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
    return f"meta_{name}" if name in reserved() or name.startswith("_") else name


def as_text(value: Any) -> Any:
    """A path or key cell the manifest reader gave as bytes (not valid UTF-8) as text
    (``pipeline.text.decode_text``); other values as they are."""
    return decode_text(bytes(value))[0] if isinstance(value, (bytes, bytearray)) else value


def resolve_media(value: Any, base: str) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    url = normalize_url(value)  # http/https/data in any case; //host/p -> https://host/p
    if url is not None:
        return url
    if "://" in value or value.startswith("/"):
        return value
    return fs.join(base, value)


def relative_to_root(uri: str, root: str) -> str:
    """``uri`` relative to the input root ``root`` (its base name if outside it, or if it
    is the root itself: ``source.uri`` names one file)."""
    if uri.startswith(root.rstrip("/") + "/"):
        return uri[len(root.rstrip("/")) + 1:]
    return posixpath.basename(uri)


