"""The SSRF guard's rules, without servers: address table, URL parsing, resolution."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from lib.archive.retry import ErrorClass, classify
from lib.transfer.failures import ArchiveFailure, Kind
from lib.transfer.netguard import Resolver, UrlGuard, refusal, resolve

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.100.100.200", "shared address space"),  # Alibaba's metadata service
        ("0.0.0.0", "this network"),  # noqa: S104 - an address under test, not a bind
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "IPv4-mapped 127.0.0.1, loopback"),
        ("::ffff:169.254.169.254", "IPv4-mapped 169.254.169.254, link-local"),
        ("64:ff9b::7f00:1", "NAT64 127.0.0.1, loopback"),
        ("64:ff9b::a9fe:a9fe", "NAT64 169.254.169.254, link-local"),
        ("2002:7f00:1::1", "6to4 127.0.0.1, loopback"),
        ("2002:c0a8:101::", "6to4 192.168.1.1, private"),
        ("::127.0.0.1", "IPv4-compatible"),
        ("fd00:ec2::254", "unique local"),  # AWS's IPv6 metadata endpoint
        ("fe80::1", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("100::1", "discard-only"),
        ("4000::1", "outside 2000::/3"),
        ("8.8.8.8", None),
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),
        ("2002:808:808::1", None),
    ],
)
def test_address_table(address: str, reason: str | None) -> None:
    found = refusal(ipaddress.ip_address(address))
    if reason is None:
        assert found is None
    else:
        assert found is not None
        assert reason in found


@pytest.mark.parametrize(
    ("address", "allowed", "refused"),
    [
        ("127.0.0.1", "127.0.0.0/8", False),
        ("127.0.0.1", "127.0.0.2/32", True),
        ("::ffff:127.0.0.1", "127.0.0.0/8", False),  # the mapped form is the same host
        ("10.1.2.3", "10.1.0.0/16", False),
        ("10.2.0.1", "10.1.0.0/16", True),
        ("fd00::1", "fd00::/8", False),
        ("fd00::1", "10.0.0.0/8", True),
    ],
)
def test_the_allowlist_opens_only_its_networks(address: str, allowed: str, refused: bool) -> None:
    found = refusal(ipaddress.ip_address(address), [ipaddress.ip_network(allowed)])
    assert (found is not None) is refused


def fixed(answers: dict[str, list[str]]) -> UrlGuard:
    return UrlGuard((), lambda host, port: answers[host])


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("file:///etc/passwd", "scheme 'file'"),
        ("gopher://127.0.0.1:70/_GET", "scheme 'gopher'"),
        ("ftp://example.com/a.png", "scheme 'ftp'"),
        ("dict://127.0.0.1:11211/", "scheme 'dict'"),
        ("data:image/png;base64,iVBORw0KGgo=", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("//example.com/a.png", "scheme 'none'"),
        ("http:///a.png", "no host"),
        ("http://:80/a.png", "no host"),
        ("http://user:pw@example.com/a.png", "userinfo"),
        ("http://example.com@127.0.0.1/a.png", "userinfo"),
        ("http://127.0.0.1\\@example.com/", "backslash"),
        ("http://example.com/a.png\r\nX-Injected: 1", "control character"),
        ("http://exa mple.com/", "whitespace"),
        ("http://example.com:99999/", "cannot be parsed"),
        ("http://example.com:0/", "port 0"),
        ("http://ｌｏｃａｌｈｏｓｔ/", "cannot be parsed"),
        ("http://example.com/" + "a" * 9000, "longer than"),
        ("http://" + "a" * 64 + ".example.com/a.png", "label longer than 63"),
        ("http://" + "abcdefghi." * 26 + "com/a.png", "longer than 253"),
        ("http://cdn..example.com/a.png", "empty label"),
        ("http://.example.com/a.png", "empty label"),
    ],
)
def test_urls_refused_before_any_lookup(url: str, fragment: str) -> None:
    def no_dns(host: str, port: int) -> list[str]:
        raise AssertionError(f"resolved {host!r}")

    with pytest.raises(ArchiveFailure) as excinfo:
        UrlGuard((), no_dns).check(url)
    assert excinfo.value.failure.kind is Kind.REFUSED_URL
    assert fragment in str(excinfo.value)
    assert "pw" not in str(excinfo.value)


def test_names_at_the_dns_limits_are_looked_up() -> None:
    looked_up: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["93.184.216.34"]

    longest = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters
    for host in ("a" * 63 + ".example.com", longest, longest + "."):
        UrlGuard((), resolver).check(f"http://{host}/a.png")
    assert looked_up == ["a" * 63 + ".example.com", longest, longest + "."]


@pytest.mark.parametrize(
    ("host", "resolves_to"),
    [
        ("2130706433", "127.0.0.1"),  # decimal
        ("0177.0.0.1", "127.0.0.1"),  # octal
        ("0x7f000001", "127.0.0.1"),  # hex
        ("0x7f.1", "127.0.0.1"),  # mixed short form
        ("127.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0", "0.0.0.0"),  # noqa: S104 - an address under test, not a bind
        ("localhost", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("[::ffff:7f00:1]", "::ffff:127.0.0.1"),
        ("[64:ff9b::a9fe:a9fe]", "64:ff9b::a9fe:a9fe"),
        ("[2002:a9fe:a9fe::]", "2002:a9fe:a9fe::"),
        ("[::1]", "::1"),
    ],
)
def test_every_spelling_of_an_address_meets_the_same_check(host: str, resolves_to: str) -> None:
    # The system resolver interprets these forms (no DNS query for any of them), and the
    # check runs on what it returned: the address the connection would use.
    bare = host.strip("[]")
    assert resolves_to in resolve(bare, 80)
    with pytest.raises(ArchiveFailure) as excinfo:
        UrlGuard().check(f"http://{host}/a.png")
    assert excinfo.value.failure.kind is Kind.REFUSED_URL
    assert "refused" in str(excinfo.value)


def test_accepted_target_carries_what_the_connection_needs() -> None:
    calls: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return ["93.184.216.34", "2606:2800:220:1::1", "93.184.216.34"]

    target = UrlGuard((), resolver).check("HTTPS://CDN.Example.com./i/a%20b.png?X-Sig=s3cr3t")
    assert calls == [("cdn.example.com.", 443)]  # once; the dot kept for DNS
    assert target.scheme == "https"
    assert target.host == "cdn.example.com"  # for Host, SNI and the certificate
    assert target.port == 443
    assert target.request_uri == "/i/a%20b.png?X-Sig=s3cr3t"
    assert target.addresses == ("93.184.216.34", "2606:2800:220:1::1")


def test_a_name_with_any_refused_address_is_refused() -> None:
    guard = fixed({"rebind.test": ["93.184.216.34", "169.254.169.254"]})
    with pytest.raises(ArchiveFailure, match=r"host rebind.test \(169.254.169.254\) refused"):
        guard.check("http://rebind.test/a.png")


def test_a_failed_lookup_is_a_transient_connection_failure() -> None:
    def broken(host: str, port: int) -> list[str]:
        raise OSError("Temporary failure in name resolution")

    with pytest.raises(ArchiveFailure) as excinfo:
        UrlGuard((), broken).check("http://cdn.example.com/a.png")
    assert excinfo.value.failure.kind is Kind.CONNECTION


def raising(error: BaseException) -> Resolver:
    def resolver(host: str, port: int) -> list[str]:
        raise error

    return resolver


@pytest.mark.parametrize(
    ("error", "kind", "error_class", "fragment"),
    [
        (
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            Kind.NO_SUCH_HOST,
            ErrorClass.PERMANENT,
            "does not exist",
        ),
        (
            socket.gaierror(socket.EAI_NODATA, "No address associated with hostname"),
            Kind.NO_SUCH_HOST,
            ErrorClass.PERMANENT,
            "does not exist",
        ),
        (
            UnicodeError("encoding with 'idna' codec failed (UnicodeError: label too long)"),
            Kind.REFUSED_URL,
            ErrorClass.PERMANENT,
            "not a valid host name",
        ),
        (
            socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
            Kind.CONNECTION,
            ErrorClass.TRANSIENT,
            "could not resolve",
        ),
        (
            socket.gaierror(socket.EAI_FAIL, "Non-recoverable failure in name resolution"),
            Kind.CONNECTION,
            ErrorClass.TRANSIENT,
            "could not resolve",
        ),
    ],
)
def test_a_name_that_cannot_resolve_fails_for_good_a_resolver_that_cannot_answer_does_not(
    error: BaseException, kind: Kind, error_class: ErrorClass, fragment: str
) -> None:
    with pytest.raises(ArchiveFailure) as excinfo:
        UrlGuard((), raising(error)).check("http://cdn.example.com/a.png?sig=s3cr3t")
    failure = excinfo.value.failure
    assert failure.kind is kind
    assert classify(failure) is error_class
    assert fragment in failure.message
    assert "cdn.example.com" in failure.message
    assert "s3cr3t" not in failure.message


def test_allowlisted_loopback_passes() -> None:
    target = UrlGuard(LOOPBACK).check("http://127.0.0.1:8080/a.png")
    assert target.addresses == ("127.0.0.1",)
    assert (target.scheme, target.host, target.port) == ("http", "127.0.0.1", 8080)
