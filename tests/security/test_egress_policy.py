"""Issue 12 item 3 and the download deadline of item 7: URL downloads obey an egress policy
(no loopback/private/link-local/... address unless allowed, every redirect hop checked,
the connection made to the checked address) and a whole-request deadline.

Every server here listens on loopback (127.0.0.1, or 127.0.0.2 as a second loopback
address); an address that is refused is never connected to, and the only names
resolved are fake ones answered by a patched ``socket.getaddrinfo`` with loopback
addresses."""

from __future__ import annotations

import ipaddress
import socket
import time
import urllib.parse

import pytest

from pipeline.storage.egress import EgressPolicy, category
from pipeline.storage.http import HttpFetcher
from pipeline.spec import DownloadSpec
from tests.http_server import PHOTOS, FaultHTTPServer

NAME = "000000000802.jpg"  # 62406 bytes
DATA = open(f"{PHOTOS}/{NAME}", "rb").read()
LOOPBACK = ("127.0.0.0/8",)


@pytest.fixture(scope="module")
def servers():
    with FaultHTTPServer() as a, FaultHTTPServer(host="127.0.0.2") as b:
        yield a, b


@pytest.fixture
def srv(servers):
    for s in servers:
        s.reset()
    return servers


def fetcher(**kw) -> HttpFetcher:
    base = {"timeout_s": 2.0, "retries": 0, "backoff_s": 0.01, "threads": 2}
    return HttpFetcher(DownloadSpec(**{**base, **kw}), 10 * 2**20)


def redirect_to(server: FaultHTTPServer, target: str) -> str:
    return server.url("redirectto/" + urllib.parse.quote(target, safe=""), NAME)


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"),
    ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fd00::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("100.64.0.1", "shared (CGNAT)"), ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("240.0.0.1", "reserved"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.1", "private"),
    ("2002:7f00:1::", "loopback"),        # 6to4 of 127.0.0.1
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
    ("8.8.8.8", None), ("2606:4700:4700::1111", None)])
def test_default_refused_categories(address, expected):
    assert category(ipaddress.ip_address(address)) == expected


def test_policy_allow_and_deny():
    ip = ipaddress.ip_address
    assert EgressPolicy().refusal(ip("127.0.0.1")).startswith("loopback address refused")
    assert EgressPolicy(allow=LOOPBACK).refusal(ip("127.0.0.1")) is None
    assert EgressPolicy(allow=LOOPBACK).refusal(ip("10.0.0.1")) is not None
    both = EgressPolicy(allow=LOOPBACK, deny=("127.0.0.1/32",))
    assert "download.deny_networks" in both.refusal(ip("127.0.0.1"))   # deny wins
    assert both.refusal(ip("127.0.0.5")) is None
    assert "deny_networks" in EgressPolicy(deny=("8.8.8.0/24",)).refusal(ip("8.8.8.8"))
    with pytest.raises(ValueError):
        DownloadSpec(allow_networks=("not-a-network",))


def test_loopback_refused_by_default_without_a_request(srv):
    a, _ = srv
    f = fetcher()
    body, err = f.fetch(a.url("ok", NAME))
    assert body is None and err.reason.value == "egress_refused"
    assert str(err) == (f"egress_refused: {a.url('ok', NAME)}: 127.0.0.1: loopback address "
                        "refused (add it to download.allow_networks to allow it)")
    assert a.counts == {} and f.stats["failed:egress_refused"] == 1
    f.close()
    ok = fetcher(allow_networks=LOOPBACK)
    assert ok.fetch(a.url("ok", NAME)) == (DATA, None)
    ok.close()


def test_deny_networks_wins_over_allow(srv):
    a, _ = srv
    f = fetcher(allow_networks=LOOPBACK, deny_networks=("127.0.0.1/32",))
    body, err = f.fetch(a.url("ok", NAME))
    assert body is None and "in download.deny_networks (127.0.0.1/32)" in str(err)
    assert a.counts == {}
    f.close()


def test_redirect_hop_is_checked(srv):
    """Allowed first hop (127.0.0.1), redirect to a refused one (127.0.0.2): refused, and
    the second server never sees a request; with 127.0.0.0/8 allowed it is followed."""
    a, b = srv
    url = redirect_to(a, b.url("ok", NAME))
    f = fetcher(allow_networks=("127.0.0.1/32",))
    body, err = f.fetch(url)
    assert body is None and str(err).startswith(f"egress_refused: {url}: 127.0.0.2: loopback")
    assert sum(a.counts.values()) == 1 and b.counts == {}
    f.close()
    ok = fetcher(allow_networks=LOOPBACK)
    assert ok.fetch(url) == (DATA, None)
    assert b.counts[f"/ok/{NAME}"] == 1
    ok.close()


