"""The downloader against real loopback servers: pinning, redirects, caps, deadlines, TLS."""

from __future__ import annotations

import contextlib
import gzip
import io
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit import images
from devkit.upstream import StreamBody, UpstreamServer
from lib.archive.retry import ErrorClass, classify
from lib.transfer.download import Downloader
from lib.transfer.failures import ArchiveFailure, Kind
from lib.transfer.held import hold
from lib.transfer.imagetype import JPEG, PNG
from lib.transfer.netguard import NO_SUCH_NAME_ERRORS, resolve
from tests.support import HANG_SECONDS, certificate, fetch_image, https_server

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
IMAGE = images.png(8, 8)


# What tells "cut at its deadline" (under a second) from the limits a broken deadline would
# leave (the 30 s read timeout, a first deadline or a server that gives up a minute away):
# far above any slow moment of a busy machine, far below those.
TELLS_APART = 10.0


def soon(seconds: float = HANG_SECONDS) -> float:
    return time.monotonic() + seconds


class CountingResolver:
    """Maps test names to fixed addresses; counts lookups (a second one would be rebinding)."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host in self.answers:
            return self.answers[host]
        return [str(info[4][0]) for info in socket.getaddrinfo(host, port)]  # IP literals only


def failure_of(excinfo: pytest.ExceptionInfo[ArchiveFailure]) -> Any:
    return excinfo.value.failure


def test_connects_to_the_checked_address_with_the_original_host(upstream: UpstreamServer) -> None:
    upstream.add("/a.png", IMAGE)
    resolver = CountingResolver({"images.test": ["127.0.0.1"]})
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK, resolver=resolver)

    url = f"http://images.test:{upstream.port}/a.png?sig=1"
    image = fetch_image(downloader, url, deadline=soon())

    assert image.file.read() == IMAGE
    assert resolver.calls == ["images.test"]  # one lookup, no rebinding window
    [request] = upstream.requests
    assert request.headers["host"] == f"images.test:{upstream.port}"
    assert request.path == "/a.png?sig=1"
    assert request.headers["accept-encoding"] == "identity"


def test_a_name_with_one_private_address_among_public_ones_is_refused() -> None:
    resolver = CountingResolver({"mixed.test": ["93.184.216.34", "10.0.0.7"]})
    downloader = Downloader(max_bytes=10**6, resolver=resolver)
    with pytest.raises(ArchiveFailure) as excinfo:
        downloader.open("http://mixed.test/a.png", deadline=soon())
    assert failure_of(excinfo).kind is Kind.REFUSED_URL
    assert "10.0.0.7" in str(excinfo.value)


def test_image_stream_api_for_a_streaming_upload(upstream: UpstreamServer) -> None:
    body = images.jpeg()
    upstream.add("/j", body, content_type="text/html")  # the header is not believed
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    with downloader.open(upstream.url("/j"), deadline=soon()) as stream:
        assert stream.image_type is JPEG
        assert stream.declared_length == len(body)
        assert b"".join(stream) == body
        assert stream.bytes_read == len(body)
        with pytest.raises(RuntimeError, match="once"):
            list(stream)


def test_three_redirects_are_followed_and_each_hop_is_checked(upstream: UpstreamServer) -> None:
    upstream.add("/final.png", IMAGE)
    upstream.add("/r3", redirect_to="/final.png")
    upstream.add("/r2", redirect_to=upstream.url("/r3"), status=307)
    upstream.add("/r1", redirect_to="/r2", status=301)
    resolver = CountingResolver({})
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK, resolver=resolver)

    assert fetch_image(downloader, upstream.url("/r1"), deadline=soon()).size == len(IMAGE)
    assert len(resolver.calls) == 4  # every hop resolved and checked again

    upstream.add("/r0", redirect_to="/r1")
    with pytest.raises(ArchiveFailure, match="more than 3 redirects") as excinfo:
        fetch_image(downloader, upstream.url("/r0"), deadline=soon())
    assert failure_of(excinfo).kind is Kind.REFUSED_URL


@pytest.mark.parametrize(
    "location",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.2/",
        "http://[::1]/",
        "file:///etc/passwd",
        "http://10.1.2.3/x.png",
    ],
)
def test_a_redirect_to_a_refused_address_is_refused(
    upstream: UpstreamServer, location: str
) -> None:
    upstream.add("/go", redirect_to=location)
    only_the_stand_in = (ipaddress.ip_network("127.0.0.1/32"),)
    downloader = Downloader(max_bytes=10**6, allow_private_networks=only_the_stand_in)
    with pytest.raises(ArchiveFailure) as excinfo:
        fetch_image(downloader, upstream.url("/go"), deadline=soon())
    assert failure_of(excinfo).kind is Kind.REFUSED_URL


def held_body(gate: threading.Event, before: bytes = b"", after: bytes = IMAGE) -> Iterator[bytes]:
    """A body that sends `before`, then nothing until `gate` opens (the test's end)."""
    yield before
    gate.wait(HANG_SECONDS)
    yield after


def test_declared_size_over_the_cap_is_refused_before_reading(
    upstream: UpstreamServer, gate: threading.Event
) -> None:
    # No byte of the body comes while the test runs: reading any would end in a timeout.
    upstream.add("/big.png", StreamBody.of(lambda: held_body(gate), 5_000_000))
    downloader = Downloader(max_bytes=1_000_000, allow_private_networks=LOOPBACK)
    with pytest.raises(ArchiveFailure, match="5000000 bytes, over") as excinfo:
        downloader.open(upstream.url("/big.png"), deadline=soon())
    assert failure_of(excinfo).kind is Kind.TOO_LARGE


@pytest.mark.parametrize("framing", ["chunked", "lie"])
def test_the_cap_is_enforced_on_the_bytes_whatever_the_header(
    upstream: UpstreamServer, framing: str
) -> None:
    body = StreamBody.of(lambda: images.png_stream(size=3_000_000))
    if framing == "chunked":
        upstream.add("/endless.png", body, chunked=True)
    else:  # claims a small body, then keeps sending: only the declared bytes count
        upstream.add("/endless.png", body, content_length=500_000)
    downloader = Downloader(max_bytes=1_000_000, allow_private_networks=LOOPBACK)
    if framing == "chunked":
        with pytest.raises(ArchiveFailure) as excinfo:
            fetch_image(downloader, upstream.url("/endless.png"), deadline=soon())
        assert failure_of(excinfo).kind is Kind.TOO_LARGE
    else:
        # HTTP framing ends the body at Content-Length: never more than it said.
        image = fetch_image(downloader, upstream.url("/endless.png"), deadline=soon())
        assert image.size == 500_000


def test_content_length_longer_than_the_body_is_a_dropped_connection(
    upstream: UpstreamServer,
) -> None:
    upstream.add("/short.png", IMAGE, content_length=len(IMAGE) + 1000)
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    with pytest.raises(ArchiveFailure) as excinfo:
        fetch_image(downloader, upstream.url("/short.png"), deadline=soon())
    assert failure_of(excinfo).kind is Kind.CONNECTION


def test_a_drop_mid_body_is_a_connection_failure(upstream: UpstreamServer) -> None:
    upstream.add("/drop.png", images.png(size=400_000), drop_after=100_000)
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    with pytest.raises(ArchiveFailure, match="dropped") as excinfo:
        fetch_image(downloader, upstream.url("/drop.png"), deadline=soon())
    assert failure_of(excinfo).kind is Kind.CONNECTION


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
def test_a_slow_drip_body_cannot_outlast_the_deadline(
    upstream: UpstreamServer, connection: str
) -> None:
    # With "Connection: close", http.client lets go of the connection's socket as soon as
    # the headers are read: the deadline must still reach the socket the body comes on.
    # The drip would take 100 s; every read of it comes well within the read timeout.
    upstream.add(
        "/drip.png",
        images.png(size=200_000),
        drip_bytes_per_sec=2_000,
        headers={"Connection": connection},
    )
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    with downloader.open(upstream.url("/drip.png"), deadline=soon()) as stream:
        stream.set_deadline(soon(0.5))  # the body's deadline, however long the headers took
        started = time.monotonic()
        with pytest.raises(ArchiveFailure, match="deadline") as excinfo:
            hold(stream, stream.image_type)
    assert failure_of(excinfo).kind is Kind.TIMEOUT
    assert time.monotonic() - started < TELLS_APART


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
def test_a_stall_after_the_deadline_moved_earlier_is_cut(
    upstream: UpstreamServer, gate: threading.Event, connection: str
) -> None:
    upstream.add(
        "/stall.png",
        StreamBody.of(lambda: held_body(gate, IMAGE[:40], IMAGE[40:]), len(IMAGE)),
        headers={"Connection": connection},
    )
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    with downloader.open(upstream.url("/stall.png"), deadline=soon()) as stream:
        stream.set_deadline(soon(0.5))  # as the worker does once it knows the size
        started = time.monotonic()
        with pytest.raises(ArchiveFailure) as excinfo:
            hold(stream, stream.image_type)
    assert failure_of(excinfo).kind is Kind.TIMEOUT
    # Cut at the moved deadline, not at the first one (a minute away) nor a read timeout.
    assert time.monotonic() - started < TELLS_APART


def test_a_server_that_never_answers_is_cut_at_the_deadline(
    upstream: UpstreamServer, gate: threading.Event
) -> None:
    upstream.add("/late.png", IMAGE, gate=gate)  # no status line while the test runs
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    started = time.monotonic()
    with pytest.raises(ArchiveFailure) as excinfo:
        fetch_image(downloader, upstream.url("/late.png"), deadline=soon(0.8))
    assert failure_of(excinfo).kind is Kind.TIMEOUT
    # Cut at the deadline, not at the 30 s read timeout.
    assert time.monotonic() - started < TELLS_APART


@contextlib.contextmanager
def header_dripper() -> Iterator[int]:
    """A server that sends a status line, then one header byte every 50 ms, for a minute at
    the most (or until the test ends)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                for _ in range(int(HANG_SECONDS / 0.05)):
                    if stop.wait(0.05):
                        break
                    conn.sendall(b"a")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=2)


def test_headers_dripped_a_byte_at_a_time_are_cut_by_the_watchdog() -> None:
    # Every single read arrives well within the socket timeout: only the total
    # deadline (the watchdog) can stop this one.
    with header_dripper() as port:
        downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
        started = time.monotonic()
        with pytest.raises(ArchiveFailure) as excinfo:
            downloader.open(f"http://127.0.0.1:{port}/x.png", deadline=soon(0.7))
    assert failure_of(excinfo).kind is Kind.TIMEOUT
    # Cut at the deadline, not when the dripper gives up.
    assert time.monotonic() - started < TELLS_APART


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ({"Content-Encoding": "gzip"}, "gzip-encoded body"),
        ({"Content-Encoding": "br"}, "br-encoded body"),
    ],
)
def test_compressed_bodies_are_refused_not_inflated(
    upstream: UpstreamServer, headers: dict[str, str], fragment: str
) -> None:
    upstream.add("/z.png", gzip.compress(images.png(size=200_000)), headers=headers)
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    with pytest.raises(ArchiveFailure, match=fragment) as excinfo:
        downloader.open(upstream.url("/z.png"), deadline=soon())
    assert failure_of(excinfo).kind is Kind.NOT_IMAGE


def test_html_served_as_png_is_not_an_image(upstream: UpstreamServer) -> None:
    upstream.add("/h.png", b"<!doctype html><title>expired</title>", content_type="image/png")
    downloader = Downloader(max_bytes=10**6, allow_private_networks=LOOPBACK)
    with pytest.raises(ArchiveFailure) as excinfo:
        downloader.open(upstream.url("/h.png"), deadline=soon())
    assert failure_of(excinfo).kind is Kind.NOT_IMAGE


def test_spool_keeps_small_images_in_memory_and_large_ones_on_disk(
    upstream: UpstreamServer,
) -> None:
    upstream.add("/s.png", IMAGE)
    upstream.add("/l.png", StreamBody.of(lambda: images.png_stream(size=3_000_000), 3_000_000))
    downloader = Downloader(max_bytes=10**7, allow_private_networks=LOOPBACK)
    with downloader.open(upstream.url("/s.png"), deadline=soon()) as stream:
        small = hold(stream, stream.image_type)
    with downloader.open(upstream.url("/l.png"), deadline=soon()) as stream:
        large = hold(stream, stream.image_type)
    assert small.image_type is PNG
    assert isinstance(small.file._spool, io.BytesIO)  # the reader's spool: in memory
    assert isinstance(large.file._spool, io.FileIO)  # a /tmp file, not memory
    assert large.size == 3_000_000
    assert b"".join(large.chunks()) == b"".join(images.png_stream(size=3_000_000))


# -- HTTPS: SNI and certificate checks use the URL's host name, not the pinned address ----


def test_https_to_a_pinned_address_verifies_the_url_host(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    cert, key = certificate(tmp_path, "images.test")
    sni: list[str | None] = []
    resolver = CountingResolver({"images.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    downloader = Downloader(
        max_bytes=10**6,
        allow_private_networks=LOOPBACK,
        resolver=resolver,
        ca_certs=str(cert),
    )
    with https_server(cert, key, IMAGE, sni) as port:
        image = fetch_image(downloader, f"https://images.test:{port}/a.png", deadline=soon())
        assert image.file.read() == IMAGE
        assert sni == ["images.test"]
        # The same address under a name the certificate does not cover: refused by TLS.
        with pytest.raises(ArchiveFailure, match="could not fetch") as excinfo:
            fetch_image(downloader, f"https://other.test:{port}/a.png", deadline=soon())
        assert failure_of(excinfo).kind is Kind.CONNECTION


def test_a_name_that_does_not_exist_fails_for_good_with_the_real_resolver() -> None:
    # RFC 6761: names under .invalid never resolve. What this machine's resolver answers
    # (no network here: glibc says EAI_NONAME, "Name or service not known") is checked
    # first, so a resolver that cannot answer at all shows up as such, not as a guard bug.
    with pytest.raises(socket.gaierror) as lookup:
        resolve("nonexistent.invalid", 443)
    assert lookup.value.errno in NO_SUCH_NAME_ERRORS, f"the resolver answered {lookup.value!r}"

    downloader = Downloader(max_bytes=10**6)
    with pytest.raises(ArchiveFailure) as excinfo:
        downloader.open("https://nonexistent.invalid/a.png?sig=s3cr3t", deadline=soon())
    failure = failure_of(excinfo)
    assert failure.kind is Kind.NO_SUCH_HOST
    assert classify(failure) is ErrorClass.PERMANENT
    assert failure.message == "host nonexistent.invalid does not exist (DNS)"
