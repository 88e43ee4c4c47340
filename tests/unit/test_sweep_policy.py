from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lib.archive.sweep_rules import (
    ASSUMED_CLOCK_AHEAD_SECONDS,
    ENTRY_SLACK_SECONDS,
    MAX_RETENTION_SECONDS,
    PAGE_RESERVE_MS,
    PAGE_SIZE,
    RETENTION_MARGIN_SECONDS,
    SEND_RESERVE_MS,
    QueueView,
    StopReason,
    SweepSummary,
    can_send_batch,
    clock_ahead,
    entered_queue,
    is_lost,
    latest_due,
    lost_before,
    next_page,
)
from lib.state.sweeps import SweptRow

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("budget_left", "remaining_ms", "expected"),
    [
        (5000, 60_000, PAGE_SIZE),
        (30, 60_000, 30),  # the last page of the per-run bound is smaller
        (0, 60_000, StopReason.MAX_ROWS),
        (5000, PAGE_RESERVE_MS, PAGE_SIZE),
        (5000, PAGE_RESERVE_MS - 1, StopReason.TIME),
        (0, 0, StopReason.MAX_ROWS),
    ],
)
def test_next_page(budget_left: int, remaining_ms: int, expected: int | StopReason) -> None:
    assert next_page(budget_left=budget_left, remaining_ms=remaining_ms) == expected


def test_a_page_needs_time_for_its_claim_and_a_send() -> None:
    assert PAGE_RESERVE_MS > SEND_RESERVE_MS
    assert can_send_batch(SEND_RESERVE_MS)
    assert not can_send_batch(SEND_RESERVE_MS - 1)


def row(record_id: int, status: str = "PENDING", due: datetime | None = None) -> SweptRow:
    return SweptRow(record_id, status, None, T0, due)


def test_only_pending_rows_are_sent() -> None:
    assert row(1).to_send
    assert not row(2, "FAILED").to_send


def test_latest_due_moves_the_keyset_forward() -> None:
    rows = [row(1, due=T0), row(2, due=T0 + timedelta(seconds=5)), row(3, due=None)]
    assert latest_due(rows, None) == T0 + timedelta(seconds=5)
    assert latest_due(rows, T0 + timedelta(hours=1)) == T0 + timedelta(hours=1)
    assert latest_due([], None) is None
    assert latest_due([row(4)], T0) == T0


def test_summary_dict() -> None:
    summary = SweepSummary(requeued=3, failed=1, pages=2, oldest_pending_age_seconds=12.5)
    assert summary.as_dict() == {
        "requeued": 3,
        "expired_locks": 0,
        "failed": 1,
        "send_failures": 0,
        "dated": 0,
        "oldest_pending_age_seconds": 12.5,
        "requeue_interval_seconds": None,
        "queue_waiting": None,
        "clock_ahead_seconds": None,
        "lane_paused": None,
        "lane_resumed": False,
        "unparked": 0,
        "stories_expired": 0,
        "events_removed": 0,
        "staged_waiting": None,
        "pages": 2,
        "claimed": 0,
        "stopped_early": False,
        "stop_reason": "done",
        "duration_ms": 0.0,
    }
    summary.stop_reason = StopReason.TIME
    assert summary.as_dict()["stopped_early"] is True
    assert summary.as_dict()["stop_reason"] == "time"


# -- lost, or still on its way -------------------------------------------------------------

INTERVAL = 900


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def view(
    *,
    waiting: int | None,
    received: datetime | None = None,
    ahead: float | None = 0.0,
    retention: int | None = 345_600,
) -> QueueView:
    return QueueView(
        now=T0,
        received_through=received,
        waiting=waiting,
        clock_ahead=ahead,
        retention_seconds=retention,
    )


def test_with_nothing_waiting_a_message_sent_an_interval_ago_is_lost() -> None:
    # Whatever is in flight is held on purpose (backoff, a booked slot: up to 12 h), and
    # each such row's due time says when its message comes back.
    assert lost_before(view(waiting=0), INTERVAL) == T0 - seconds(INTERVAL)
    assert lost_before(view(waiting=0, received=T0 - seconds(86_400)), INTERVAL) == T0 - seconds(
        INTERVAL
    )


