"""Issue 13: header values servers really send. A redirect ``Location`` with a raw Latin-1
byte is followed percent-encoded; a ``Retry-After`` that is a fraction or junk falls back
to the retry policy's backoff (it used to end the download after one request)."""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path

import pytest

from pipeline.spec import DownloadSpec
from pipeline.storage.http import HttpFetcher
from tests.http_server import PHOTOS, FaultHTTPServer

NAME = "000000000802.jpg"
DATA = (Path(PHOTOS) / NAME).read_bytes()


@pytest.fixture(scope="module")
def server():
    with FaultHTTPServer() as srv:
        yield srv


@pytest.fixture
def srv(server):
    server.reset()
    return server


def _fetcher(**kw) -> HttpFetcher:
    base = {"timeout_s": 2.0, "retries": 2, "backoff_s": 0.2, "threads": 4, "max_per_host": 4,
            "allow_networks": ("127.0.0.0/8",)}
    return HttpFetcher(DownloadSpec(**{**base, **kw}), 10 * 2**20)


def test_latin1_location_is_percent_encoded_and_followed(srv):
    target = f"/ok/{NAME}?name=café"  # the raw byte E9 in the Location header
    url = srv.url("redirectto/" + urllib.parse.quote(target, safe="", encoding="latin-1"),
                  NAME)
    with _fetcher() as f:
        body, err = f.fetch(url)
    assert err is None and body == DATA
    assert srv.targets[-1] == f"/ok/{NAME}?name=caf%E9"


def test_utf8_location_still_followed_as_utf8(srv):
    target = f"/ok/{NAME}?name=" + "café".encode().decode("latin-1")  # bytes C3 A9
    url = srv.url("redirectto/" + urllib.parse.quote(target, safe="", encoding="latin-1"),
                  NAME)
    with _fetcher() as f:
        body, err = f.fetch(url)
    assert err is None and body == DATA
    assert srv.targets[-1] == f"/ok/{NAME}?name=caf%C3%A9"


@pytest.mark.parametrize("value", ["0.5", "soon", "-3", "Mon, 99 Foo 2025 99:99:99 GMT"])
def test_fractional_or_invalid_retry_after_retries_with_backoff(srv, value):
    route = "retryafter/" + urllib.parse.quote(value, safe="")
    with _fetcher(backoff_s=0.2) as f:
        t0 = time.monotonic()
        body, err = f.fetch(srv.url(route, NAME))
        elapsed = time.monotonic() - t0
        assert err is None and body == DATA, err
        assert f.stats["retries"] == 1
    assert srv.counts[f"/{route}/{NAME}"] == 2
    assert 0.19 <= elapsed < 2.0, elapsed  # the policy's first backoff (0.2 s + jitter)


def test_whole_seconds_retry_after_still_honoured(srv):
    with _fetcher(backoff_s=0.01) as f:
        t0 = time.monotonic()
        body, err = f.fetch(srv.url("retryafter/1", NAME))
    assert err is None and body == DATA and time.monotonic() - t0 >= 0.95
