"""A reused connection adds no fixed delay (lib.transfer.quickack).

A request sent soon after the last answer puts Linux's end of a kept connection in
delayed-ACK mode. A server that writes an answer's header and body apart with Nagle on (the
upstream stand-in's `nagle=True`, as Python's http.server does) sends the body only once
the header is acknowledged, so every answer on a reused connection waited for the delayed
ACK, up to 40 ms. Each test puts the kept socket in that mode itself (as the kernel does,
but every time), holds the server's answer, and waits for the socket to leave it: it must
read its answer acknowledging each segment at once. Without the fix it never leaves it
and the wait runs out. The time it saves is the bench's to show (point 3), not a test's."""

from __future__ import annotations

import io
import ipaddress
import socket
import threading
import time
from collections.abc import Callable

from devkit import images
from devkit.lsky import Behaviour, LskyStandIn
from devkit.upstream import UpstreamServer
from lib.transfer.download import Downloader
from lib.transfer.imagetype import PNG, DownloadedImage
from lib.transfer.lsky import LskyClient
from tests.support import HANG_SECONDS, fetch_image, wait_until

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
IMAGE = images.png(8, 8)
TCP = socket.IPPROTO_TCP
# An exchange's own deadline: past the test's wait, so that the wait is what runs out.
EXCHANGE_SECONDS = 2 * HANG_SECONDS


def _delaying_acks(sock: socket.socket) -> bool:
    return sock.getsockopt(TCP, socket.TCP_QUICKACK) == 0


def _exchange_held_in_delayed_ack_mode(
    sock: socket.socket | None,
    exchange: Callable[[], object],
    *,
    arrived: Callable[[], bool],
    release: threading.Event,
) -> list[object]:
    """`exchange` (a request on `sock`'s connection, whose answer the server holds until
    `release` is set) run with `sock` in delayed-ACK mode; asserts that the socket leaves
    that mode once the request is out, before any of the answer comes. What `exchange`
    returned, once it has."""
    assert sock is not None
    assert sock.getsockopt(TCP, socket.TCP_NODELAY) != 0  # our own writes never wait either
    sock.setsockopt(TCP, socket.TCP_QUICKACK, 0)
    assert _delaying_acks(sock)
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(exchange()), daemon=True)
    thread.start()
    try:
        wait_until(arrived, "the request reached the server")
        wait_until(lambda: not _delaying_acks(sock), "the socket left delayed-ACK mode")
    finally:
        release.set()
        thread.join(EXCHANGE_SECONDS)
    return results


def test_a_reused_provider_connection_acknowledges_its_answer_at_once() -> None:
    with UpstreamServer(nagle=True) as upstream:
        url = upstream.add("/a.png", IMAGE)
        downloader = Downloader(max_bytes=10**7, allow_private_networks=LOOPBACK)

        def fetch() -> bytes:
            image = fetch_image(downloader, url, deadline=time.monotonic() + EXCHANGE_SECONDS)
            try:
                return b"".join(image.chunks())
            finally:
                image.close()

        assert fetch() == IMAGE
        [kept] = downloader.kept._idle
        gate = threading.Event()
        upstream.add("/a.png", IMAGE, gate=gate)  # the next answer waits for the test
        results = _exchange_held_in_delayed_ack_mode(
            kept.conn.sock, fetch, arrived=lambda: upstream.hits("/a.png") == 2, release=gate
        )
        assert results == [IMAGE]
        first, second = (request.client for request in upstream.requests)
        assert second == first  # over the kept connection


def test_a_reused_lsky_connection_acknowledges_its_answer_at_once(lsky: LskyStandIn) -> None:
    client = LskyClient(base_url=lsky.base_url, token=lambda force: lsky.token)

    def upload() -> str:
        image = DownloadedImage(file=io.BytesIO(IMAGE), size=len(IMAGE), image_type=PNG)
        return client.upload(
            image, filename="a.png", deadline=time.monotonic() + EXCHANGE_SECONDS
        ).url

    upload()
    pool = client.pool.connection_from_url(client.upload_url)
    [conn] = [conn for conn in pool.pool.queue if conn is not None]  # type: ignore[union-attr]
    gate = threading.Event()
    lsky.script(Behaviour.held(gate))
    lsky.body_arriving.clear()
    results = _exchange_held_in_delayed_ack_mode(
        conn.sock, upload, arrived=lsky.body_arriving.is_set, release=gate
    )
    assert len(results) == 1
    assert len(lsky.uploads) == 2
    assert pool.num_connections == 1  # over the kept connection
