"""Shared plumbing for the stdlib HTTP servers in devkit (upstream, lsky)."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class Link:
    """A network link of `bytes_per_sec` for one body (a bench's bandwidth-limited pair):
    `cross(n)` returns once n more bytes could have crossed it since the first did. Each
    wait is to a schedule, not a sleep per piece, so the sleeps' overshoots do not add up."""

    def __init__(self, bytes_per_sec: float) -> None:
        if not bytes_per_sec > 0:
            raise ValueError(f"a link's rate must be positive, not {bytes_per_sec!r}")
        self.bytes_per_sec = bytes_per_sec
        self._start: float | None = None
        self._crossed = 0

    def cross(self, size: int) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = now
        self._crossed += size
        due = self._start + self._crossed / self.bytes_per_sec
        if due > now:
            time.sleep(due - now)


class _Server(ThreadingHTTPServer):
    # Handler threads must not keep the interpreter (or pytest) alive.
    daemon_threads = True
    # Tests may open many connections at once; do not refuse them.
    request_queue_size = 64
    owner: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up mid-response is routine in failure tests (size
        # limits, timeouts, dropped connections); anything else is printed.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive) handler that does not print access logs."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, a keep-alive
    # client's delayed ACK stalls every response by ~40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # tests assert on recorded requests; access logs are noise

    def drop_connection(self) -> None:
        """Half-close both ways now: the client sees EOF mid-response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class BackgroundServer:
    """A ThreadingHTTPServer on 127.0.0.1 serving from a daemon thread.

    The socket is bound in the constructor (port 0 = the OS picks a free one),
    so `base_url` is known before `start()` and there is no free-port race.
    """

    handler_class: type[QuietHandler]

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port), self.handler_class)
        self._server.owner = self
        address = self._server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        self.base_url = f"http://{self.host}:{self.port}"
        self._thread: threading.Thread | None = None

    def url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},  # quick shutdown()
                name=f"{type(self).__name__}:{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve in the calling thread (for the command-line entry points)."""
        self._server.serve_forever(poll_interval=0.2)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
