"""Fetch the upstream image: a URL we did not choose, from a server we do not trust.

`Downloader.open(url, deadline)` gives an ImageStream once the guarded connection is made,
redirects followed and the first bytes sniffed; iterating it enforces the size cap and a
total deadline (a watchdog). docs/explanation/transfers.md has the rationale.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.client import RemoteDisconnected
from types import TracebackType
from typing import Self
from urllib.parse import urljoin

from urllib3.connection import HTTPConnection
from urllib3.exceptions import (
    HTTPError,
    InvalidHeader,
    LocationParseError,
    NewConnectionError,
    TimeoutError,
)
from urllib3.response import HTTPResponse
from urllib3.util import parse_url

from lib.platform.redact import outside_text
from lib.platform.watchdog import Watchdog
from lib.transfer.failures import ArchiveFailure, Kind, Stage, fail, retry_after_seconds
from lib.transfer.framing import check_framing
from lib.transfer.imagetype import SNIFF_BYTES, ImageType, sniff
from lib.transfer.kept import KeptConnections, Key
from lib.transfer.netguard import IPNetwork, Resolver, Target, UrlGuard, resolve
from lib.transfer.pinned import pinned_connection

CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0  # per read; the deadline bounds the total
MAX_REDIRECTS = 3
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
SPOOL_IN_MEMORY_BYTES = 1024 * 1024
READ_CHUNK_BYTES = 256 * 1024
USER_AGENT = "image-archive/1.0 (+https://github.com/lsky-org/lsky-pro uploader)"
# Sent on every request; compressed bodies are refused, never inflated (lib.transfer.framing).
REQUEST_HEADERS = {"User-Agent": USER_AGENT, "Accept": "image/*", "Accept-Encoding": "identity"}


def safe_url(url: str) -> str:
    """A URL as it may appear in logs and errors: scheme, host and path, no query or userinfo
    (provider URLs are signed; the signature is a credential)."""
    try:
        parts = parse_url(url)
    except LocationParseError:
        return "(unparseable URL)"
    host = parts.host or "?"
    port = f":{parts.port}" if parts.port else ""
    path = parts.path or ""
    path = path if len(path) <= 80 else path[:77] + "..."
    return f"{parts.scheme}://{host}{port}{path}"


class ImageStream:
    """An upstream image body being read: iterate for its chunks (the sniffed head first).

    The size cap and the deadline are enforced while iterating; a body that ends early
    raises. Close it (or use `with`) to release the connection and the watchdog.
    """

    def __init__(
        self,
        *,
        url: str,
        conn: HTTPConnection,
        response: HTTPResponse,
        watchdog: Watchdog,
        deadline: float,
        max_bytes: int,
        declared_length: int | None,
        keep: Callable[[HTTPConnection], None] | None = None,
    ) -> None:
        """keep: takes the connection once the body was read to its end (kept.py)."""
        self.url = url  # safe form, for messages
        self._conn = conn
        self._response = response
        self._watchdog = watchdog
        self._deadline = deadline
        self.max_bytes = max_bytes
        self.declared_length = declared_length
        self.bytes_read = 0
        self._head = b""
        self._started = False
        self._whole = False  # the body was read to its end, exactly as framed
        self._keep = keep
        self.image_type = self._sniff()

    def set_deadline(self, deadline: float) -> None:
        """Move the deadline (e.g. to keep time for the upload once the size is known)."""
        self._deadline = deadline
        self._watchdog.rearm(deadline)

    def _sniff(self) -> ImageType:
        while len(self._head) < SNIFF_BYTES:
            chunk = self._read()
            if not chunk:
                break
            self._head += chunk
        image_type = sniff(self._head[:SNIFF_BYTES])
        if image_type is None:
            raise fail(
                Stage.DOWNLOAD,
                Kind.NOT_IMAGE,
                "upstream body is not a PNG, JPEG, GIF, WebP or AVIF image",
            )
        return image_type

    def __iter__(self) -> Iterator[bytes]:
        if self._started:
            raise RuntimeError("an ImageStream can be iterated once")
        self._started = True
        if self._head:
            yield self._head
            self._head = b""
        while chunk := self._read():
            yield chunk
        if self.declared_length is not None and self.bytes_read != self.declared_length:
            raise fail(
                Stage.DOWNLOAD,
                Kind.CONNECTION,
                f"body was {self.bytes_read} bytes, Content-Length said {self.declared_length}",
            )
        self._whole = True

    def _read(self) -> bytes:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0 or self._watchdog.fired:
            raise self._too_slow()
        sock = self._watchdog.sock
        if sock is not None and sock.fileno() != -1:  # -1: the body is done, socket closed
            # Each read may wait at most until the deadline (the watchdog is the backstop).
            sock.settimeout(min(READ_TIMEOUT_SECONDS, remaining))
        try:
            chunk = self._response.read1(READ_CHUNK_BYTES, decode_content=False)
        except (HTTPError, OSError) as error:
            if self._watchdog.fired or isinstance(error, TimeoutError | socket.timeout):
                raise self._too_slow() from None
            raise fail(
                Stage.DOWNLOAD, Kind.CONNECTION, f"connection dropped while reading {self.url}"
            ) from None
        if not chunk and self._watchdog.fired:
            raise self._too_slow()  # the watchdog's shutdown looks like an early EOF
        self.bytes_read += len(chunk)
        if self.bytes_read > self.max_bytes:
            raise fail(
                Stage.DOWNLOAD, Kind.TOO_LARGE, f"image is over the {self.max_bytes}-byte limit"
            )
        return chunk

    def _too_slow(self) -> ArchiveFailure:
        return fail(
            Stage.DOWNLOAD, Kind.TIMEOUT, f"reading {self.url} ran past the attempt's deadline"
        )

    def close(self) -> None:
        self._watchdog.cancel()
        # Open still (no "Connection: close"), its answer read whole: the next request
        # may go on it. Anything less (a body cut short, a deadline) closes it.
        reusable = self._whole and not self._watchdog.fired and self._conn.sock is not None
        self._response.close()
        if reusable and self._keep is not None:
            self._keep(self._conn)
        else:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Downloader:
    def __init__(
        self,
        *,
        max_bytes: int,
        allow_private_networks: tuple[IPNetwork, ...] = (),
        resolver: Resolver = resolve,
        ca_certs: str | None = None,
    ) -> None:
        """ca_certs: an extra CA bundle for HTTPS (a private provider's CA; tests)."""
        self.max_bytes = max_bytes
        self.guard = UrlGuard(allow_private_networks, resolver)
        self._tls = {"ca_certs": ca_certs} if ca_certs else {}
        self.kept = KeptConnections()

    def open(self, url: str, *, deadline: float) -> ImageStream:
        """Connect, follow redirects and check the answer; raises ArchiveFailure."""
        for _ in range(MAX_REDIRECTS + 1):
            target = self.guard.check(url)
            conn, response, watchdog = self._request(target, url, deadline)
            try:
                location = _redirect_location(response, url)
                if location is None:
                    return self._stream(url, conn, response, watchdog, deadline, key=_key(target))
            except BaseException:
                watchdog.cancel()
                conn.close()
                raise
            # A redirect: this connection is done; the next hop is checked from scratch.
            watchdog.cancel()
            conn.close()
            url = urljoin(url, location)
        raise fail(Stage.DOWNLOAD, Kind.REFUSED_URL, f"more than {MAX_REDIRECTS} redirects")

    def _request(
        self, target: Target, url: str, deadline: float
    ) -> tuple[HTTPConnection, HTTPResponse, Watchdog]:
        kept = self.kept.take(_key(target), target.addresses)
        if kept is not None:
            try:
                return self._exchange(kept, target, url, deadline)
            except _Unanswered:
                pass  # the server closed it as the request went out: once more, anew
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise fail(Stage.DOWNLOAD, Kind.TIMEOUT, "no time left to download")
        conn = pinned_connection(
            target.scheme,
            target.host,
            target.port,
            addresses=target.addresses,
            deadline=deadline,
            timeout=min(CONNECT_TIMEOUT_SECONDS, remaining),
            **self._tls,
        )
        return self._exchange(conn, target, url, deadline, fresh=True)

    def _exchange(
        self,
        conn: HTTPConnection,
        target: Target,
        url: str,
        deadline: float,
        *,
        fresh: bool = False,
    ) -> tuple[HTTPConnection, HTTPResponse, Watchdog]:
        """The request on `conn` and the answer's headers. On a kept connection (not
        `fresh`), a server that hung up without a word raises _Unanswered."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            conn.close()
            raise fail(Stage.DOWNLOAD, Kind.TIMEOUT, "no time left to download")
        if conn.sock is not None:  # kept: its last read's timeout is not this request's
            conn.sock.settimeout(min(CONNECT_TIMEOUT_SECONDS, remaining))
        watchdog = Watchdog(conn, deadline)
        try:
            conn.request(
                "GET",
                target.request_uri,
                headers=REQUEST_HEADERS,
                preload_content=False,
                decode_content=False,
            )
            watchdog.attach(conn.sock)
            # Waiting for the status line and headers is bounded by the time left
            # per read and by the watchdog in total.
            conn.timeout = min(READ_TIMEOUT_SECONDS, max(0.001, deadline - time.monotonic()))
            response = conn.getresponse()
        except (HTTPError, OSError) as error:
            watchdog.cancel()
            conn.close()
            if not fresh and not watchdog.fired and isinstance(error, _HUNG_UP):
                raise _Unanswered from None
            if isinstance(error, InvalidHeader):  # Content-Lengths that disagree
                detail = outside_text(error, 160)
                raise fail(
                    Stage.DOWNLOAD,
                    Kind.NOT_IMAGE,
                    f"upstream's answer for {safe_url(url)} is malformed: {detail}",
                ) from None
            timed_out = isinstance(error, TimeoutError | socket.timeout) and not isinstance(
                error,
                NewConnectionError,  # a ConnectTimeoutError subclass, but a refusal
            )
            if watchdog.fired or timed_out:
                raise fail(
                    Stage.DOWNLOAD, Kind.TIMEOUT, f"timed out waiting for {safe_url(url)}"
                ) from None
            raise fail(
                Stage.DOWNLOAD,
                Kind.CONNECTION,
                f"could not fetch {safe_url(url)} ({type(error).__name__})",
            ) from None
        return conn, response, watchdog

    def _stream(
        self,
        url: str,
        conn: HTTPConnection,
        response: HTTPResponse,
        watchdog: Watchdog,
        deadline: float,
        *,
        key: Key,
    ) -> ImageStream:
        where = safe_url(url)
        if response.status != 200:
            raise fail(
                Stage.DOWNLOAD,
                Kind.HTTP_STATUS,
                f"upstream answered HTTP {response.status} for {where}",
                status=response.status,
                retry_after=retry_after_seconds(response.headers.get("Retry-After")),
            )
        check_framing(response.headers, where)
        declared = response.length_remaining
        if declared is not None and declared > self.max_bytes:
            raise fail(
                Stage.DOWNLOAD,
                Kind.TOO_LARGE,
                f"image is {declared} bytes, over the {self.max_bytes}-byte limit",
            )
        return ImageStream(
            url=where,
            conn=conn,
            response=response,
            watchdog=watchdog,
            deadline=deadline,
            max_bytes=self.max_bytes,
            declared_length=declared,
            keep=partial(self.kept.keep, key),
        )


class _Unanswered(Exception):
    """A kept connection the server closed before it answered (it may have closed it as
    the request went out): the request is sent again on a new connection."""


# What a server that closed a kept connection looks like to the next request on it.
_HUNG_UP = (RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _key(target: Target) -> Key:
    return (target.scheme, target.host.lower(), target.port)


def _redirect_location(response: HTTPResponse, url: str) -> str | None:
    """Where a redirect points, None when the response is not a redirect."""
    if response.status not in REDIRECT_STATUSES:
        return None
    location = response.headers.get("Location")
    if not location:
        raise fail(
            Stage.DOWNLOAD,
            Kind.HTTP_STATUS,
            f"redirect without Location from {safe_url(url)}",
            status=response.status,
        )
    return str(location)
