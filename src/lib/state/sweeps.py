"""The sweeper's statements: expired locks taken over, lost messages found again, the
queue's receive mark, and the ages it reports (lib/sql/queries.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.platform.db import Database
from lib.state.lane import settled
from lib.state.queries import Statements
from lib.state.status import ArchiveStatus

# The first keyset page starts below every due time.
BEGINNING = "-infinity"


@dataclass(frozen=True)
class SweptRow:
    """A row as one sweeper statement left it."""

    record_id: int
    archive_status: str  # PENDING: send a message; FAILED: concluded, nothing to send
    previous_enqueued_at: datetime | None  # put back when the send fails
    enqueued_at: datetime | None  # the statement's stamp (its now())
    next_run_at: datetime | None = None
    backfilled: bool = False  # queued by a backfill: sent after the live rows
    event_id: str | None = None  # the completion event of a row it failed (events on)

    @property
    def to_send(self) -> bool:
        return self.archive_status == ArchiveStatus.PENDING


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
            backfilled=bool(backfilled),
            event_id=None if event_id is None else str(event_id),
        )
        for record_id, status, previous, stamp, due, backfilled, event_id in rows
    ]


class SweepRecords(Statements):
    """publish: completion events are published (ARCHIVE_EVENT_BUS): a row a sweep fails
    gets its event in the outbox, in the same statement (SweptRow.event_id). `paced`: as
    ArchiveRecords' (an unpaced attempt that vanished took no slot)."""

    def __init__(self, db: Database, *, publish: bool = False, paced: bool = False) -> None:
        super().__init__(db)
        self.publish = publish
        # A recovered attempt vanished: its upload may have been counted by Lsky (its slot
        # stays as an upload, or unpaced one is entered), and it comes back for no booking.
        self._vanished = settled(counted=True, paced=paced, vanished=True)

    def _events(self) -> dict[str, Any]:
        return {"publish": self.publish, "event_id": None}

    def take_expired_locks(
        self, *, limit: int, lock_ttl_seconds: int, max_attempts: int
    ) -> list[SweptRow]:
        return _swept(
            self._run(
                "recover_expired_locks",
                limit=limit,
                lock_ttl=lock_ttl_seconds,
                max_attempts=max_attempts,
                **self._vanished,
                **self._events(),
            )
        )

    def take_lockless(self, *, limit: int, max_attempts: int) -> list[SweptRow]:
        return _swept(
            self._run(
                "recover_lockless",
                limit=limit,
                max_attempts=max_attempts,
                **self._vanished,
                **self._events(),
            )
        )

    def take_lost(
        self,
        *,
        limit: int,
        grace_seconds: int,
        lost_before: datetime,
        after: datetime | None,
        backfilled: bool = False,
    ) -> list[SweptRow]:
        """Lost and parked rows, live ones or (`backfilled`) those a backfill queued; a
        sent row is lost when its message entered the queue before `lost_before`
        (lib.archive.sweep_rules)."""
        params: dict[str, Any] = {
            "limit": limit,
            "grace": grace_seconds,
            "lost_before": lost_before,
            "after": BEGINNING if after is None else after,
            **self._events(),
        }
        if backfilled:
            return _swept(self._run("take_lost_backfilled", **params))
        return _swept(self._run("take_lost", **params))

    def queue_mark(self) -> tuple[datetime | None, datetime]:
        """The queue's receive mark (None: nothing received yet) and the database's now()."""
        [[mark, now]] = self._run("queue_mark")
        return mark, now

    def date_undated(self, *, limit: int) -> list[int]:
        """PENDING rows without a due time made due now; returns their ids."""
        return [int(row[0]) for row in self._run("date_undated", limit=limit)]

    def expire_events(self, *, retention_seconds: int, limit: int) -> dict[int, int]:
        """Retention: the events of up to `limit` concluded records, up to a conclusion
        older than `retention_seconds`, removed; returns {record id: events removed}."""
        rows = self._run("expire_events", retention=retention_seconds, limit=limit)
        return {int(record_id): int(count) for record_id, count in rows}

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

    # -- staged copies --------------------------------------------------------------------

    def staged_summary(self) -> StagedSummary:
        """Staged copies waiting to be published, and FAILED rows that kept one."""
        [[waiting, oldest, failed]] = self._run("staged_summary")
        return StagedSummary(
            waiting=int(waiting),
            oldest_age_seconds=round(float(oldest), 1),
            failed_keeping_copy=int(failed),
        )
