"""Kept provider connections (lib.transfer.kept): the next image from the same host goes
over the connection the last one came on, and only when that is safe: the body was read
to its end, the server kept the connection open, the guard approves its address again
now, it has not been idle too long, and a server that hangs up on the request is asked
again on a new connection. The provider is the upstream stand-in on loopback; each
request it records names the TCP connection it came on (`client`)."""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from pathlib import Path

import pytest

from devkit import images
from devkit.upstream import StreamBody, UpstreamServer
from lib.transfer import kept
from lib.transfer.download import Downloader
from lib.transfer.failures import ArchiveFailure, Kind
from lib.transfer.kept import KeptConnections
from tests.support import HANG_SECONDS, certificate, fetch_image, https_server

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
IMAGE = images.png(8, 8)


def soon() -> float:
    return time.monotonic() + HANG_SECONDS


def _downloader(**kwargs: object) -> Downloader:
    return Downloader(max_bytes=10**7, allow_private_networks=LOOPBACK, **kwargs)  # type: ignore[arg-type]


def _fetch(downloader: Downloader, url: str) -> bytes:
    image = fetch_image(downloader, url, deadline=soon())
    try:
        return b"".join(image.chunks())
    finally:
        image.close()


def _connections(upstream: UpstreamServer) -> list[str]:
    """The TCP connection each request came on, in order."""
    return [request.client for request in upstream.requests]


def test_images_from_one_host_come_over_one_connection(upstream: UpstreamServer) -> None:
    urls = [upstream.add(f"/{n}.png", IMAGE) for n in range(3)]
    downloader = _downloader()
    assert [_fetch(downloader, url) for url in urls] == [IMAGE] * 3
    first, *others = _connections(upstream)
    assert others == [first, first]


def test_a_body_not_read_to_its_end_closes_its_connection(upstream: UpstreamServer) -> None:
    big = images.png(size=2_000_000)
    cut = upstream.add("/big.png", big)
    whole = upstream.add("/small.png", IMAGE)
    downloader = _downloader()
    with downloader.open(cut, deadline=soon()) as stream:
        next(iter(stream))  # a first chunk, then given up (a look-up, a failure)
    assert _fetch(downloader, whole) == IMAGE
    first, second = _connections(upstream)
    assert first != second  # the unread rest would have been read as the next answer


def test_a_body_over_the_size_limit_closes_its_connection(upstream: UpstreamServer) -> None:
    size = 3_000_000
    over = upstream.add(
        "/over.png", StreamBody.of(lambda: images.png_stream(size=size)), chunked=True
    )
    small = upstream.add("/small.png", IMAGE)
    downloader = Downloader(max_bytes=1_000_000, allow_private_networks=LOOPBACK)
    with pytest.raises(ArchiveFailure) as excinfo:
        fetch_image(downloader, over, deadline=soon())
    assert excinfo.value.failure.kind is Kind.TOO_LARGE
    assert _fetch(downloader, small) == IMAGE
    first, second = _connections(upstream)
    assert first != second


def test_a_connection_the_server_closed_is_not_used_again(upstream: UpstreamServer) -> None:
    url = upstream.add("/a.png", IMAGE, close_after=True)  # closed without a word
    downloader = _downloader()
    assert [_fetch(downloader, url) for _ in range(3)] == [IMAGE] * 3
    assert len(set(_connections(upstream))) == 3


def test_a_request_the_server_hangs_up_on_is_asked_again_on_a_new_connection(
    upstream: UpstreamServer,
) -> None:
    url = upstream.add("/a.png", IMAGE, drop_reused=True)
    downloader = _downloader()
    assert _fetch(downloader, url) == IMAGE
    assert _fetch(downloader, url) == IMAGE  # its request on the kept one: no answer
    first, dropped, fresh = _connections(upstream)
    assert dropped == first
    assert fresh != first


def test_a_kept_connection_goes_only_to_an_address_the_guard_approves_now() -> None:
    # One port on two loopback addresses; the host's name moves from the first to the second.
    first = UpstreamServer("127.0.0.1")
    second = UpstreamServer("127.0.0.2", first.port)
    with first, second:
        for server in (first, second):
            server.add("/a.png", IMAGE)
        answers = {"provider.test": ["127.0.0.1"]}
        downloader = _downloader(resolver=lambda host, port: answers[host])
        url = f"http://provider.test:{first.port}/a.png"
        assert _fetch(downloader, url) == IMAGE
        answers["provider.test"] = ["127.0.0.2"]
        assert _fetch(downloader, url) == IMAGE
        assert len(first.requests) == 1  # not over the connection kept to 127.0.0.1
        assert len(second.requests) == 1


