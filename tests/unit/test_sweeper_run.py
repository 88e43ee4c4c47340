"""The sweeper's paging, sending and stopping rules, on an in-memory store and queue.

The SQL itself is tested against PostgreSQL in tests/integration/test_sweeper.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lib.archive.sweep_rules import PAGE_RESERVE_MS, SEND_RESERVE_MS, Step, StopReason
from lib.archive.sweeper import Sweeper
from lib.platform.config import DatabaseConfig, SweeperSettings
from lib.platform.sqs import QueueCounts
from lib.state.lane import LaneState
from lib.state.sweeps import StagedSummary, SweptRow

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
STAMP = T0 + timedelta(hours=1)
QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/archive"


def rows(ids: range | list[int], status: str = "PENDING") -> list[SweptRow]:
    return [
        SweptRow(i, status, T0 if i % 2 else None, STAMP, T0 + timedelta(seconds=i)) for i in ids
    ]


class FakeStore:
    def __init__(self, pages: dict[Step, list[list[SweptRow]]], *, fail_on: Step | None = None):
        self.pages = {step: list(p) for step, p in pages.items()}
        self.fail_on = fail_on
        self.calls: list[tuple[Step, int, datetime | None]] = []
        self.restored: list[SweptRow] = []

    def _next(self, step: Step, limit: int, after: datetime | None = None) -> list[SweptRow]:
        self.calls.append((step, limit, after))
        if step is self.fail_on:
            raise RuntimeError("database went away")
        pages = self.pages.get(step) or []
        return pages.pop(0)[:limit] if pages else []

    def take_lockless(self, *, limit: int, max_attempts: int) -> list[SweptRow]:
        return self._next(Step.LOCKLESS, limit)

    def take_expired_locks(
        self, *, limit: int, lock_ttl_seconds: int, max_attempts: int
    ) -> list[SweptRow]:
        return self._next(Step.EXPIRED, limit)

    def take_lost(
        self,
        *,
        limit: int,
        grace_seconds: int,
        lost_before: datetime,
        after: datetime | None,
        backfilled: bool = False,
    ) -> list[SweptRow]:
        self.lost_before = lost_before
        return self._next(Step.LOST_BACKFILLED if backfilled else Step.LOST, limit, after)

    def queue_mark(self) -> tuple[datetime | None, datetime]:
        return None, T0

    def state(self) -> LaneState:  # LaneStore's
        return LaneState(now=T0)

    def roll_up(self) -> tuple[int, int]:  # LaneStore's
        return (0, 0)

    def staged_summary(self) -> StagedSummary:
        return StagedSummary(waiting=0, oldest_age_seconds=0.0, failed_keeping_copy=0)

    def date_undated(self, *, limit: int) -> list[int]:
        return []

    def expire_events(self, *, retention_seconds: int, limit: int) -> dict[int, int]:
        return {}

    def restore(self, claimed: list[SweptRow]) -> int:
        self.restored += claimed
        return len(claimed)

    def oldest_pending_age_seconds(self) -> float:
        return 42.0


class FakeQueue:
    """send_batch answers from `script` in order (a dict of failures, or an exception)."""

    def __init__(self, script: list[dict[str, str] | Exception] | None = None) -> None:
        self.script = list(script or [])
        self.sent: list[list[tuple[str, str]]] = []

    def send_batch(self, queue_url: str, entries: list[tuple[str, str]]) -> dict[str, str]:
        assert queue_url == QUEUE_URL
        assert len(entries) <= 10
        answer = self.script.pop(0) if self.script else {}
        if isinstance(answer, Exception):
            raise answer
        self.sent.append(entries)
        return answer

    def ids(self) -> list[int]:
        return [int(entry_id) for batch in self.sent for entry_id, _ in batch]

    def counts(self, queue_url: str) -> QueueCounts:
        return QueueCounts(visible=0, in_flight=0, delayed=0)


def make(
    store: FakeStore, queue: FakeQueue, *, max_rows: int = 5000, page_size: int = 100
) -> Sweeper:
    settings = SweeperSettings(
        database=DatabaseConfig(url="postgresql://x"), queue_url=QUEUE_URL, max_rows=max_rows
    )
    return Sweeper(
        settings=settings,
        records=store,  # type: ignore[arg-type]
        lanes=store,  # type: ignore[arg-type]
        queue=queue,  # type: ignore[arg-type]
        page_size=page_size,
    )


def plenty() -> int:
    return 600_000


pytestmark = pytest.mark.usefixtures("clean_metrics")


def test_pages_through_every_step_and_sends_ten_per_call() -> None:
    store = FakeStore(
        {
            Step.EXPIRED: [rows(range(1, 101)), rows(range(101, 121)) + rows([121], "FAILED")],
            Step.LOST: [rows(range(200, 300)), rows(range(300, 305))],
            Step.LOST_BACKFILLED: [rows(range(400, 403))],
        }
    )
    queue = FakeQueue()
    summary = make(store, queue).run(remaining_ms=plenty)

    assert queue.ids() == [*range(200, 305), *range(1, 121), *range(400, 403)]
    assert all(len(batch) == 10 for batch in queue.sent[:10])
    # Bodies follow the message contract; entry ids are the record ids.
    assert queue.sent[0][0] == ("200", json.dumps({"recordId": "200"}))
    assert summary.requeued == 228
    assert summary.expired_locks == 121
    assert summary.failed == 1
    assert summary.send_failures == 0
    assert summary.pages == 5
    assert summary.stop_reason is StopReason.DONE
    assert summary.oldest_pending_age_seconds == 42.0
    assert store.restored == []
    # Lost messages first, then lockless and expired locks, then a backfill's lost and
    # parked rows (live records first); a short page ends a step.
    assert [(step, limit) for step, limit, _ in store.calls] == [
        (Step.LOST, 100),
        (Step.LOST, 100),
        (Step.LOCKLESS, 100),
        (Step.EXPIRED, 100),
        (Step.EXPIRED, 100),
        (Step.LOST_BACKFILLED, 100),
    ]
    # Keyset paging: the second page of lost messages starts at the first page's last due time.
    assert store.calls[0][2] is None
    assert store.calls[1][2] == T0 + timedelta(seconds=299)


def test_failed_entries_are_restored_and_the_run_goes_on() -> None:
    store = FakeStore({Step.LOST: [rows(range(1, 21))]})
    queue = FakeQueue([{"3": "ThrottlingException", "7": "InternalError"}, {}])
    summary = make(store, queue).run(remaining_ms=plenty)

    assert [row.record_id for row in store.restored] == [3, 7]
    assert summary.requeued == 18
    assert summary.send_failures == 2
    assert summary.stop_reason is StopReason.DONE


def test_a_failed_call_restores_the_rest_of_the_page_and_stops(
    logs: Callable[[], list[dict[str, Any]]],
) -> None:
    store = FakeStore({Step.LOST: [rows(range(1, 31))], Step.EXPIRED: [rows(range(100, 110))]})
    queue = FakeQueue([{}, ConnectionError("Could not connect to the endpoint URL")])
    summary = make(store, queue).run(remaining_ms=plenty)

    assert queue.ids() == list(range(1, 11))
    assert [row.record_id for row in store.restored] == list(range(11, 31))
    assert summary.requeued == 10
    assert summary.send_failures == 20
    assert summary.stop_reason is StopReason.SQS_ERROR
    assert summary.stopped_early
    # No further page is claimed once SQS failed: those rows stay untouched.
    assert [step for step, _, _ in store.calls] == [Step.LOST]
    error = next(line for line in logs() if line["level"] == "ERROR")
    assert error["error"] == "ConnectionError"
    assert next(line for line in logs() if line["message"] == "sweep finished")["level"] == (
        "WARNING"
    )


def test_no_page_is_started_without_time_for_it() -> None:
    store = FakeStore({Step.EXPIRED: [rows(range(1, 5))]})
    queue = FakeQueue()
    summary = make(store, queue).run(remaining_ms=lambda: PAGE_RESERVE_MS - 1)

    assert store.calls == []
    assert queue.sent == []
    assert summary.stop_reason is StopReason.TIME
    assert summary.stopped_early


def test_time_running_out_mid_page_restores_the_unsent_rows() -> None:
    clock = iter([PAGE_RESERVE_MS, PAGE_RESERVE_MS, SEND_RESERVE_MS, SEND_RESERVE_MS - 1])
    store = FakeStore({Step.LOST: [rows(range(1, 31))]})
    queue = FakeQueue()
    summary = make(store, queue).run(remaining_ms=lambda: next(clock, 0))

    assert queue.ids() == list(range(1, 21))
    assert [row.record_id for row in store.restored] == list(range(21, 31))
    assert summary.stop_reason is StopReason.TIME
    assert [step for step, _, _ in store.calls] == [Step.LOST]


def test_the_run_is_bounded_by_max_rows() -> None:
    store = FakeStore({Step.LOST: [rows(range(1, 101))], Step.EXPIRED: [rows(range(101, 201))]})
    queue = FakeQueue()
    summary = make(store, queue, max_rows=150).run(remaining_ms=plenty)

    # The bound is shared by the steps: what lost messages used is not left for the rest.
    assert [(step, limit) for step, limit, _ in store.calls] == [
        (Step.LOST, 100),
        (Step.LOST, 50),
        (Step.LOCKLESS, 50),
        (Step.EXPIRED, 50),
    ]
    assert queue.ids() == list(range(1, 151))
    assert summary.claimed == 150
    assert summary.requeued == 150
    assert summary.stop_reason is StopReason.MAX_ROWS


def test_failed_rows_are_not_sent(logs: Callable[[], list[dict[str, Any]]]) -> None:
    store = FakeStore({Step.EXPIRED: [rows([5, 6], "FAILED") + rows([7])]})
    queue = FakeQueue()
    summary = make(store, queue).run(remaining_ms=plenty)

    assert queue.ids() == [7]
    assert summary.failed == 2
    failed = next(line for line in logs() if line["message"] == "archive failed by the sweeper")
    assert failed["record_ids"] == ["5", "6"]
    assert failed["reason"] == "lock expired after the last attempt"


def test_a_database_error_fails_the_run_after_reporting(
    logs: Callable[[], list[dict[str, Any]]],
) -> None:
    from lib.platform.observability import metrics

    store = FakeStore({Step.LOST: [rows(range(1, 4))]}, fail_on=Step.EXPIRED)
    queue = FakeQueue()
    with pytest.raises(RuntimeError, match="database went away"):
        make(store, queue).run(remaining_ms=plenty)

    assert queue.ids() == [1, 2, 3]
    aborted = next(line for line in logs() if line["message"] == "sweep aborted")
    assert aborted["requeued"] == 3
    # What was done is still counted in the metrics flushed by the handler.
    names = {
        m["Name"] for m in metrics.serialize_metric_set()["_aws"]["CloudWatchMetrics"][0]["Metrics"]
    }
    assert {"Requeued", "SweepFailed"} <= names
