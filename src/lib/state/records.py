"""The worker's statements on image_generation_records: the claim and the writes that
conclude an attempt (lib/sql/queries.sql). Only archive_* and hosted_* columns are
written; the generation's own status is read, never changed.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from lib.platform.db import Database
from lib.platform.redact import outside_text
from lib.state.claim import (
    EARLY_SLACK_SECONDS,
    ClaimResult,
    ClaimSnapshot,
    Confirmed,
    KeptOriginal,
    Restoring,
    SentImage,
    StagedCopy,
    Task,
    confirmed_params,
    original_params,
)
from lib.state.events import Actor, Event, EventKind, detail_param, events_param
from lib.state.lane import lane_state, settled
from lib.state.outbox import Publication, Written, published_params
from lib.state.queries import Statements
from lib.state.status import WaitReason

# archive_error has text from outside (a host's answer): redacted, then bounded, on its
# way in (lib.platform.redact).
ERROR_LIMIT = 500
# An SQS message id is a UUID; anything longer in the event is not one.
MESSAGE_ID_LIMIT = 100


class Recorded(enum.StrEnum):
    """What the success write found."""

    UNDER_LOCK = "under_lock"  # the normal case
    AFTER_LOCK_PASSED = "after_lock_passed"  # recorded although another attempt took over
    ALREADY_THIS = "already_this"  # a re-run after a lost reply: our write had committed
    ALREADY_OTHER = "already_other"  # another attempt had already archived the record
    ROW_GONE = "row_gone"  # the generation service deleted the record meanwhile


class ArchiveRecords(Statements):
    """The archive's state machine in PostgreSQL, one round trip per call. publish: the
    completion events written are kept in `written`. paced (LSKY_RATE_LIMITS set): an
    attempt without a slot uploaded nothing; unpaced, settle_ledger enters the upload."""

    def __init__(self, db: Database, *, publish: bool = False, paced: bool = False) -> None:
        super().__init__(db)
        self.written = Written(publish)
        self.paced = paced

    def claim(
        self,
        record_id: int,
        *,
        owner: str,
        lock_ttl_seconds: int,
        max_attempts: int,
        capture_while_paused: bool = False,
        message_id: str = "",
        receive_count: int = 0,
        queue_mark: datetime | None = None,
        published: Sequence[Publication] = (),
        confirmed: Sequence[Confirmed] = (),
    ) -> ClaimResult:
        """capture_while_paused (staging on): a paused lane still lets a row that is not
        staged yet be claimed, to be captured; a staged row waits for the lane.
        message_id, receive_count: the message's, for the story's `received` event.
        queue_mark: the message's SentTimestamp on its first receive (Message.queue_mark),
        which moves the queue's receive mark on in the same statement.
        published: the events this container published since its last claim, which leave
        the outbox in the same statement (lib.publish).
        confirmed: the originals S3 answered for since (lib.archive.confirmations), which
        the statement confirms; how many it did is the result's `confirmed`."""
        [row] = self._run(
            "claim",
            record_id=record_id,
            owner=owner,
            lock_ttl=lock_ttl_seconds,
            max_attempts=max_attempts,
            early_slack=EARLY_SLACK_SECONDS,
            capture_while_paused=capture_while_paused,
            message_id=outside_text(message_id, MESSAGE_ID_LIMIT),
            receive_count=max(0, min(receive_count, 2**31 - 1)),
            queue_mark=queue_mark,
            publish=self.written.publish,
            event_id=None,
            **published_params(published, Actor.WORKER),
            **confirmed_params(confirmed),
            paced=self.paced,
        )
        self.written.add(record_id, row[25:29])
        (claimed_id, user_id, username, url, started, attempt) = row[5:11]
        may_be_hosted = row[11]
        staged_key, staged_sha256, staged_bytes, first_claimed_at, booked_at, sent = row[19:25]
        restoring, old_key = row[29:31]
        original = KeptOriginal.from_row(row[31:39])
        confirmed_count = int(row[39] or 0)
        snapshot = ClaimSnapshot.of(row[:5], lane_state(row[12:19]), booked_at)
        if claimed_id is None:
            return ClaimResult(None, snapshot, confirmed_count)
        task = Task(
            record_id=int(claimed_id),
            user_id=int(user_id),
            username=username,
            image_url=url or "",
            started_at=started,
            attempt=int(attempt),
            may_be_hosted=bool(may_be_hosted),
            staged_key=staged_key,
            staged_sha256=staged_sha256,
            staged_bytes=None if staged_bytes is None else int(staged_bytes),
            first_claimed_at=first_claimed_at,
            booked_at=booked_at,
            sent=SentImage.from_json(sent),
            restore=Restoring(old_key, original) if restoring else None,
        )
        return ClaimResult(task, snapshot, confirmed_count)

    def succeed(
        self,
        task: Task,
        *,
        owner: str,
        hosted_url: str,
        mime_type: str,
        response: dict[str, Any],
        log_upload: bool = True,
        altered: bool | None = None,
        original: KeptOriginal | None = None,
        events: Sequence[Event] = (),
        detail: Mapping[str, Any] | None = None,
        size: int | None = None,
    ) -> Recorded:
        """Record the hosted image; says what the row had before (see Recorded).

        altered: whether Lsky stored other bytes than were sent (None: not compared).
        log_upload: the upload goes into the ledger (an adoption sent nothing: False).
        original: the original kept beside it, recorded when this write records the image.
        events: the attempt's, written before its `archived` (whose `detail` adds to the
        URL and `altered`).
        size: the image's bytes, for its completion event (None: not known).
        """
        event_id = self.written.event_id()
        key = response.get("key")
        # The completion event's fields the worker knows (lib.publish.entries reads them);
        # the statement adds the record, its attempts and what it replaced.
        event = {
            "hostedUrl": hosted_url,
            "mimeType": mime_type or None,
            "size": size,
            "key": key if isinstance(key, str) else None,
        }
        story = {"url": hosted_url, "altered": altered, "event_id": event_id, **(detail or {})}
        rows = self._run(
            "succeed",
            record_id=task.record_id,
            owner=owner,
            hosted_url=hosted_url,
            mime_type=mime_type,
            hosted_response=json.dumps(response, ensure_ascii=False),
            log_upload=log_upload,
            altered=altered,
            event_id=event_id,
            event_detail=json.dumps(event, ensure_ascii=False),
            **original_params(original),
            **settled(counted=log_upload, paced=self.paced),
            **_story(task, events, story),
        )
        if not rows:
            return Recorded.ROW_GONE
        self.written.add(task.record_id, rows[0][3:7])
        held_lock, written, same_url = (bool(value) for value in rows[0][:3])
        if written:
            return Recorded.UNDER_LOCK if held_lock else Recorded.AFTER_LOCK_PASSED
        return Recorded.ALREADY_THIS if same_url else Recorded.ALREADY_OTHER

    def retry(
        self,
        task: Task,
        *,
        owner: str,
        error: str,
        delay_seconds: int,
        may_be_hosted: bool = True,
        staged: StagedCopy | None = None,
        sent: SentImage | None = None,
        counted: bool = False,
        events: Sequence[Event] = (),
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """PENDING again after `delay_seconds`; False when the lock had passed on.

        may_be_hosted: whether this attempt may have left an image on Lsky (default: the
        safe answer for a caller that cannot tell; it costs the next attempt a look-up).
        staged: a copy staged during this attempt, recorded with the row.
        counted: this attempt sent an upload Lsky may have counted (its slot stays in the
        ledger as an upload; otherwise it is given back, as is any booking).
        events, detail: the attempt's events, and what its `retried` adds to the error.
        """
        kept = outside_text(error, ERROR_LIMIT)
        rows = self._run(
            "retry",
            record_id=task.record_id,
            owner=owner,
            error=kept,
            delay=delay_seconds,
            may_be_hosted=may_be_hosted,
            sent=_sent(sent),
            kind=str(EventKind.RETRIED),
            **_staged_params(staged),
            **settled(counted=counted, paced=self.paced),
            **_story(
                task, events, {"error": kept, "delay_seconds": delay_seconds, **(detail or {})}
            ),
        )
        return bool(rows)

    def fail(
        self,
        task: Task,
        *,
        owner: str,
        error: str,
        may_be_hosted: bool = True,
        keep_staged: bool = False,
        staged: StagedCopy | None = None,
        sent: SentImage | None = None,
        counted: bool = False,
        events: Sequence[Event] = (),
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """FAILED; False when the lock had passed on (may_be_hosted, counted as in retry).
        keep_staged: the row keeps (or records `staged` as) its staged copy, for a
        replay; otherwise it forgets it. events, detail: as in retry."""
        params = _staged_params(staged)
        del params["forget_staged"]
        kept = outside_text(error, ERROR_LIMIT)
        event_id = self.written.event_id()
        story = {
            "by": Actor.WORKER,
            "error": kept,
            "keeps_staged_copy": keep_staged,
            "event_id": event_id,
        }
        rows = self._run(
            "fail",
            record_id=task.record_id,
            owner=owner,
            error=kept,
            may_be_hosted=may_be_hosted,
            keep_staged=keep_staged,
            sent=_sent(sent),
            kind=str(EventKind.FAILED),
            event_id=event_id,
            publish=event_id is not None,
            **params,
            **settled(counted=counted, paced=self.paced),
            **_story(task, events, {**story, **(detail or {})}),
        )
        if rows:
            self.written.add(task.record_id, rows[0][1:5])
        return bool(rows)

    def release(
        self,
        task: Task,
        *,
        owner: str,
        delay_seconds: int,
        wait_reason: WaitReason,
        error: str | None = None,
        park: bool = False,
        may_be_hosted: bool | None = None,
        staged: StagedCopy | None = None,
        forget_staged: bool = False,
        sent: SentImage | None = None,
        counted: bool = False,
        keep_booking: bool = False,
        events: Sequence[Event] = (),
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """PENDING with the attempt given back; False when the lock had passed on.

        wait_reason: why it waits (archive-ctl status counts them).
        park: no message is left for it (the sweeper sends one once due).
        may_be_hosted: None puts back what the claim found (nothing was sent since).
        staged: a copy staged during this attempt, recorded with the row;
        forget_staged: the row's own copy is dropped (it did not match what was captured).
        counted as in retry; keep_booking: the record comes back for its booked slot.
        events, detail: the attempt's events, and what its `held` or `parked` adds.
        """
        kept = None if error is None else outside_text(error, ERROR_LIMIT)
        story = {"why": str(wait_reason), "given_back": True, "error": kept}
        rows = self._run(
            "release",
            record_id=task.record_id,
            owner=owner,
            delay=delay_seconds,
            error=kept,
            park=park,
            wait_reason=str(wait_reason),
            may_be_hosted=task.may_be_hosted if may_be_hosted is None else may_be_hosted,
            sent=_sent(sent),
            kind=str(EventKind.PARKED if park else EventKind.HELD),
            **_staged_params(staged, forget=forget_staged),
            **settled(counted=counted, paced=self.paced, keep_booking=keep_booking),
            **_story(task, events, {**story, **(detail or {})}),
        )
        return bool(rows)

    def park(
        self,
        record_id: int,
        *,
        delay_seconds: int,
        wait_reason: WaitReason | None,
        detail: Mapping[str, Any] | None = None,
        held: bool = False,
    ) -> bool:
        """A PENDING row left without a message until it is due in `delay_seconds` (the
        sweeper sends it then); `held`: its message is kept, hidden until then. wait_reason
        None keeps the row's. detail: what its `parked` (or `held`) event adds to why and
        until when. A booking it had goes (settle_ledger)."""
        return bool(
            self._run(
                "park",
                record_id=record_id,
                delay=delay_seconds,
                wait_reason=None if wait_reason is None else str(wait_reason),
                **settled(counted=False, paced=self.paced),
                detail=detail_param(**(detail or {})),
                held=held,
            )
        )


def _story(task: Task, events: Sequence[Event], detail: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters a concluding statement writes the story with: the attempt's events
    (oldest first), its number, and the detail of the statement's own event."""
    return {
        "events": events_param(events),
        "attempt": task.attempt,
        "detail": detail_param(**{k: v for k, v in detail.items() if v is not None}),
    }


def _sent(sent: SentImage | None) -> str | None:
    return None if sent is None else json.dumps(sent.as_json())


def _staged_params(staged: StagedCopy | None, *, forget: bool = False) -> dict[str, Any]:
    return {
        "staged_key": None if staged is None else staged.key,
        "staged_sha256": None if staged is None else staged.sha256,
        "staged_bytes": None if staged is None else staged.size,
        "forget_staged": forget,
    }
