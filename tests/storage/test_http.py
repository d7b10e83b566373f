"""HttpFetcher against a local fault-injecting HTTP server (tests/http_server.py)."""

from __future__ import annotations

import hashlib
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.storage.http import HttpFetcher, is_disallowed, user_agent_token
from pipeline.spec import DownloadSpec
from tests.http_server import PHOTOS, FaultHTTPServer

NAME = "000000000802.jpg"  # 62406 bytes
DATA = open(f"{PHOTOS}/{NAME}", "rb").read()
MAX = 10 * 1024 * 1024


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def server():
    with FaultHTTPServer() as srv:
        yield srv


@pytest.fixture
def srv(server):
    server.reset()
    return server


def fetcher(max_bytes: int = MAX, **kw) -> HttpFetcher:
    base = {"timeout_s": 2.0, "retries": 2, "backoff_s": 0.01, "threads": 8, "max_per_host": 4,
            "allow_networks": ("127.0.0.0/8",)}  # the test server is on loopback
    return HttpFetcher(DownloadSpec(**{**base, **kw}), max_bytes)


def test_ok_bytes_and_user_agent(srv):
    f = fetcher()
    body, err = f.fetch(srv.url("ok", NAME))
    assert err is None and sha(body) == sha(DATA)
    assert srv.user_agents == [DownloadSpec().user_agent]
    assert f.stats["ok"] == 1 and f.stats["requests"] == 1 and f.stats["bytes"] == len(DATA)
    f.close()
    f = fetcher(user_agent="testbot/9 (+http://127.0.0.1)")
    assert f.fetch(srv.url("ok", NAME))[1] is None
    assert srv.user_agents[-1] == "testbot/9 (+http://127.0.0.1)"


def test_404_not_retried(srv):
    f = fetcher()
    body, err = f.fetch(srv.url("status/404", NAME))
    assert body is None
    assert str(err) == f"failed_to_download: {srv.url('status/404', NAME)}: HTTP 404"
    assert srv.counts[f"/status/404/{NAME}"] == 1
    assert f.stats["failed:http_404"] == 1 and f.stats.get("retries", 0) == 0


@pytest.mark.parametrize("code", [500, 503, 429])
def test_5xx_retried_then_failed(srv, code):
    f = fetcher(retries=2)
    body, err = f.fetch(srv.url(f"status/{code}", NAME))
    assert body is None and str(err).startswith("failed_to_download: ") and str(err).endswith(f"HTTP {code}")
    assert srv.counts[f"/status/{code}/{NAME}"] == 3
    assert f.stats["retries"] == 2 and f.stats["requests"] == 3


def test_retries_zero(srv):
    f = fetcher(retries=0)
    assert str(f.fetch(srv.url("status/500", NAME))[1]).endswith("HTTP 500")
    assert srv.counts[f"/status/500/{NAME}"] == 1


def test_flaky_recovers(srv):
    f = fetcher(retries=2)
    body, err = f.fetch(srv.url("flaky/2", NAME))
    assert err is None and sha(body) == sha(DATA)
    assert srv.counts[f"/flaky/2/{NAME}"] == 3 and f.stats["retries"] == 2


def test_flaky_beyond_retries(srv):
    f = fetcher(retries=2)
    body, err = f.fetch(srv.url("flaky/3", NAME))
    assert body is None and str(err).endswith("HTTP 503")
    assert srv.counts[f"/flaky/3/{NAME}"] == 3


def test_backoff_first_delay_then_doubles(srv):
    # backoff_s is the first retry's delay; then 2x: 0.15 + 0.3 (+ jitter up to 0.15 each).
    f = fetcher(retries=2, backoff_s=0.15)
    t0 = time.monotonic()
    assert str(f.fetch(srv.url("status/502", NAME))[1]).endswith("HTTP 502")
    elapsed = time.monotonic() - t0
    assert 0.44 <= elapsed < 2.0, elapsed


