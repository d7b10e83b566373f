"""Issue 12 item 1 on a real S3 API (SeaweedFS on 127.0.0.1, ``s3_server``): a manifest's
rows read only under its prefix, ``source.uri`` and ``source.allowed_roots``; another
bucket, another prefix of the same bucket and ``..`` keys are ``outside_input_root`` rows,
never read; objects are read with a bounded (ranged) read."""

from __future__ import annotations

import json
import uuid

from pipeline.input.confine import InputRoots, read_bounded
from pipeline.spec import DecodeSpec, SourceSpec
from tests.conftest import PHOTOS
from tests.security.test_input_confinement import SECRET, assert_no_secret, read_all, reasons

PHOTO = sorted(PHOTOS.glob("*.jpg"))[0]


def test_s3_rows_outside_the_prefix_are_refused(s3_server, s3_env):
    client, bucket = s3_server.client(), s3_env
    other = f"o-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=other)
    client.put_object(Bucket=other, Key="secret.jpg", Body=SECRET)
    client.put_object(Bucket=bucket, Key="elsewhere/secret.jpg", Body=SECRET)
    client.put_object(Bucket=bucket, Key="m/img.jpg", Body=PHOTO.read_bytes())
    rows = [{"path": "img.jpg"}, {"path": f"s3://{other}/secret.jpg"},
            {"path": f"S3://{other}/secret.jpg"}, {"path": f"s3://{bucket}/elsewhere/secret.jpg"},
            {"path": "../elsewhere/secret.jpg"}, {"path": f"s3://{bucket}-x/m/img.jpg"}]
    client.put_object(Bucket=bucket, Key="m/manifest.jsonl",
                      Body="".join(json.dumps(r) + "\n" for r in rows).encode())
    spec = SourceSpec(kind="manifest", uri=f"s3://{bucket}/m/manifest.jsonl")
    cols = read_all(spec)
    assert reasons(cols) == [None] + ["outside_input_root"] * 5
    assert cols["_source_bytes"][0] == PHOTO.read_bytes()
    assert "'.' or '..' in an object key" in str(cols["_read_error"][4])
    assert_no_secret(cols)
    # allowed_roots opens exactly the named prefix
    spec = SourceSpec(kind="manifest", uri=f"s3://{bucket}/m/manifest.jsonl",
                      allowed_roots=(f"s3://{other}",))
    assert reasons(read_all(spec))[:3] == [None, None, None]


def test_s3_read_is_bounded(s3_server, s3_env):
    client, bucket = s3_server.client(), s3_env
    client.put_object(Bucket=bucket, Key="in/big.bin", Body=b"z" * 100_000)
    roots = InputRoots([f"s3://{bucket}/in"])
    data, err = read_bounded(f"s3://{bucket}/in/big.bin", 1000, roots)
    assert data is None and str(err) == "too_large: more than 1000 bytes > max_bytes 1000"
    data, err = read_bounded(f"s3://{bucket}/in/big.bin", 100_000, roots)
    assert err is None and len(data) == 100_000
    spec = SourceSpec(kind="files", uri=f"s3://{bucket}/in", extensions=(".bin",))
    cols = read_all(spec, DecodeSpec(max_bytes=99_999))
    assert reasons(cols) == ["too_large"]
