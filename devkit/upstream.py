"""A scriptable upstream image server (the provider's temporary image URLs).

    with UpstreamServer() as up:
        up.add("/a.png", images.png(), fail_first=2)
        url = up.url("/a.png")

Routes match on the path without the query string. Every option is
per-route; `hits(path)` counts requests, including failed ones, and `bodies_sent(path)`
says when each whole body's last byte went out. `link_bytes_per_sec` makes the server a
provider behind a link of that rate (every body crosses it; a bench's limited pair).
`nagle=True` leaves Nagle's algorithm on (no TCP_NODELAY), as Python's http.server and
many small services do: each answer's header and body go out in two writes, so the body
waits for the client's ACK of the header.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from devkit._http import BackgroundServer, Link, QuietHandler

__all__ = ["HELD_AT_MOST_SECONDS", "RequestRecord", "Route", "StreamBody", "UpstreamServer"]

HELD_AT_MOST_SECONDS = 120.0  # a route's gate nobody sets cannot hang a test run
LINK_PIECE_BYTES = 64 * 1024  # a limited link sends this much at a time, evenly spaced


@dataclass(frozen=True)
class StreamBody:
    """A body produced on demand, so 50 MB is never held (twice) in memory.

    `length` is the true size; None means unknown, and the response is then
    sent chunked unless the route sets `content_length`.
    """

    factory: Callable[[], Iterable[bytes]]
    length: int | None = None

    @classmethod
    def repeat(cls, chunk: bytes, count: int) -> StreamBody:
        """`chunk` sent `count` times."""
        return cls(lambda: (chunk for _ in range(count)), len(chunk) * count)

    @classmethod
    def of(cls, factory: Callable[[], Iterable[bytes]], length: int | None = None) -> StreamBody:
        return cls(factory, length)


Body = bytes | StreamBody | Callable[[], Iterable[bytes]]


@dataclass
class Route:
    body: Body
    status: int = 200
    content_type: str | None = "image/png"
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    fail_first: int = 0
    fail_status: int = 503
    fail_after: int | None = None
    fail_after_status: int = 403
    drip_bytes_per_sec: float | None = None
    drop_after: int | None = None
    content_length: int | None = None
    redirect_to: str | None = None
    chunked: bool = False
    gate: threading.Event | None = None
    gate_after: int | None = None
    close_after: bool = False
    drop_reused: bool = False


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str  # including any query string
    headers: dict[str, str]
    client: str = ""  # "ip:port": one per TCP connection


class UpstreamServer(BackgroundServer):
    """Scriptable image server on 127.0.0.1 (context manager; `start()`/`stop()`)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        link_bytes_per_sec: float | None = None,
        nagle: bool = False,
    ) -> None:
        self.handler_class = _Handler
        self.nagle = nagle
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {}
        self._hits: defaultdict[str, int] = defaultdict(int)
        self._sent: defaultdict[str, list[float]] = defaultdict(list)
        self.requests: list[RequestRecord] = []
        if link_bytes_per_sec is not None:
            Link(link_bytes_per_sec)  # refuses a rate that is not positive, here
        self.link_bytes_per_sec = link_bytes_per_sec
        super().__init__(host, port)

    # -- scripting ------------------------------------------------------------

    def add(
        self,
        path: str,
        body: Body = b"",
        *,
        status: int = 200,
        content_type: str | None = "image/png",
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
        fail_first: int = 0,
        fail_status: int = 503,
        fail_after: int | None = None,
        fail_after_status: int = 403,
        drip_bytes_per_sec: float | None = None,
        drop_after: int | None = None,
        content_length: int | None = None,
        redirect_to: str | None = None,
        chunked: bool = False,
        gate: threading.Event | None = None,
        gate_after: int | None = None,
        close_after: bool = False,
        drop_reused: bool = False,
    ) -> str:
        """Register (or replace) a route; returns its absolute URL.

        - delay: seconds to wait before the status line (a slow server).
        - fail_first: the first N hits answer `fail_status` with a short body.
        - fail_after: every hit after the first N answers `fail_after_status` (403:
          a provider's temporary URL that expired once it had been fetched N times).
        - drip_bytes_per_sec: send the body slowly (a stalled transfer).
        - drop_after: close the connection after N body bytes (the headers
          still promise the full length).
        - content_length: the Content-Length to announce, true or not; the
          connection is closed after a lie so keep-alive cannot desync.
        - redirect_to: answer 302 (or `status` if it is a 3xx) to this URL/path.
        - chunked: Transfer-Encoding: chunked, no Content-Length at all.
        - gate: hold each request before the status line until this event is set (at
          most HELD_AT_MOST_SECONDS): a server as slow as the test needs, whatever the
          machine's speed (`hits` counts a held request already).
        - gate_after: hold at this many body bytes instead (the status line, the headers
          and that much of the body went out): a download still arriving for as long as
          the test needs. With drop_after at the same count, the gate comes first.
        - close_after: close the connection once the answer is out, without saying so
          (no "Connection: close"): a server that drops idle keep-alive connections.
        - drop_reused: a request on a connection that already served one is read, then
          the connection closed without an answer (a server closing an idle connection
          as the client's next request arrives).
        """
        route = Route(
            body=body,
            status=status,
            content_type=content_type,
            headers=dict(headers or {}),
            delay=delay,
            fail_first=fail_first,
            fail_status=fail_status,
            fail_after=fail_after,
            fail_after_status=fail_after_status,
            drip_bytes_per_sec=drip_bytes_per_sec,
            drop_after=drop_after,
            content_length=content_length,
            redirect_to=redirect_to,
            chunked=chunked,
            gate=gate,
            gate_after=gate_after,
            close_after=close_after,
            drop_reused=drop_reused,
        )
        with self._lock:
            self._routes[_route_key(path)] = route
        return self.url(path)

    def hits(self, path: str) -> int:
        with self._lock:
            return self._hits[_route_key(path)]

    def bodies_sent(self, path: str) -> list[float]:
        """When the last byte of each whole body served for `path` went out, at the
        earliest (time.monotonic() just before its last write; this process's clock: a
        client cannot have it before then), in order."""
        with self._lock:
            return list(self._sent[_route_key(path)])

    def reset(self) -> None:
        with self._lock:
            self._routes.clear()
            self._hits.clear()
            self._sent.clear()
            self.requests.clear()

    # -- used by the handler ----------------------------------------------------

    def _dispatch(
        self, method: str, raw_path: str, headers: dict[str, str], client: str = ""
    ) -> tuple[Route, int]:
        key = _route_key(raw_path)
        with self._lock:
            self._hits[key] += 1
            self.requests.append(RequestRecord(method, raw_path, headers, client))
            route = self._routes.get(key)
            hit = self._hits[key]
        if route is None:
            raise KeyError(key)
        return route, hit

    def _body_sent(self, raw_path: str, at: float) -> None:
        with self._lock:
            self._sent[_route_key(raw_path)].append(at)


