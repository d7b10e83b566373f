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
from datetime import datetime
from urllib.parse import quote, unquote_plus, urlencode, urlparse

import pyarrow.fs as pafs

SCHEME = "s3://"


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """Endpoint URL (``http://127.0.0.1:8333``) and region; None means "from the environment"
    when ``from_env`` (the driver), else AWS itself and ``us-east-1`` (actors of a job, whose
    settings the driver resolved into the spec: a node's own environment never changes where
    a job reads and writes)."""

    endpoint_url: str | None = None
    region: str | None = None
    from_env: bool = True

    def resolved(self) -> "S3Settings":
        if not self.from_env:
            return S3Settings(self.endpoint_url or None, self.region or "us-east-1", False)
        endpoint = (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL") or None)
        region = (self.region or os.environ.get("AWS_REGION")
                  or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        return S3Settings(endpoint, region)


SETTINGS = S3Settings()


def configure(endpoint_url: str | None, region: str | None, from_env: bool = True) -> None:
    """Set this process's S3 endpoint and region (None: from the environment if
    ``from_env``, else AWS and ``us-east-1``)."""
    global SETTINGS
    SETTINGS = S3Settings(endpoint_url, region, from_env)


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
    that ``pipeline.storage.retry`` repeats and counts itself.
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


def delta_options() -> dict[str, str]:
    """delta-rs ``storage_options`` for the current settings: the endpoint
    (``AWS_ALLOW_HTTP`` for an ``http://`` one), the region, the credentials the boto3
    chain resolves now (environment, profile, web identity), and conditional puts
    (``conditional_put: etag``: a log entry is created with ``If-None-Match: *``, so of two
    writers of one table version exactly one commits; SeaweedFS and AWS S3 honour it)."""
    s = SETTINGS.resolved()
    out = {"AWS_REGION": s.region, "conditional_put": "etag"}
    if s.endpoint_url:
        # both names: delta-rs takes AWS_ENDPOINT_URL_S3 from the environment over an
        # AWS_ENDPOINT_URL option (a node's environment must not move the job's storage)
        out["AWS_ENDPOINT_URL"] = out["AWS_ENDPOINT_URL_S3"] = s.endpoint_url
        if s.endpoint_url.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    credentials = client()._request_signer._credentials  # noqa: SLF001 - the chain's
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        out.update(AWS_ACCESS_KEY_ID=frozen.access_key, AWS_SECRET_ACCESS_KEY=frozen.secret_key)
        if frozen.token:
            out["AWS_SESSION_TOKEN"] = frozen.token
    return out


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
    ``mtime_s`` is LastModified in seconds since the epoch.

    The request is S3 ``ListObjectsV2`` signed by botocore (``S3SigV4Auth``, the client's
    credentials), sent with ``urllib`` and parsed with ``xml.etree.ElementTree`` (C): about
    4x faster than the boto3 client call, whose pure-Python response parser dominates a
    listing (20,000 keys: 0.44 s against 1.6 s on a local SeaweedFS; it is what a resume
    of 100k partitions spends before its first dispatch). Errors are raised as botocore
    ``ClientError`` (S3 error code and HTTP status) or ``ConnectionError``, so
    ``pipeline.storage.retry`` classifies them as it does the client's.
    """
    bucket, key = split(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    query = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
    if token:
        query["continuation-token"] = token
    root = _signed_get(bucket, query, "ListObjectsV2")
    items = []
    for obj in root.iter(_NS + "Contents"):
        name = unquote_plus(obj.findtext(_NS + "Key", ""))
        if name.endswith("/"):
            continue
        stamp = obj.findtext(_NS + "LastModified", "")
        mtime = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0
        items.append((f"{SCHEME}{bucket}/{name}", int(obj.findtext(_NS + "Size", "0")), mtime))
    truncated = root.findtext(_NS + "IsTruncated", "false") == "true"
    return items, (root.findtext(_NS + "NextContinuationToken") or None) if truncated else None


_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def _bucket_url(bucket: str) -> str:
    """The bucket's base URL: path style under the configured endpoint, else AWS's
    virtual-hosted ``https://<bucket>.s3.<region>.amazonaws.com``."""
    s = SETTINGS.resolved()
    if s.endpoint_url:
        return f"{s.endpoint_url.rstrip('/')}/{quote(bucket)}"
    return f"https://{bucket}.s3.{s.region}.amazonaws.com"


def _signed_get(bucket: str, query: dict[str, str], operation: str):
    """GET ``<bucket url>?<query>`` signed with SigV4; the parsed XML root. Raises
    ``botocore.exceptions.ClientError`` for an S3 error response, ``ConnectionError`` when
    the server cannot be reached or the connection breaks."""
    import urllib.error
    import urllib.request
    import xml.etree.ElementTree as ET

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.exceptions import ClientError

    c = client()
    url = f"{_bucket_url(bucket)}/?{urlencode(sorted(query.items()), quote_via=quote)}"
    request = AWSRequest(method="GET", url=url)
    credentials = c._request_signer._credentials  # noqa: SLF001 - the client's own chain
    if credentials is not None:
        S3SigV4Auth(credentials.get_frozen_credentials(), "s3",
                    c.meta.region_name).add_auth(request)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(request.headers)),
                                    timeout=60) as response:
            return ET.fromstring(response.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            err = ET.fromstring(body)
            code, message = err.findtext("Code") or str(e.code), err.findtext("Message") or ""
        except ET.ParseError:
            code, message = str(e.code), body[:200].decode("utf-8", "replace")
        raise ClientError({"Error": {"Code": code, "Message": message},
                           "ResponseMetadata": {"HTTPStatusCode": e.code}}, operation) from None
    except (urllib.error.URLError, OSError) as e:
        raise ConnectionError(f"{operation} s3://{bucket}: {e}") from e


def throttle_prefix(uri: str) -> str:
    """The prefix throttling is tracked by: bucket and first key segment."""
    bucket, key = split(uri)
    return f"{bucket}/{key.split('/', 1)[0]}"
