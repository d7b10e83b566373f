"""The output's section: ``sink`` (where and how the output is written: Parquet,
quarantine, WebDataset shards, datasinks from the user's own package).
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator

from pipeline.spec.base import PluginSpec, _Strict


#: What deltalake 1.6 (delta-rs) cannot hold in a table's location, local or S3: a ``%``
#: and two hex digits (decoded twice: once by its object store, once by its log reader, so a
#: table under ``pct%20dir`` is written to one place and read from another; delta-rs issues
#: #1156, #2266), control characters (its object store refuses them in a path) and ``\``
#: (read as ``/``: ``b\s`` becomes the folders ``b/s``).
DELTA_UNSAFE = re.compile(r"%[0-9A-Fa-f]{2}|[\x00-\x1f\x7f\\]")


def delta_location_problem(uri: str) -> str | None:
    """Why no Delta table can be kept at the output ``uri`` (a local path: its absolute
    form, as delta-rs canonicalises it), or None when one can (see ``DELTA_UNSAFE``)."""
    path = uri if "://" in uri else os.path.abspath(uri)
    found = DELTA_UNSAFE.search(path)
    if found is None:
        return None
    return (f"{path!r} holds {found.group(0)!r}: deltalake (delta-rs) cannot keep the "
            f"output's Delta table where the location holds a '%' followed by two hex "
            f"digits (it decodes them twice), a control character or a backslash; choose an "
            f"output path without one")


class WebDatasetSinkSpec(_Strict):
    """WebDataset output: per `ok` sample `<key>.jpg|.webp` (the resized image; for video
    the sampled frames as `<key>.<i>.jpg`), `<key>.json` (metadata) and `<key>.txt`
    (caption), in shards under ``wds/<partition>/a-<attempt>/``, named by the commit
    marker like every other output file."""

    enabled: bool = Field(False, description="Also write WebDataset shards.")
    shard_max_bytes: int = Field(256 * 2**20, ge=1024, description="Start a new shard once "
                                 "a shard holds this many bytes (a sample is never split).")
    shard_max_samples: int = Field(10_000, ge=1, description="Start a new shard after this "
                                   "many samples.")


class SinkSpec(_Strict):
    """Where and how the output is written."""

    uri: str = Field(description="Output root: holds _plan/, _checkpoints/, data/, quarantine/, "
                     "_SUCCESS (and _generations/ after an overwrite); must not overlap the input.")
    rows_per_row_group: int = Field(
        256, ge=1, description="Rows buffered before a Parquet row group is written.")
    max_buffer_bytes: int = Field(
        64 * 2**20, ge=2**16, description="Bytes of rows a Parquet datasink (data and "
        "quarantine) buffers per worker before it writes a row group, whichever of this "
        "and `rows_per_row_group` comes first; a batch larger than this is converted and "
        "written in pieces, so carried columns of many MiB per row cannot hold "
        "`rows_per_row_group` rows in memory (a row group stays under twice this; a row "
        "larger than this is written alone). "
        "Memory only: not part of the fingerprint.")
    compression: Literal["zstd", "snappy", "none"] = Field("zstd", description="Parquet codec.")
    quarantine: bool = Field(True, description="Also write error rows with their source bytes "
                             "to quarantine/.")
    quarantine_max_row_bytes: int = Field(
        16 * 2**20, ge=0, description="Quarantine keeps the bytes of media that failed to "
        "decode up to this size per row (larger: `source_bytes` is null); rows refused "
        "before decoding (outside the input roots, too large, not a file, download "
        "failed or refused) never keep bytes.")
    quarantine_bytes: Literal["media", "digest", "all"] = Field(
        "media", description="Which error rows keep their bytes in quarantine "
        "(`source_bytes`): `media`: only those whose bytes sniff as an image or video "
        "format by their magic bytes (a text file, a key, an HTML page keep none: a "
        "stranger's manifest naming a secret must not copy it); `digest`: none; `all`: "
        "every row read without error (up to `quarantine_max_row_bytes`). Every row read "
        "without error keeps `source_sha256` and `source_size` either way.")
    quarantine_buffer_bytes: int = Field(
        64 * 2**20, ge=1, description="Quarantine rows buffered per worker before a row "
        "group is written (bytes of `source_bytes`; also bounded by rows_per_row_group).")
    webdataset: WebDatasetSinkSpec = Field(
        WebDatasetSinkSpec(),
        description="WebDataset `.tar` shards written beside the Parquet files.")
    allow_bucket_root: bool = Field(
        False, description="Allow a bucket root (`s3://bucket`) as `uri`: an output owns its "
        "whole prefix (a new generation replaces the old ones, `mmpipe gc` deletes in it).")
    hash_columns: tuple[Literal["sha256", "phash"], ...] = Field(
        (), description="Hash columns to write even when nothing in the job needs them: "
        "`sha256` (of the source bytes) and `phash` (64-bit pHash, with `low_detail`). "
        "Images compute a hash only when a step, the dedup index or this list needs it "
        "(`dedup.exact` / `dedup.dataset.exact` need sha256, `dedup.near` / "
        "`dedup.dataset.near` need phash; `mmpipe validate --explain` names the reason). "
        "Videos always write both (their decode makes them).")
    allow_foreign_files: bool = Field(
        False, description="Allow a `uri` that already holds files and is not an mmpipe "
        "output (no `_plan/`, `_checkpoints/`, `_generations/`, `_job/` or `_SUCCESS`): "
        "by default such a folder is refused before anything is written, naming what is "
        "there. Either way gc and `--mode overwrite` delete only the files of mmpipe's own "
        "layout (`data/<pid>/a-<attempt>/...` and its own root entries), never another "
        "file, a nested output or what a symbolic link points at.")
    @field_validator("uri")
    @classmethod
    def _delta_location(cls, uri: str) -> str:
        problem = delta_location_problem(uri)
        if problem is not None:
            raise ValueError(problem)
        return uri

    datasinks: tuple[PluginSpec, ...] = Field(
        (), description="Datasinks from the user's own package (`FileDatasink` subclasses, "
        "built as `Class(sink.uri, **with)`), written beside the Parquet files; their "
        "files are named by the commit marker like every other output file.")
