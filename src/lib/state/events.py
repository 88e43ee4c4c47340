"""A record's story: the kinds of event (mirrored by the CHECK of image_archive_events), who
enqueues, the bound every detail keeps, and EventLog, an attempt's events kept in memory
until the statement that concludes it writes them. docs/explanation/stories.md says why it is so.
"""

from __future__ import annotations

import enum
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lib.platform.redact import outside_text


class EventKind(enum.StrEnum):
    """image_archive_events.kind; the table's CHECK lists the same names."""

    ENQUEUED = "enqueued"  # a message is (to be) sent for it: by whom (Actor), why
    UNSENT = "unsent"  # that message did not go out: the stamp was put back
    DEQUEUED = "dequeued"  # an interrupted backfill made it never-queued again
    DATED = "dated"  # the sweeper gave a PENDING row without a due time one
    RECEIVED = "received"  # a message for it reached the archive function
    CLAIMED = "claimed"  # an attempt started: its number, the invocation that has the lock
    LOCK_TAKEN_OVER = "lock_taken_over"  # an expired lock ended: by a claim or the sweeper
    LOCK_LOST = "lock_lost"  # an attempt's write found its lock passed on: not recorded
    FETCHED = "fetched"  # the bytes in hand (provider or staged copy), or the failure
    STAGED = "staged"  # a copy put in the staging bucket
    SLOT = "slot"  # pacing's answer: taken now, booked for later, to wait, or paused
    LANE_PAUSED = "lane_paused"  # this attempt's answer from Lsky paused the lane
    LOOKED_UP = "looked_up"  # an earlier attempt's image looked for: adopted or not, why
    UPLOAD_ANSWERED = "upload_answered"  # Lsky's answer to the upload, or the failure
    HELD = "held"  # given back (or not claimed), its message held: why and until when
    PARKED = "parked"  # waiting without a message: why and until when
    UNPARKED = "unparked"  # the lane reopened: due again
    RETRIED = "retried"  # the attempt failed, another follows: error class, next run
    FAILED = "failed"  # concluded as FAILED: the error, and by whom
    ARCHIVED = "archived"  # concluded as SUCCEEDED: the hosted URL, altered or adopted
    AUDITED = "audited"  # the hosted copy checked: only a verdict that changed or is not intact
    ORIGINAL_KEPT = "original_kept"  # a second copy kept in the originals bucket, from where
    RESTORED = "restored"  # published again from its original: the old and new URL and key
    LOST_ON_HOST = "lost_on_host"  # missing or altered on the host, with nothing to restore from


# The kinds that conclude a record: the sweeper's retention counts from them.
CONCLUDING = (EventKind.ARCHIVED, EventKind.FAILED)


class Actor(enum.StrEnum):
    """Who did it, in an event's `by` (enqueued, unparked, failed, lock_taken_over...)."""

    PRODUCER = "producer"  # the generation service (inferred from the row) or a Python caller
    ENQUEUE = "archive-ctl enqueue"
    BACKFILL = "archive-ctl backfill"
    REQUEUE = "archive-ctl requeue"
    DLQ_REDRIVE = "archive-ctl redrive-dlq"
    LANE_CLEAR = "archive-ctl lane clear"
    SWEEPER = "sweeper"
    WORKER = "archive function"
    AUDITOR = "auditor"
    AUDIT = "archive-ctl audit"
    RESTORE = "archive-ctl restore"


# A detail is a small JSON object: each text redacted then cut to FIELD_LIMIT characters,
# at most LIST_LIMIT items of a list, and the whole at most DETAIL_LIMIT characters.
FIELD_LIMIT = 300
LIST_LIMIT = 5
DETAIL_LIMIT = 1_000
# What a detail that still does not fit is cut to, field by field.
_SHORT_FIELD = 60


def _bounded(value: Any, field_limit: int, list_limit: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {
            outside_text(key, 40): _bounded(item, field_limit, list_limit)
            for key, item in list(value.items())[:20]
        }
    if isinstance(value, list | tuple):
        return [_bounded(item, field_limit, list_limit) for item in list(value)[:list_limit]]
    return outside_text(value, field_limit)


def bounded_detail(detail: Mapping[str, Any]) -> dict[str, Any]:
    """`detail` made safe to keep: texts redacted (tokens, passwords, URL signatures) and
    cut, lists shortened, numbers finite, and the whole within DETAIL_LIMIT characters (the
    longest fields shortened first, then fields dropped, with `"truncated": true`)."""
    kept: dict[str, Any] = _bounded(dict(detail), FIELD_LIMIT, LIST_LIMIT)
    if _size(kept) <= DETAIL_LIMIT:
        return kept
    kept = _bounded(kept, _SHORT_FIELD, 2)
    kept["truncated"] = True
    while _size(kept) > DETAIL_LIMIT and len(kept) > 1:
        kept.pop(next(key for key in reversed(kept) if key != "truncated"))
    return kept


def _size(detail: Mapping[str, Any]) -> int:
    return len(json.dumps(detail, ensure_ascii=False))


@dataclass(frozen=True)
class Event:
    """One event; `at` None: the time of the statement that writes it."""

    kind: EventKind
    detail: Mapping[str, Any]
    at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "at": None if self.at is None else self.at.isoformat(),
            "detail": dict(self.detail),
        }


def events_param(events: Sequence[Event]) -> str:
    """The `:events` parameter of a concluding statement: a JSON array, oldest first."""
    return json.dumps([event.as_json() for event in events], ensure_ascii=False)


def detail_param(**detail: Any) -> str:
    """A statement's `:detail` parameter: a bounded JSON object."""
    return json.dumps(bounded_detail(detail), ensure_ascii=False)


class EventLog:
    """The events of one attempt, in memory until the statement that concludes it writes
    them (no round trip of their own). Times are the database's: the claim's now() moved
    on by the time elapsed here, so they sort with the events statements write."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._origin: tuple[datetime, float] | None = None

    def start(self, db_now: datetime) -> None:
        """The claim's clock: what `now` the following events are measured from."""
        self._origin = (db_now, time.monotonic())

    def note(self, kind: EventKind, **detail: Any) -> None:
        """An event now (fields given as None are left out)."""
        kept = {key: value for key, value in detail.items() if value is not None}
        self._events.append(Event(kind, bounded_detail(kept), self._now()))

    def pending(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def written(self) -> None:
        """The concluding statement kept them: a second conclusion must not repeat them."""
        self._events.clear()

    def _now(self) -> datetime | None:
        if self._origin is None:
            return None
        db_now, since = self._origin
        return db_now + timedelta(seconds=time.monotonic() - since)
