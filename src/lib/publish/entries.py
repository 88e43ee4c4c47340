"""Completion events as EventBridge receives them (pure): each detail type's detail (its
JSON Schema is in docs/reference/events-and-metrics.md), PutEvents' entries and batches,
what its answer means. Every field is read from the outbox row and bounded here, whoever
wrote the row: texts redacted and cut, numbers checked, unknown fields left out; an entry
stays far below 256 KB."""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lib.platform.redact import outside_text
from lib.state.error_classes import error_class
from lib.state.outbox import OutboxEvent

SOURCE = "image-archive"


class DetailType(enum.StrEnum):
    """The completion events (image_archive_outbox's CHECK lists the same names)."""

    ARCHIVED = "Image Archived"
    FAILED = "Image Archive Failed"
    RESTORED = "Image Restored"  # archived again, replacing another hosted URL (a repair)


# Bounds of the detail's texts. A hosted URL is checked at 2,048 characters when Lsky
# answers (lib.transfer.lsky_upload); a row may contain anything.
URL_LIMIT = 2_048
KEY_LIMIT = 64
MIME_LIMIT = 100
ERROR_LIMIT = 500
MAX_COUNT = 2**31 - 1
MAX_SIZE = 2**53 - 1  # a JavaScript-safe integer

# PutEvents: at most 10 entries a call, 256 KB of entries in all (Time counts 14 bytes;
# Source, DetailType and Detail their UTF-8 bytes).
MAX_ENTRIES = 10
MAX_REQUEST_BYTES = 256 * 1024
TIME_BYTES = 14


def _text(value: Any, limit: int) -> str | None:
    return None if value is None or value == "" else outside_text(value, limit)


def _whole(value: Any, maximum: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if 0 <= value <= maximum else None


def iso_time(moment: datetime) -> str:
    """An instant as ISO 8601 in UTC with milliseconds, e.g. 2025-01-31T12:00:00.123Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def detail(event: OutboxEvent) -> dict[str, Any]:
    """The event's detail, as its detail type's schema says
    (docs/reference/events-and-metrics.md)."""
    stored = event.detail
    found: dict[str, Any] = {
        "eventId": event.event_id,
        "recordId": str(event.record_id),
        "time": iso_time(event.created_at),
        "attempts": _whole(stored.get("attempts"), MAX_COUNT) or 0,
    }
    if event.detail_type == DetailType.FAILED:
        error = _text(stored.get("error"), ERROR_LIMIT) or "unknown error"
        return {**found, "error": error, "errorClass": error_class(error)}
    found |= {
        "hostedUrl": _text(stored.get("hostedUrl"), URL_LIMIT) or "",
        "mimeType": _text(stored.get("mimeType"), MIME_LIMIT),
        "size": _whole(stored.get("size"), MAX_SIZE),
        "key": _text(stored.get("key"), KEY_LIMIT),
    }
    if event.detail_type == DetailType.RESTORED:
        found |= {
            "previousHostedUrl": _text(stored.get("previousHostedUrl"), URL_LIMIT) or "",
            "previousKey": _text(stored.get("previousKey"), KEY_LIMIT),
        }
    return found


def entry(event: OutboxEvent) -> dict[str, Any]:
    """The PutEvents entry (the bus is added by lib.platform.eventbridge). Time is the
    conclusion's, so a re-sent event keeps it as well as its eventId."""
    return {
        "Source": SOURCE,
        "DetailType": str(event.detail_type),
        "Detail": json.dumps(detail(event), ensure_ascii=False, separators=(",", ":")),
        "Time": event.created_at,
    }


def entry_bytes(item: Mapping[str, Any]) -> int:
    """EventBridge's size of an entry ("Calculating PutEvents event entry size")."""
    size = TIME_BYTES if item.get("Time") is not None else 0
    for name in ("Source", "DetailType", "Detail"):
        size += len(str(item.get(name, "")).encode())
    return size + sum(len(str(r).encode()) for r in item.get("Resources", []))


def batches(events: Sequence[OutboxEvent]) -> list[list[OutboxEvent]]:
    """The events in PutEvents calls, in order: at most MAX_ENTRIES and MAX_REQUEST_BYTES
    each (an event's entry is a few KB at most: see the module's docstring)."""
    found: list[list[OutboxEvent]] = []
    size = 0
    for event in events:
        bytes_ = entry_bytes(entry(event))
        if not found or len(found[-1]) >= MAX_ENTRIES or size + bytes_ > MAX_REQUEST_BYTES:
            found.append([])
            size = 0
        found[-1].append(event)
        size += bytes_
    return found


# -- what PutEvents answered ---------------------------------------------------------------

# PutEventsResultEntry's ErrorCode (EventBridge API reference): retryable ones, ours to fix
# (the role, the bus: retried until fixed, never dropped), and refusals of the entry itself.
RETRYABLE = frozenset({"InternalFailure", "ThrottlingException"})
CONFIGURATION = frozenset(
    {
        "AccessDeniedException",
        "InvalidAccountIdException",
        "NotAuthorizedForSourceException",
        "NotAuthorizedForDetailTypeException",
    }
)
REFUSED = frozenset({"MalformedDetail", "InvalidArgument", "RedactionFailure"})
# An entry refused for good this many times is dropped (logged, counted): the refusal is
# the entry's own, and repeated, not a passing fault.
MAX_REJECTIONS = 3
REASON_LIMIT = 200


class Fate(enum.StrEnum):
    PUBLISHED = "published"
    RETRY = "retry"  # throttled, failed, unknown, or our configuration: tried again
    REFUSED = "refused"  # the entry itself: dropped after MAX_REJECTIONS


@dataclass(frozen=True)
class Answer:
    event: OutboxEvent
    fate: Fate
    error: str = ""  # "<ErrorCode>: <ErrorMessage>", redacted and bounded

    @property
    def dropped(self) -> bool:
        """Refused for good once too often: the sweeper drops it."""
        return self.fate is Fate.REFUSED and self.event.rejections + 1 >= MAX_REJECTIONS


def answers(sent: Sequence[OutboxEvent], results: Sequence[Mapping[str, Any]]) -> list[Answer]:
    """Each event's fate from PutEvents' Entries (the same order as sent). An entry the
    answer does not account for is not published: a caller never assumes a publication."""
    found = []
    for index, event in enumerate(sent):
        result = results[index] if index < len(results) else {}
        code = result.get("ErrorCode")
        if not code and isinstance(result.get("EventId"), str) and result["EventId"]:
            found.append(Answer(event, Fate.PUBLISHED))
            continue
        code = outside_text(code or "NotAcknowledged", 60)
        message = outside_text(result.get("ErrorMessage") or "", REASON_LIMIT)
        error = f"{code}: {message}" if message else code
        fate = Fate.REFUSED if code in REFUSED else Fate.RETRY
        found.append(Answer(event, fate, error))
    return found


def codes(found: Iterable[Answer]) -> list[str]:
    """The error codes among the answers, sorted, once each (a log line's field)."""
    return sorted({a.error.split(":", 1)[0] for a in found if a.fate is not Fate.PUBLISHED})
