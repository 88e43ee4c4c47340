"""The sweeper: no record stays PENDING or RUNNING forever.

Each run, in bounded pages: lost messages are sent again, expired locks go back to
PENDING (and are sent) or to FAILED. The paging and time rules are pure, in
lib.archive.sweep_rules; docs/explanation/sweeper.md has the rationale.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.enqueue import send_records
from lib.archive.lane import probe_can_clear
from lib.archive.sweep_rules import (
    ASSUMED_CLOCK_AHEAD_SECONDS,
    EXPIRY_BATCHES,
    EXPIRY_RECORDS,
    NEVER,
    PAGE_RESERVE_MS,
    PAGE_SIZE,
    UNPARK_SPREAD_SECONDS,
    QueueView,
    Step,
    StopReason,
    SweepSummary,
    can_send_batch,
    clock_ahead,
    latest_due,
    live_first,
    logged_ids,
    lost_before,
    next_page,
    probe_deadline,
)
from lib.platform.config import SweeperSettings
from lib.platform.eventbridge import EventBus
from lib.platform.grants import is_permission_denied
from lib.platform.observability import logger, metrics
from lib.platform.redact import outside_text
from lib.platform.sqs import Queue, QueueCounts
from lib.publish.sweep import publish_leftovers
from lib.state.events import Actor
from lib.state.lane import PauseReason
from lib.state.lane_store import LaneStore
from lib.state.outbox import OutboxStore
from lib.state.privileges import explain_denial
from lib.state.sweeps import SweepRecords, SweptRow


class Sweeper:
    def __init__(
        self,
        *,
        settings: SweeperSettings,
        records: SweepRecords,
        lanes: LaneStore,
        queue: Queue,
        page_size: int = PAGE_SIZE,
        probe: Callable[[float], bool] | None = None,
        events: tuple[OutboxStore, EventBus] | None = None,
    ) -> None:
        """probe: whether the host account is healthy again (Lsky's profile endpoint), known
        by the deadline it is given. events: the outbox and its bus (None: events off)."""
        self.settings = settings
        self.records = records
        self.lanes = lanes
        self.queue = queue
        self.probe = probe
        self.events = events
        self._lane_open = True
        self._lost_before = NEVER  # set by each run
        self.own_events: list[str] = []  # completion events this run's statements wrote
        self.page_size = page_size

    def run(self, *, remaining_ms: Callable[[], int]) -> SweepSummary:
        """One sweep; stops early (leaving the rest to the next run) when time runs short."""
        started = time.monotonic()
        summary = SweepSummary()
        self.own_events = []
        try:
            dated = self.records.date_undated(limit=self.settings.max_rows)
            summary.dated = len(dated)
            if dated:
                logger.info(
                    "undated records made due", count=len(dated), record_ids=logged_ids(dated)
                )
            summary.ledger_rolled_up, _ = self.lanes.roll_up()
            self._read_lane(summary, remaining_ms)
            self._read_queue(summary)
            for step in Step:
                stop = self._sweep(step, summary, remaining_ms)
                if stop is not None:
                    summary.stop_reason = stop
                    break
            self._expire_events(summary, remaining_ms)
            summary.events = _publish(self, remaining_ms)
            summary.oldest_pending_age_seconds = self.records.oldest_pending_age_seconds()
            summary.staged = self.records.staged_summary()
        except Exception as error:
            # The database went away, a grant is missing (our configuration: said as
            # such), or a bug: report what was done, then fail the invocation loudly.
            # Rows claimed but not sent wait one requeue interval.
            if is_permission_denied(error):
                metrics.add_metric(name="PermissionDenied", unit=MetricUnit.Count, value=1)
                logger.error(
                    "sweep stopped: the database role lacks a grant",
                    error=explain_denial(self.records.db, error),
                )
            logger.exception("sweep aborted", **summary.as_dict())
            raise
        finally:
            summary.duration_ms = round((time.monotonic() - started) * 1000, 1)
            self._emit_metrics(summary)
        log = logger.warning if summary.stop_reason is StopReason.SQS_ERROR else logger.info
        log("sweep finished", **summary.as_dict())
        return summary

    def _read_lane(self, summary: SweepSummary, remaining_ms: Callable[[], int]) -> None:
        """The lane decides what this run sends: nothing lost or parked while it is paused
        (the probe may open it)."""
        lane = self.lanes.state()
        if (
            lane.paused
            and lane.reason == PauseReason.ACCOUNT
            and probe_can_clear(lane.detail)
            and self._probe(probe_deadline(remaining_ms()))
        ):
            self.lanes.clear(reason="account")
            unparked = self.lanes.unpark(
                spread_seconds=UNPARK_SPREAD_SECONDS, by=Actor.SWEEPER, limit=self.settings.max_rows
            )
            summary.unparked = len(unparked)
            summary.lane_resumed = True
            logger.info(
                "the host account is healthy again; upload lane opened",
                unparked=len(unparked),
                record_ids=logged_ids(unparked),
            )
            lane = self.lanes.state()
        self._lane_open = not lane.paused
        summary.lane_paused = lane.reason if lane.paused else None
        if lane.paused:
            paused_for = (lane.now - lane.paused_since).total_seconds() if lane.paused_since else 0
            metrics.add_metric(
                name="LanePausedSeconds", unit=MetricUnit.Seconds, value=round(paused_for)
            )
        metrics.add_metric(
            name="LanePausedAccount",
            unit=MetricUnit.Count,
            value=1 if lane.paused and lane.reason == PauseReason.ACCOUNT else 0,
        )

    def _read_queue(self, summary: SweepSummary) -> None:
        """When a sent row's message is lost (lib.archive.sweep_rules.lost_before)."""
        view = queue_view(self.queue, self.settings.queue_url, self.records)
        self._lost_before = lost_before(view, self.settings.requeue_interval_seconds)
        summary.requeue_interval_seconds = round((view.now - self._lost_before).total_seconds())
        summary.queue_waiting = view.waiting
        ahead = view.clock_ahead
        summary.clock_ahead_seconds = None if ahead is None else round(ahead, 3)

    def _probe(self, deadline: float) -> bool:
        if self.probe is None:
            return False
        try:
            return self.probe(deadline)
        except Exception as error:  # noqa: BLE001 - a failed probe leaves the pause as it is
            logger.warning(
                "account probe failed",
                error=type(error).__name__,
                detail=outside_text(error, 200),
            )
            return False

    def _sweep(
        self, step: Step, summary: SweepSummary, remaining_ms: Callable[[], int]
    ) -> StopReason | None:
        """Page through one kind of stale row; None when it has no eligible row left."""
        if step.sends_waiting_rows and not self._lane_open:
            # Nothing is uploaded while the lane is paused; rows parked by it (and any
            # lost message) are sent once it opens, so they are not received in vain.
            return None
        after: datetime | None = None
        while True:
            limit = next_page(
                budget_left=self.settings.max_rows - summary.claimed,
                remaining_ms=remaining_ms(),
                page_size=self.page_size,
            )
            if isinstance(limit, StopReason):
                return limit
            rows = self._take(step, limit, after)
            if not rows:
                return None
            logger.info(
                "sweep took records",
                step=str(step),
                count=len(rows),
                record_ids=logged_ids(row.record_id for row in rows),
            )
            summary.pages += 1
            summary.claimed += len(rows)
            self._concluded(step, rows, summary)
            to_send = live_first([row for row in rows if row.to_send])
            stop = self._send(step, to_send, summary, remaining_ms)
            if stop is not None:
                return stop
            if len(rows) < limit:
                return None
            after = latest_due(rows, after)

    def _take(self, step: Step, limit: int, after: datetime | None) -> list[SweptRow]:
        settings = self.settings
        match step:
            case Step.LOCKLESS:
                return self.records.take_lockless(limit=limit, max_attempts=settings.max_attempts)
            case Step.EXPIRED:
                return self.records.take_expired_locks(
                    limit=limit,
                    lock_ttl_seconds=settings.lock_ttl_seconds,
                    max_attempts=settings.max_attempts,
                )
            case Step.LOST | Step.LOST_BACKFILLED:
                return self.records.take_lost(
                    limit=limit,
                    grace_seconds=settings.grace_seconds,
                    lost_before=self._lost_before,
                    after=after,
                    backfilled=step is Step.LOST_BACKFILLED,
                )
        raise AssertionError(f"unknown step {step}")  # pragma: no cover

    def _concluded(self, step: Step, rows: list[SweptRow], summary: SweepSummary) -> None:
        if not step.sends_waiting_rows:
            summary.expired_locks += len(rows)
        self.own_events += [row.event_id for row in rows if row.event_id is not None]
        failed = [row.record_id for row in rows if not row.to_send]
        if not failed:
            return
        summary.failed += len(failed)
        reason = (
            "lock expired after the last attempt"
            if not step.sends_waiting_rows
            else "generation is not SUCCEEDED; nothing to archive"
        )
        logger.error(
            "archive failed by the sweeper",
            step=str(step),
            reason=reason,
            count=len(failed),
            record_ids=logged_ids(failed),
        )

    def _send(
        self,
        step: Step,
        rows: list[SweptRow],
        summary: SweepSummary,
        remaining_ms: Callable[[], int],
    ) -> StopReason | None:
        """Send one page's messages; rows not sent get their stamp back."""
        report = send_records(
            self.queue,
            self.settings.queue_url,
            [row.record_id for row in rows],
            may_send=lambda: can_send_batch(remaining_ms()),
        )
        summary.requeued += len(report.sent)
        if report.sent:
            logger.info(
                "sweep sent records",
                step=str(step),
                count=len(report.sent),
                record_ids=logged_ids(report.sent),
            )
        stop: StopReason | None = None
        if report.error is not None:
            # Nothing of that call was sent; the rows stay eligible for the next run.
            logger.error(
                "could not send to the archive queue; stopping this run",
                step=str(step),
                error=type(report.error).__name__,
                detail=outside_text(report.error, 200),
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
                record_ids=logged_ids(report.failed),
            )
        unsent = set(report.unsent)
        if unsent:
            summary.send_failures += len(unsent)
            self.records.restore([row for row in rows if row.record_id in unsent])
        return stop

    def _expire_events(self, summary: SweepSummary, remaining_ms: Callable[[], int]) -> None:
        """Retention: concluded records' stories past ARCHIVE_EVENT_RETENTION_DAYS, a batch
        of records at a time while time is left; never a live record's
        (docs/explanation/stories.md)."""
        retention = self.settings.event_retention_days * 86_400
        for _ in range(EXPIRY_BATCHES):
            if remaining_ms() < PAGE_RESERVE_MS:
                return
            removed = self.records.expire_events(retention_seconds=retention, limit=EXPIRY_RECORDS)
            if not removed:
                return
            summary.stories_expired += len(removed)
            summary.events_removed += sum(removed.values())
            logger.info(
                "events of concluded records removed after the retention",
                count=len(removed),
                events=sum(removed.values()),
                record_ids=logged_ids(removed),
            )
            if len(removed) < EXPIRY_RECORDS:
                return

    @staticmethod
    def _emit_metrics(summary: SweepSummary) -> None:
        metrics.add_metric(name="Requeued", unit=MetricUnit.Count, value=summary.requeued)
        metrics.add_metric(name="SweepFailed", unit=MetricUnit.Count, value=summary.failed)
        if (staged := summary.staged) is not None:
            # StagedOldestAgeSeconds feeds StagedCopiesAgeAlarm (0 when nothing is staged).
            metrics.add_metric(
                name="StagedOldestAgeSeconds",
                unit=MetricUnit.Seconds,
                value=staged.oldest_age_seconds,
            )
            metrics.add_metric(name="StagedWaiting", unit=MetricUnit.Count, value=staged.waiting)
            metrics.add_metric(
                name="StagedFailedKeepingCopy",
                unit=MetricUnit.Count,
                value=staged.failed_keeping_copy,
            )
        if summary.oldest_pending_age_seconds is not None:
            metrics.add_metric(
                name="OldestPendingAgeSeconds",
                unit=MetricUnit.Seconds,
                value=summary.oldest_pending_age_seconds,
            )


def _publish(sweeper: Sweeper, remaining_ms: Callable[[], int]) -> dict[str, Any]:
    """The completion events left in the outbox, and those this run's statements wrote,
    published (lib.publish.sweep); nothing when events are off."""
    if sweeper.events is None:
        return {}
    outbox, bus = sweeper.events
    return publish_leftovers(
        outbox,
        bus,
        grace_seconds=sweeper.settings.grace_seconds,
        own=sweeper.own_events,
        remaining_ms=remaining_ms,
    ).as_dict()


def queue_view(queue: Queue, queue_url: str, records: SweepRecords) -> QueueView:
    """What a sweep knows of the archive queue: how far it has moved (the receive mark the
    claims keep), what waits in it, and SQS's clock against the database's, measured from
    the one GetQueueAttributes call and the mark's statement right after it."""
    started = time.monotonic()
    try:
        counts: QueueCounts | None = queue.counts(queue_url)
    except Exception as error:  # noqa: BLE001 - unknown counts: the receive mark decides
        logger.warning("could not read the queue's counts", error=type(error).__name__)
        counts = None
    mark, now = records.queue_mark()
    elapsed = time.monotonic() - started
    ahead = None
    if counts is not None and counts.date is not None:
        ahead = clock_ahead(counts.date, now, elapsed)
        if ahead is None or abs(ahead) > ASSUMED_CLOCK_AHEAD_SECONDS:
            # The rule allows for a measured difference; said because every other clock
            # comparison (lock expiry, due times) assumes the two agree.
            logger.warning(
                "SQS's clock and the database's disagree",
                sqs_date=counts.date.isoformat(),
                database_now=now.isoformat(),
            )
    return QueueView(
        now=now,
        received_through=mark,
        waiting=None if counts is None else counts.waiting,
        clock_ahead=ahead,
        retention_seconds=None if counts is None else counts.retention_seconds,
    )
