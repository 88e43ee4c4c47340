"""Work done after the function's response, before Lambda freezes the container: a Lambda
internal extension (a thread of this process, registered with the Extensions API during
init) runs the job the handler hands it for each invocation, then tells Lambda it is done
(docs/explanation/completion-events.md, "Published after the response")."""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from lib.platform.observability import log_unexpected, logger

# A job is given the invocation's milliseconds left; it never raises (if it does, it is
# logged).
Job = Callable[[int], None]

NAME = "image-archive-after-response"
REGISTER = "/2020-01-01/extension/register"
NEXT = "/2020-01-01/extension/event/next"
# Registration is a loopback call during init: answered at once, or something is wrong.
REGISTER_TIMEOUT_SECONDS = 2.0
# Back in /next this long before the invocation's deadline at the latest, job or none:
# Lambda freezes (or times out) the invocation only when every extension is.
DEADLINE_MARGIN_MS = 200
# Lambda's longest timeout: a deadline further away is not believed.
MAX_INVOCATION_MS = 900_000
# Hand-offs kept for invocations the thread has not seen yet (normally one).
MAX_WAITING = 8
# After a failed /next, the thread waits this long before asking again.
RETRY_SECONDS = 1.0
MAX_IDENTIFIER = 128


class AfterResponse:
    """The registered extension; `hand_off` is the handler's side, the thread Lambda's."""

    def __init__(self, api: str, identifier: str) -> None:
        self._api = api
        self._identifier = identifier
        self._ready = threading.Condition()
        self._jobs: dict[str, Job | None] = {}
        self._thread = threading.Thread(target=self._run, name="after-response", daemon=True)

    @classmethod
    def register(cls, api: str) -> AfterResponse | None:
        """Registered for INVOKE (the only event an internal extension may have) and
        started; None, said once, when the Extensions API refuses or cannot be reached."""
        try:
            identifier = _register(api)
        except Exception as error:  # noqa: BLE001 - the handler publishes before returning
            logger.warning(
                "could not register the after-response extension; completion events are "
                "published before the function returns",
                error=type(error).__name__,
            )
            return None
        extension = cls(api, identifier)
        extension._thread.start()
        return extension

    def hand_off(self, request_id: str, job: Job | None) -> None:
        """This invocation's job (None: nothing to do); always called, also when the
        handler raised, so that the extension never waits for it past the deadline."""
        with self._ready:
            self._jobs[request_id] = job
            while len(self._jobs) > MAX_WAITING:
                del self._jobs[next(iter(self._jobs))]
            self._ready.notify_all()

    def _run(self) -> None:
        connection: http.client.HTTPConnection | None = None
        while True:  # never ends: a dead extension would hold every invocation to its timeout
            try:
                connection = connection or http.client.HTTPConnection(self._api)
                event = self._next(connection)
            except Exception as error:  # noqa: BLE001 - asked again after a pause
                logger.warning("the Extensions API's next event failed", error=type(error).__name__)
                connection = None
                time.sleep(RETRY_SECONDS)
                continue
            try:
                self._serve(event)
            except Exception as error:  # noqa: BLE001 - said; the next invocation is served
                log_unexpected("the after-response job failed", error)

    def _next(self, connection: http.client.HTTPConnection) -> dict[str, Any]:
        """Blocks until Lambda's next event: no timeout, the container may be frozen."""
        connection.request("GET", NEXT, headers={"Lambda-Extension-Identifier": self._identifier})
        response = connection.getresponse()
        body = response.read(64 * 1024)
        if response.status != 200:
            raise ExtensionsApiError(f"event/next answered {response.status}")
        event = json.loads(body)
        if not isinstance(event, dict):
            raise ExtensionsApiError("event/next answered no object")
        return event

    def _serve(self, event: dict[str, Any]) -> None:
        """INVOKE: wait for the handler's hand-off (until near the deadline), run it."""
        if event.get("eventType") != "INVOKE":
            return
        request_id = str(event.get("requestId") or "")[:MAX_IDENTIFIER]
        deadline_ms = _deadline_ms(event.get("deadlineMs"))
        with self._ready:
            # An INVOKE without its id (never seen) takes the first hand-off that comes.
            handed = self._ready.wait_for(
                lambda: request_id in self._jobs if request_id else bool(self._jobs),
                timeout=max(deadline_ms - DEADLINE_MARGIN_MS - _now_ms(), 0) / 1000,
            )
            request_id = request_id or next(iter(self._jobs), "")
            job = self._jobs.pop(request_id, None)
            # Hand-offs of invocations never announced: their jobs are done by this one's.
            self._jobs.clear()
        if not handed:
            logger.warning("no after-response job handed off before the deadline")
        if job is not None:
            job(max(deadline_ms - _now_ms(), 0))


class ExtensionsApiError(Exception):
    """The Extensions API refused a call."""


def _register(api: str) -> str:
    connection = http.client.HTTPConnection(api, timeout=REGISTER_TIMEOUT_SECONDS)
    try:
        connection.request(
            "POST",
            REGISTER,
            body=json.dumps({"events": ["INVOKE"]}),
            headers={"Lambda-Extension-Name": NAME, "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        response.read(64 * 1024)
        identifier = response.getheader("Lambda-Extension-Identifier") or ""
    finally:
        connection.close()
    if response.status != 200:
        raise ExtensionsApiError(f"register answered {response.status}")
    if not identifier or len(identifier) > MAX_IDENTIFIER or not identifier.isprintable():
        raise ExtensionsApiError("register answered no usable identifier")
    return identifier


def _deadline_ms(value: object) -> int:
    """The invocation's deadline (epoch ms); now when it is absent or absurd: no wait, and
    no time left for a job."""
    now = _now_ms()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return now
    return int(min(max(value, now), now + MAX_INVOCATION_MS))


def _now_ms() -> int:
    return int(time.time() * 1000)
