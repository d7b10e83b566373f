"""The input's sections: ``source`` (where the input is, what kind it is, how it is cut
into partitions), ``storage`` (the object store connection) and ``download`` (HTTP(S)
downloads of manifest URLs). A ``source`` field that the chosen ``source.kind`` does not
use (``SOURCE_FIELD_KINDS``) is an error when a spec sets it.
"""

from __future__ import annotations

import ipaddress
import typing
from typing import Literal

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator

from pipeline.spec.base import (_USES_DOC, _WITH_DOC, VIDEO_EXTENSIONS, FieldNotApplicable, Uses,
                                _Strict, image_extensions)


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