def test_redirect_limit_and_schemes(srv):
    a, _ = srv
    f = fetcher(allow_networks=LOOPBACK, max_redirects=2)
    # a chain of 3 redirects (each to the next) ending at the photo
    url = a.url("ok", NAME)
    for _ in range(3):
        url = redirect_to(a, url)
    body, err = f.fetch(url)
    assert body is None and str(err).endswith("too many redirects")
    assert sum(a.counts.values()) == 3             # the first request and two redirects
    assert fetcher(allow_networks=LOOPBACK, max_redirects=3).fetch(url) == (DATA, None)
    for target in ("file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:70/x"):
        body, err = f.fetch(redirect_to(a, target))
        assert body is None and "unsupported scheme" in str(err), (target, err)
    f.close()


@pytest.fixture
def fake_dns(monkeypatch):
    """``socket.getaddrinfo`` answering ``evil.test`` with 127.0.0.1 and ``rebind.test``
    with 127.0.0.1 the first time, 127.0.0.2 afterwards (DNS rebinding); other names as
    usual. ``calls`` counts the fake lookups by name."""
    real = socket.getaddrinfo
    calls: dict[str, int] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if host in ("evil.test", "rebind.test"):
            calls[host] = calls.get(host, 0) + 1
            ip = "127.0.0.2" if host == "rebind.test" and calls[host] > 1 else "127.0.0.1"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, int(port)))]
        return real(host, port, *args, **kwargs)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return calls


def test_name_resolving_to_loopback_refused(srv, fake_dns):
    a, _ = srv
    url = f"http://evil.test:{a.port}/ok/{NAME}"
    f = fetcher()
    body, err = f.fetch(url)
    assert body is None and str(err) == (f"egress_refused: {url}: evil.test resolves to "
                                         "127.0.0.1: loopback address refused (add it to "
                                         "download.allow_networks to allow it)")
    assert a.counts == {}
    f.close()


def test_connects_to_the_checked_address(srv, fake_dns):
    """The name is resolved once; the socket goes to that address (127.0.0.1, allowed)
    with the name in the Host header, never to what a second lookup would say
    (127.0.0.2, refused here, where another server listens)."""
    a, b = srv
    url = f"http://rebind.test:{a.port}/ok/{NAME}"
    f = fetcher(allow_networks=("127.0.0.1/32",))
    assert f.fetch(url) == (DATA, None)
    assert fake_dns["rebind.test"] == 1
    assert a.hosts == [f"rebind.test:{a.port}"] and b.counts == {}
    f.close()


def test_slow_body_hits_the_total_deadline(srv):
    """A body trickled in small pieces (each read well within timeout_s, the whole in 6 s)
    stops at max_time_s, also on a pooled (reused) connection."""
    a, _ = srv
    f = fetcher(allow_networks=LOOPBACK, timeout_s=3.0, max_time_s=0.5)
    assert f.fetch(a.url("ok", NAME)) == (DATA, None)   # the connection is now pooled
    t0 = time.monotonic()
    body, err = f.fetch(a.url("trickle/6", NAME))
    elapsed = time.monotonic() - t0
    assert body is None and str(err) == (f"failed_to_download: {a.url('trickle/6', NAME)}: "
                                         "download took longer than max_time_s 0.5 s")
    assert elapsed < 1.5, elapsed
    t0 = time.monotonic()
    body, err = f.fetch(a.url("slow/4", NAME))  # headers after 4 s: timeout_s would wait 3
    assert body is None and "max_time_s 0.5 s" in str(err)
    assert time.monotonic() - t0 < 1.5
    assert f.stats["failed:timeout"] == 2
    f.close()


@pytest.mark.parametrize("url, address", [
    ("http://[::1]:9/x", "::1"), ("http://0x7f000001:9/x", "127.0.0.1"),
    ("http://2130706433:9/x", "127.0.0.1"), ("http://127.1:9/x", "127.0.0.1"),
    ("http://[::ffff:127.0.0.1]:9/x", "::ffff:127.0.0.1"), ("http://0.0.0.0:9/x", "0.0.0.0"),
    ("https://169.254.169.254/latest/meta-data/", "169.254.169.254")])
def test_address_spellings_are_refused_before_connecting(url, address):
    """Hex, decimal, short and IPv6-mapped spellings of internal addresses are judged by
    the address they resolve to (all refused here, so nothing is ever connected to)."""
    f = fetcher()
    body, err = f.fetch(url)
    assert body is None and err.reason.value == "egress_refused", err
    assert f"{address}: " in str(err) and "download.allow_networks" in str(err)
    f.close()


def test_retry_waits_end_at_the_deadline(srv):
    """A Retry-After of 10 s (capped at 30) would hold the thread; the deadline ends it."""
    a, _ = srv
    f = fetcher(allow_networks=LOOPBACK, retries=2, max_time_s=0.5)
    t0 = time.monotonic()
    body, err = f.fetch(a.url("retryafter/10", NAME))
    assert body is None and "download took longer than max_time_s 0.5 s" in str(err)
    assert time.monotonic() - t0 < 1.5
    f.close()
