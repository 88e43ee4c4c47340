"""Answers read with each segment acknowledged as it is read (TCP_QUICKACK): a request sent
soon after the last answer leaves Linux delaying its ACKs, and a server that writes an
answer's header and body apart with Nagle on keeps the body back for that ACK, up to 40 ms
(docs/explanation/transfers.md, "Delayed ACKs"). Our own sends need no care: urllib3 sets
TCP_NODELAY on every socket it opens."""

from __future__ import annotations

import contextlib
import socket

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.response import HTTPResponse

# Linux only; elsewhere the answer is read as the system acknowledges it.
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def ack_at_once(sock: socket.socket | None) -> None:
    """Leave delayed-ACK mode on `sock` now (the request is out; only the answer's reads
    follow, and nothing sent before the next request puts it back)."""
    if _QUICKACK is None or sock is None:
        return
    with contextlib.suppress(OSError):  # closed under us: the read that follows says so
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


class PromptAckConnection(HTTPConnection):
    """An urllib3 connection that reads each answer with ack_at_once."""

    def getresponse(self) -> HTTPResponse:  # type: ignore[override] # as urllib3 does
        ack_at_once(self.sock)
        return super().getresponse()


class PromptAckHTTPSConnection(PromptAckConnection, HTTPSConnection):
    pass
