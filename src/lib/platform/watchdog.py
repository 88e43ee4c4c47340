"""A deadline that holds whatever a connection is blocked on (connect, TLS, headers, body).

A socket timeout bounds each read, not their sum: an answer sent a byte a second never
trips it. The watchdog's timer shuts the connection's socket when the deadline passes;
the blocked call then fails, and the caller reports a timeout (`fired`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar, cast


class _Connection(Protocol):
    sock: socket.socket | None


class DeadlinePassed(TimeoutError):
    """A request was about to start on a connection whose deadline has already passed."""


class Watchdog:
    """Shuts the watched connection's socket at `deadline` (time.monotonic())."""

    def __init__(self, conn: _Connection | None, deadline: float) -> None:
        self._conn = conn
        # The socket, once connected: http.client drops conn.sock as soon as it has read
        # the headers of a "Connection: close" response, while the body still flows on it.
        self.sock: socket.socket | None = None
        self.fired = False
        self._timer: threading.Timer | None = None
        self.rearm(deadline)

    def rearm(self, deadline: float) -> None:
        self.cancel()
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, conn: _Connection) -> None:
        """The connection the guarded call now uses (a pooled one is known only then)."""
        self._conn, self.sock = conn, None

    def attach(self, sock: socket.socket | None) -> None:
        self.sock = sock

    def _fire(self) -> None:
        self.fired = True
        conn = self._conn
        sock = self.sock or (conn.sock if conn is not None else None)  # mid-connect or TLS
        if sock is not None:
            # The plain socket's shutdown, also for an SSLSocket: it wakes the blocked
            # reader without touching the TLS object that thread is using. OSError: the
            # socket is already closed, nothing left to interrupt.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# -- pooled connections (urllib3's, and botocore's built on them) ------------------------
# A pool picks the connection inside the library's call, so the pool's connections tell
# the watchdog of the call running on their thread (`watched`) which one it got.

_active = threading.local()


def active() -> Watchdog | None:
    """The watchdog of the guarded call running on this thread, if any."""
    watchdog: Watchdog | None = getattr(_active, "watchdog", None)
    return watchdog


@contextlib.contextmanager
def watched(deadline: float, *, keep: bool = False) -> Iterator[Watchdog]:
    """Pooled requests made inside the block end by `deadline`. keep=True leaves the
    watchdog running after the block (a body still to be read): the caller cancels it."""
    watchdog = Watchdog(None, deadline)
    outer = active()
    _active.watchdog = watchdog
    try:
        yield watchdog
    except BaseException:
        watchdog.cancel()
        raise
    finally:
        _active.watchdog = outer
    if not keep:
        watchdog.cancel()


def _watching(conn: _Connection, send: Callable[[], None]) -> None:
    watchdog = active()
    if watchdog is not None:
        if watchdog.fired:
            # A retry after the deadline (botocore retries): it could not be held.
            raise DeadlinePassed("the deadline of this call has passed")
        watchdog.watch(conn)
    send()
    if watchdog is not None:
        watchdog.attach(conn.sock)  # before http.client may let go of it


Pool = TypeVar("Pool")


def watched_pool(pool_class: type[Pool]) -> type[Pool]:
    """`pool_class` (an urllib3 connection pool, or botocore's) whose connections report
    each request to the active watchdog."""
    base: Any = getattr(pool_class, "ConnectionCls")  # noqa: B009 - not on the type bound

    def request(self: Any, *args: Any, **kwargs: Any) -> None:
        _watching(self, lambda: base.request(self, *args, **kwargs))

    connection = type(f"Watched{base.__name__}", (base,), {"request": request})
    pool = type(f"Watched{pool_class.__name__}", (pool_class,), {"ConnectionCls": connection})
    return cast(type[Pool], pool)
