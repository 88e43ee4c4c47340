"""The sweeper's rules (pure): the kinds of stale rows in the order a run takes them, the
paging and time budget, when a row's message is lost rather than on its way, and what a
run reports. lib.archive.sweeper applies them; docs/explanation/sweeper.md has the rationale.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lib.state.sweeps import StagedSummary, SweptRow

# Rows parked by a pause that the probe cleared come due over this many seconds.
UNPARK_SPREAD_SECONDS = 60.0
# Ids listed in one log line at most (the counts are always complete).
LOGGED_IDS = 50


def logged_ids(ids: Iterable[int]) -> list[str]:
    """The records a log line names: the first LOGGED_IDS of `ids` in order, as strings
    (JavaScript-safe, as the message's recordId); its `count` field says how many."""
    return [str(record_id) for record_id in sorted(ids)[:LOGGED_IDS]]


def named_ids(ids: Iterable[int]) -> str:
    """The same for a line of text: `4, 5, 9`, or the first LOGGED_IDS and how many more."""
    every = sorted(ids)
    shown = ", ".join(logged_ids(every))
    more = len(every) - LOGGED_IDS
    return f"{shown} and {more} more" if more > 0 else shown


# Rows claimed per statement: ten SendMessageBatch calls. Small enough that a page's
# row locks last milliseconds and that a stop mid-run leaves little behind.
PAGE_SIZE = 100
# Worst case of one SendMessageBatch with the sweeper's client (2 attempts, 2 s
# connect / 5 s read timeouts, plus backoff) and the statement that puts back the
# stamps of rows it could not send. A batch is only started with this much left.
SEND_RESERVE_MS = 15_000
# A page also needs its claim statement; after that the page is sent batch by batch.
PAGE_RESERVE_MS = SEND_RESERVE_MS + 5_000
# Retention: the stories of this many concluded records a statement (about ten events
# each), this many statements a run at most; each only with PAGE_RESERVE_MS left.
EXPIRY_RECORDS = 1_000
EXPIRY_BATCHES = 10
# The account probe's whole exchange with Lsky, at most; it always leaves the run this
# much for its statements and a first page.
PROBE_SECONDS = 10.0
PROBE_RESERVE_MS = PAGE_RESERVE_MS + 5_000


class Step(enum.StrEnum):
    """The kinds of stale rows, in the order a run handles them.

    Lost messages first: nothing else would ever bring them back, whereas a crashed
    attempt's own message returns after the visibility timeout. It also keeps the
    rows this run takes over from expired locks (PENDING now, long due, just sent)
    out of this run's lost-message scan. A backfill's rows come last: live records first.
    """

    # PENDING rows long past due and not sent recently: their message was lost; and rows
    # we parked, once due. Live records' only: backfilled ones come last.
    LOST = "lost"
    # RUNNING rows whose lock time is missing: the archive claim treats them as expired.
    LOCKLESS = "lockless"
    # RUNNING rows whose lock expired: the worker died (crash, timeout, lost container).
    EXPIRED = "expired"
    # Lost and parked rows a backfill queued (archive_backfilled): after every live one.
    LOST_BACKFILLED = "lost_backfilled"

    @property
    def sends_waiting_rows(self) -> bool:
        """Lost or parked rows, which wait while the lane is paused (not expired locks)."""
        return self in (Step.LOST, Step.LOST_BACKFILLED)


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


# -- lost or on its way (docs/explanation/sweeper.md) --------------------

# A standard queue serves messages roughly in the order they became visible: one that
# entered the queue (was sent, or came back from a hold) is received before any that
# entered more than this later. The same slack covers a send's lag behind the row's stamp
# (a page of the sweeper's is stamped, then sent ten by ten) and a hold's behind the row's
# due time (the visibility is set just after the write).
ENTRY_SLACK_SECONDS = 120
# SQS's clock against the database's, when a sweep could not measure it (no Date header in
# SQS's answer): assumed ahead by at most this much.
ASSUMED_CLOCK_AHEAD_SECONDS = 60
# A standard queue keeps a message at most 14 days (its MessageRetentionPeriod, counted from
# the first send); read from the queue, this is the bound when it cannot be. Beyond the
# retention and a margin for a send's lag behind its stamp, nothing is left to wait for.
MAX_RETENTION_SECONDS = 1_209_600
RETENTION_MARGIN_SECONDS = 3_600
# A measured difference larger than this is not a clock's: the header is taken as unknown.
MAX_CLOCK_AHEAD_SECONDS = 86_400
NEVER = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class QueueView:
    """What a sweep knows of the archive queue, and the database's clock it judges by."""

    now: datetime  # the database's clock
    # The receive mark: the newest SentTimestamp among messages the worker received for the
    # first time (SQS's clock; image_archive_queue). None: none since the mark existed.
    received_through: datetime | None
    # Messages waiting to be received: visible, or delayed (ApproximateNumberOfMessages +
    # ...Delayed). In flight ones do not count: those are held on purpose, their rows say
    # until when. None: SQS did not answer.
    waiting: int | None
    # How far SQS's clock may be ahead of the database's, measured (seconds; negative when
    # behind); None: not measured.
    clock_ahead: float | None = None
    retention_seconds: int | None = None


def lost_before(view: QueueView, interval_seconds: int) -> datetime:
    """The time before which a row's message, had it entered the queue then (its last
    send, or the end of the hold the worker set on it: the row's due time) and the row not
    been claimed since, is lost: it was sent more than the requeue interval ago, and either
    nothing is waiting in the queue (whatever is in flight is held on purpose), or the
    worker has received a message sent ENTRY_SLACK_SECONDS after it (the queue has moved
    past it). Either way, never later than the queue's retention allows it to live."""
    plain = view.now - timedelta(seconds=interval_seconds)
    # Nothing waiting: whatever is in flight is held on purpose, and its rows say so.
    cutoff = plain if view.waiting == 0 else min(plain, _moved_past(view))
    retention = min(view.retention_seconds or MAX_RETENTION_SECONDS, MAX_RETENTION_SECONDS)
    gone = view.now - timedelta(seconds=retention + RETENTION_MARGIN_SECONDS)
    return max(cutoff, gone)


def _moved_past(view: QueueView) -> datetime:
    """Before this, whatever entered the queue has come out: the receive mark in the
    database's clock, less the slack. The beginning of time when nothing was received
    (or the mark is not a time the arithmetic can move: a row written by hand)."""
    if view.received_through is None:
        return NEVER
    ahead = ASSUMED_CLOCK_AHEAD_SECONDS if view.clock_ahead is None else view.clock_ahead
    try:
        return view.received_through - timedelta(seconds=ahead + ENTRY_SLACK_SECONDS)
    except OverflowError:
        return NEVER


def entered_queue(enqueued_at: datetime | None, next_run_at: datetime | None) -> datetime | None:
    """When a row's message last entered the queue: its last send, or, when the worker held
    it, the hold's end (the row's due time), whichever is later. None: no message was sent
    (parked, or a send that failed and was unstamped), and the grace period decides.

    Never earlier than the truth: a row claimed since its last send has a later due time
    (retry, release) or a new stamp (the expired-lock step); a duplicate held early is held
    until the row's due time."""
    if enqueued_at is None:
        return None
    return enqueued_at if next_run_at is None else max(enqueued_at, next_run_at)


def is_lost(
    *,
    enqueued_at: datetime | None,
    next_run_at: datetime | None,
    cutoff: datetime,
    now: datetime,
    grace_seconds: int,
) -> bool:
    """The lost-message step's test of one PENDING row, as `lost_row` in queries.sql puts
    it: due more than the grace period ago, and never sent or entered before `cutoff`."""
    if next_run_at is None or next_run_at >= now - timedelta(seconds=grace_seconds):
        return False
    entered = entered_queue(enqueued_at, next_run_at)
    return entered is None or entered < cutoff


def clock_ahead(sqs_date: datetime, db_now: datetime, elapsed_seconds: float) -> float | None:
    """How far SQS's clock is ahead of the database's at most (seconds): its answer's Date
    (whole seconds, rounded down) against the database's now() read after it, the two
    reads `elapsed_seconds` apart from the SQS call's start to the statement's end. None
    for a difference of more than a day: a Date header that is not SQS's clock."""
    ahead = (sqs_date - db_now).total_seconds() + 1.0 + max(elapsed_seconds, 0.0)
    return ahead if abs(ahead) <= MAX_CLOCK_AHEAD_SECONDS else None


def latest_due(rows: Sequence[SweptRow], after: datetime | None) -> datetime | None:
    """Where the next page of lost messages starts (keyset paging on the due time)."""
    dues = [row.next_run_at for row in rows if row.next_run_at is not None]
    if after is not None:
        dues.append(after)
    return max(dues) if dues else after


def live_first(rows: Sequence[SweptRow]) -> list[SweptRow]:
    """A page's rows in the order their messages go out: live records before backfilled
    ones, the longest due first (an UPDATE returns its rows in no particular order)."""
    return sorted(
        rows,
        key=lambda row: (row.backfilled, row.next_run_at.timestamp() if row.next_run_at else 0.0),
    )


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
    # How long ago a row's message must have entered the queue to be lost (lost_before).
    requeue_interval_seconds: int | None = None
    queue_waiting: int | None = None  # messages waiting to be received, as SQS counted them
    clock_ahead_seconds: float | None = None  # SQS's clock against the database's, at most
    lane_paused: str | None = None  # the pause reason, while the lane is paused
    lane_resumed: bool = False  # the probe found the account healthy and opened the lane
    unparked: int = 0  # rows parked by that pause, made due now
    ledger_rolled_up: int = 0  # uploads older than the ledger's hours, counted per hour
    stories_expired: int = 0  # concluded records whose events the retention removed
    events_removed: int = 0  # and how many events that was
    staged: StagedSummary | None = None  # copies in the staging bucket, as the rows say
    # Completion events (lib.publish.sweep.PublishReport.as_dict); empty when events are off.
    events: dict[str, Any] = field(default_factory=dict)
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
            "queue_waiting": self.queue_waiting,
            "clock_ahead_seconds": self.clock_ahead_seconds,
            "lane_paused": self.lane_paused,
            "lane_resumed": self.lane_resumed,
            "unparked": self.unparked,
            "stories_expired": self.stories_expired,
            "events_removed": self.events_removed,
            "staged_waiting": None if self.staged is None else self.staged.waiting,
            **self.events,
            "pages": self.pages,
            "claimed": self.claimed,
            "stopped_early": self.stopped_early,
            "stop_reason": str(self.stop_reason),
            "duration_ms": self.duration_ms,
        }
