"""Datasources: what a record is and where it came from; never writes under the output.

One module per datasource (``files``, ``manifest``, ``webdataset``), each a subclass of
``pipeline.input.base.Datasource``; ``make_datasource`` maps ``source.kind`` to its class.
Readers of formats (``manifest_rows``, ``shards``), the ``Fetcher``, confinement and
``source_uri`` live beside them.
"""

from __future__ import annotations

from pipeline.input.base import Datasource
from pipeline.input.files import FilesDatasource
from pipeline.input.manifest import ManifestDatasource
from pipeline.input.webdataset import WebDatasetDatasource
from pipeline.spec import DecodeSpec, DownloadSpec, SourceSpec, VideoSpec

#: ``source.kind`` -> datasource class.
DATASOURCES: dict[str, type[Datasource]] = {
    "files": FilesDatasource, "manifest": ManifestDatasource, "webdataset": WebDatasetDatasource}


def make_datasource(spec: SourceSpec, decode: DecodeSpec, download: DownloadSpec | None = None,
                    video: VideoSpec | None = None) -> Datasource:
    """Return the datasource for ``spec.kind`` (a key of ``DATASOURCES``)."""
    return DATASOURCES[spec.kind](spec, decode, download, video)
