from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lib.archive.sweep_rules import (
    PAGE_RESERVE_MS,
    PAGE_SIZE,
    SEND_RESERVE_MS,
    StopReason,
    SweepSummary,
    can_send_batch,
    latest_due,
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
