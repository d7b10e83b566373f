"""S3 (and S3-compatible stores: MinIO, SeaweedFS, R2): the only module that knows ``s3://``.

Data goes through ``pyarrow.fs.S3FileSystem`` (listing, streaming reads, multipart
writes); boto3 does what pyarrow lacks: conditional ``PutObject`` (``If-None-Match: *``)
for commit markers, and paginated listings that stream in key order. Both use the
standard AWS credential chain (environment, shared profile, web identity / IRSA).

The endpoint is ``storage.endpoint_url`` from the job spec, else the standard
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` environment variables, else AWS itself.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from urllib.parse import urlparse

import pyarrow.fs as pafs

SCHEME = "s3://"


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """Endpoint URL (``http://127.0.0.1:8333``) and region; None means "from the environment"."""

    endpoint_url: str | None = None
    region: str | None = None

    def resolved(self) -> "S3Settings":
        endpoint = (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL") or None)
        region = (self.region or os.environ.get("AWS_REGION")
                  or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        return S3Settings(endpoint, region)


SETTINGS = S3Settings()


def configure(endpoint_url: str | None, region: str | None) -> None:
    """Set this process's S3 endpoint and region (None: from the environment)."""
    global SETTINGS
    SETTINGS = S3Settings(endpoint_url, region)


def is_s3(uri: str) -> bool:
    """True for ``s3://bucket/key`` URIs."""
    return uri.startswith(SCHEME)


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``. Raises ``ValueError`` without a bucket."""
    rest = uri[len(SCHEME):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{uri}: no bucket in S3 URI")
    return bucket, key


def filesystem(sdk_retries: bool = True) -> pafs.S3FileSystem:
    """The ``pyarrow`` S3 filesystem for the current settings (cached).

    ``sdk_retries=True`` (streams handed to pyarrow readers/writers, e.g. multipart
    uploads, whose individual requests only the SDK can repeat): the AWS SDK's standard
    retry strategy, 3 attempts. ``sdk_retries=False``: one attempt, for whole requests
    that ``pipeline.io.retry`` repeats and counts itself.
    """
    s = SETTINGS.resolved()
    return _filesystem(s.endpoint_url, s.region, 3 if sdk_retries else 1)


@functools.lru_cache(maxsize=16)
def _filesystem(endpoint_url: str | None, region: str, sdk_attempts: int) -> pafs.S3FileSystem:
    kwargs = {"region": region, "allow_bucket_creation": False, "allow_bucket_deletion": False,
              "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=sdk_attempts),
              "connect_timeout": 10, "request_timeout": 60}
    if endpoint_url:
        url = urlparse(endpoint_url)
        kwargs.update(endpoint_override=url.netloc or url.path, scheme=url.scheme or "https")
    return pafs.S3FileSystem(**kwargs)


def client():
    """A boto3 S3 client for the current settings (cached; boto3 clients are thread-safe)."""
    s = SETTINGS.resolved()
    return _client(s.endpoint_url, s.region)


@functools.lru_cache(maxsize=8)
def _client(endpoint_url: str | None, region: str):
    import boto3
    from botocore.config import Config

    cfg = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=10,
                 read_timeout=60, max_pool_connections=64)
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=cfg)


def put_if_absent(uri: str, data: bytes) -> bool:
    """``PutObject`` with ``If-None-Match: *``: True if created, False on 412 (it exists).

    Other errors (409 ConditionalRequestConflict included) propagate for the caller's retry.
    """
    from botocore.exceptions import ClientError

    bucket, key = split(uri)
    try:
        client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        return True
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "PreconditionFailed" or \
                e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
            return False
        raise


def list_page(uri: str, token: str | None) -> tuple[list[tuple[str, int, float]], str | None]:
    """One page (up to 1000 keys, in key order) of the objects under the prefix ``uri``:
    ``([(uri, size_bytes, mtime_s), ...], continuation token or None at the end)``;
    ``mtime_s`` is LastModified in seconds since the epoch."""
    bucket, key = split(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    kwargs = {"Bucket": bucket, "Prefix": prefix}
    if token:
        kwargs["ContinuationToken"] = token
    page = client().list_objects_v2(**kwargs)
    items = [(f"{SCHEME}{bucket}/{o['Key']}", int(o["Size"]), o["LastModified"].timestamp())
             for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return items, page.get("NextContinuationToken") if page.get("IsTruncated") else None


def throttle_prefix(uri: str) -> str:
    """The prefix throttling is tracked by: bucket and first key segment."""
    bucket, key = split(uri)
    return f"{bucket}/{key.split('/', 1)[0]}"
