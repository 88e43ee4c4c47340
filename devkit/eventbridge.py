"""A loopback EventBridge in front of moto's: PutEvents passes through to moto (whose rules
deliver to their targets), or fails the way EventBridge fails, call by call as scripted.

EventBridge speaks JSON 1.1 (POST /, X-Amz-Target: AWSEvents.<Action>). What it answers
when it fails, as its API reference has it:
- a throttled call: HTTP 400, {"__type": "ThrottlingException", "message": "Rate exceeded"};
- an internal failure: HTTP 500, {"__type": "InternalException", ...};
- a partial failure: HTTP 200, {"FailedEntryCount": n, "Entries": [...]}, one result per
  entry in order, each an EventId or an ErrorCode and ErrorMessage (InternalFailure and
  ThrottlingException are retryable; MalformedDetail, InvalidArgument... are not).
A refused entry is taken out of the request before the rest goes on to moto, so what
reaches the rule's target is exactly what the answer says was published.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

JSON = "application/x-amz-json-1.1"
MESSAGES = {
    "ThrottlingException": "Rate exceeded",
    "InternalFailure": "An internal failure occurred",
    "MalformedDetail": "Detail is malformed.",
    "InvalidArgument": "Parameter Detail is not valid.",
}


@dataclass(frozen=True)
class Behaviour:
    """What the gate does with one PutEvents call."""

    kind: str  # pass, throttle, fail, refuse, hold
    refused: dict[int, str] = field(default_factory=dict)  # entry index -> ErrorCode
    gate: threading.Event | None = None
    deliver: bool = True  # a held call: passed on once the gate opens, or dropped

    @staticmethod
    def throttled() -> Behaviour:
        return Behaviour("throttle")

    @staticmethod
    def failed() -> Behaviour:
        return Behaviour("fail")

    @staticmethod
    def refusing(**codes: str) -> Behaviour:
        """Entries refused by index: refusing(e1="ThrottlingException") refuses the second."""
        return Behaviour("refuse", {int(k.removeprefix("e")): v for k, v in codes.items()})

    @staticmethod
    def held(gate: threading.Event, *, deliver: bool = True) -> Behaviour:
        """The request is read and held, unanswered, until `gate` opens; then it passes, or
        (deliver False: its caller died waiting) the connection is closed unanswered."""
        return Behaviour("hold", gate=gate, deliver=deliver)


class EventBridgeGate:
    """`moto_endpoint` None: the gate takes every entry itself (an EventId each, nothing
    forwarded), an EventBridge that answers at once: the archive function's own cost of a
    PutEvents on loopback (bench/overhead.py; moto's server takes tens of milliseconds)."""

    def __init__(self, moto_endpoint: str | None) -> None:
        self._moto = None if moto_endpoint is None else urlsplit(moto_endpoint)
        self.taken = 0  # entries answered with an EventId
        self._lock = threading.Lock()
        self._script: list[Behaviour] = []
        self.calls: list[list[dict[str, Any]]] = []  # each PutEvents call's entries
        self.answered: list[float] = []  # time.monotonic() as each call's answer is sent
        self.holding = threading.Event()  # a held call has arrived
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, *behaviours: Behaviour) -> None:
        """The next calls' behaviours, in order; later calls pass."""
        with self._lock:
            self._script = list(behaviours)
            self.calls.clear()
            self.answered.clear()
            self.holding.clear()

    def _next(self) -> Behaviour:
        with self._lock:
            return self._script.pop(0) if self._script else Behaviour("pass")

    def start(self) -> EventBridgeGate:
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive, as EventBridge's answers are

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                if target != "AWSEvents.PutEvents":
                    self._relay(body)
                    return
                request = json.loads(body or b"{}")
                entries = list(request.get("Entries", []))
                with gate._lock:
                    gate.calls.append(entries)
                gate._answer(self, request, entries)

            def _relay(self, body: bytes) -> None:
                status, headers, answer = gate._forward(self.headers, body)
                self._reply(status, answer, headers.get("Content-Type", JSON))

            def _reply(self, status: int, body: bytes, content_type: str = JSON) -> None:
                # One write: headers and body in separate segments would meet the client's
                # delayed ACK (Nagle), 40 ms a call.
                head = (
                    f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}\r\n"
                    f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                    f"x-amzn-RequestId: {uuid.uuid4()}\r\n\r\n"
                )
                self.wfile.write(head.encode() + body)

        self._handler = Handler
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- the answers ----------------------------------------------------------------------

    def _answer(self, handler: Any, request: dict[str, Any], entries: list[Any]) -> None:
        behaviour = self._next()
        send: Callable[..., None] = handler._reply

        def reply(status: int, body: bytes) -> None:
            with self._lock:  # before it is sent: no client can have it earlier
                self.answered.append(time.monotonic())
            send(status, body)

        if behaviour.kind == "throttle":
            reply(400, _error("ThrottlingException"))
            return
        if behaviour.kind == "fail":
            reply(500, _error("InternalException"))
            return
        if behaviour.kind == "hold" and behaviour.gate is not None:
            self.holding.set()
            behaviour.gate.wait()
            if not behaviour.deliver:
                handler.close_connection = True
                return
        refused = behaviour.refused if behaviour.kind == "refuse" else {}
        passed = [e for i, e in enumerate(entries) if i not in refused]
        results: list[dict[str, Any]] = []
        if passed and self._moto is None:
            results = [{"EventId": str(uuid.uuid4())} for _ in passed]
        elif passed:
            status, _, body = self._forward(
                handler.headers, json.dumps({**request, "Entries": passed}).encode()
            )
            if status != 200:
                reply(status, body)
                return
            results = list(json.loads(body).get("Entries", []))
        answered: list[dict[str, Any]] = []
        for index in range(len(entries)):
            code = refused.get(index)
            if code is not None:
                answered.append({"ErrorCode": code, "ErrorMessage": MESSAGES.get(code, code)})
            else:
                answered.append(results.pop(0))
        failed = sum(1 for a in answered if "ErrorCode" in a)
        with self._lock:
            self.taken += len(answered) - failed
        reply(200, json.dumps({"FailedEntryCount": failed, "Entries": answered}).encode())

    def _forward(self, headers: Any, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """The request as it came (moto does not check signatures), to moto."""
        if self._moto is None:
            return 400, {}, _error("UnknownOperationException")
        connection = http.client.HTTPConnection(
            self._moto.hostname or "127.0.0.1", self._moto.port, timeout=10
        )
        try:
            keep = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
            connection.request("POST", "/", body=body, headers=keep)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()


def _error(code: str) -> bytes:
    return json.dumps({"__type": code, "message": MESSAGES.get(code, code)}).encode()
