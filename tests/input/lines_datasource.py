"""A datasource added the documented way (DESIGN.md, "Extending the pipeline", "Add a
datasource"): this one module, a ``Datasource`` subclass, named in the spec as
``source: {kind: plugin, uses: tests.input.lines_datasource:LinesDatasource}``
(``pipeline.plugins``; a built-in one would be an entry in ``input.DATASOURCES``).

``source.uri`` is a UTF-8 text file with one media path per line (absolute, or relative
to the file's folder; blank lines and ``#`` comments skipped); each line is one record,
keyed by the path's stem. Reads go through the ``Fetcher``, so confinement to
``source.allowed_roots`` and ``decode.max_bytes`` apply; a line naming a missing or
refused file is an error row, never an exception."""

from __future__ import annotations

import posixpath

from pipeline.columns import KEY, RAW_CAPTION, READ_ERROR, SOURCE_BYTES, SOURCE_URI
from pipeline.input.base import Datasource
from pipeline.keys import stem_key
from pipeline.records import InputItem
from pipeline.storage import fs
from pipeline.text import decode_text


class LinesDatasource(Datasource):
    """One record per line of a list file (see the module docstring)."""

    def list_inputs(self):
        base = posixpath.dirname(fs.normalize(self.spec.uri))
        text = decode_text(fs.read_bytes(self.spec.uri))[0]
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            uri = line if line.startswith("/") or "://" in line else fs.join(base, line)
            yield InputItem(uri=uri, size_bytes=fs.file_size(uri) or 0,
                            key=stem_key(posixpath.basename(uri)))

    def _read(self, partition, batch_size, pool, fetcher):
        for start in range(0, len(partition.inputs), batch_size):
            items = partition.inputs[start:start + batch_size]
            read = list(pool.map(lambda item: fetcher.fetch(item.uri, None), items))
            yield {KEY: [i.key for i in items], SOURCE_URI: [i.uri for i in items],
                   SOURCE_BYTES: [data for data, _ in read],
                   RAW_CAPTION: [None] * len(items), READ_ERROR: [err for _, err in read]}
