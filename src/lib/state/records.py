"""The only code that runs SQL on image_generation_records: one method per named query.

Every statement is in lib/sql/queries.sql. Only the archive_* (and hosted_*) columns
are written; the generation's own status is read, never changed.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.platform.db import Database
from lib.platform.redact import outside_text
from lib.state.claim import EARLY_SLACK_SECONDS, ClaimResult, ClaimSnapshot, Task
from lib.state.lane import LaneState, lane_state
from lib.state.queries import QUERIES
from lib.state.status import ArchiveStatus

# The first keyset page starts below every due time.
BEGINNING = "-infinity"
# How far back the lane's upload log reaches: the longest window pacing can enforce.
UPLOAD_LOG_SECONDS = 31 * 86_400
# archive_error and the lane's pause_detail hold text from outside (a host's answer): it
# is redacted, then bounded, on its way in (lib.platform.redact).
ERROR_LIMIT = 500
PAUSE_DETAIL_LIMIT = 200


class Recorded(enum.StrEnum):
    """What the success write found."""

    UNDER_LOCK = "under_lock"  # the normal case
    AFTER_LOCK_PASSED = "after_lock_passed"  # recorded although another attempt took over
    ALREADY_THIS = "already_this"  # a re-run after a lost reply: our write had committed
    ALREADY_OTHER = "already_other"  # another attempt had already archived the record
    ROW_GONE = "row_gone"  # the generation service deleted the record meanwhile


@dataclass(frozen=True)
class SweptRow:
    """A row as one sweeper statement left it."""

    record_id: int
    archive_status: str  # PENDING: send a message; FAILED: concluded, nothing to send
    previous_enqueued_at: datetime | None  # put back when the send fails
    enqueued_at: datetime | None  # the statement's stamp (its now())
    next_run_at: datetime | None = None

    @property
    def to_send(self) -> bool:
        return self.archive_status == ArchiveStatus.PENDING


@dataclass(frozen=True)
class MarkedRow:
    """One id asked for by `mark_for_enqueue`, as it was and whether it was marked."""

    record_id: int
    exists: bool
    status: str | None
    archive_status: str | None
    marked_at: datetime | None  # None: not marked (see status/archive_status)


@dataclass(frozen=True)
class FailedRecord:
    record_id: int
    started_at: datetime | None
    attempts: int
    error: str | None


@dataclass(frozen=True)
class LiveCounts:
    """The states `archive-ctl status` shows by default (index reads only)."""

    pending: int
    pending_due: int
    # How long the longest-waiting PENDING row has been due; 0 when none is due yet.
    oldest_pending_age_seconds: float | None
    running: int
    running_expired: int
    failed: int
    failed_last_24h: int


@dataclass(frozen=True)
class AlteredCounts:
    """Archives whose stored bytes Lsky changed (archive_altered); counting stops at `limit`."""

    total: int
    last_24h: int
    limit: int


@dataclass(frozen=True)
class StagedSummary:
    """Images captured to the staging bucket (lib.archive.staging), as the rows say."""

    waiting: int  # PENDING or RUNNING rows whose next attempt uploads from a staged copy
    oldest_age_seconds: float  # how long the oldest of those has been staged; 0 when none
    failed_keeping_copy: int  # FAILED rows that kept theirs for `requeue --failed`


def _swept(rows: list[list[Any]]) -> list[SweptRow]:
    return [
        SweptRow(
            record_id=int(record_id),
            archive_status=str(status),
            previous_enqueued_at=previous,
            enqueued_at=stamp,
            next_run_at=due if isinstance(due, datetime) else None,
        )
        for record_id, status, previous, stamp, due in rows
    ]


class ArchiveRecords:
    """The archive's state machine in PostgreSQL, one round trip per call."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _run(self, name: str, **params: Any) -> list[list[Any]]:
        return self.db.run(QUERIES[name], **params)

    # -- the worker ----------------------------------------------------------------------

    def claim(
        self,
        record_id: int,
        *,
        owner: str,
        lock_ttl_seconds: int,
        max_attempts: int,
        capture_while_paused: bool = False,
    ) -> ClaimResult:
        """capture_while_paused (staging on): a paused lane still lets a row that is not
        staged yet be claimed, to be captured; a staged row waits for the lane."""
        [row] = self._run(
            "claim",
            record_id=record_id,
            owner=owner,
            lock_ttl=lock_ttl_seconds,
            max_attempts=max_attempts,
            early_slack=EARLY_SLACK_SECONDS,
            capture_while_paused=capture_while_paused,
        )
        (status, archive_status, expired, due_in, exhausted) = row[:5]
        (claimed_id, user_id, username, url, started, attempt) = row[5:11]
        may_be_hosted = row[11]
        lane = lane_state(row[12:18])
        staged_key = row[18]
        snapshot = ClaimSnapshot(
            exists=status is not None,
            status=status,
            archive_status=archive_status,
            lock_expired=bool(expired),
            due_in_seconds=float(due_in) if due_in is not None else 0.0,
            exhausted=bool(exhausted),
            lane=lane,
        )
        if claimed_id is None:
            return ClaimResult(None, snapshot)
        task = Task(
            record_id=int(claimed_id),
            user_id=int(user_id),
            username=username,
            image_url=url or "",
            started_at=started,
            attempt=int(attempt),
            may_be_hosted=bool(may_be_hosted),
            staged_key=staged_key,
        )
        return ClaimResult(task, snapshot)

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
    ) -> Recorded:
        """Record the hosted image; says what the row held before (see Recorded).

        altered: whether Lsky stored other bytes than were sent (None: not compared).
        """
        rows = self._run(
            "succeed",
            record_id=task.record_id,
            owner=owner,
            hosted_url=hosted_url,
            mime_type=mime_type,
            hosted_response=json.dumps(response, ensure_ascii=False),
            log_upload=log_upload,
            log_seconds=UPLOAD_LOG_SECONDS,
            altered=altered,
        )
        if not rows:
            return Recorded.ROW_GONE
        held_lock, written, same_url = (bool(value) for value in rows[0])
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
        staged_key: str | None = None,
    ) -> bool:
        """PENDING again after `delay_seconds`; False when the lock had passed on.

        may_be_hosted: whether this attempt may have left an image on Lsky (default: the
        safe answer for a caller that cannot tell; it costs the next attempt a look-up).
        staged_key: a copy staged during this attempt, recorded with the row.
        """
        rows = self._run(
            "retry",
            record_id=task.record_id,
            owner=owner,
            error=outside_text(error, ERROR_LIMIT),
            delay=delay_seconds,
            may_be_hosted=may_be_hosted,
            staged_key=staged_key,
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
        staged_key: str | None = None,
    ) -> bool:
        """FAILED; False when the lock had passed on (may_be_hosted as in retry).
        keep_staged: the row keeps (or records `staged_key` as) its staged copy, for a
        replay; otherwise it forgets it."""
        rows = self._run(
            "fail",
            record_id=task.record_id,
            owner=owner,
            error=outside_text(error, ERROR_LIMIT),
            may_be_hosted=may_be_hosted,
            keep_staged=keep_staged,
            staged_key=staged_key,
        )
        return bool(rows)

    def release(
        self,
        task: Task,
        *,
        owner: str,
        delay_seconds: int,
        error: str | None = None,
        park: bool = False,
        may_be_hosted: bool | None = None,
        staged_key: str | None = None,
    ) -> bool:
        """PENDING with the attempt given back; False when the lock had passed on.

        park: no message is left for it (the sweeper sends one once due).
        may_be_hosted: None puts back what the claim found (nothing was sent since).
        staged_key: a copy staged during this attempt, recorded with the row.
        """
        rows = self._run(
            "release",
            record_id=task.record_id,
            owner=owner,
            delay=delay_seconds,
            error=None if error is None else outside_text(error, ERROR_LIMIT),
            park=park,
            may_be_hosted=task.may_be_hosted if may_be_hosted is None else may_be_hosted,
            staged_key=staged_key,
        )
        return bool(rows)

    def park(self, record_id: int, *, due: datetime) -> bool:
        """A PENDING row left without a message until `due` (the sweeper sends it then)."""
        return bool(self._run("park", record_id=record_id, due=due))

    # -- the lane -----------------------------------------------------------------------

    def lane(self) -> LaneState:
        [row] = self._run("lane_state")
        return lane_state(row)

    def pause_lane(
        self, *, until: datetime | str, reason: str, window: str | None, detail: str
    ) -> None:
        self._run(
            "pause_lane",
            until=until,
            reason=reason,
            window=window,
            detail=outside_text(detail, PAUSE_DETAIL_LIMIT),
        )

    def clear_pause(self, *, reason: str | None = None) -> str | None:
        """Open the lane; returns the reason of the pause cleared, None if it was open."""
        rows = self._run("clear_pause", reason=reason)
        return str(rows[0][0]) if rows else None

    def reserve_upload(
        self, *, version: int, upload_times: list[datetime], closed_until: datetime | None
    ) -> bool:
        """Write the lane's new upload log (and a pacing pause) if nobody changed it since
        `version`; False: read it again and decide again."""
        rows = self._run(
            "reserve_upload",
            version=version,
            upload_times=upload_times,
            closed_until=closed_until,
        )
        return bool(rows)

    # -- the sweeper ---------------------------------------------------------------------

    def take_expired_locks(
        self, *, limit: int, lock_ttl_seconds: int, max_attempts: int
    ) -> list[SweptRow]:
        return _swept(
            self._run(
                "recover_expired_locks",
                limit=limit,
                lock_ttl=lock_ttl_seconds,
                max_attempts=max_attempts,
            )
        )

    def take_lockless(self, *, limit: int, max_attempts: int) -> list[SweptRow]:
        return _swept(self._run("recover_lockless", limit=limit, max_attempts=max_attempts))

    def take_lost(
        self, *, limit: int, grace_seconds: int, interval_seconds: int, after: datetime | None
    ) -> list[SweptRow]:
        rows = self._run(
            "take_lost",
            limit=limit,
            grace=grace_seconds,
            interval=interval_seconds,
            after=BEGINNING if after is None else after,
        )
        return _swept(rows)

    def date_undated(self, *, limit: int) -> int:
        return len(self._run("date_undated", limit=limit))

    def restore(self, rows: list[SweptRow]) -> int:
        """Give unsent rows their previous archive_enqueued_at back; returns how many."""
        restored = 0
        # One page's rows share one stamp (now() of its statement); group to be safe.
        for stamp in {row.enqueued_at for row in rows if row.enqueued_at is not None}:
            group = [row for row in rows if row.enqueued_at == stamp]
            restored += len(
                self._run(
                    "restore_stamps",
                    ids=[row.record_id for row in group],
                    previous=[row.previous_enqueued_at for row in group],
                    stamp=stamp,
                )
            )
        return restored

    def oldest_pending_age_seconds(self) -> float:
        return round(float(self._run("oldest_pending_age")[0][0]), 1)

    # -- the producer side and operators -------------------------------------------------

    def mark_for_enqueue(self, record_ids: list[int]) -> list[MarkedRow]:
        return [
            MarkedRow(int(record_id), bool(exists), status, archive_status, marked_at)
            for record_id, exists, status, archive_status, marked_at in self._run(
                "mark_for_enqueue", ids=record_ids
            )
        ]

    def unstamp(self, record_ids: list[int], *, stamp: datetime) -> None:
        self._run("unstamp", ids=record_ids, stamp=stamp)

    def requeue_failed(self, *, since: datetime | None, limit: int) -> list[tuple[int, datetime]]:
        rows = self._run("requeue_failed", since=BEGINNING if since is None else since, limit=limit)
        return [(int(record_id), stamp) for record_id, stamp in rows]

    def count_failed(self, *, since: datetime | None) -> int:
        [[total]] = self._run("count_failed", since=BEGINNING if since is None else since)
        return int(total)

    def preview_failed(self, *, since: datetime | None, limit: int) -> list[FailedRecord]:
        rows = self._run("preview_failed", since=BEGINNING if since is None else since, limit=limit)
        return [
            FailedRecord(int(i), started, int(attempts), error)
            for i, started, attempts, error in rows
        ]

    def live_counts(self, *, lock_ttl_seconds: int) -> LiveCounts:
        [row] = self._run("live_counts", lock_ttl=lock_ttl_seconds)
        pending, due, oldest, running, expired, failed, failed_24h = row
        return LiveCounts(
            pending=int(pending),
            pending_due=int(due),
            oldest_pending_age_seconds=None if oldest is None else round(float(oldest), 1),
            running=int(running),
            running_expired=int(expired),
            failed=int(failed),
            failed_last_24h=int(failed_24h),
        )

    def altered_counts(self, *, limit: int = 10_000) -> AlteredCounts:
        [[total, recent]] = self._run("altered_counts", limit=limit)
        return AlteredCounts(total=int(total), last_24h=int(recent), limit=limit)

    def all_counts(self) -> dict[str, int]:
        return {str(state): int(count) for state, count in self._run("all_counts")}

    # -- staged copies --------------------------------------------------------------------

    def staged_summary(self) -> StagedSummary:
        """Staged copies waiting to be published, and FAILED rows that kept one."""
        [[waiting, oldest, failed]] = self._run("staged_summary")
        return StagedSummary(
            waiting=int(waiting),
            oldest_age_seconds=round(float(oldest), 1),
            failed_keeping_copy=int(failed),
        )

    # -- backfill and the lane, for operators (archive-ctl) --------------------------------

    def count_backfill(
        self, *, since: datetime | None, until: datetime | None, user_id: int | None
    ) -> int:
        [[total]] = self._run("count_backfill", **self._backfill_range(since, until, user_id))
        return int(total)

    def preview_backfill(
        self, *, since: datetime | None, until: datetime | None, user_id: int | None, limit: int
    ) -> list[tuple[int, datetime, int]]:
        """The first `limit` rows backfill would take: (id, started_at, user_id)."""
        rows = self._run(
            "preview_backfill", limit=limit, **self._backfill_range(since, until, user_id)
        )
        return [(int(record_id), started, int(user)) for record_id, started, user in rows]

    def mark_backfill_page(
        self,
        *,
        since: datetime | None,
        until: datetime | None,
        user_id: int | None,
        after: tuple[datetime, int] | None,
        limit: int,
    ) -> list[tuple[int, datetime, datetime]]:
        """Mark the next never-queued rows after the keyset `after` (started_at, id)
        PENDING; returns (id, started_at, stamp) for each."""
        rows = self._run(
            "mark_backfill_page",
            limit=limit,
            after_started=BEGINNING if after is None else after[0],
            after_id=0 if after is None else after[1],
            **self._backfill_range(since, until, user_id),
        )
        return [(int(record_id), started, stamp) for record_id, started, stamp in rows]

    def unmark_backfill(self, record_ids: list[int], *, stamp: datetime) -> list[int]:
        """Make rows a backfill page marked with `stamp` never-queued again; returns those
        put back (a row someone touched since keeps its state)."""
        return [int(row[0]) for row in self._run("unmark_backfill", ids=record_ids, stamp=stamp)]

    @staticmethod
    def _backfill_range(
        since: datetime | None, until: datetime | None, user_id: int | None
    ) -> dict[str, Any]:
        return {
            "since": BEGINNING if since is None else since,
            "until": "infinity" if until is None else until,
            "user_id": user_id,
        }
