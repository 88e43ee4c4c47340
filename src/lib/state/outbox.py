"""The outbox of completion events (image_archive_outbox, lib/sql/queries.sql): what a
concluding statement wrote, the sweeper's page and its settlement, the counts `status`
shows, and a record's events still waiting for `show`. lib.publish publishes them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.state.events import Actor
from lib.state.queries import Statements

# `status` counts the waiting events up to this many (an outage can leave many).
COUNT_LIMIT = 10_000


@dataclass(frozen=True)
class OutboxEvent:
    """One completion event as its statement wrote it (the detail as stored, raw)."""

    event_id: str
    record_id: int
    detail_type: str
    detail: dict[str, Any]
    created_at: datetime  # the conclusion's time (the database's clock)
    tries: int = 0  # publications that failed so far (the sweeper's count)
    rejections: int = 0  # of them, EventBridge refused the entry for good


@dataclass(frozen=True)
class Publication:
    """An event PutEvents took: its id and when it answered (the database's clock, as the
    conclusion's time moved on by the container's own)."""

    event_id: str
    at: datetime


@dataclass(frozen=True)
class Missed:
    """An event a PutEvents call did not publish, and why (an error code and message)."""

    event_id: str
    error: str
    rejected: bool  # refused for good (the entry itself), not throttled or failed


@dataclass(frozen=True)
class Page:
    """The sweeper's page of events, and the database's now() when it was taken."""

    events: list[OutboxEvent]
    now: datetime | None


@dataclass(frozen=True)
class Settled:
    published: int
    missed: int
    dropped: int


@dataclass(frozen=True)
class OutboxSummary:
    waiting: int  # events not published yet (counted up to `limit`)
    oldest_age_seconds: float  # how long the oldest has waited; 0 when none
    limit: int = COUNT_LIMIT


@dataclass(frozen=True)
class Waiting:
    """A record's event still in the outbox (`archive-ctl show`)."""

    event_id: str
    detail_type: str
    created_at: datetime
    tries: int
    last_error: str | None


def _json(value: Any) -> dict[str, Any]:
    """jsonb as pg8000 hands it back (a dict, or text); anything else: empty."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def outbox_event(record_id: int, row: Sequence[Any]) -> OutboxEvent | None:
    """(event_id, detail_type, detail, created_at) as a statement returns them; None when
    it wrote no event (events off, nothing concluded)."""
    event_id, detail_type, detail, created_at = row
    if event_id is None:
        return None
    return OutboxEvent(str(event_id), record_id, str(detail_type), _json(detail), created_at)


def published_params(published: Sequence[Publication], by: Actor) -> dict[str, Any]:
    """The parameters of outbox_published: ids, times, and who published them."""
    return {
        "published": [p.event_id for p in published],
        "published_at": [p.at for p in published],
        "by": str(by),
    }


class Written:
    """The completion events a container's statements wrote, for its publisher to take
    (lib.publish). publish: events are on; the statements write them only then."""

    def __init__(self, publish: bool) -> None:
        self.publish = publish
        self._events: list[OutboxEvent] = []

    def event_id(self) -> str | None:
        """A new event's id for a statement to write, or None when events are off."""
        return str(uuid.uuid4()) if self.publish else None

    def add(self, record_id: int, row: Sequence[Any]) -> None:
        """(event_id, detail_type, detail, created_at) as a statement returned them."""
        event = outbox_event(record_id, row)
        if event is not None:
            self._events.append(event)

    def take(self) -> list[OutboxEvent]:
        """The events written since the last call."""
        taken, self._events = self._events, []
        return taken


class OutboxStore(Statements):
    """The sweeper's and archive-ctl's statements on the outbox."""

    def take(
        self, *, grace_seconds: int, lease_seconds: int, limit: int, own: Sequence[str] = ()
    ) -> Page:
        """Events to publish now, held for `lease_seconds`: older than the grace period
        (oldest first, `limit` at most), and the `own` ones this run wrote."""
        rows = self._run(
            "outbox_take", grace=grace_seconds, lease=lease_seconds, limit=limit, own=list(own)
        )
        events = [
            OutboxEvent(
                str(event_id),
                int(record_id),
                str(detail_type),
                _json(detail),
                created_at,
                int(tries),
                int(rejections),
            )
            for event_id, record_id, detail_type, detail, created_at, tries, rejections, _ in rows
        ]
        return Page(events, rows[0][7] if rows else None)

    def settle(
        self,
        *,
        published: Sequence[Publication],
        missed: Sequence[Missed],
        dropped: Sequence[Missed],
        by: Actor = Actor.SWEEPER,
    ) -> Settled:
        """Published and dropped events leave the outbox (their stories say so); missed ones
        count a try and wait for the next sweep."""
        [[done, failed, gone]] = self._run(
            "outbox_settle",
            **published_params(published, by),
            missed=[m.event_id for m in missed],
            errors=[m.error for m in missed],
            rejected=[m.rejected for m in missed],
            dropped=[d.event_id for d in dropped],
            dropped_errors=[d.error for d in dropped],
        )
        return Settled(int(done), int(failed), int(gone))

    def summary(self, *, limit: int = COUNT_LIMIT) -> OutboxSummary:
        [[waiting, oldest]] = self._run("outbox_summary", limit=limit)
        return OutboxSummary(int(waiting), round(float(oldest), 1), limit)

    def waiting(self, event_ids: Sequence[str]) -> list[Waiting]:
        """The given events that are still in the outbox, oldest first."""
        if not event_ids:
            return []
        rows = self._run("record_outbox", event_ids=list(event_ids))
        return [
            Waiting(str(event_id), str(kind), created_at, int(tries), last_error)
            for event_id, kind, created_at, tries, last_error in rows
        ]