def test_with_messages_waiting_only_what_the_queue_has_moved_past_is_lost() -> None:
    # The worker received a message sent 30 minutes ago: whatever entered more than the
    # slack before that has been received.
    received = T0 - seconds(1800)
    assert lost_before(view(waiting=300, received=received), INTERVAL) == received - seconds(
        ENTRY_SLACK_SECONDS
    )
    # ...but never less than the interval ago, however far the queue has moved.
    assert lost_before(view(waiting=2, received=T0), INTERVAL) == T0 - seconds(INTERVAL)
    # SQS's clock 30 s ahead of the database's (measured): its timestamps read 30 s earlier.
    assert lost_before(
        view(waiting=2, received=received, ahead=30), INTERVAL
    ) == received - seconds(30 + ENTRY_SLACK_SECONDS)
    assert lost_before(
        view(waiting=2, received=received, ahead=-30), INTERVAL
    ) == received - seconds(ENTRY_SLACK_SECONDS - 30)
    # Not measured: assumed ahead by up to ASSUMED_CLOCK_AHEAD_SECONDS.
    assert lost_before(
        view(waiting=2, received=received, ahead=None), INTERVAL
    ) == received - seconds(ASSUMED_CLOCK_AHEAD_SECONDS + ENTRY_SLACK_SECONDS)
    # Counts unknown (SQS did not answer): as if something waited.
    assert lost_before(view(waiting=None, received=received), INTERVAL) == received - seconds(
        ENTRY_SLACK_SECONDS
    )


def test_a_queue_that_has_not_moved_holds_only_what_its_retention_allows() -> None:
    # Nothing received (yet) and messages waiting: nothing sent is known to be lost, until
    # SQS would have deleted it.
    retention = 345_600
    gone = T0 - seconds(retention + RETENTION_MARGIN_SECONDS)
    assert lost_before(view(waiting=5), INTERVAL) == gone
    assert lost_before(view(waiting=5, received=T0 - seconds(10 * 86_400)), INTERVAL) == gone
    # A retention SQS did not say: the longest it allows.
    assert lost_before(view(waiting=None, retention=None), INTERVAL) == T0 - seconds(
        MAX_RETENTION_SECONDS + RETENTION_MARGIN_SECONDS
    )


def test_a_row_s_message_entered_the_queue_at_its_last_send_or_the_end_of_its_hold() -> None:
    sent, due = T0 - seconds(3600), T0 - seconds(600)
    assert entered_queue(sent, due) == due  # held (backoff, a slot) after the send
    assert entered_queue(due, sent) == due  # sent again after it was due (the sweeper)
    assert entered_queue(sent, None) == sent
    assert entered_queue(None, due) is None  # no message was sent: parked, or unstamped


@pytest.mark.parametrize(
    ("stamp", "due", "lost"),
    [
        (None, 400, True),  # never sent (or unstamped), past the grace period
        (None, 200, False),  # within the grace period
        (2000, 1500, True),  # entered before the cutoff (1000 s ago)
        (2000, 900, False),  # held until 900 s ago: back in the queue after the cutoff
        (900, 2000, False),  # sent again 900 s ago
        (2000, -60, False),  # not due yet (in backoff)
    ],
)
def test_a_pending_row_is_lost_as_lost_row_says(stamp: int | None, due: int, lost: bool) -> None:
    assert (
        is_lost(
            enqueued_at=None if stamp is None else T0 - seconds(stamp),
            next_run_at=T0 - seconds(due),
            cutoff=T0 - seconds(1000),
            now=T0,
            grace_seconds=300,
        )
        is lost
    )


def test_sqs_s_clock_is_measured_from_its_date_header_as_an_upper_bound() -> None:
    # Date says 12:00:00 (SQS's clock, rounded down to the second); the database said
    # 11:59:58.5 at most 0.2 s after the call began: SQS is at most 2.7 s ahead.
    assert clock_ahead(T0, T0 - seconds(1.5), 0.2) == pytest.approx(2.7)
    assert clock_ahead(T0, T0 + seconds(30), 0.05) == pytest.approx(-28.95)
    # A day or more apart: not SQS's clock (a proxy's header, a broken one): unknown.
    assert clock_ahead(T0, T0 - seconds(86_400), 0.0) is None
    assert clock_ahead(datetime(9999, 12, 31, tzinfo=UTC), T0, 0.0) is None


@pytest.mark.parametrize(
    "absurd",
    [
        {"retention": 10**12},  # a retention SQS would never say: at most its 14 days
        {"retention": 0},
        {"received": datetime(1, 1, 1, tzinfo=UTC), "ahead": 120.0},  # a mark written by hand
        {"received": datetime(9999, 12, 31, tzinfo=UTC), "ahead": -86_400.0},
    ],
)
def test_absurd_values_never_break_the_rule(absurd: dict[str, object]) -> None:
    queue = view(waiting=3, **absurd)  # type: ignore[arg-type]
    cutoff = lost_before(queue, INTERVAL)
    assert T0 - seconds(MAX_RETENTION_SECONDS + RETENTION_MARGIN_SECONDS) <= cutoff
    assert cutoff <= T0 - seconds(INTERVAL)
