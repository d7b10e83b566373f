"""``pipeline.input.fetch`` URL rules: scheme case (RFC 3986 §3.1), protocol-relative
references (RFC 3986 §4.2), ``data:`` URIs (RFC 2397), against a local HTTP server."""

from __future__ import annotations

import base64
import contextlib
import urllib.parse

import pytest

from pipeline.input.fetch import (Fetcher, data_uri_media_type, is_data_uri, is_url, normalize_url, read_data_uri)
from pipeline.spec import DownloadSpec
from tests.conftest import CASES, PHOTOS
from tests.http_server import FaultHTTPServer

HOPPER = (CASES / "C47_gray" / "hopper_gray.jpg").read_bytes()  # 5353 bytes, a real JPEG
NAME = "000000000802.jpg"
DATA = (PHOTOS / NAME).read_bytes()
B64 = base64.b64encode(HOPPER).decode()


@pytest.fixture(scope="module")
def server():
    with FaultHTTPServer() as srv:
        yield srv


def make_fetcher(max_bytes: int = 10 << 20, stage_media: bool = False) -> Fetcher:
    return Fetcher(max_bytes, DownloadSpec(timeout_s=2.0, retries=0, threads=2,
                                             allow_networks=("127.0.0.0/8",)), None,
                   stage_media)


def test_normalize_url_rules():
    assert normalize_url("http://h/a.jpg") == "http://h/a.jpg"
    assert normalize_url("HTTP://Host/A.jpg") == "http://Host/A.jpg"
    assert normalize_url("Https://h/a.jpg?X=Y") == "https://h/a.jpg?X=Y"
    assert normalize_url("DATA:image/png;base64,AAAA") == "data:image/png;base64,AAAA"
    # Protocol-relative: https (PROTOCOL_RELATIVE_SCHEME).
    assert normalize_url("//cdn.example.com/i/a.jpg") == "https://cdn.example.com/i/a.jpg"
    assert normalize_url("//127.0.0.1:8080/x") == "https://127.0.0.1:8080/x"
    # Not URLs fetched by Fetcher: storage URIs and paths (absolute, relative, ///).
    for value in ("s3://b/k.jpg", "S3://b/k.jpg", "file:///x.jpg", "/abs/a.jpg", "///abs/a.jpg",
                  "a.jpg", "sub/a.jpg", "C:\\a.jpg", "ftp://h/a.jpg", "", None):
        assert normalize_url(value) is None, value
        assert not is_url(value)
    for value in ("HTTP://h/a", "https://h/a", "//h/a", "data:,x", "Data:,x"):
        assert is_url(value)
    assert is_data_uri("DaTa:,x") and not is_data_uri("//h/a") and not is_data_uri(None)
    assert data_uri_media_type("data:Image/JPEG;base64,xx") == "image/jpeg"
    assert data_uri_media_type("data:;base64,xx") == "text/plain"


@pytest.mark.parametrize("uri", [
    "data:image/jpeg;base64," + B64,
    "DATA:image/jpeg;BASE64," + B64,
    "data:image/jpeg;base64," + B64.rstrip("="),                                # no padding
    "data:image/jpeg;base64," + "\n".join(B64[i:i + 76] for i in range(0, len(B64), 76)),
    "data:image/jpeg;base64," + urllib.parse.quote(B64, safe=""),               # %2B %2F %3D
    "data:image/jpeg," + urllib.parse.quote(HOPPER),                            # percent form
    "data:;base64," + B64,                                                      # no media type
])
def test_data_uri_exact_bytes(uri):
    f = make_fetcher()
    assert f.fetch(uri, None) == (HOPPER, None)
    assert read_data_uri(uri, len(HOPPER)) == (HOPPER, None)
    assert f.stats() == {}  # no HTTP session was needed


def test_data_uri_plain_text():
    assert read_data_uri("data:,A%20brief%20note", 100) == (b"A brief note", None)
    assert read_data_uri("data:text/plain;charset=utf-8,caf%C3%A9", 100) == (
        "café".encode(), None)
    assert read_data_uri("data:,", 100) == (b"", None)


