"""Network egress policy for URL downloads: which addresses a download may connect to.

A URL manifest is written by strangers, and a worker runs inside a cluster next to
metadata services, object stores and dashboards. By default a download refuses
loopback, link-local (``169.254.0.0/16``: cloud metadata), private (RFC 1918, ULA
``fc00::/7``), shared (CGNAT ``100.64.0.0/10``), multicast, unspecified, reserved and
other non-global addresses (``ipaddress`` properties; an IPv4 address embedded in IPv6 -
mapped, 6to4, NAT64 - is judged as itself). ``download.allow_networks`` (CIDR) lets
such networks through; ``download.deny_networks`` refuses networks, and wins over both.

The check is made on the resolved address of every connection, so every redirect hop
too, and the connection is made to exactly the address that was checked: the name is
resolved once (``socket.getaddrinfo``), and the socket connects to that IP while the
request keeps the name in its ``Host`` header and TLS SNI/certificate check (no
DNS-rebinding window between check and connect). ``guarded_adapter`` builds a
``requests`` adapter whose urllib3 connections do this; a refusal raises
``EgressRefused`` (a ``ValueError``: never retried).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import connection

from pipeline.storage import deadline

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SHARED = ipaddress.ip_network("100.64.0.0/10")   # RFC 6598 carrier-grade NAT
NAT64 = ipaddress.ip_network("64:ff9b::/96")     # RFC 6052 well-known prefix

_CATEGORIES = (("is_unspecified", "unspecified"), ("is_loopback", "loopback"),
               ("is_link_local", "link-local"), ("is_multicast", "multicast"),
               ("is_reserved", "reserved"), ("is_private", "private"))


class EgressRefused(ValueError):
    """A download refused by the egress policy: ``host`` resolved to ``address``, which
    is ``why`` (text naming the setting that would change it)."""

    def __init__(self, host: str, address: str, why: str):
        where = address if host.strip("[]") == address else f"{host} resolves to {address}"
        super().__init__(f"{where}: {why}")
        self.host, self.address, self.why = host, address, why


def _embedded(ip: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped, 6to4 or NAT64 IPv6 address, else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def category(ip: IPAddress) -> str | None:
    """Why ``ip`` is refused by default (``"loopback"``, ``"private"``, ``"shared
    (CGNAT)"``, ``"not globally routable"``, ...), or None for a public address."""
    ip = _embedded(ip)
    for attr, name in _CATEGORIES:
        if getattr(ip, attr):
            return name
    if ip in SHARED:
        return "shared (CGNAT)"
    if not ip.is_global:
        return "not globally routable"
    return None


class EgressPolicy:
    """``allow``/``deny``: CIDR texts (``download.allow_networks``/``deny_networks``).
    Raises ``ValueError`` for a bad CIDR."""

    def __init__(self, allow: Iterable[str] = (), deny: Iterable[str] = ()):
        self.allow = tuple(ipaddress.ip_network(n, strict=False) for n in allow)
        self.deny = tuple(ipaddress.ip_network(n, strict=False) for n in deny)

    def refusal(self, ip: IPAddress) -> str | None:
        """None if a download may connect to ``ip``, else why not (naming the setting)."""
        for candidate in {ip, _embedded(ip)}:
            for net in self.deny:
                if candidate.version == net.version and candidate in net:
                    return f"in download.deny_networks ({net})"
        for candidate in {ip, _embedded(ip)}:
            for net in self.allow:
                if candidate.version == net.version and candidate in net:
                    return None
        why = category(ip)
        if why is None:
            return None
        return f"{why} address refused (add it to download.allow_networks to allow it)"

    def resolve(self, host: str, port: int) -> tuple[socket.AddressFamily, str]:
        """Resolve ``host`` once and return ``(family, ip)`` of its first permitted
        address. Raises ``socket.gaierror`` (no such name) or ``EgressRefused`` (every
        address refused; the message names the first)."""
        first: tuple[str, str] | None = None
        for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            text = str(sockaddr[0]).split("%", 1)[0]
            why = self.refusal(ipaddress.ip_address(text))
            if why is None:
                return family, text
            first = first or (text, why)
        if first is None:
            raise socket.gaierror(socket.EAI_NONAME, f"no address for {host}")
        raise EgressRefused(host, *first)


def _guarded(base: type[HTTPConnection], policy: EgressPolicy) -> type[HTTPConnection]:
    """``base`` whose sockets go to the checked address (see the module docstring) and
    are attached to the thread's ``deadline.Watch``."""

    class Guarded(base):  # type: ignore[misc, valid-type]
        def _new_conn(self) -> socket.socket:
            watch = deadline.current()
            if watch is not None:
                watch.check()
            try:
                _, ip = policy.resolve(self._dns_host, self.port)
            except socket.gaierror as e:
                raise NameResolutionError(self.host, self, e) from e
            try:
                sock = connection.create_connection(
                    (ip, self.port), self.timeout, source_address=self.source_address,
                    socket_options=self.socket_options)
            except socket.timeout as e:
                raise ConnectTimeoutError(self, f"Connection to {self.host} ({ip}) timed "
                                          f"out. (connect timeout={self.timeout})") from e
            except OSError as e:
                raise NewConnectionError(self, f"Failed to establish a new connection to "
                                         f"{ip}: {e}") from e
            if watch is not None:
                watch.attach(sock)
            return sock

        def getresponse(self, *args, **kwargs):
            watch = deadline.current()
            if watch is not None:   # a pooled connection reused by this request
                watch.attach(self.sock)
            return super().getresponse(*args, **kwargs)

    Guarded.__name__ = f"Guarded{base.__name__}"
    return Guarded


class GuardedAdapter(HTTPAdapter):
    """A ``requests`` adapter whose connections obey ``policy`` (``HTTPAdapter``'s other
    arguments as keywords)."""

    def __init__(self, policy: EgressPolicy, **kwargs):
        self.policy = policy
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        pools = {}
        for scheme, pool, conn in (("http", HTTPConnectionPool, HTTPConnection),
                                   ("https", HTTPSConnectionPool, HTTPSConnection)):
            pools[scheme] = type(f"Guarded{pool.__name__}", (pool,),
                                 {"ConnectionCls": _guarded(conn, self.policy)})
        self.poolmanager.pool_classes_by_scheme = pools
