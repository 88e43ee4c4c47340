"""Lambda's Runtime API and Extensions API on loopback, for a real runtime (awslambdaric)
to run a handler as Lambda would, internal extensions included.

Written from AWS's documented APIs (runtimes-api, runtimes-extensions-api):
- POST /2020-01-01/extension/register (Lambda-Extension-Name; {"events": [...]}): 200 and a
  Lambda-Extension-Identifier; only during Init (before the runtime's first
  invocation/next), and an internal extension may register for INVOKE only;
- GET /2020-01-01/extension/event/next (Lambda-Extension-Identifier): the next event,
  {"eventType": "INVOKE", "deadlineMs", "requestId", "invokedFunctionArn", "tracing"};
- GET /2018-06-01/runtime/invocation/next: the event, with Lambda-Runtime-Aws-Request-Id,
  -Deadline-Ms, -Invoked-Function-Arn, -Trace-Id; POST .../invocation/{id}/response or
  /error answers it (202); POST /2018-06-01/runtime/init/error reports a failed init.
An invocation is delivered to the runtime and to every extension at once, only when all
of them are waiting in their next; the function's response is available as soon as the
runtime posts it, and the environment could be frozen only once every extension called
its next again (`released`): the next invocation waits for that.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from devkit._http import BackgroundServer, QuietHandler

FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:ArchiveFunction"
RUNTIME = "/2018-06-01/runtime"
EXTENSION = "/2020-01-01/extension"


@dataclass
class Invocation:
    """One invoke, and when (time.monotonic()) each thing happened to it."""

    request_id: str
    event: dict[str, Any]
    deadline_ms: int
    delivered: float | None = None  # the runtime's invocation/next answered
    responded: float | None = None  # the runtime posted its response (or error)
    response: Any = None
    error: Any = None
    released: float | None = None  # every extension back in event/next: freezable
    released_ms: int | None = None  # the same, epoch milliseconds (as deadline_ms)
    done: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)


class LambdaRuntimeStandIn(BackgroundServer):
    """`refuse_registration`: register answers 500 (the Extensions API failing)."""

    def __init__(self, *, refuse_registration: bool = False) -> None:
        self.handler_class = _Handler
        super().__init__()
        self.refuse_registration = refuse_registration
        self.address = f"{self.host}:{self.port}"
        self.extensions: dict[str, str] = {}  # identifier -> name
        self.registrations: list[tuple[int, dict[str, Any]]] = []  # (status, body) each
        self.init_errors: list[Any] = []
        self._cond = threading.Condition()
        self._init_over = False
        self._runtime_waiting = False
        self._ready: set[str] = set()  # extensions waiting in event/next
        self._events: dict[str, deque[dict[str, Any]]] = {}
        self._pending: deque[Invocation] = deque()
        self._current: Invocation | None = None
        self._for_runtime: Invocation | None = None

    def invoke(self, event: dict[str, Any], *, timeout_seconds: float = 30.0) -> Invocation:
        """Queue an invoke; its `answered` is set when the runtime posts its response,
        its `done` when the environment could be frozen."""
        invocation = Invocation(
            str(uuid.uuid4()), event, int(time.time() * 1000 + timeout_seconds * 1000)
        )
        with self._cond:
            self._pending.append(invocation)
            self._dispatch()
        return invocation

    # -- the model (called with the lock held) ---------------------------------------------

    def _dispatch(self) -> None:
        if self._current is not None and self._current.responded and self._all_ready():
            self._current.released = time.monotonic()
            self._current.released_ms = int(time.time() * 1000)
            self._current.done.set()
            self._current = None
        if self._current is None and self._pending and self._runtime_waiting and self._all_ready():
            invocation = self._current = self._pending.popleft()
            self._for_runtime = invocation
            for identifier in self.extensions:
                self._ready.discard(identifier)
                self._events[identifier].append(
                    {
                        "eventType": "INVOKE",
                        "deadlineMs": invocation.deadline_ms,
                        "requestId": invocation.request_id,
                        "invokedFunctionArn": FUNCTION_ARN,
                        "tracing": {"type": "X-Amzn-Trace-Id", "value": _trace_id()},
                    }
                )
        self._cond.notify_all()

    def _all_ready(self) -> bool:
        return self._ready >= set(self.extensions)

    def _register(self, name: str | None, body: Any) -> tuple[int, dict[str, Any], str | None]:
        events = body.get("events") if isinstance(body, dict) else None
        if self.refuse_registration:
            return 500, {"errorType": "Extension.Unknown", "errorMessage": "refused"}, None
        if not name or not isinstance(events, list) or not events:
            return 400, {"errorType": "InvalidRequest", "errorMessage": "bad request"}, None
        if self._init_over:
            return 403, {"errorType": "Extension.Forbidden", "errorMessage": "init over"}, None
        if set(events) - {"INVOKE"}:
            # Only Init's extensions in this process exist here: all internal, INVOKE only.
            return 400, {"errorType": "InvalidEventType", "errorMessage": str(events)}, None
        identifier = str(uuid.uuid4())
        self.extensions[identifier] = name
        self._events[identifier] = deque()
        return 200, {"functionName": "ArchiveFunction", "functionVersion": "$LATEST"}, identifier

    def _extension_next(self, identifier: str) -> dict[str, Any] | None:
        with self._cond:
            if identifier not in self.extensions:
                return None
            self._ready.add(identifier)
            self._dispatch()
            self._cond.wait_for(lambda: bool(self._events[identifier]))
            return self._events[identifier].popleft()

    def _runtime_next(self) -> Invocation:
        with self._cond:
            self._init_over = True
            self._runtime_waiting = True
            self._dispatch()
            self._cond.wait_for(lambda: self._for_runtime is not None)
            invocation = self._for_runtime
            assert invocation is not None
            self._for_runtime = None
            self._runtime_waiting = False
            invocation.delivered = time.monotonic()
            return invocation

    def _answer(self, request_id: str, kind: str, body: Any) -> bool:
        with self._cond:
            invocation = self._current
            if invocation is None or invocation.request_id != request_id:
                return False
            invocation.responded = time.monotonic()
            if kind == "response":
                invocation.response = body
            else:
                invocation.error = body
            invocation.answered.set()
            self._dispatch()
            return True


def _trace_id() -> str:
    root = f"1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]}"
    return f"Root={root};Parent={uuid.uuid4().hex[:16]};Sampled=0"


class _Handler(QuietHandler):
    def _body(self) -> Any:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        api: LambdaRuntimeStandIn = self.server.owner
        if self.path == f"{RUNTIME}/invocation/next":
            invocation = api._runtime_next()
            self._send(
                200,
                invocation.event,
                {
                    "Lambda-Runtime-Aws-Request-Id": invocation.request_id,
                    "Lambda-Runtime-Deadline-Ms": str(invocation.deadline_ms),
                    "Lambda-Runtime-Invoked-Function-Arn": FUNCTION_ARN,
                    "Lambda-Runtime-Trace-Id": _trace_id(),
                },
            )
        elif self.path == f"{EXTENSION}/event/next":
            event = api._extension_next(self.headers.get("Lambda-Extension-Identifier", ""))
            if event is None:
                self._send(403, {"errorType": "Extension.Unknown", "errorMessage": "unknown"})
            else:
                self._send(200, event, {"Lambda-Extension-Event-Identifier": str(uuid.uuid4())})
        else:
            self._send(404, {"errorType": "NotFound", "errorMessage": self.path})

    def do_POST(self) -> None:
        api: LambdaRuntimeStandIn = self.server.owner
        body = self._body()
        if self.path == f"{EXTENSION}/register":
            with api._cond:
                status, answer, identifier = api._register(
                    self.headers.get("Lambda-Extension-Name"), body
                )
                api.registrations.append((status, body))
            headers = {"Lambda-Extension-Identifier": identifier} if identifier else {}
            self._send(status, answer, headers)
        elif self.path == f"{RUNTIME}/init/error":
            api.init_errors.append(body)
            self._send(202, {"status": "OK"})
        elif self.path.startswith(f"{RUNTIME}/invocation/"):
            request_id, _, kind = self.path.removeprefix(f"{RUNTIME}/invocation/").partition("/")
            if kind in ("response", "error") and api._answer(request_id, kind, body):
                self._send(202, {"status": "OK"})
            else:
                self._send(400, {"errorType": "InvalidRequestID", "errorMessage": request_id})
        else:
            self._send(404, {"errorType": "NotFound", "errorMessage": self.path})
