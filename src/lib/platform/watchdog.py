"""A deadline that binds whatever a connection is blocked on (connect, TLS, headers, body).

A socket timeout bounds each read, not their sum: an answer sent a byte a second never
trips it. The watchdog shuts the connection's socket when the deadline passes (one keeper
thread waits for every deadline); the blocked call fails, the caller reports a timeout.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
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
        self.no_retry = False  # botocore sends the request no more (a sealed body)
        self._token: int | None = None  # this watchdog's entry in the keeper, while armed
        self.rearm(deadline)

    def rearm(self, deadline: float) -> None:
        _KEEPER.arm(self, deadline)

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
        _KEEPER.cancel(self)

    def fire_now(self) -> None:
        """Fire on this thread, at once: the call is given up (another thread cuts it, or
        its body can no longer be sent), and botocore's retry hook sees it has fired."""
        _KEEPER.cancel(self)
        self._fire()


class _Keeper:
    """One thread for every watchdog of the process, started with the first: arming or
    moving a deadline is a heap entry, not a thread's start (on the transfer's path, a
    new thread waits for a CPU before the request can go on)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int]] = []  # (deadline, token), stale ones included
        self._armed: dict[int, Watchdog] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def after_fork(self) -> None:
        """In a forked child the keeper's thread is gone: the next arming starts one. The
        parent's deadlines stay the parent's: firing one here would shut a socket the
        two processes share."""
        self._changed = threading.Condition()
        self._due, self._armed = [], {}
        self._thread = None

    def arm(self, watchdog: Watchdog, deadline: float) -> None:
        with self._changed:
            self._forget(watchdog)
            token = next(self._tokens)
            watchdog._token = token
            self._armed[token] = watchdog
            heapq.heappush(self._due, (deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self._thread.start()
            elif self._due[0][1] == token:
                self._changed.notify()  # sooner than what the thread waits for

    def cancel(self, watchdog: Watchdog) -> None:
        with self._changed:
            self._forget(watchdog)

    def _forget(self, watchdog: Watchdog) -> None:
        if watchdog._token is not None:
            self._armed.pop(watchdog._token, None)
            watchdog._token = None
            if len(self._due) > 2 * len(self._armed) + 64:  # keep cancelled entries few
                self._due = [entry for entry in self._due if entry[1] in self._armed]
                heapq.heapify(self._due)

    def _run(self) -> None:
        while True:
            _fire_guarded(self._next_due())

    def _next_due(self) -> Watchdog:
        """The next watchdog whose deadline has passed, disarmed (waits for one)."""
        with self._changed:
            while True:
                while self._due and self._due[0][1] not in self._armed:
                    heapq.heappop(self._due)
                if not self._due:
                    self._changed.wait()
                    continue
                deadline, token = self._due[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                heapq.heappop(self._due)
                watchdog = self._armed.pop(token)
                watchdog._token = None
                return watchdog


def _fire_guarded(watchdog: Watchdog) -> None:
    # Outside the keeper's lock: a shutdown must not delay arming elsewhere.
    with contextlib.suppress(Exception):
        watchdog._fire()


_KEEPER = _Keeper()
os.register_at_fork(after_in_child=_KEEPER.after_fork)


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
            # A retry after the deadline (botocore retries): it could not be bound.
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
