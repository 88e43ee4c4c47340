"""Statements for producers and operators (archive-ctl): queue rows, requeue failures,
a backfill, and the counts `status` shows (lib/sql/queries.sql)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.state.queries import Statements
from lib.state.selection import MAX_ID, Cursor, ListedRecord, Selection
from lib.state.sweeps import BEGINNING


@dataclass(frozen=True)
class MarkedRow:
    """One id asked for by `mark_for_enqueue`, as it was and whether it was marked."""

    record_id: int
    exists: bool
    status: str | None
    archive_status: str | None
    marked_at: datetime | None  # None: not marked (see status/archive_status)


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
class WaitingCount:
    """PENDING rows that wait for their due time for one reason (lib.state.status.WaitReason;
    "unknown" for rows an older release or the producer dated), held or parked."""

    reason: str
    parked: bool  # no message out: the sweeper sends one when due
    rows: int


@dataclass(frozen=True)
class LaneDemand:
    """The records in the upload lane, live and backfilled (`lane_demand`)."""

    live_waiting: int  # live rows waiting for the lane: a host pause, a pacing slot
    live_due: int  # live rows due now (queued or running) that have no upload slot yet
    backfill_queued: int  # backfilled rows PENDING (queued, or waiting), not in backoff
    backfill_unslotted: int  # backfilled rows PENDING or RUNNING that have no upload slot


# Rows `lane_demand` reads at most: past that, the lane is busy enough for a backfill to wait.
DEMAND_READ_LIMIT = 10_000


class OperatorRecords(Statements):
    def mark_for_enqueue(self, record_ids: list[int], *, by: str) -> list[MarkedRow]:
        """`by`: who enqueues (lib.state.events.Actor), for the story's `enqueued`."""
        return [
            MarkedRow(int(record_id), bool(exists), status, archive_status, marked_at)
            for record_id, exists, status, archive_status, marked_at in self._run(
                "mark_for_enqueue", ids=record_ids, by=by
            )
        ]

    def unstamp(self, record_ids: list[int], *, stamp: datetime, by: str, error: str) -> None:
        """Rows whose message did not go out lose `stamp`; `by` and the (redacted) `error`
        are their `unsent` event's."""
        self._run("unstamp", ids=record_ids, stamp=stamp, by=by, error=error)

    def mark_redriven(self, messages: Sequence[tuple[int, str]]) -> dict[int, str]:
        """The records of DLQ messages ((record id, message id) pairs) made ready for their
        messages' return: a FAILED row gets a fresh attempt budget, a PENDING one a stamp.
        Returns {record id: what it was} for the rows marked."""
        rows = self._run(
            "mark_redriven",
            ids=[record_id for record_id, _ in messages],
            message_ids=[message_id for _, message_id in messages],
        )
        return {int(record_id): str(was) for record_id, was in rows}

    def list_records(
        self, selection: Selection, *, after: Cursor | None, limit: int, requeuable: bool = False
    ) -> list[ListedRecord]:
        """One page, newest first: failures by failure time, anything else by id.
        requeuable: failures of a SUCCEEDED generation only (what a requeue takes)."""
        if selection.failures or requeuable:
            rows = self._run(
                "list_failed",
                requeuable=requeuable,
                after_time=after.failed_at if after and after.failed_at else "infinity",
                after_id=after.record_id if after else MAX_ID,
                limit=limit,
                **selection.failure_range(),
                **selection.params(),
            )
        else:
            rows = self._run(
                "list_records",
                state=selection.state,
                with_error=selection.error_text is not None or bool(selection.error_patterns),
                after_id=after.record_id if after else MAX_ID,
                limit=limit,
                **selection.params(),
            )
        return [ListedRecord.from_row(row) for row in rows]

    def count_failed(self, selection: Selection, *, requeuable: bool) -> int:
        [[total]] = self._run(
            "count_failed",
            requeuable=requeuable,
            **selection.failure_range(),
            **selection.params(),
        )
        return int(total)

    def requeue_failed(self, selection: Selection, *, limit: int) -> list[tuple[int, datetime]]:
        """Give up to `limit` FAILED rows of the selection new attempts (PENDING, due now,
        stamped), newest failure first; returns (id, stamp) of each."""
        rows = self._run(
            "requeue_failed",
            requeuable=True,
            limit=limit,
            **selection.failure_range(),
            **selection.params(),
        )
        return [(int(record_id), stamp) for record_id, stamp in rows]

    def record_states(self, record_ids: list[int]) -> list[MarkedRow]:
        """Each id as it is now (marked_at None): why a requeue left it alone."""
        return [
            MarkedRow(int(record_id), bool(exists), status, archive_status, None)
            for record_id, exists, status, archive_status in self._run(
                "record_states", ids=record_ids
            )
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

    def waiting_counts(self) -> list[WaitingCount]:
        """PENDING rows not due yet, by wait reason, held and parked apart."""
        return [
            WaitingCount(str(reason), bool(parked), int(count))
            for reason, parked, count in self._run("waiting_counts")
        ]

    def all_counts(self) -> dict[str, int]:
        return {str(state): int(count) for state, count in self._run("all_counts")}

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

    def lane_demand(self, *, limit: int = DEMAND_READ_LIMIT) -> LaneDemand:
        [[waiting, due, queued, unslotted]] = self._run("lane_demand", limit=limit)
        return LaneDemand(int(waiting), int(due), int(queued), int(unslotted))

    def count_never_queued(self, *, limit: int) -> int:
        """Never-queued SUCCEEDED generations, counted up to `limit`."""
        [[total]] = self._run("count_never_queued", limit=limit)
        return int(total)

    @staticmethod
    def _backfill_range(
        since: datetime | None, until: datetime | None, user_id: int | None
    ) -> dict[str, Any]:
        return {
            "since": BEGINNING if since is None else since,
            "until": "infinity" if until is None else until,
            "user_id": user_id,
        }
