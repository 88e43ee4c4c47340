"""The sweeper: no record stays PENDING or RUNNING forever.

Each run, in bounded pages: lost messages are sent again, expired locks go back to
PENDING (and are sent) or to FAILED. The paging and time rules are pure functions at
the top; docs/archive.md has the rationale (double sends, index use, failure modes).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.enqueue import send_records
from lib.archive.lane import probe_can_clear
from lib.platform.config import SweeperSettings
from lib.platform.observability import logger, metrics
from lib.platform.redact import outside_text
from lib.platform.sqs import Queue
from lib.state.lane import PauseReason
from lib.state.lane_store import LaneStore
from lib.state.sweeps import StagedSummary, SweepRecords, SweptRow

# Rows parked by a pause that the probe cleared come due over this many seconds.
UNPARK_SPREAD_SECONDS = 60.0
# Ids listed in one log line at most (the counts are always complete).
_LOGGED_IDS = 50

# Rows claimed per statement: ten SendMessageBatch calls. Small enough that a page's
# row locks are held for milliseconds and that a stop mid-run leaves little behind.
PAGE_SIZE = 100
# Worst case of one SendMessageBatch with the sweeper's client (2 attempts, 2 s
# connect / 5 s read timeouts, plus backoff) and the statement that puts back the
# stamps of rows it could not send. A batch is only started with this much left.
SEND_RESERVE_MS = 15_000
# A page also needs its claim statement; after that the page is sent batch by batch.
PAGE_RESERVE_MS = SEND_RESERVE_MS + 5_000
# The account probe's whole exchange with Lsky, at most; it always leaves the run this
# much for its statements and a first page.
PROBE_SECONDS = 10.0
PROBE_RESERVE_MS = PAGE_RESERVE_MS + 5_000


class Step(enum.StrEnum):
    """The kinds of stale rows, in the order a run handles them.

    Lost messages first: nothing else would ever bring them back, whereas a crashed
    attempt's own message returns after the visibility timeout. It also keeps the
    rows this run takes over from expired locks (PENDING now, long due, just sent)
    out of this run's lost-message scan.
    """

    # PENDING rows long past due and not sent recently: their message was lost.
    LOST = "lost"
    # RUNNING rows whose lock time is missing: the archive claim treats them as expired.
    LOCKLESS = "lockless"
    # RUNNING rows whose lock expired: the worker died (crash, timeout, lost container).
    EXPIRED = "expired"


class StopReason(enum.StrEnum):
    DONE = "done"  # every eligible row was handled
    MAX_ROWS = "max_rows"  # the per-run bound was reached; the next run continues
    TIME = "time"  # the invocation was about to run out of time
    SQS_ERROR = "sqs_error"  # a whole SendMessageBatch call failed; retry next run


def next_page(
    *, budget_left: int, remaining_ms: int, page_size: int = PAGE_SIZE
) -> int | StopReason:
    """Rows to claim in the next page, or why the run stops before it.

    Checked before every page: a page is claimed only when there is time to send it.
    """
    if budget_left <= 0:
        return StopReason.MAX_ROWS
    if remaining_ms < PAGE_RESERVE_MS:
        return StopReason.TIME
    return min(page_size, budget_left)


def probe_deadline(remaining_ms: int) -> float:
    """When the account probe must have its answer: PROBE_SECONDS from now at most, and
    early enough to leave the run PROBE_RESERVE_MS."""
    seconds = min(PROBE_SECONDS, (remaining_ms - PROBE_RESERVE_MS) / 1000)
    return time.monotonic() + max(seconds, 0.0)


def can_send_batch(remaining_ms: int) -> bool:
    return remaining_ms >= SEND_RESERVE_MS


# A queued message may wait this many times the average backlog wait before it counts as
# lost (standard queues are not FIFO), and never longer than a day.
BACKLOG_SAFETY = 2.0
MAX_BACKLOG_WAIT_SECONDS = 86_400


def requeue_interval(interval_seconds: int, *, queued: int | None, rate: float) -> int:
    """How long after its last send a row's message may still be on its way: the requeue
    interval, plus the time the queue ahead of it needs at the current drain rate. A queue
    that does not drain makes no sent message look lost; unknown depth: the interval.
    Rows never sent (no stamp: parked, or a failed send) are not affected."""
    if not queued:
        return interval_seconds
    if rate <= 0:
        return interval_seconds + MAX_BACKLOG_WAIT_SECONDS
    wait = min(BACKLOG_SAFETY * queued / rate, MAX_BACKLOG_WAIT_SECONDS)
    return interval_seconds + int(wait)


def latest_due(rows: Sequence[SweptRow], after: datetime | None) -> datetime | None:
    """Where the next page of lost messages starts (keyset paging on the due time)."""
    dues = [row.next_run_at for row in rows if row.next_run_at is not None]
    if after is not None:
        dues.append(after)
    return max(dues) if dues else after


@dataclass
class SweepSummary:
    """What a run did; `as_dict` is the handler's return value."""

    requeued: int = 0  # messages sent (lost messages and expired locks)
    expired_locks: int = 0  # RUNNING rows taken over (back to PENDING, or FAILED)
    failed: int = 0  # rows made FAILED (attempts used up, or nothing to archive)
    send_failures: int = 0  # rows not sent (send failed or not attempted); still eligible
    dated: int = 0  # PENDING rows without a due time that were given one
    pages: int = 0  # claim statements that took at least one row
    claimed: int = 0  # rows taken, counted against the per-run bound
    stop_reason: StopReason = StopReason.DONE
    oldest_pending_age_seconds: float | None = None
    requeue_interval_seconds: int | None = None  # the interval the lost-message step used
    lane_paused: str | None = None  # the pause reason, while the lane is paused
    lane_resumed: bool = False  # the probe found the account healthy and opened the lane
    unparked: int = 0  # rows parked by that pause, made due now
    ledger_rolled_up: int = 0  # uploads older than the ledger's hours, counted per hour
    staged: StagedSummary | None = None  # copies in the staging bucket, as the rows say
    duration_ms: float = 0.0

    @property
    def stopped_early(self) -> bool:
        return self.stop_reason is not StopReason.DONE

    def as_dict(self) -> dict[str, Any]:
        return {
            "requeued": self.requeued,
            "expired_locks": self.expired_locks,
            "failed": self.failed,
            "send_failures": self.send_failures,
            "dated": self.dated,
            "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
            "requeue_interval_seconds": self.requeue_interval_seconds,
            "lane_paused": self.lane_paused,
            "lane_resumed": self.lane_resumed,
            "unparked": self.unparked,
            "staged_waiting": None if self.staged is None else self.staged.waiting,
            "pages": self.pages,
            "claimed": self.claimed,
            "stopped_early": self.stopped_early,
            "stop_reason": str(self.stop_reason),
            "duration_ms": self.duration_ms,
        }


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
    ) -> None:
        """probe: whether the host account is healthy again (Lsky's profile endpoint),
        known by the deadline it is given (time.monotonic())."""
        self.settings = settings
        self.records = records
        self.lanes = lanes
        self.queue = queue
        self.probe = probe
        self._lane_open = True
        self._requeue_interval = settings.requeue_interval_seconds
        self.page_size = page_size

    def run(self, *, remaining_ms: Callable[[], int]) -> SweepSummary:
        """One sweep; stops early (leaving the rest to the next run) when time runs short."""
        started = time.monotonic()
        summary = SweepSummary()
        try:
            summary.dated = self.records.date_undated(limit=self.settings.max_rows)
            summary.ledger_rolled_up, _ = self.lanes.roll_up()
            self._read_lane(summary, remaining_ms)
            for step in Step:
                stop = self._sweep(step, summary, remaining_ms)
                if stop is not None:
                    summary.stop_reason = stop
                    break
            summary.oldest_pending_age_seconds = self.records.oldest_pending_age_seconds()
            summary.staged = self.records.staged_summary()
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

    def _read_lane(self, summary: SweepSummary, remaining_ms: Callable[[], int]) -> None:
        """The lane decides what this run sends: nothing lost or parked while it is paused
        (the probe may open it), and a requeue interval that grows with the backlog."""
        lane = self.lanes.state()
        if (
            lane.paused
            and lane.reason == PauseReason.ACCOUNT
            and probe_can_clear(lane.detail)
            and self._probe(probe_deadline(remaining_ms()))
        ):
            self.lanes.clear(reason="account")
            summary.unparked = self.lanes.unpark(
                spread_seconds=UNPARK_SPREAD_SECONDS, limit=self.settings.max_rows
            )
            summary.lane_resumed = True
            logger.info("the host account is healthy again; upload lane opened")
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
        self._requeue_interval = requeue_interval(
            self.settings.requeue_interval_seconds,
            queued=self._queued(),
            rate=lane.drain_per_second,
        )
        summary.requeue_interval_seconds = self._requeue_interval

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

    def _queued(self) -> int | None:
        try:
            return self.queue.depth(self.settings.queue_url)
        except Exception as error:  # noqa: BLE001 - without the depth, the plain grace applies
            logger.warning("could not read the queue depth", error=type(error).__name__)
            return None

    def _sweep(
        self, step: Step, summary: SweepSummary, remaining_ms: Callable[[], int]
    ) -> StopReason | None:
        """Page through one kind of stale row; None when it has no eligible row left."""
        if step is Step.LOST and not self._lane_open:
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
            summary.pages += 1
            summary.claimed += len(rows)
            self._concluded(step, rows, summary)
            stop = self._send(step, [row for row in rows if row.to_send], summary, remaining_ms)
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
            case Step.LOST:
                return self.records.take_lost(
                    limit=limit,
                    grace_seconds=settings.grace_seconds,
                    interval_seconds=self._requeue_interval,
                    after=after,
                )
        raise AssertionError(f"unknown step {step}")  # pragma: no cover

    def _concluded(self, step: Step, rows: list[SweptRow], summary: SweepSummary) -> None:
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
                record_ids=[str(record_id) for record_id in sorted(report.failed)[:_LOGGED_IDS]],
            )
        unsent = set(report.unsent)
        if unsent:
            summary.send_failures += len(unsent)
            self.records.restore([row for row in rows if row.record_id in unsent])
        return stop

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
