"""Connections to a provider kept open between downloads (HTTP keep-alive): the container's
next image from the same host skips the TCP and TLS handshakes (docs/explanation/transfers.md, "Kept
connections"). One is kept only once a body was read to its end and the server left it
open; it is taken again only for the same scheme, host and port, to an address the guard
has just approved again, idle less than KEPT_IDLE_SECONDS, and not closed by the server."""

from __future__ import annotations

import ipaddress
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass

from urllib3.connection import HTTPConnection

# Servers drop idle keep-alive connections after 5 s (Apache) to 75 s (nginx) and say so
# (a FIN, seen before reuse); a NAT or a frozen container drops them silently, after
# minutes. Past this, a connection is not trusted to be alive.
KEPT_IDLE_SECONDS = 30.0
KEPT_CONNECTIONS = 2  # the provider's host or two; a container takes one image at a time

Key = tuple[str, str, int]  # scheme, host, port
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass
class _Idle:
    key: Key
    conn: HTTPConnection
    since: float  # time.monotonic()
    since_wall: float  # time.time(): a frozen container's monotonic clock may stand still


class KeptConnections:
    """Idle connections, newest first, at most KEPT_CONNECTIONS."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._idle: list[_Idle] = []
        _ALL.add(self)

    def keep(self, key: Key, conn: HTTPConnection) -> None:
        """`conn`, its answer read to the end, for the next request to `key`."""
        entry = _Idle(key, conn, self._clock(), self._wall())
        with self._lock:
            self._idle.insert(0, entry)
            dropped, self._idle = self._idle[KEPT_CONNECTIONS:], self._idle[:KEPT_CONNECTIONS]
        for old in dropped:
            old.conn.close()

    def take(self, key: Key, addresses: Collection[str]) -> HTTPConnection | None:
        """An idle connection to `key` whose peer is one of `addresses` (the guard's, just
        now), still open and young enough; None if there is none. Any other connection
        to `key` is closed (the host's addresses or the time moved on)."""
        with self._lock:
            mine = [entry for entry in self._idle if entry.key == key]
            self._idle = [entry for entry in self._idle if entry.key != key]
        found: HTTPConnection | None = None
        allowed = {_address(address) for address in addresses}
        for entry in mine:
            if found is None and self._usable(entry, allowed):
                found = entry.conn
            else:
                entry.conn.close()
        return found

    def _usable(self, entry: _Idle, allowed: set[Address | None]) -> bool:
        idle = max(self._clock() - entry.since, self._wall() - entry.since_wall)
        if not 0 <= idle < KEPT_IDLE_SECONDS or not entry.conn.is_connected:
            return False  # is_connected: no FIN, no stray bytes waiting on the socket
        sock = entry.conn.sock
        try:
            peer = _address(str(sock.getpeername()[0])) if sock is not None else None
        except OSError:
            return False
        return peer is not None and peer in allowed

    def _forget(self) -> None:
        """In a forked child: the sockets are the parent's too; close only our copies."""
        self._lock = threading.Lock()
        idle, self._idle = self._idle, []
        for entry in idle:
            entry.conn.close()


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


_ALL: weakref.WeakSet[KeptConnections] = weakref.WeakSet()


def _forget_all() -> None:
    for kept in list(_ALL):
        kept._forget()


os.register_at_fork(after_in_child=_forget_all)