def _route_key(path: str) -> str:
    return urlsplit(path).path or "/"


class _Handler(QuietHandler):
    def setup(self) -> None:
        # Before StreamRequestHandler.setup reads it: per server, not per class.
        self.disable_nagle_algorithm = not self.server.owner.nagle
        super().setup()

    def do_GET(self) -> None:
        self._respond(head=False)

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def _respond(self, *, head: bool) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        served, self._served = getattr(self, "_served", 0), getattr(self, "_served", 0) + 1
        try:
            route, hit = self.server.owner._dispatch(self.command, self.path, headers, client)
        except KeyError:
            self._simple(404, b"not found\n")
            return
        if route.drop_reused and served:
            self.drop_connection()
            return
        if route.close_after:
            self.close_connection = True  # after this answer, and without a word
        if route.delay:
            time.sleep(route.delay)
        if route.gate is not None and route.gate_after is None:
            route.gate.wait(HELD_AT_MOST_SECONDS)
        if hit <= route.fail_first:
            self._simple(route.fail_status, b"upstream temporarily unavailable\n")
            return
        if route.fail_after is not None and hit > route.fail_after:
            self._simple(route.fail_after_status, b"request has expired\n")
            return
        if route.redirect_to is not None:
            status = route.status if 300 <= route.status < 400 else 302
            self.send_response(status)
            self.send_header("Location", route.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_body(route, head=head)

    def _simple(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_body(self, route: Route, *, head: bool) -> None:
        pieces, true_length = _materialise(route.body)
        announced = route.content_length if route.content_length is not None else true_length
        chunked = route.chunked or announced is None

        self.send_response(route.status)
        if route.content_type is not None:
            self.send_header("Content-Type", route.content_type)
        for name, value in route.headers.items():
            self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(announced))
        lied = route.content_length is not None and route.content_length != true_length
        if lied or route.drop_after is not None:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if not head:
            self._send_pieces(route, pieces, chunked=chunked)

    def _send_pieces(self, route: Route, pieces: Iterable[bytes], *, chunked: bool) -> None:
        owner: UpstreamServer = self.server.owner
        rate = owner.link_bytes_per_sec
        link = None if rate is None else Link(rate)
        pieces = _drip(pieces, route.drip_bytes_per_sec)
        if link is not None:
            pieces = _sliced(pieces, LINK_PIECE_BYTES)
        marks = {m for m in (route.gate_after, route.drop_after) if m is not None}
        sent = 0
        # When the body's last byte went out, at the earliest: before its last write.
        last_write = time.monotonic()
        try:
            for piece in _split_at(pieces, marks):
                if self._held_or_dropped(route, sent):
                    return
                if link is not None:
                    link.cross(len(piece))
                last_write = time.monotonic()
                self._write(piece, chunked=chunked)
                sent += len(piece)
            if self._held_or_dropped(route, sent):
                return
            if chunked:
                last_write = time.monotonic()  # the last chunk ends the body
                self.wfile.write(b"0\r\n\r\n")
            owner._body_sent(self.path, last_write)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (size limit, timeout): that is its right.
            self.close_connection = True

    def _held_or_dropped(self, route: Route, sent: int) -> bool:
        """At `sent` body bytes: wait for the route's gate if it holds here, then drop the
        connection if the route drops here (True: the response ends now)."""
        if route.gate is not None and route.gate_after == sent:
            route.gate.wait(HELD_AT_MOST_SECONDS)
        if route.drop_after == sent:
            self.drop_connection()
            return True
        return False

    def _write(self, piece: bytes, *, chunked: bool) -> None:
        if not piece:
            return
        if chunked:
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        else:
            self.wfile.write(piece)


def _materialise(body: Body) -> tuple[Iterable[bytes], int | None]:
    if isinstance(body, bytes | bytearray):
        return (bytes(body),), len(body)
    if isinstance(body, StreamBody):
        return body.factory(), body.length
    return body(), None


def _sliced(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    for piece in pieces:
        for offset in range(0, len(piece), size):
            yield piece[offset : offset + size]


def _split_at(pieces: Iterable[bytes], marks: set[int]) -> Iterator[bytes]:
    """The pieces, cut so that no piece straddles a mark (a byte count); no empty piece."""
    sent = 0
    for piece in pieces:
        rest = piece
        while rest:
            ahead = [mark - sent for mark in marks if sent < mark < sent + len(rest)]
            cut = min(ahead, default=len(rest))
            yield rest[:cut]
            rest = rest[cut:]
            sent += cut


def _drip(pieces: Iterable[bytes], rate: float | None) -> Iterator[bytes]:
    if rate is None:
        yield from pieces
        return
    # Small slices at a steady rate; ~20 writes a second keeps it smooth.
    step = max(1, int(rate / 20))
    for piece in pieces:
        for offset in range(0, len(piece), step):
            yield piece[offset : offset + step]
            time.sleep(step / rate)
