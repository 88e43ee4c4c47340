"""The sweeper: no record stays PENDING or RUNNING forever.

Each run, in bounded pages: PENDING rows whose due time is well past and that were
not sent recently are sent again, then RUNNING rows whose lock expired go back to
PENDING and are sent again (or become FAILED when their attempts are used up).

Double sends: one statement per page picks the rows `FOR UPDATE SKIP LOCKED` and
stamps `archive_enqueued_at = now()` in the same UPDATE, so a second sweeper
running at the same time skips the rows this one holds and, once they are
committed, no longer finds them eligible until a requeue interval has passed.
Only then are the messages sent. A row whose send failed gets its previous stamp
back and stays eligible for the next run. If the process dies between the UPDATE
and the send (or the UPDATE's reply is lost and the connection is retried), the
stamped rows have no message: they wait one requeue interval and are sent then.
Nothing is lost; at worst a message arrives one interval late.

Every statement uses the partial indexes of archive_migration.sql with a range
condition, so a run reads the stale rows, not the table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive import sweep_policy
from lib.archive.sweep_policy import ClaimedRow, Step, StopReason, SweepSummary
from lib.platform.config import SweeperSettings
from lib.platform.db import Database
from lib.platform.observability import logger, metrics
from lib.platform.sqs import Queue, send_records

# Expired locks. The attempt was spent when the claim counted it, so archive_attempts
# is left alone: the row is either FAILED (no attempt left) or PENDING to be sent
# again at once. archive_next_run_at is kept: the row has been due since before its
# lock, so if the send fails it is already past due for the lost-message query.
# `{lock_condition}` is one of the two fixed conditions below, never user input.
_RECOVER_SQL = """
WITH picked AS (
    SELECT id, archive_enqueued_at
    FROM image_generation_records
    WHERE archive_status = 'RUNNING' AND {lock_condition}
    ORDER BY archive_locked_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE image_generation_records AS r
SET archive_status = CASE WHEN r.archive_attempts >= :max_attempts
                          THEN 'FAILED' ELSE 'PENDING' END,
    archive_error = CASE WHEN r.archive_attempts >= :max_attempts
                         THEN 'lock expired after the last attempt'
                         ELSE format('lock expired during attempt %s/%s; sent again',
                                     r.archive_attempts, CAST(:max_attempts AS int)) END,
    archive_next_run_at = CASE WHEN r.archive_attempts >= :max_attempts
                               THEN NULL ELSE r.archive_next_run_at END,
    archive_enqueued_at = CASE WHEN r.archive_attempts >= :max_attempts
                               THEN r.archive_enqueued_at ELSE now() END,
    archive_locked_by = NULL,
    archive_locked_at = NULL
FROM picked
WHERE r.id = picked.id
RETURNING r.id, r.archive_status, picked.archive_enqueued_at, r.archive_enqueued_at,
          r.archive_next_run_at
"""
# Same lock-expiry rule as the archive claim (lib.records.CLAIM_SQL), which also
# takes over a RUNNING row without a lock time. Two statements rather than an OR:
# an OR with IS NULL turns the index range scan into a scan of the whole index.
EXPIRED_LOCK_SQL = _RECOVER_SQL.format(
    lock_condition="archive_locked_at < now() - make_interval(secs => :lock_ttl)"
)
LOCKLESS_SQL = _RECOVER_SQL.format(lock_condition="archive_locked_at IS NULL")

# A PENDING row without a due time (the generation service may leave it NULL) would
# never match the lost-message query. Give it one: now, so the grace period starts
# when the sweeper first sees it, and a message still on its way is not doubled.
DATE_UNDATED_SQL = """
WITH picked AS (
    SELECT id
    FROM image_generation_records
    WHERE archive_status = 'PENDING' AND archive_next_run_at IS NULL
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE image_generation_records AS r
SET archive_next_run_at = now()
FROM picked
WHERE r.id = picked.id
RETURNING r.id
"""

# Lost messages: due more than the grace period ago (the queue would have delivered
# by now) and not sent within the requeue interval. Keyset paging on the due time
# (`:after`) keeps later pages from re-reading rows an earlier page already passed.
# A row whose generation is not SUCCEEDED can never be claimed, so sending it would
# repeat every interval forever: it is concluded as FAILED instead.
LOST_MESSAGE_SQL = """
WITH picked AS (
    SELECT id, archive_enqueued_at
    FROM image_generation_records
    WHERE archive_status = 'PENDING'
      AND archive_next_run_at >= CAST(:after AS timestamptz)
      AND archive_next_run_at < now() - make_interval(secs => :grace)
      AND (archive_enqueued_at IS NULL
           OR archive_enqueued_at < now() - make_interval(secs => :interval))
    ORDER BY archive_next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE image_generation_records AS r
SET archive_status = CASE WHEN r.status = 'SUCCEEDED' THEN 'PENDING' ELSE 'FAILED' END,
    archive_error = CASE WHEN r.status = 'SUCCEEDED' THEN r.archive_error
                         ELSE format('generation status is %s; nothing to archive', r.status)
                    END,
    archive_next_run_at = CASE WHEN r.status = 'SUCCEEDED' THEN r.archive_next_run_at END,
    archive_enqueued_at = CASE WHEN r.status = 'SUCCEEDED'
                               THEN now() ELSE r.archive_enqueued_at END
FROM picked
WHERE r.id = picked.id
RETURNING r.id, r.archive_status, picked.archive_enqueued_at, r.archive_enqueued_at,
          r.archive_next_run_at
"""

# Put back the stamps of rows whose send failed, so they stay eligible. Only where
# the stamp is still ours: anything that re-stamped the row since knows better.
RESTORE_SQL = """
UPDATE image_generation_records AS r
SET archive_enqueued_at = v.previous
FROM unnest(CAST(:ids AS bigint[]), CAST(:previous AS timestamptz[])) AS v(id, previous)
WHERE r.id = v.id AND r.archive_enqueued_at = CAST(:stamp AS timestamptz)
RETURNING r.id
"""

# How long the oldest PENDING row has been due (0 when none is overdue). min() over
# the partial index reads one index entry.
OLDEST_PENDING_SQL = """
SELECT CAST(COALESCE(GREATEST(EXTRACT(EPOCH FROM now() - min(archive_next_run_at)), 0), 0)
            AS double precision)
FROM image_generation_records
WHERE archive_status = 'PENDING'
"""

# The lowest due time, as the first page's keyset start.
_BEGINNING = "-infinity"
# Ids listed in one log line at most (the counts are always complete).
_LOGGED_IDS = 50


def _claimed(rows: list[list[Any]]) -> list[ClaimedRow]:
    return [
        ClaimedRow(
            record_id=int(record_id),
            archive_status=str(status),
            previous_enqueued_at=previous,
            enqueued_at=stamp,
            next_run_at=due if isinstance(due, datetime) else None,
        )
        for record_id, status, previous, stamp, due in rows
    ]


class SweepStore:
    """The sweeper's SQL, one round trip per call."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def take_expired_locks(
        self, *, limit: int, lock_ttl_seconds: int, max_attempts: int
    ) -> list[ClaimedRow]:
        return _claimed(
            self.db.run(
                EXPIRED_LOCK_SQL, limit=limit, lock_ttl=lock_ttl_seconds, max_attempts=max_attempts
            )
        )

    def take_lockless(self, *, limit: int, max_attempts: int) -> list[ClaimedRow]:
        return _claimed(self.db.run(LOCKLESS_SQL, limit=limit, max_attempts=max_attempts))

    def take_lost(
        self, *, limit: int, grace_seconds: int, interval_seconds: int, after: datetime | None
    ) -> list[ClaimedRow]:
        rows = self.db.run(
            LOST_MESSAGE_SQL,
            limit=limit,
            grace=grace_seconds,
            interval=interval_seconds,
            after=_BEGINNING if after is None else after,
        )
        return _claimed(rows)

    def date_undated(self, *, limit: int) -> int:
        return len(self.db.run(DATE_UNDATED_SQL, limit=limit))

    def restore(self, rows: list[ClaimedRow]) -> int:
        """Give unsent rows their previous archive_enqueued_at back; returns how many."""
        restored = 0
        # One page's rows share one stamp (now() of its statement); group to be safe.
        stamps = {row.enqueued_at for row in rows if row.enqueued_at is not None}
        for stamp in stamps:
            group = [row for row in rows if row.enqueued_at == stamp]
            restored += len(
                self.db.run(
                    RESTORE_SQL,
                    ids=[row.record_id for row in group],
                    previous=[row.previous_enqueued_at for row in group],
                    stamp=stamp,
                )
            )
        return restored

    def oldest_pending_age_seconds(self) -> float:
        return round(float(self.db.run(OLDEST_PENDING_SQL)[0][0]), 1)


class Sweeper:
    def __init__(
        self,
        *,
        settings: SweeperSettings,
        store: SweepStore,
        queue: Queue,
        page_size: int = sweep_policy.PAGE_SIZE,
    ) -> None:
        self.settings = settings
        self.store = store
        self.queue = queue
        self.page_size = page_size

    def run(self, *, remaining_ms: Callable[[], int]) -> SweepSummary:
        """One sweep; stops early (leaving the rest to the next run) when time runs short."""
        started = time.monotonic()
        summary = SweepSummary()
        try:
            summary.dated = self.store.date_undated(limit=self.settings.max_rows)
            for step in Step:
                stop = self._sweep(step, summary, remaining_ms)
                if stop is not None:
                    summary.stop_reason = stop
                    break
            summary.oldest_pending_age_seconds = self.store.oldest_pending_age_seconds()
        except Exception:
            # The database went away (or a bug): report what was done, then fail the
            # invocation loudly. Rows claimed but not sent wait one requeue interval.
            logger.exception("sweep aborted", **summary.as_dict())
            raise
        finally:
            summary.duration_ms = round((time.monotonic() - started) * 1000, 1)
            self._emit_metrics(summary)
        log = logger.warning if summary.stop_reason is StopReason.SQS_ERROR else logger.info
        log("sweep finished", **summary.as_dict())
        return summary

    def _sweep(
        self, step: Step, summary: SweepSummary, remaining_ms: Callable[[], int]
    ) -> StopReason | None:
        """Page through one kind of stale row; None when it has no eligible row left."""
        after: datetime | None = None
        while True:
            limit = sweep_policy.next_page(
                budget_left=self.settings.max_rows - summary.claimed,
                remaining_ms=remaining_ms(),
                page_size=self.page_size,
            )
            if isinstance(limit, StopReason):
                return limit
            rows = self._take(step, limit, after)
            if not rows:
                return None
            summary.pages += 1
            summary.claimed += len(rows)
            self._concluded(step, rows, summary)
            stop = self._send(step, [row for row in rows if row.to_send], summary, remaining_ms)
            if stop is not None:
                return stop
            if len(rows) < limit:
                return None
            after = sweep_policy.latest_due(rows, after)

    def _take(self, step: Step, limit: int, after: datetime | None) -> list[ClaimedRow]:
        settings = self.settings
        match step:
            case Step.LOCKLESS:
                return self.store.take_lockless(limit=limit, max_attempts=settings.max_attempts)
            case Step.EXPIRED:
                return self.store.take_expired_locks(
                    limit=limit,
                    lock_ttl_seconds=settings.lock_ttl_seconds,
                    max_attempts=settings.max_attempts,
                )
            case Step.LOST:
                return self.store.take_lost(
                    limit=limit,
                    grace_seconds=settings.grace_seconds,
                    interval_seconds=settings.requeue_interval_seconds,
                    after=after,
                )
        raise AssertionError(f"unknown step {step}")  # pragma: no cover

    def _concluded(self, step: Step, rows: list[ClaimedRow], summary: SweepSummary) -> None:
        if step is not Step.LOST:
            summary.expired_locks += len(rows)
        failed = [row.record_id for row in rows if not row.to_send]
        if not failed:
            return
        summary.failed += len(failed)
        reason = (
            "lock expired after the last attempt"
            if step is not Step.LOST
            else "generation is not SUCCEEDED; nothing to archive"
        )
        logger.error(
            "archive failed by the sweeper",
            step=str(step),
            reason=reason,
            count=len(failed),
            record_ids=[str(record_id) for record_id in failed[:_LOGGED_IDS]],
        )

    def _send(
        self,
        step: Step,
        rows: list[ClaimedRow],
        summary: SweepSummary,
        remaining_ms: Callable[[], int],
    ) -> StopReason | None:
        """Send one page's messages; rows not sent get their stamp back."""
        report = send_records(
            self.queue,
            self.settings.queue_url,
            [row.record_id for row in rows],
            may_send=lambda: sweep_policy.can_send_batch(remaining_ms()),
        )
        summary.requeued += len(report.sent)
        stop: StopReason | None = None
        if report.error is not None:
            # Nothing of that call was sent; the rows stay eligible for the next run.
            logger.error(
                "could not send to the archive queue; stopping this run",
                step=str(step),
                error=type(report.error).__name__,
                detail=str(report.error)[:200],
            )
            stop = StopReason.SQS_ERROR
        elif report.out_of_time:
            stop = StopReason.TIME
        if report.failed:
            logger.warning(
                "some messages were not sent",
                step=str(step),
                count=len(report.failed),
                codes=sorted(set(report.failed.values())),
                record_ids=[str(record_id) for record_id in sorted(report.failed)[:_LOGGED_IDS]],
            )
        unsent = set(report.unsent)
        if unsent:
            summary.send_failures += len(unsent)
            self.store.restore([row for row in rows if row.record_id in unsent])
        return stop

    @staticmethod
    def _emit_metrics(summary: SweepSummary) -> None:
        metrics.add_metric(name="Requeued", unit=MetricUnit.Count, value=summary.requeued)
        metrics.add_metric(name="SweepFailed", unit=MetricUnit.Count, value=summary.failed)
        if summary.oldest_pending_age_seconds is not None:
            metrics.add_metric(
                name="OldestPendingAgeSeconds",
                unit=MetricUnit.Seconds,
                value=summary.oldest_pending_age_seconds,
            )
