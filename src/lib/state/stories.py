"""Reading one record's story back (`archive-ctl show`): its row as the story needs it and
its events, newest last (lib/sql/queries.sql: record_story, record_events)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lib.state.events import CONCLUDING
from lib.state.outbox import OutboxStore
from lib.state.queries import Statements


@dataclass(frozen=True)
class RecordRow:
    """The columns of image_generation_records `show` reads, and the database's now()."""

    record_id: int
    status: str | None  # the generation's
    archive_status: str | None
    attempts: int
    next_run_at: datetime | None
    wait_reason: str | None
    enqueued_at: datetime | None
    locked_by: str | None
    locked_at: datetime | None
    lock_expired: bool
    error: str | None
    archived_at: datetime | None
    hosted_url: str | None
    staged_key: str | None
    staged_at: datetime | None
    staged_bytes: int | None
    altered: bool | None
    may_be_hosted: bool
    backfilled: bool
    started_at: datetime | None
    now: datetime
    booked_at: datetime | None  # its booked upload slot (pacing), if any
    events: int  # how many events it has
    failed_at: datetime | None  # when a FAILED record failed
    failed_at_estimated: bool  # an older release failed it without recording when
    # A FAILED record's error class (lib.archive.retry.ErrorClass) as its last `failed`
    # event says it; None when no event says (the sweeper's, an older release's, expired).
    failed_class: str | None = None


@dataclass(frozen=True)
class StoredEvent:
    at: datetime
    attempt: int
    kind: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class Story:
    record_id: int
    row: RecordRow | None  # None: no such record (its events may outlive it)
    events: list[StoredEvent]  # the newest `limit`, oldest first
    total: int  # how many events it has in all


def _detail(value: Any) -> dict[str, Any]:
    """A stored detail as a dict (pg8000 may hand jsonb back as text); anything else a
    hand or an older release left there becomes {"value": ...}."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {"value": value}
    return value if isinstance(value, dict) else {"value": value}


class StoryRecords(Statements):
    def story(self, record_id: int, *, lock_ttl_seconds: int, limit: int) -> Story:
        rows = self._run("record_story", record_id=record_id, lock_ttl=lock_ttl_seconds)
        row = RecordRow(*rows[0]) if rows else None
        found = self._run("record_events", record_id=record_id, limit=limit)
        events = [
            StoredEvent(at, int(attempt), str(kind), _detail(detail))
            for at, attempt, kind, detail, _ in found
        ]
        total = int(found[0][4]) if found else 0
        events = self._with_publications(events, None if not rows else rows[0][20])
        if row is not None:
            row = RecordRow(
                **{
                    **row.__dict__,
                    "attempts": int(row.attempts),
                    "lock_expired": bool(row.lock_expired),
                    "may_be_hosted": bool(row.may_be_hosted),
                    "backfilled": bool(row.backfilled),
                    "events": int(row.events),
                    "failed_at_estimated": bool(row.failed_at_estimated),
                }
            )
        return Story(record_id, row, events, total)

    def _with_publications(
        self, events: list[StoredEvent], now: datetime | None
    ) -> list[StoredEvent]:
        """The story with each completion event's fate in its place: published or dropped
        (noted on its conclusion), or still waiting in the outbox (as of now)."""
        found = list(events)
        waiting: list[tuple[str, StoredEvent]] = []
        for event in events:
            event_id = event.detail.get("event_id")
            if event.kind not in CONCLUDING or not isinstance(event_id, str):
                continue
            fate = _publication(event, event_id)
            if fate is not None:
                found.append(fate)
            else:
                waiting.append((event_id, event))
        if waiting:
            still = {w.event_id: w for w in OutboxStore(self.db).waiting([i for i, _ in waiting])}
            for event_id, event in waiting:
                if (pending := still.get(event_id)) is not None:
                    detail = {
                        "event_id": event_id,
                        "detail_type": pending.detail_type,
                        "tries": pending.tries,
                        "last_error": pending.last_error,
                    }
                    at = max(now or event.at, event.at)
                    found.append(StoredEvent(at, event.attempt, PUBLISHING, detail))
        return sorted(found, key=lambda e: e.at)


# Lines of the story that are no rows of image_archive_events: a completion event's fate,
# noted on the conclusion that wrote it (lib.publish), or read from the outbox.
PUBLISHED, DROPPED, PUBLISHING = "published", "event_dropped", "publishing"


def _publication(event: StoredEvent, event_id: str) -> StoredEvent | None:
    """The conclusion's note of what became of its event, as a line of its own."""
    d = event.detail
    for kind, at_key in ((PUBLISHED, "published_at"), (DROPPED, "dropped_at")):
        if not isinstance(d.get(at_key), str):
            continue
        try:
            at = datetime.fromisoformat(d[at_key])
        except ValueError:
            continue
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        detail = {"event_id": event_id, **{k: v for k, v in d.items() if k in _NOTED}}
        return StoredEvent(max(at, event.at), event.attempt, kind, detail)
    return None


_NOTED = ("detail_type", "published_by", "dropped_because", "tries")