def test_retry_after_honoured(srv):
    f = fetcher(retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    body, err = f.fetch(srv.url("retryafter/1", NAME))
    assert err is None and sha(body) == sha(DATA)
    assert time.monotonic() - t0 >= 0.95
    assert srv.counts[f"/retryafter/1/{NAME}"] == 2


def test_timeout_bounded(srv):
    f = fetcher(timeout_s=0.3, retries=1)
    t0 = time.monotonic()
    body, err = f.fetch(srv.url("slow/3", NAME))
    elapsed = time.monotonic() - t0
    assert body is None
    assert str(err) == f"failed_to_download: {srv.url('slow/3', NAME)}: timeout after 0.3 s"
    assert elapsed < 1.5, elapsed  # two attempts of 0.3 s and a short backoff
    assert srv.counts[f"/slow/3/{NAME}"] == 2  # a read timeout before the headers is retried
    assert f.stats["failed:timeout"] == 1


def test_timeout_mid_body(srv):
    f = fetcher(timeout_s=0.3, retries=2)
    t0 = time.monotonic()
    body, err = f.fetch(srv.url("slowbody/2", NAME))
    assert body is None and str(err).endswith("timeout after 0.3 s reading the body")
    assert time.monotonic() - t0 < 1.5
    assert srv.counts[f"/slowbody/2/{NAME}"] == 1  # a failed body read is not retried


def test_trickling_body_bounded_by_max_time(srv):
    """Every read returns within timeout_s, but the whole body would take 4 s."""
    big = "000000216794.jpg"  # 377906 bytes: 20 pieces of ~19 KB, 0.2 s apart
    f = fetcher(timeout_s=1.0, max_time_s=0.5)
    t0 = time.monotonic()
    body, err = f.fetch(srv.url("trickle/4", big))
    assert body is None
    assert str(err) == (f"failed_to_download: {srv.url('trickle/4', big)}: "
                   "download took longer than max_time_s 0.5 s")
    assert time.monotonic() - t0 < 0.5 + 1.0 + 0.5      # max_time_s + one read + slack
    ok = fetcher(timeout_s=1.0, max_time_s=10)
    body, err = ok.fetch(srv.url("trickle/0.4", big))
    assert err is None and body == open(f"{PHOTOS}/{big}", "rb").read()


def test_slow_within_timeout_ok(srv):
    f = fetcher(timeout_s=2.0)
    body, err = f.fetch(srv.url("slow/0.2", NAME))
    assert err is None and body == DATA


def test_truncated(srv):
    f = fetcher()
    body, err = f.fetch(srv.url("truncated", NAME))
    assert body is None
    assert str(err) == (f"failed_to_download: {srv.url('truncated', NAME)}: truncated body: "
                   f"got {len(DATA) // 2} of {len(DATA)} bytes")
    assert f.stats["failed:truncated"] == 1
    # The pool is still usable afterwards.
    assert f.fetch(srv.url("ok", NAME))[0] == DATA


def test_html_error_page_returned(srv):
    body, err = fetcher().fetch(srv.url("html", NAME))
    assert err is None and body.startswith(b"<") and b"<html>" in body


def robots_url(srv, directive: str) -> str:
    return srv.url("robots/" + urllib.parse.quote(directive, safe=""), NAME)


@pytest.mark.parametrize("directive,expected", [
    ("noai", "noai"),
    ("noindex, nofollow", "noindex"),
    ("NoImageAI", "noimageai"),
    ("mmpipe: noai", "noai"),
    ("*: noimageindex", "noimageindex"),
    ("otherbot: noai", None),
    ("nofollow", None),
    ("unavailable_after: 25 Jun 2010 15:00:00 PST", None),
])
def test_robots(srv, directive, expected):
    f = fetcher()
    url = robots_url(srv, directive)
    body, err = f.fetch(url)
    if expected is None:
        assert err is None and body == DATA
    else:
        assert body is None
        assert str(err) == f"failed_to_download: {url}: opted out by X-Robots-Tag: {expected}"
        assert f.stats["failed:opted_out"] == 1


def test_robots_every_header_counts(srv):
    f = fetcher()
    q = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731
    url = srv.url(f"robots2/{q('otherbot: noai')}/{q('noindex')}", NAME)
    assert str(f.fetch(url)[1]).endswith("opted out by X-Robots-Tag: noindex")
    url = srv.url(f"robots2/{q('otherbot: noai')}/{q('nofollow')}", NAME)
    assert f.fetch(url)[0] == DATA


def test_robots_ignored_when_list_empty(srv):
    body, err = fetcher(disallowed_header_directives=()).fetch(robots_url(srv, "noai"))
    assert err is None and body == DATA


def test_opt_out_and_too_large_do_not_read_body(tmp_path):
    # 8 MB, far over the socket buffers: the server can only finish writing it if the
    # client reads it. The server records the body bytes of completed writes only.
    (tmp_path / "big.jpg").write_bytes(DATA * 135)
    size = len(DATA) * 135
    with FaultHTTPServer(str(tmp_path)) as big:
        f = fetcher()
        url = robots_url(big, "noai").replace(NAME, "big.jpg")
        assert str(f.fetch(url)[1]).endswith("opted out by X-Robots-Tag: noai")
        f2 = fetcher(max_bytes=size - 1)
        assert str(f2.fetch(big.url("ok", "big.jpg"))[1]) == f"too_large: {size} bytes > max_bytes {size - 1}"
        assert f.fetch(big.url("ok", "big.jpg"))[0] == DATA * 135
        time.sleep(0.2)
        assert big.body_bytes_sent == {"/ok/big.jpg": size}


def test_is_disallowed_unit():
    bad = ("noai", "noimageai", "noindex", "noimageindex")
    assert is_disallowed(["noai"], "mmpipe", bad) == "noai"
    assert is_disallowed(["otherbot: noai"], "mmpipe", bad) is None
    assert is_disallowed(["MMPIPE: noai, nofollow"], "mmpipe", bad) == "noai"
    assert is_disallowed(["otherbot: noai", "none"], "mmpipe", bad) is None
    assert is_disallowed([], "mmpipe", bad) is None
    assert is_disallowed(["noai"], "mmpipe", ()) is None
    assert user_agent_token("mmpipe/0.1 (+https://github.com/mmpipe/mmpipe)") == "mmpipe"
    assert user_agent_token("img2dataset") == "img2dataset"


def test_too_large_by_content_length(srv):
    f = fetcher(max_bytes=len(DATA) - 1)
    body, err = f.fetch(srv.url("ok", NAME))
    assert body is None and str(err) == f"too_large: {len(DATA)} bytes > max_bytes {len(DATA) - 1}"
    assert f.fetch(srv.url("ok", NAME)) == (None, err)  # the connection was dropped cleanly
    assert fetcher(max_bytes=len(DATA)).fetch(srv.url("ok", NAME))[0] == DATA


def test_too_large_without_content_length(srv):
    f = fetcher(max_bytes=1000)
    body, err = f.fetch(srv.url("chunked", NAME))
    assert body is None and str(err) == "too_large: more than 1000 bytes > max_bytes 1000"
    assert fetcher().fetch(srv.url("chunked", NAME)) == (DATA, None)


def test_redirect_followed(srv):
    f = fetcher()
    body, err = f.fetch(srv.url("redirect", NAME))
    assert err is None and body == DATA
    assert srv.counts[f"/redirect/{NAME}"] == 1 and srv.counts[f"/ok/{NAME}"] == 1
    assert f.stats["requests"] == 2


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/a.jpg", "file:///etc/hostname",
                                 "data:image/png;base64,AAAA", "127.0.0.1/a.jpg", ""])
