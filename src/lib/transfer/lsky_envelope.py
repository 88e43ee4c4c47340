"""Lsky Pro's JSON envelope ({"status", "message", "data"}), read the same way for every
endpoint (pure): redirects to /login, error statuses, bodies that are not JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lib.platform.redact import outside_text
from lib.transfer.failures import Kind, Stage, fail, retry_after_seconds

REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Lsky's `message` as kept in a log line, archive_error or the lane's pause_detail.
MESSAGE_LIMIT = 160


def short_message(value: Any, *, secrets: Iterable[str] = ()) -> str:
    """Lsky's `message`, safe for a log line or archive_error: redacted (a misconfigured
    server may echo the Authorization header), then one bounded line."""
    return outside_text(value, MESSAGE_LIMIT, secrets=secrets)


def parsed(raw: bytes) -> Any:
    """A body read as JSON; None when it is not JSON (or nests past the parser's depth:
    json.loads raises RecursionError, not ValueError, for a body of brackets)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class Envelope:
    payload: dict[str, Any]  # the JSON object of an HTTP 200
    message: str  # its `message`, shortened


def read_envelope(
    stage: Stage,
    subject: str,
    status: int,
    raw: bytes,
    *,
    location: str | None = None,
    retry_after: str | None = None,
    secrets: Iterable[str] = (),
) -> Envelope:
    """The JSON object of an HTTP 200 answer; raises ArchiveFailure (at `stage`) for a
    redirect, another status or a body that is not a JSON object. `subject` names the
    answer in messages ("Lsky", "Lsky's image list"); `secrets` (the request's token) are
    redacted from Lsky's message before it is shortened."""
    if status in REDIRECTS:
        if location and "/login" in location:
            raise fail(
                stage, Kind.HTTP_STATUS, "Lsky redirected to /login: token refused", status=401
            )
        raise fail(stage, Kind.HTTP_STATUS, f"Lsky redirected (HTTP {status})", status=status)
    payload = parsed(raw)
    message = (
        short_message(payload.get("message", ""), secrets=secrets)
        if isinstance(payload, dict)
        else ""
    )
    if status != 200:
        detail = f": {message}" if message else ""
        raise fail(
            stage,
            Kind.HTTP_STATUS,
            f"{subject} answered HTTP {status}{detail}",
            status=status,
            retry_after=retry_after_seconds(retry_after),
        )
    if not isinstance(payload, dict):
        raise fail(
            stage,
            Kind.BAD_RESPONSE,
            f"{subject} answered HTTP 200 with a non-JSON body",
            status=200,
        )
    return Envelope(payload, message)
