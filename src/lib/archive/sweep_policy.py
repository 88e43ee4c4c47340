"""The sweeper's pure decisions: how much to take next, when to stop, what a run did.

No I/O here (lib.archive.sweeper runs the SQL and the sends), so the paging and time rules
can be tested from tables.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# Rows claimed per statement: ten SendMessageBatch calls. Small enough that a page's
# row locks are held for milliseconds and that a stop mid-run leaves little behind.
PAGE_SIZE = 100
# Worst case of one SendMessageBatch with the sweeper's client (2 attempts, 2 s
# connect / 5 s read timeouts, plus backoff) and the statement that puts back the
# stamps of rows it could not send. A batch is only started with this much left.
SEND_RESERVE_MS = 15_000
# A page also needs its claim statement; after that the page is sent batch by batch.
PAGE_RESERVE_MS = SEND_RESERVE_MS + 5_000


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


@dataclass(frozen=True)
class ClaimedRow:
    """A row as one claim statement left it."""

    record_id: int
    archive_status: str  # PENDING: send a message; FAILED: concluded, nothing to send
    previous_enqueued_at: datetime | None  # put back when the send fails
    enqueued_at: datetime | None  # the claim's stamp (now() of its statement)
    next_run_at: datetime | None = None

    @property
    def to_send(self) -> bool:
        return self.archive_status == "PENDING"


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


def can_send_batch(remaining_ms: int) -> bool:
    return remaining_ms >= SEND_RESERVE_MS


def latest_due(rows: Sequence[ClaimedRow], after: datetime | None) -> datetime | None:
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
            "pages": self.pages,
            "claimed": self.claimed,
            "stopped_early": self.stopped_early,
            "stop_reason": str(self.stop_reason),
            "duration_ms": self.duration_ms,
        }