def test_unsupported_scheme(srv, url):
    f = fetcher()
    body, err = f.fetch(url)
    assert body is None and str(err).startswith(f"failed_to_download: {url}: unsupported scheme")
    assert not srv.counts and f.stats.get("requests", 0) == 0


@pytest.mark.parametrize("url", ["http:///a.jpg", "http://[::1/a.jpg"])
def test_invalid_url(url):
    body, err = fetcher().fetch(url)
    assert body is None and str(err).startswith(f"failed_to_download: {url}: invalid url")


def test_connection_refused_retried():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f = fetcher(retries=2)
    body, err = f.fetch(f"http://127.0.0.1:{port}/ok/{NAME}")
    assert body is None and f"failed_to_download: http://127.0.0.1:{port}/ok/{NAME}: connection " in str(err)
    assert f.stats["retries"] == 2 and f.stats["failed:connection"] == 1


def run_many(f: HttpFetcher, urls: list[str], threads: int) -> list:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(f.fetch, urls))


def test_per_host_limit(srv):
    f = fetcher(threads=8, max_per_host=2, timeout_s=5.0)
    urls = [srv.url("slow/0.3", NAME) + f"?i={i}" for i in range(12)]
    results = run_many(f, urls, 8)
    assert all(err is None and body == DATA for body, err in results)
    assert srv.max_in_flight_by_route["/slow/0.3"] == 2
    assert f.stats["ok"] == 12 and f.stats["requests"] == 12 and f.stats["fetches"] == 12
    # Control: with a higher limit the server does see more at once.
    srv.reset()
    run_many(fetcher(threads=8, max_per_host=6, timeout_s=5.0), urls, 8)
    assert srv.max_in_flight_by_route["/slow/0.3"] > 2