class Clocks:
    def __init__(self) -> None:
        self.monotonic = 1000.0
        self.wall = 1_800_000_000.0


@pytest.mark.parametrize("which", ["monotonic", "wall"])
def test_a_connection_idle_past_its_time_is_not_used(upstream: UpstreamServer, which: str) -> None:
    clocks = Clocks()
    url = upstream.add("/a.png", IMAGE)
    downloader = _downloader()
    downloader.kept = KeptConnections(clock=lambda: clocks.monotonic, wall=lambda: clocks.wall)
    assert _fetch(downloader, url) == IMAGE
    setattr(clocks, which, getattr(clocks, which) + kept.KEPT_IDLE_SECONDS * 0.9)
    assert _fetch(downloader, url) == IMAGE  # young enough: the same connection
    # A frozen container's monotonic clock may stand still: either clock ages it.
    setattr(clocks, which, getattr(clocks, which) + kept.KEPT_IDLE_SECONDS)
    assert _fetch(downloader, url) == IMAGE
    first, again, fresh = _connections(upstream)
    assert again == first
    assert fresh != first


def test_a_forked_child_never_uses_its_parent_s_connections(upstream: UpstreamServer) -> None:
    url = upstream.add("/a.png", IMAGE)
    downloader = _downloader()
    assert _fetch(downloader, url) == IMAGE  # kept, idle, at the fork
    key = ("http", "127.0.0.1", upstream.port)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if downloader.kept.take(key, ["127.0.0.1"]) is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _fetch(downloader, url) == IMAGE  # the parent's is still whole, and used
    first, second = _connections(upstream)
    assert second == first


def test_a_body_given_up_while_its_rest_is_still_coming_closes_its_connection(
    upstream: UpstreamServer,
) -> None:
    # Nothing waits on the socket when the next request would go: only the stream knows
    # its answer is unfinished (the server holds the rest back).
    gate = threading.Event()
    held = upstream.add("/held.png", images.png(size=2_000_000), gate=gate, gate_after=100_000)
    whole = upstream.add("/small.png", IMAGE)
    downloader = _downloader()
    try:
        with downloader.open(held, deadline=soon()) as stream:
            for _ in stream:
                if stream.bytes_read >= 100_000:
                    break  # all that was sent: the socket has nothing more to read
        assert _fetch(downloader, whole) == IMAGE
    finally:
        gate.set()
    first, second = _connections(upstream)
    assert first != second


def test_images_over_https_need_one_tls_handshake(tmp_path: Path) -> None:
    # The production case: a provider's CDN over TLS. Each handshake asks for the name
    # (SNI): one for three images.
    cert, key = certificate(tmp_path, "images.test")
    handshakes: list[str | None] = []

    with https_server(cert, key, IMAGE, handshakes) as port:
        downloader = _downloader(resolver=lambda host, port: ["127.0.0.1"], ca_certs=str(cert))
        urls = [f"https://images.test:{port}/{n}.png" for n in range(3)]
        assert [_fetch(downloader, url) for url in urls] == [IMAGE] * 3
        assert handshakes == ["images.test"]


def test_a_wall_clock_set_back_neither_ages_nor_rejuvenates_a_connection(
    upstream: UpstreamServer,
) -> None:
    # NTP may step the wall clock back an hour: the monotonic clock still tells the age.
    clocks = Clocks()
    url = upstream.add("/a.png", IMAGE)
    downloader = _downloader()
    downloader.kept = KeptConnections(clock=lambda: clocks.monotonic, wall=lambda: clocks.wall)
    assert _fetch(downloader, url) == IMAGE
    clocks.wall -= 3600
    assert _fetch(downloader, url) == IMAGE  # young by the monotonic clock: used
    clocks.wall -= 3600
    clocks.monotonic += kept.KEPT_IDLE_SECONDS
    assert _fetch(downloader, url) == IMAGE  # old by the monotonic clock: not used
    first, again, fresh = _connections(upstream)
    assert again == first
    assert fresh != first