def test_data_uri_over_max_bytes():
    f = make_fetcher(max_bytes=len(HOPPER) - 1)
    for uri in ("data:image/jpeg;base64," + B64, "data:image/jpeg," + urllib.parse.quote(HOPPER),
                "data:image/jpeg;base64," + urllib.parse.quote(B64, safe="")):
        body, err = f.fetch(uri, None)
        assert body is None
        assert str(err) == f"too_large: {len(HOPPER)} bytes > max_bytes {len(HOPPER) - 1}"
    # Plain ASCII text over the limit: refused by its length.
    err = read_data_uri("data:," + "x" * 101, 100)[1]
    assert str(err) == "too_large: 101 bytes > max_bytes 100"


def test_data_uri_oversized_refused_before_decoding(monkeypatch):
    import pipeline.input.fetch as fetch_mod

    def no_decode(*a, **k):
        raise AssertionError("decoded")

    monkeypatch.setattr(fetch_mod.base64, "b64decode", no_decode)
    monkeypatch.setattr(fetch_mod, "unquote_to_bytes", no_decode)
    big = "data:application/octet-stream;base64," + "A" * (4 * 1000)  # 3000 bytes
    assert str(read_data_uri(big, 1000)[1]) == "too_large: 3000 bytes > max_bytes 1000"
    huge = "data:image/jpeg;base64," + "%41" * 5000  # percent-encoded: > 4 * max + 1024
    err = read_data_uri(huge, 1000)[1]
    assert err.reason.value == "too_large" and "15000 characters" in str(err)


@pytest.mark.parametrize("uri,fault", [
    ("data:image/jpeg;base64" + B64, "no ',' before the data"),
    ("data:image/jpeg;base64,A*BC", "invalid base64"),
    ("data:image/jpeg;base64,ABCDE", "invalid base64 (5 characters)"),
    ("data:image/jpeg;base64,AB=CD", "invalid base64"),
    ("data:image/jpeg;base64,%FF%FE", "invalid base64"),
])
def test_data_uri_malformed(uri, fault):
    body, err = make_fetcher().fetch(uri, None)
    assert body is None and err.reason.value == "failed_to_download"
    assert "malformed data: URI" in str(err) and fault in str(err)
    assert len(str(err)) < 200  # the URI is cut in the message


def test_data_uri_staged_with_its_media_type_suffix():
    f = make_fetcher(stage_media=True)
    uri = "data:image/jpeg;base64," + B64
    data, err = f.fetch(uri, None)
    assert data == HOPPER and err is None
    with contextlib.ExitStack() as stack:
        path, err = f.stage(uri, data, stack)
        assert err is None and path.endswith(".jpg") and open(path, "rb").read() == HOPPER


def test_upper_case_scheme_fetched_over_http(server):
    server.reset()
    f = make_fetcher()
    try:
        for url in (server.url("ok", NAME).replace("http://", "HTTP://"),
                    server.url("ok", NAME).replace("http://", "Http://")):
            assert is_url(url)
            assert f.fetch(url, None) == (DATA, None)
        assert server.counts[f"/ok/{NAME}"] == 2 and f.stats()["ok"] == 2
    finally:
        f.close()


def test_protocol_relative_is_fetched_as_https(server):
    """``//127.0.0.1:<port>/...`` is requested as https (the plain-HTTP test server
    cannot speak TLS, so this fails, naming the https URL)."""
    f = make_fetcher()
    try:
        ref = server.url("ok", NAME)[len("http:"):]
        body, err = f.fetch(ref, None)
        assert body is None and str(err).startswith(f"failed_to_download: https:{ref}: ")
    finally:
        f.close()


def test_upper_case_storage_schemes(tmp_path):
    (tmp_path / "a.jpg").write_bytes(HOPPER)
    f = make_fetcher()
    assert f.fetch(f"FILE://{tmp_path}/a.jpg", None) == (HOPPER, None)
    assert f.fetch(f"File://{tmp_path}/a.jpg", None) == (HOPPER, None)