def _localhost_is_only_127() -> bool:
    try:
        infos = socket.getaddrinfo("localhost", 80, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(i[4][0] == "127.0.0.1" for i in infos)


@pytest.mark.skipif(not _localhost_is_only_127(), reason="localhost is not only 127.0.0.1")
def test_per_host_limit_is_per_host(srv):
    f = fetcher(threads=8, max_per_host=2, timeout_s=5.0)
    urls = [f"{host}/slow/0.3/{NAME}?i={i}" for i in range(6)
            for host in (srv.base_url, f"http://localhost:{srv.port}")]
    results = run_many(f, urls, 8)
    assert all(err is None for _, err in results)
    assert srv.max_in_flight_by_route["/slow/0.3"] == 4


def test_concurrent_mixed(srv):
    f = fetcher(threads=8, max_per_host=8)
    routes = ["ok", "status/404", "html", "truncated", "robots/noai", "flaky/1", "redirect"]
    urls = [srv.url(r, NAME) + f"?i={i}" for i in range(4) for r in routes]
    results = run_many(f, urls, 8)
    for url, (body, err) in zip(urls, results):
        assert (body is None) != (err is None), url
    oks = [u for u, (b, _) in zip(urls, results) if b is not None]
    assert len(oks) == 4 * 4  # ok, html, flaky/1, redirect
    s = f.stats
    assert s["fetches"] == len(urls)
    assert s["failed:http_404"] == 4 and s["failed:truncated"] == 4 and s["failed:opted_out"] == 4
    f.close()


def test_a_partition_read_closes_its_downloads_and_counts_them(srv, tmp_path):
    """URL manifests: each partition read has its own fetcher; its download threads are
    gone when the read ends, and its counters go to that attempt's statistics."""
    import json
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.output.plan import pack
    from pipeline.input import make_datasource
    from pipeline.stats import AttemptStats
    from pipeline.spec import DecodeSpec, SourceSpec

    manifest = tmp_path / "urls.jsonl"
    urls = [srv.url("ok", NAME), srv.url("status/404", NAME), srv.url("ok", NAME) + "?2"]
    manifest.write_text("".join(json.dumps({"url": u}) + "\n" for u in urls))
    source = make_datasource(SourceSpec(kind="manifest", uri=str(manifest)), DecodeSpec(),
                             DownloadSpec(retries=0, threads=4,
                                          allow_networks=("127.0.0.0/8",)))
    part = next(pack(source.list_inputs(), 10))
    stats = AttemptStats()
    with ThreadPoolExecutor(2) as pool:
        batches = list(source.read_partition(part, 2, pool, stats))
    errors = [e for b in batches for e in b["_read_error"]]
    assert [None if e is None else e.reason.value for e in errors] == [
        None, "failed_to_download", None]
    assert not [t for t in threading.enumerate() if t.name.startswith("mmpipe-download")]
    assert stats.downloads["fetches"] == 3 and stats.downloads["ok"] == 2
    assert stats.downloads["failed:http_404"] == 1


# --- URL schemes (RFC 3986 §3.1) and Content-Encoding (RFC 9110 §8.4) -------------------

@pytest.mark.parametrize("scheme", ["HTTP", "Http", "hTtP"])
def test_scheme_is_case_insensitive(srv, scheme):
    f = fetcher()
    url = srv.url("ok", NAME).replace("http", scheme, 1)
    body, err = f.fetch(url)
    assert err is None and body == DATA
    assert srv.counts[f"/ok/{NAME}"] == 1


def test_lower_scheme_and_content_codings_unit():
    from pipeline.storage.http import content_codings, lower_scheme

    assert lower_scheme("HTTPS://Host/A.JPG?Q=1") == "https://Host/A.JPG?Q=1"
    assert lower_scheme("S3://Bucket/Key") == "s3://Bucket/Key"
    assert lower_scheme("http://h/x") == "http://h/x"
    for unchanged in ("C:\\Photos\\A.jpg", "Photos/A.jpg", "DATA:,x", "/abs/A.jpg", ""):
        assert lower_scheme(unchanged) == unchanged
    assert content_codings("gzip") == ["gzip"]
    assert content_codings("GZip, br") == ["gzip", "br"]
    assert content_codings("identity, , x-gzip") == ["x-gzip"]
    assert content_codings(None) == content_codings("") == []


ENCODINGS = ["gzip", "x-gzip", "deflate", "rawdeflate", "br", "GZIP", "gzip,br",
             "deflate,gzip", "identity"]


@pytest.mark.parametrize("coding", ENCODINGS)
def test_content_encoding_decoded(srv, coding):
    f = fetcher()
    body, err = f.fetch(srv.url(f"encoded/{coding}", NAME))
    assert err is None and body == DATA
    assert f.stats["ok"] == 1 and f.stats["bytes"] == len(DATA)
    # Without Content-Length (chunked) too.
    body, err = f.fetch(srv.url(f"encodedchunked/{coding}", NAME))
    assert err is None and body == DATA


def test_content_encoding_of_a_compressible_body(tmp_path):
    """A body that compresses well (a BMP-like raw image): the decoded size is far above
    Content-Length, and max_bytes is compared with the decoded size."""
    raw = bytes(range(256)) * 4096  # 1 MiB
    (tmp_path / "raw.bin").write_bytes(raw)
    with FaultHTTPServer(str(tmp_path)) as s:
        for coding in ("gzip", "deflate", "br"):
            assert fetcher().fetch(s.url(f"encoded/{coding}", "raw.bin")) == (raw, None)
            assert fetcher(max_bytes=len(raw)).fetch(
                s.url(f"encoded/{coding}", "raw.bin")) == (raw, None)
            body, err = fetcher(max_bytes=len(raw) - 1).fetch(
                s.url(f"encoded/{coding}", "raw.bin"))
            assert body is None and str(err) == (f"too_large: more than {len(raw) - 1} "
                                                 f"decoded bytes > max_bytes {len(raw) - 1}")


def test_content_encoding_max_bytes_counts_decoded_bytes(srv):
    # gzip of a JPEG is about as large as the JPEG: max_bytes = the image size is enough.
    assert fetcher(max_bytes=len(DATA)).fetch(srv.url("encoded/gzip", NAME)) == (DATA, None)
    body, err = fetcher(max_bytes=len(DATA) - 1).fetch(srv.url("encoded/gzip", NAME))
    assert body is None and str(err).startswith("too_large: ")
    # An encoded body far over max_bytes is refused by its Content-Length, unread.
    f = fetcher(max_bytes=1000)
    body, err = f.fetch(srv.url("encoded/gzip", NAME))
    assert body is None and str(err).startswith("too_large: ")
    assert str(err).endswith(" bytes (gzip-encoded) > max_bytes 1000")


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "gzip,br"])
def test_compression_bomb_stopped_at_max_bytes(srv, coding):
    """64 MiB of zeros (a few KiB encoded) with max_bytes 1 MiB: too_large after about
    1 MiB is decoded; the 64 MiB are never in memory."""
    import tracemalloc

    from tests.http_server import bomb
    bomb(coding, 64)  # made (and cached) before measuring
    f = fetcher(max_bytes=1 << 20)
    tracemalloc.start()
    try:
        body, err = f.fetch(srv.url(f"bomb/{urllib.parse.quote(coding)}/64", NAME))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert body is None
    assert str(err) == f"too_large: more than {1 << 20} decoded bytes > max_bytes {1 << 20}"
    assert peak < 8 << 20, peak
    assert f.stats["failed:too_large"] == 1


