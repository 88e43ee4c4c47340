"""urllib3 connections that go to addresses the guard already checked, never to a new lookup.

Only the TCP connect is redirected; Host, SNI and certificate checks use the URL's host.
They are kept (lib.transfer.kept), so they read answers without a delayed-ACK wait.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util.connection import create_connection

from lib.transfer.quickack import PromptAckConnection


class _Pinned(PromptAckConnection):
    _addresses: tuple[str, ...]
    _deadline: float

    def pin(self, addresses: Sequence[str], deadline: float) -> None:
        self._addresses = tuple(addresses)
        self._deadline = deadline

    def _new_conn(self) -> socket.socket:
        error: OSError | None = None
        for address in self._addresses:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                break
            timeout = remaining if self.timeout is None else min(float(self.timeout), remaining)
            try:
                # An IP literal: create_connection's getaddrinfo does no DNS for it.
                return create_connection(
                    (address, self.port),
                    timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except OSError as exc:
                error = exc
        if error is None or isinstance(error, TimeoutError):
            raise ConnectTimeoutError(self, f"connecting to {self.host} timed out")
        raise NewConnectionError(self, f"could not connect to {self.host}")


class PinnedHTTPConnection(_Pinned):
    pass


class PinnedHTTPSConnection(_Pinned, HTTPSConnection):
    pass


def pinned_connection(
    scheme: str,
    host: str,
    port: int,
    *,
    addresses: Sequence[str],
    deadline: float,
    timeout: float,
    **tls: Any,
) -> HTTPConnection:
    """A connection to `host`:`port` that connects only to `addresses` (already checked)."""
    cls = PinnedHTTPSConnection if scheme == "https" else PinnedHTTPConnection
    conn = cls(host, port, timeout=timeout, **(tls if scheme == "https" else {}))
    conn.pin(addresses, deadline)
    return conn
