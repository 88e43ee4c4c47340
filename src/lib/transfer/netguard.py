"""Which URLs the downloader may fetch, and the addresses it may connect to (the SSRF guard).

The rule applies to the addresses a host resolves to, and those same addresses are what
the connection uses (lib.transfer.pinned): no second lookup, no rebinding. Pure except
for `resolve`, which tests inject. docs/explanation/security.md lists what is refused and why.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from lib.transfer.failures import ArchiveFailure, Kind, Stage, fail

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]  # (host, port) -> addresses, as getaddrinfo gives

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL_LENGTH = 8192
# DNS limits (RFC 1035): a name that breaks them can never resolve, whatever the resolver.
MAX_HOST_NAME_LENGTH = 253
MAX_LABEL_LENGTH = 63
# getaddrinfo's answers for "this name has no address" (NXDOMAIN, or no A/AAAA record):
# asking again will not create it. EAI_AGAIN (no answer from DNS) stays a transient
# connection failure. EAI_NODATA is not defined everywhere.
NO_SUCH_NAME_ERRORS = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) if code is not None
)
# Whitespace and control characters have no place in a URL; a backslash is read as "/"
# by browsers (WHATWG) but as a userinfo/path character by RFC 3986 parsers, the
# classic parser-differential trick. Refused rather than guessed at.
_UNSAFE_CHARACTERS = re.compile(r"[\x00-\x20\x7f\\]")


def _networks(table: Iterable[tuple[str, str]]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(cidr), why) for cidr, why in table)


# IANA's special-purpose registries: nothing here is a public image host.
BLOCKED_V4 = _networks(
    [
        ("0.0.0.0/8", "'this network' (0.0.0.0 reaches the local host)"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (cloud metadata lives at 169.254.169.254)"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved (including broadcast)"),
    ]
)
BLOCKED_V6 = _networks(
    [
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::/96", "IPv4-compatible (deprecated)"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("2001::/23", "IETF protocol assignments (Teredo, ORCHID, ...)"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("fc00::/7", "unique local (private)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
    ]
)
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address a v6 address carries and how, for forms that reach it."""
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", address.ipv4_mapped
    if address in NAT64:
        return "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return "6to4", address.sixtofour
    return None


def refusal(address: IPAddress, allowed: Iterable[IPNetwork] = ()) -> str | None:
    """Why the downloader must not connect to `address`, or None when it may."""
    allowed = tuple(allowed)
    if any(address.version == net.version and address in net for net in allowed):
        return None
    if isinstance(address, ipaddress.IPv4Address):
        table: tuple[tuple[IPNetwork, str], ...] = BLOCKED_V4
    else:
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            how, inner = embedded
            reason = refusal(inner, allowed)
            return None if reason is None else f"{how} {inner}, {reason}"
        table = BLOCKED_V6
    for network, why in table:
        if address in network:
            return why
    if isinstance(address, ipaddress.IPv6Address) and address not in GLOBAL_UNICAST_V6:
        return "reserved (outside 2000::/3)"
    return None


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order (one lookup)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class Target:
    """A URL the guard accepted, and where to connect for it."""

    scheme: str
    host: str  # as sent in Host and SNI, checked against the certificate
    port: int
    request_uri: str  # path and query, percent-encoded
    addresses: tuple[str, ...]  # every one checked; tried in this order


def host_name_problem(host: str) -> str | None:
    """Why `host` (no trailing dot) cannot be a DNS name, or None. IP literals pass."""
    if ":" in host:
        return None  # an IPv6 literal; the address check decides
    if len(host) > MAX_HOST_NAME_LENGTH:
        return f"host name is longer than {MAX_HOST_NAME_LENGTH} characters"
    labels = host.split(".")
    if any(not label for label in labels):
        return f"host {host} has an empty label"
    if any(len(label) > MAX_LABEL_LENGTH for label in labels):
        return f"host name has a label longer than {MAX_LABEL_LENGTH} characters"
    return None


def _refused(message: str) -> ArchiveFailure:
    return fail(Stage.DOWNLOAD, Kind.REFUSED_URL, message)


class UrlGuard:
    def __init__(self, allowed: Iterable[IPNetwork] = (), resolver: Resolver = resolve) -> None:
        self.allowed = tuple(allowed)
        self._resolve = resolver

    def check(self, url: str) -> Target:
        """The Target for `url`; raises ArchiveFailure: refused_url (including names that
        cannot exist), no_such_host (DNS says so), connection (DNS did not answer).
        Messages name the host, never the query or userinfo (signatures, passwords)."""
        if len(url) > MAX_URL_LENGTH:
            raise _refused(f"URL is longer than {MAX_URL_LENGTH} characters")
        if _UNSAFE_CHARACTERS.search(url):
            raise _refused("URL contains whitespace, a control character or a backslash")
        try:
            parts = parse_url(url)
        except LocationParseError:
            raise _refused("URL cannot be parsed (bad host or port)") from None
        scheme = (parts.scheme or "").lower()
        if scheme not in DEFAULT_PORTS:
            raise _refused(f"scheme {scheme or 'none'!r} refused: only http and https")
        if parts.auth is not None:
            raise _refused("URL carries userinfo (credentials) before the host")
        dns_host = (parts.host or "").strip("[]")
        host = dns_host.rstrip(".")  # certificates and Host headers carry no trailing dot
        if not host:
            raise _refused("URL has no host")
        port = parts.port if parts.port is not None else DEFAULT_PORTS[scheme]
        if not 0 < port < 65536:
            raise _refused(f"port {port} refused")
        addresses = self._addresses(dns_host, host, port)
        return Target(scheme, host, port, parts.request_uri, addresses)

    def _addresses(self, dns_host: str, host: str, port: int) -> tuple[str, ...]:
        problem = host_name_problem(host)
        if problem is not None:
            raise _refused(problem)
        try:
            found = self._resolve(dns_host, port)
        except UnicodeError:
            # The idna codec refused the name: no lookup happened, and none ever could.
            raise _refused(f"host {host[:100]} is not a valid host name (IDNA)") from None
        except socket.gaierror as error:
            if error.errno in NO_SUCH_NAME_ERRORS:
                raise fail(
                    Stage.DOWNLOAD, Kind.NO_SUCH_HOST, f"host {host} does not exist (DNS)"
                ) from None
            raise fail(Stage.DOWNLOAD, Kind.CONNECTION, f"could not resolve {host}") from None
        except OSError:
            raise fail(Stage.DOWNLOAD, Kind.CONNECTION, f"could not resolve {host}") from None
        if not found:
            raise fail(Stage.DOWNLOAD, Kind.CONNECTION, f"{host} resolved to no address")
        # Refuse the host if ANY of its addresses is refused: mixing a private address
        # into a public name's answers is exactly what a rebinding attacker does.
        for raw in found:
            address = ipaddress.ip_address(raw.split("%", 1)[0])
            reason = refusal(address, self.allowed)
            if reason is not None:
                where = f"address {address}" if raw == host else f"host {host} ({address})"
                raise _refused(f"{where} refused: {reason}")
        return tuple(dict.fromkeys(found))