def test_decode_content_pieces_are_bounded():
    import gzip

    from pipeline.storage.http import decode_content
    blob = gzip.compress(bytes(16 << 20))
    pieces = decode_content([blob], ["gzip"], 4096)
    taken = [next(pieces) for _ in range(10)]
    assert all(len(p) <= 4096 for p in taken)  # lazily: only what is asked for is decoded


def test_cut_compressed_stream_is_truncated(srv):
    for coding in ("gzip", "deflate", "br"):
        url = srv.url(f"encodedcut/{coding}", NAME)
        body, err = fetcher().fetch(url)
        assert body is None
        assert str(err).startswith(f"failed_to_download: {url}: truncated body: the "
                                   f"{coding} stream ends before its end (got ")


def test_encoded_body_shorter_than_content_length(srv):
    from tests.http_server import encode
    encoded = encode(DATA, "gzip")[0]
    url = srv.url("encodedtruncated/gzip", NAME)
    f = fetcher()
    body, err = f.fetch(url)
    assert body is None
    assert str(err) == (f"failed_to_download: {url}: truncated body: got "
                        f"{len(encoded) // 2} of {len(encoded)} bytes")
    assert f.stats["failed:truncated"] == 1
    assert f.fetch(srv.url("ok", NAME))[0] == DATA


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_bad_compressed_data(srv, coding):
    # The coding named, but the body is the JPEG itself.
    url = srv.url(f"encoded/fake-{coding}", NAME)
    f = fetcher()
    body, err = f.fetch(url)
    assert body is None
    assert str(err).startswith(f"failed_to_download: {url}: bad content encoding: bad "
                               f"{coding} data: ")
    assert f.stats["failed:decoding"] == 1


@pytest.mark.parametrize("coding", ["compress", "zstd", "x-custom"])
def test_unknown_content_encoding(srv, coding):
    url = srv.url(f"encoded/{coding}", NAME)
    f = fetcher()
    body, err = f.fetch(url)
    assert body is None
    assert str(err).startswith(f"failed_to_download: {url}: unsupported Content-Encoding "
                               f"{coding!r} (decoded: ")
    assert f.stats["failed:content_encoding"] == 1
