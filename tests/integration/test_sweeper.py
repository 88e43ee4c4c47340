"""The sweeper against the real PostgreSQL and moto SQS (and the archive handler after it).

Seeded times are seconds before the database's now() (tests.support): `locked_at=1000`
is "locked 1000 s ago", `next_run_at=-60` is "due in 60 s". Defaults apply unless a
test says otherwise: grace 300 s, requeue interval 900 s, lock TTL 180 s, 3 attempts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from devkit import images
from devkit.plans import explain
from devkit.postgres import apply_schema, connect
from devkit.sqs import QueuePair
from lib.archive import runtime
from lib.archive.message import encode, parse_record_id
from lib.archive.runtime import build_sweeper
from lib.platform.config import load_sweeper_settings
from lib.platform.sqs import Queue, QueueCounts
from lib.state.lane import settled
from lib.state.queries import QUERIES
from tests.integration.conftest import ArchiveHarness
from tests.logcapture import LogAssertions, capture_logs
from tests.support import (
    FakeLambdaContext,
    db_now,
    fetch_record,
    seconds_ago,
    seed_record,
    seed_running,
    set_uploads,
    wait_until,
)

PNG = images.png(8, 8)
URL = "https://upstream.invalid/gen.png"
UNREACHABLE_SQS = "http://127.0.0.1:9"


@dataclass
class SweepHarness(LogAssertions):
    sqs: Any
    queues: QueuePair
    raw_logs: list[str] = field(default_factory=list)

    def run(self, context: FakeLambdaContext | None = None) -> dict[str, Any]:
        """Invoke the handler as the EventBridge schedule does."""
        from handlers.sweeper import lambda_handler

        context = context or FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60)
        result: dict[str, Any] = lambda_handler({}, context)
        return result

    def drain(self) -> list[int]:
        """Record ids of every visible message, received and deleted as a consumer would
        (the queue is empty afterwards: its depth feeds the sweeper's backlog rule)."""
        ids: list[int] = []
        while True:
            response = self.sqs.receive_message(
                QueueUrl=self.queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = response.get("Messages", [])
            if not messages:
                return ids
            for message in messages:
                assert message["Body"] == encode(parse_record_id(message["Body"]))
                ids.append(parse_record_id(message["Body"]))
                self.sqs.delete_message(
                    QueueUrl=self.queues.url, ReceiptHandle=message["ReceiptHandle"]
                )


pytestmark = pytest.mark.usefixtures("clean_metrics")


@pytest.fixture
def sweep_env(archive_env: Callable[..., dict[str, str]]) -> Iterator[Callable[..., None]]:
    """Set the functions' shared environment (overrides as keyword args), reset the sweeper."""

    def apply(**overrides: str | None) -> None:
        archive_env(**overrides)
        runtime.reset()

    apply()
    yield apply
    runtime.reset()


@pytest.fixture
def sweep(sweep_env: Callable[..., None], sqs: Any, queues: QueuePair) -> Iterator[SweepHarness]:
    with capture_logs() as raw:
        yield SweepHarness(sqs=sqs, queues=queues, raw_logs=raw)


def all_rows(db: Any) -> dict[int, dict[str, Any]]:
    ids = [row[0] for row in db.run("SELECT id FROM image_generation_records ORDER BY id")]
    return {record_id: fetch_record(db, record_id) for record_id in ids}


# -- (a) lost messages ------------------------------------------------------------------


def test_lost_message_is_sent_again_once_per_interval(sweep: SweepHarness, db: Any) -> None:
    # The generation service committed PENDING, then its SendMessage failed.
    seed_record(db, 1, image_url=URL, next_run_at=1000, enqueued_at=None)
    # Sent before, more than an interval ago, and still not archived: lost too.
    seed_record(db, 2, image_url=URL, next_run_at=5000, enqueued_at=2000)

    started = db_now(db)
    summary = sweep.run()

    assert summary["requeued"] == 2
    assert summary["failed"] == 0
    assert summary["send_failures"] == 0
    assert summary["pages"] == 1
    assert summary["stopped_early"] is False
    assert sorted(sweep.drain()) == [1, 2]
    for record_id in (1, 2):
        row = fetch_record(db, record_id)
        assert row["archive_status"] == "PENDING"
        assert row["archive_enqueued_at"] >= started  # stamped by this run
        assert row["archive_attempts"] == 0
    # The oldest due first, and the due time is not changed by a resend.
    assert seconds_ago(db, fetch_record(db, 2)["archive_next_run_at"]) >= 5000

    # The next run (or a second sweeper) within the interval sends nothing again.
    again = sweep.run()
    assert again["requeued"] == 0
    assert again["pages"] == 0
    assert sweep.drain() == []
    finished = sweep.log_for("sweep finished")
    assert finished["requeued"] == 0
    assert finished["stop_reason"] == "done"


def test_fresh_rows_are_left_alone(sweep: SweepHarness, db: Any) -> None:
    seed_record(db, 1, image_url=URL, next_run_at=-60, attempts=1)  # backoff still running
    seed_record(db, 2, image_url=URL, next_run_at=100)  # due, within the grace period
    seed_record(db, 3, image_url=URL, next_run_at=1000, enqueued_at=100)  # sent recently
    seed_running(db, 4, locked_at=10)  # lock still valid
    seed_running(db, 5, attempts=3, locked_at=170)  # lock about to expire, not yet
    seed_record(db, 6, image_url=URL, archive_status="SUCCEEDED", next_run_at=None)
    seed_record(db, 7, image_url=URL, archive_status="FAILED", attempts=3, archive_error="x")
    seed_record(db, 8, image_url=URL, archive_status=None)  # never queued
    before = all_rows(db)
    due = before[3]["archive_next_run_at"]

    age_before = seconds_ago(db, due)
    summary = sweep.run()
    age_after = seconds_ago(db, due)

    assert all_rows(db) == before
    assert sweep.drain() == []
    assert summary["requeued"] == summary["failed"] == summary["expired_locks"] == 0
    assert summary["pages"] == 0
    # Row 3 is the oldest PENDING row: due 1000 s ago (its message is on its way).
    assert age_before >= 1000
    assert age_before - 1 <= summary["oldest_pending_age_seconds"] <= age_after + 1  # rounded


def test_undated_pending_row_gets_a_due_time_then_is_sent(sweep: SweepHarness, db: Any) -> None:
    seed_record(db, 1, image_url=URL, next_run_at=None)

    started = db_now(db)
    summary = sweep.run()

    assert summary["dated"] == 1
    assert summary["requeued"] == 0  # the grace period starts now: its message may be on its way
    row = fetch_record(db, 1)
    assert row["archive_next_run_at"] >= started  # dated by this run
    assert sweep.drain() == []

    db.run("UPDATE image_generation_records SET archive_next_run_at = now() - interval '301 s'")
    assert sweep.run()["requeued"] == 1
    assert sweep.drain() == [1]


def test_pending_row_of_a_generation_that_did_not_succeed_is_failed(
    sweep: SweepHarness, db: Any
) -> None:
    seed_record(db, 1, image_url=URL, status="DELETED", next_run_at=1000)

    summary = sweep.run()

    assert summary["failed"] == 1
    assert summary["requeued"] == 0
    row = fetch_record(db, 1)
    assert row["archive_status"] == "FAILED"
    assert row["archive_error"] == "generation status is DELETED; nothing to archive"
    assert row["status"] == "DELETED"
    assert row["archive_next_run_at"] is None
    assert sweep.drain() == []


# -- (b) expired locks ------------------------------------------------------------------


def test_crashed_worker_row_is_recovered_then_archived(
    sweep_env: Callable[..., None],
    sweep: SweepHarness,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> None:
    sweep_env(LSKY_TOKEN=lsky.token)  # whatever token the stand-in was started with
    upstream.add("/gen/9.png", PNG)
    # Attempt 1 started 1000 s ago and its worker died: the lock (TTL 180 s) expired.
    seed_running(
        db,
        9,
        image_url=upstream.url("/gen/9.png"),
        locked_at=1000,
        next_run_at=1000,
        enqueued_at=1000,
        archive_error="download failed: earlier problem [attempt 1/3]",
    )

    started = db_now(db)
    summary = sweep.run()

    assert summary["expired_locks"] == 1
    assert summary["requeued"] == 1
    assert summary["failed"] == 0
    row = fetch_record(db, 9)
    assert row["archive_status"] == "PENDING"
    assert row["archive_attempts"] == 1  # that attempt was spent; the claim counts the next
    assert row["archive_error"] == "lock expired during attempt 1/3; sent again"
    assert row["archive_locked_by"] is None
    assert row["archive_locked_at"] is None
    assert row["archive_enqueued_at"] >= started  # sent by this run
    assert seconds_ago(db, row["archive_next_run_at"]) >= 1000

    # The archive function gets the new message and finishes the job.
    event = archive.receive()
    assert [json.loads(r["body"]) for r in event["Records"]] == [{"recordId": "9"}]
    assert archive.invoke(event) == {"batchItemFailures": []}
    row = fetch_record(db, 9)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["archive_attempts"] == 2
    assert row["archive_error"] is None
    assert row["hosted_image_url"].startswith(lsky.base_url)
    assert lsky.successful_uploads == 1
    assert sweep.run()["requeued"] == 0


@pytest.mark.parametrize(("max_attempts", "expected"), [("3", "FAILED"), ("5", "PENDING")])
def test_exhausted_row_is_failed(
    sweep_env: Callable[..., None],
    sweep: SweepHarness,
    db: Any,
    max_attempts: str,
    expected: str,
) -> None:
    sweep_env(ARCHIVE_MAX_ATTEMPTS=max_attempts)
    seed_running(db, 3, attempts=3, locked_at=600, next_run_at=600, enqueued_at=900)

    summary = sweep.run()

    row = fetch_record(db, 3)
    assert row["archive_status"] == expected
    assert row["archive_attempts"] == 3
    assert row["status"] == "SUCCEEDED"  # the generation itself is never touched
    assert row["archive_locked_by"] is None
    assert row["archive_locked_at"] is None
    if expected == "FAILED":
        assert row["archive_error"] == "lock expired after the last attempt"
        assert row["archive_next_run_at"] is None
        assert seconds_ago(db, row["archive_enqueued_at"]) >= 900  # nothing was sent
        assert (summary["failed"], summary["requeued"]) == (1, 0)
        assert sweep.drain() == []
        failed = sweep.log_for("archive failed by the sweeper")
        assert failed["record_ids"] == ["3"]
        assert failed["level"] == "ERROR"
    else:
        assert row["archive_error"] == "lock expired during attempt 3/5; sent again"
        assert (summary["failed"], summary["requeued"]) == (0, 1)
        assert sweep.drain() == [3]


def test_running_row_without_a_lock_time_is_taken_over(sweep: SweepHarness, db: Any) -> None:
    seed_running(db, 4, locked_at=None)

    summary = sweep.run()

    assert (summary["expired_locks"], summary["requeued"]) == (1, 1)
    assert fetch_record(db, 4)["archive_status"] == "PENDING"
    assert sweep.drain() == [4]


# -- failures, bounds, concurrency --------------------------------------------------------


def test_sqs_down_loses_nothing(
    sweep_env: Callable[..., None],
    sweep: SweepHarness,
    db: Any,
    moto: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seed_record(db, 1, image_url=URL, next_run_at=1000)  # lost, never enqueued
    seed_record(db, 2, image_url=URL, next_run_at=3000, enqueued_at=2000)  # lost again
    seed_running(db, 3, attempts=2, locked_by=None, locked_at=1000, next_run_at=1000)  # crashed
    seed_running(db, 4, attempts=3, locked_by=None, locked_at=1000)  # on its last attempt
    before = all_rows(db)
    sweep_env(AWS_ENDPOINT_URL_SQS=UNREACHABLE_SQS)

    caplog.set_level(logging.DEBUG, logger="botocore.retries.standard")
    summary = sweep.run()

    # Two calls gave up after their few retries (botocore says so): the queue's counts,
    # then the first page's send. No storm, and nothing after that: the run stops.
    gave_up = [r for r in caplog.records if r.getMessage().startswith("Max attempts")]
    assert len(gave_up) == 2
    assert summary["requeued"] == 0
    # The first page: row 1, which has no message out. Whether row 2's still waits in the
    # queue cannot be told without SQS (and nothing is received yet): it is not taken.
    assert summary["send_failures"] == 1
    assert summary["queue_waiting"] is None
    assert sweep.log_for("could not read the queue's counts")["level"] == "WARNING"
    assert summary["stop_reason"] == "sqs_error"
    assert summary["stopped_early"] is True
    error = sweep.log_for("could not send to the archive queue; stopping this run")
    assert error["level"] == "ERROR"
    assert error["error"] == "EndpointConnectionError"
    assert sweep.log_for("sweep finished")["level"] == "WARNING"
    assert all_rows(db) == before  # the stamps were put back: all still eligible

    sweep_env(AWS_ENDPOINT_URL_SQS=moto.endpoint_url)
    summary = sweep.run()

    assert (summary["requeued"], summary["failed"], summary["send_failures"]) == (3, 1, 0)
    assert sorted(sweep.drain()) == [1, 2, 3]
    assert fetch_record(db, 4)["archive_status"] == "FAILED"


def test_sqs_down_after_taking_over_an_expired_lock(
    sweep_env: Callable[..., None], sweep: SweepHarness, db: Any, moto: Any
) -> None:
    seed_running(db, 3, attempts=2, locked_by=None, locked_at=1000, next_run_at=1000)
    sweep_env(AWS_ENDPOINT_URL_SQS=UNREACHABLE_SQS)

    summary = sweep.run()

    assert (summary["expired_locks"], summary["requeued"], summary["send_failures"]) == (1, 0, 1)
    # The lock is gone for good (its worker is dead) but the attempt is not counted twice,
    # and without a stamp the row is a lost message for the next run.
    row = fetch_record(db, 3)
    assert row["archive_status"] == "PENDING"
    assert row["archive_attempts"] == 2
    assert row["archive_enqueued_at"] is None
    assert seconds_ago(db, row["archive_next_run_at"]) >= 1000

    sweep_env(AWS_ENDPOINT_URL_SQS=moto.endpoint_url)
    assert sweep.run()["requeued"] == 1
    assert sweep.drain() == [3]


class DroppingQueue(Queue):
    """The real queue, except that some entries come back Failed (as throttling does)."""

    def __init__(self, drop: set[str]) -> None:
        super().__init__()
        self.drop = drop

    def send_batch(self, queue_url: str, entries: Any) -> dict[str, str]:
        kept = [entry for entry in entries if entry[0] not in self.drop]
        failed = super().send_batch(queue_url, kept)
        failed.update(
            {entry[0]: "ThrottlingException" for entry in entries if entry[0] in self.drop}
        )
        return failed


def test_partial_batch_failure_leaves_only_the_failed_rows_eligible(
    sweep: SweepHarness, db: Any
) -> None:
    for record_id in range(1, 26):
        seed_record(
            db,
            record_id,
            image_url=URL,
            next_run_at=1000,
            enqueued_at=2000 if record_id % 2 else None,
        )
    before = {i: fetch_record(db, i)["archive_enqueued_at"] for i in range(1, 26)}
    started = db_now(db)
    sweeper = build_sweeper(load_sweeper_settings())
    sweeper.queue = DroppingQueue({"4", "15", "25"})
    try:
        summary = sweeper.run(remaining_ms=lambda: 60_000)
    finally:
        sweeper.records.db.close()

    assert summary.requeued == 22
    assert summary.send_failures == 3
    assert summary.stop_reason == "done"
    assert sorted(sweep.drain()) == sorted(set(range(1, 26)) - {4, 15, 25})
    for record_id in range(1, 26):
        stamp = fetch_record(db, record_id)["archive_enqueued_at"]
        if record_id in (4, 15, 25):
            assert stamp == before[record_id]
        else:
            assert stamp >= started  # sent by this run
    warning = sweep.log_for("some messages were not sent")
    assert warning["codes"] == ["ThrottlingException"]

    # The next run sends exactly the rows that failed.
    assert sweep.run()["requeued"] == 3
    assert sorted(sweep.drain()) == [4, 15, 25]


def test_a_run_is_bounded_and_the_next_continues(
    sweep_env: Callable[..., None], sweep: SweepHarness, db: Any
) -> None:
    sweep_env(ARCHIVE_SWEEP_MAX_ROWS="25")
    for record_id in range(1, 41):
        seed_record(db, record_id, image_url=URL, next_run_at=2000 - record_id)

    first = sweep.run()
    assert (first["requeued"], first["stop_reason"], first["stopped_early"]) == (
        25,
        "max_rows",
        True,
    )
    assert sorted(sweep.drain()) == list(range(1, 26))  # the longest overdue first

    second = sweep.run()
    assert (second["requeued"], second["stop_reason"]) == (15, "done")
    assert sorted(sweep.drain()) == list(range(26, 41))


def test_live_rows_are_sent_before_backfilled_ones(
    sweep_env: Callable[..., None], sweep: SweepHarness, db: Any
) -> None:
    """Issue 21 item 6: parked and lost rows go back live first, even when the backfill's
    are due earlier (the sweeper used to send the oldest due first, history and all)."""
    sweep_env(ARCHIVE_SWEEP_MAX_ROWS="6")
    parked = {"enqueued_at": None, "archive_wait_reason": "paused"}
    for record_id in range(1, 6):  # history: lost long ago, and parked, due first
        seed_record(
            db, record_id, image_url=URL, next_run_at=5000 - record_id, archive_backfilled=True
        )
        seed_record(
            db,
            10 + record_id,
            image_url=URL,
            next_run_at=200 - record_id,
            archive_backfilled=True,
            **parked,
        )
    for record_id in (21, 22):  # live: lost, and parked, due later
        seed_record(db, record_id, image_url=URL, next_run_at=1000 + record_id)
    for record_id in (31, 32):
        seed_record(db, record_id, image_url=URL, next_run_at=100 - record_id, **parked)
    sweeper = build_sweeper(load_sweeper_settings())
    sweeper.page_size = 3
    queue = CountingQueue()
    sweeper.queue = queue
    try:
        first = sweeper.run(remaining_ms=lambda: 60_000)
        # Live rows first, oldest due first among them; then history fills the run's bound.
        assert [int(i) for i in queue.sent[:4]] == [22, 21, 31, 32]
        assert all(int(i) < 20 for i in queue.sent[4:])
        assert (first.requeued, first.stop_reason) == (6, "max_rows")
        queue.sent.clear()
        second = sweeper.run(remaining_ms=lambda: 60_000)
    finally:
        sweeper.records.db.close()
    assert second.requeued == 6
    assert sorted(int(i) for i in queue.sent) == [3, 4, 5, 11, 12, 13]


def test_small_pages(sweep: SweepHarness, db: Any) -> None:
    for record_id in range(1, 36):
        seed_record(db, record_id, image_url=URL, next_run_at=1000 + record_id)
    sweeper = build_sweeper(load_sweeper_settings())
    sweeper.page_size = 10
    try:
        summary = sweeper.run(remaining_ms=lambda: 60_000)
    finally:
        sweeper.records.db.close()
    assert (summary.pages, summary.requeued) == (4, 35)
    assert sorted(sweep.drain()) == list(range(1, 36))


def test_stops_before_the_time_runs_out(sweep: SweepHarness, db: Any) -> None:
    seed_record(db, 1, image_url=URL, next_run_at=1000)
    seed_running(db, 2, locked_by=None, locked_at=1000)
    before = all_rows(db)

    summary = sweep.run(FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=10))

    assert summary["stopped_early"] is True
    assert summary["stop_reason"] == "time"
    assert summary["pages"] == 0
    assert all_rows(db) == before
    assert sweep.drain() == []


def test_rows_held_by_another_sweeper_are_skipped(
    sweep: SweepHarness, db: Any, pg_dsn: str
) -> None:
    for record_id in (1, 2, 3):
        seed_record(db, record_id, image_url=URL, next_run_at=1000)
    other = connect(pg_dsn)
    try:
        other.run("BEGIN")
        other.run("SELECT id FROM image_generation_records WHERE id = 2 FOR UPDATE")
        # Skipped, not waited for: waiting would end in the statement timeout, sending none.
        assert sweep.run()["requeued"] == 2
        assert sorted(sweep.drain()) == [1, 3]
        other.run("ROLLBACK")
    finally:
        other.close()
    # Released without being stamped: the next run takes it.
    assert sweep.run()["requeued"] == 1
    assert sweep.drain() == [2]


def test_two_sweepers_at_once_do_not_double_send(sweep: SweepHarness, db: Any) -> None:
    # Few rows and small pages: moto's receive slows down with the queue's length.
    total = 120
    db.run("INSERT INTO users (id, username) VALUES (1, 'alice') ON CONFLICT (id) DO NOTHING")
    db.run(
        "INSERT INTO image_generation_records (id, user_id, status, image_url, archive_status,"
        " archive_next_run_at) SELECT g, 1, 'SUCCEEDED', :url, 'PENDING',"
        " now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, :n) AS g",
        url=URL,
        n=total,
    )
    sweepers = [build_sweeper(load_sweeper_settings()) for _ in range(2)]
    barrier = threading.Barrier(len(sweepers))
    summaries: list[Any] = []

    def run(sweeper: Any) -> None:
        sweeper.page_size = 5
        barrier.wait()
        summaries.append(sweeper.run(remaining_ms=lambda: 60_000))

    threads = [threading.Thread(target=run, args=(s,)) for s in sweepers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for sweeper in sweepers:
            sweeper.records.db.close()

    assert len(summaries) == 2
    assert sum(s.requeued for s in summaries) == total
    assert all(s.requeued > 0 for s in summaries)  # both really ran at the same time
    sent = sweep.drain()
    assert len(sent) == total
    assert sorted(sent) == list(range(1, total + 1))  # each row exactly once


# -- handler contract: summary, metrics, logs ---------------------------------------------


def test_handler_emits_metrics_and_logs_the_summary(
    sweep: SweepHarness, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_record(db, 1, image_url=URL, next_run_at=1000)
    seed_running(db, 2, attempts=3, locked_by=None, locked_at=1000)
    seed_record(db, 3, image_url=URL, next_run_at=700, enqueued_at=60)
    oldest_due = fetch_record(db, 1)["archive_next_run_at"]

    age_before = seconds_ago(db, oldest_due)
    summary = sweep.run()
    age_after = seconds_ago(db, oldest_due)

    # Row 1's age (due 1000 s ago) as the run saw it, however long the run took.
    oldest = summary.pop("oldest_pending_age_seconds")
    assert age_before >= 1000
    assert age_before - 1 <= oldest <= age_after + 1  # rounded
    # SQS's clock against the database's, measured from its answer's Date header (whole
    # seconds): here one machine's clock, so within a second and the call's time.
    ahead = summary.pop("clock_ahead_seconds")
    assert 0 <= ahead <= 2
    assert summary == {
        "requeued": 1,
        "expired_locks": 1,
        "failed": 1,
        "send_failures": 0,
        "dated": 0,
        "requeue_interval_seconds": 900,  # an empty queue: the plain interval
        "queue_waiting": 0,
        "lane_paused": None,
        "lane_resumed": False,
        "unparked": 0,
        "stories_expired": 0,
        "events_removed": 0,
        "staged_waiting": 0,
        "pages": 2,
        "claimed": 2,
        "stopped_early": False,
        "stop_reason": "done",
        "duration_ms": pytest.approx(summary["duration_ms"]),
    }
    emf = [
        json.loads(line)
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("{") and '"_aws"' in line
    ]
    assert len(emf) == 1
    [directive] = emf[0]["_aws"]["CloudWatchMetrics"]
    units = {metric["Name"]: metric["Unit"] for metric in directive["Metrics"]}
    assert units == {
        "Requeued": "Count",
        "SweepFailed": "Count",
        "OldestPendingAgeSeconds": "Seconds",
        "LanePausedAccount": "Count",
        "StagedOldestAgeSeconds": "Seconds",
        "StagedWaiting": "Count",
        "StagedFailedKeepingCopy": "Count",
    }
    assert emf[0]["LanePausedAccount"] == [0.0]
    assert directive["Namespace"] == "ImageArchive"
    assert emf[0]["Requeued"] == [1.0]
    assert emf[0]["SweepFailed"] == [1.0]
    assert emf[0]["OldestPendingAgeSeconds"] == [oldest]
    finished = sweep.log_for("sweep finished")
    assert finished["requeued"] == 1
    assert finished["function_name"] == "SweeperFunction"  # Lambda context injected


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_missing_queue_url_fails_loudly(
    sweep_env: Callable[..., None], sweep: SweepHarness
) -> None:
    from lib.platform.errors import ConfigError

    sweep_env(ARCHIVE_QUEUE_URL=None)
    with pytest.raises(ConfigError, match="ARCHIVE_QUEUE_URL"):
        sweep.run()


def test_sweeper_function_with_its_event_file_and_env_json(
    monkeypatch: pytest.MonkeyPatch, db: Any, pg_dsn: str, lsky: Any, moto: Any, sqs: Any
) -> None:
    """As `sam local invoke SweeperFunction -e events/sweeper_schedule.json --env-vars env.json`."""
    from handlers.sweeper import lambda_handler
    from tests.integration.test_sam_events import load_json, local_env

    env = local_env(
        "SweeperFunction", pg_dsn=pg_dsn, lsky_url=lsky.base_url, sqs_url=moto.endpoint_url
    )
    queue_url = sqs.create_queue(QueueName=env["ARCHIVE_QUEUE_URL"].rsplit("/", 1)[1])["QueueUrl"]
    assert queue_url == env["ARCHIVE_QUEUE_URL"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runtime.reset()
    seed_record(db, 1, image_url=URL, next_run_at=1000)
    try:
        summary = lambda_handler(
            load_json("events/sweeper_schedule.json"),
            FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60),
        )
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    finally:
        runtime.reset()
    # The queue's name is fixed (shared with test_sam_events), and moto allows one
    # PurgeQueue a minute: clean up by deleting what was received.
    for message in messages:
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])

    assert summary["requeued"] == 1
    assert [m["Body"] for m in messages] == [encode(1)]


# -- point 3: indexes on a big table --------------------------------------------------------

BIG_DATABASE = "archive_sweeper_explain"
BIG_ROWS = 1_000_000
PARKED_INDEX = "image_generation_records_archive_parked_idx"
BACKFILLED_INDEX = "image_generation_records_archive_backfilled_idx"
PENDING_INDEX = "image_generation_records_archive_pending_idx"
RUNNING_INDEX = "image_generation_records_archive_running_idx"
VANISHED = settled(counted=True, paced=False, vanished=True)  # the recovery settles the ledger
UPLOADS_RECORD_INDEX = "image_archive_uploads_record_idx"
PRIMARY_KEY = "image_generation_records_pkey"
EVENTS_INDEX = "image_archive_events_record_idx"

# 1,000 stale rows: 1-400 lost messages, 401-800 expired locks, 801-1000 expired on their
# last attempt. Everything else must not be read: 2,000 in backoff, 500 due within the
# grace period, 100 under a live lock, and 996,400 archived, failed or never queued.
BIG_TABLE_SQL = """
INSERT INTO image_generation_records (
    id, user_id, status, image_url, archive_status, archive_attempts, archive_next_run_at,
    archive_locked_by, archive_locked_at, archive_enqueued_at, hosted_image_url)
SELECT g, 1, 'SUCCEEDED', 'https://upstream.invalid/' || g || '.png',
    CASE WHEN g <= 400 THEN 'PENDING' WHEN g <= 1000 THEN 'RUNNING'
         WHEN g <= 3500 THEN 'PENDING' WHEN g <= 3600 THEN 'RUNNING'
         WHEN g <= 990000 THEN 'SUCCEEDED' WHEN g <= 995000 THEN 'FAILED' END,
    CASE WHEN g BETWEEN 801 AND 1000 THEN 3 WHEN g <= 3600 THEN 1 ELSE 0 END,
    CASE WHEN g <= 1000 THEN now() - interval '1 hour' - g * interval '1 ms'
         WHEN g <= 3000 THEN now() + interval '10 minutes' + g * interval '1 ms'
         WHEN g <= 3500 THEN now() - interval '60 seconds' + g * interval '1 ms' END,
    CASE WHEN g BETWEEN 401 AND 1000 OR g BETWEEN 3501 AND 3600 THEN 'worker' END,
    CASE WHEN g BETWEEN 401 AND 1000 THEN now() - interval '1 hour' - g * interval '1 ms'
         WHEN g BETWEEN 3501 AND 3600 THEN now() - g * interval '1 ms' END,
    CASE WHEN g <= 3600 THEN now() - interval '2 hours' END,
    CASE WHEN g BETWEEN 3601 AND 990000 THEN 'https://img.invalid/' || g || '.png' END
FROM generate_series(1, :rows) AS g
"""


class CountingQueue(Queue):
    """A queue that counts what is sent to it and holds nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def send_batch(self, queue_url: str, entries: Any) -> dict[str, str]:
        self.sent += [entry_id for entry_id, _ in entries]
        return {}

    def counts(self, queue_url: str) -> QueueCounts:
        return QueueCounts(visible=0, in_flight=0, delayed=0)


def table_stats(conn: Any) -> dict[str, int]:
    [[seq_scan, idx_tup_fetch, n_tup_ins, n_tup_upd]] = conn.run(
        "SELECT seq_scan, idx_tup_fetch, n_tup_ins, n_tup_upd FROM pg_stat_user_tables"
        " WHERE relname = 'image_generation_records'"
    )
    return {
        "seq_scan": seq_scan,
        "idx_tup_fetch": idx_tup_fetch or 0,
        "n_tup_ins": n_tup_ins,
        "n_tup_upd": n_tup_upd,
    }


@pytest.fixture
def big_table(pg_dsn: str) -> Iterator[str]:
    """A separate database with the schema and 1,000,000 records; its DSN."""
    admin = connect(urlunsplit(urlsplit(pg_dsn)._replace(path="/postgres")))
    admin.run(f'DROP DATABASE IF EXISTS "{BIG_DATABASE}" WITH (FORCE)')
    admin.run(f'CREATE DATABASE "{BIG_DATABASE}"')
    dsn = urlunsplit(urlsplit(pg_dsn)._replace(path=f"/{BIG_DATABASE}"))
    try:
        apply_schema(dsn)
        conn = connect(dsn)
        try:
            conn.run("INSERT INTO users (id, username) VALUES (1, 'alice')")
            # Skip the per-row foreign key check (3x faster); needs a superuser, as the
            # throwaway cluster's is. Without one the load is just slower.
            with contextlib.suppress(Exception):
                conn.run("SET session_replication_role = replica")
            conn.run(BIG_TABLE_SQL, rows=BIG_ROWS)
            conn.run("RESET session_replication_role")
            conn.run("ANALYZE image_generation_records")
        finally:
            conn.close()
        yield dsn
    finally:
        admin.run(f'DROP DATABASE IF EXISTS "{BIG_DATABASE}" WITH (FORCE)')
        admin.close()


@pytest.mark.slow
def test_a_run_reads_only_the_stale_rows_of_a_big_table(big_table: str) -> None:
    conn = connect(big_table)
    try:
        assert conn.run("SELECT count(*) FROM image_generation_records") == [[BIG_ROWS]]
        limit = 5000  # the per-run bound: a page could be that large
        # With completion events on: a failed row's event goes into the outbox as well.
        events = {"publish": True, "event_id": None}
        claims = {
            "expired locks": (
                QUERIES["recover_expired_locks"],
                RUNNING_INDEX,
                600,
                {"lock_ttl": 180, **VANISHED, **events},
            ),
            "lockless": (QUERIES["recover_lockless"], RUNNING_INDEX, 0, {**VANISHED, **events}),
            "lost messages": (
                QUERIES["take_lost"],
                PENDING_INDEX,
                400,
                {
                    "grace": 300,
                    "lost_before": datetime.now(UTC) - timedelta(seconds=900),
                    "after": "-infinity",
                    **events,
                },
            ),
            "undated": (QUERIES["date_undated"], PENDING_INDEX, 0, {}),
        }
        for name, (statement, index, stale, params) in claims.items():
            bound = {"limit": limit, **params}
            if "max_attempts" in statement:
                bound["max_attempts"] = 3
            nodes = explain(conn, statement, analyze=True, **bound)
            # The events table is empty here (a scan of nothing is the planner's cheapest):
            # bench/history.py checks the story's reads among 10,000,000 events. The ledger
            # is small by design: a scan of it is the planner's choice too.
            scans = [n for n in nodes if n.node_type == "Seq Scan"]
            small = ("image_archive_events", "image_archive_uploads")
            assert not [n for n in scans if n.relation not in small], (name, nodes)
            # A range scan of the partial index (plain or bitmap, as the planner likes)...
            [scan] = [n for n in nodes if n.index == index]
            assert scan.node_type in ("Index Scan", "Bitmap Index Scan", "Index Only Scan")
            assert scan.index_cond, f"{name}: a scan of the whole index, not a range"
            # ...that reads only the stale rows: nothing read and then filtered out.
            assert scan.actual_rows == stale, (name, scan)
            # (A CTE's rows filtered in memory read nothing: the failed rows' events.)
            read = [n for n in nodes if n.node_type != "CTE Scan"]
            assert not any(n.removed_by_filter for n in read), (name, nodes)
            # The UPDATE finds the picked rows by primary key; lost messages also read the
            # parked rows' own index and the backfilled rows' (ranges of nothing here); the
            # story looks a picked record's events up by its own index, and a recovery
            # settles each row's slots in the ledger by its record index.
            also = {PARKED_INDEX} if name == "lost messages" else set()
            if name in ("expired locks", "lockless"):
                also = {UPLOADS_RECORD_INDEX}
            known = {index, PRIMARY_KEY, EVENTS_INDEX, *also}
            assert {n.index for n in nodes if n.index} <= known, nodes
        # A backfill's lost and parked rows: ranges of their own index (nothing here).
        nodes = explain(
            conn,
            QUERIES["take_lost_backfilled"],
            analyze=True,
            **{"limit": limit, **claims["lost messages"][3]},
        )
        assert {n.index for n in nodes if n.index} <= {BACKFILLED_INDEX, PRIMARY_KEY, EVENTS_INDEX}
        scans = [n for n in nodes if n.index == BACKFILLED_INDEX]
        assert scans, nodes
        assert all(n.index_cond and n.actual_rows == 0 for n in scans), nodes

        [[stamp]] = conn.run("SELECT now()")
        restore = QUERIES["restore_stamps"]
        nodes = explain(conn, restore, ids=[1, 2], previous=[None, stamp], stamp=stamp)
        assert not [n for n in nodes if n.node_type == "Seq Scan"]
        assert PRIMARY_KEY in {n.index for n in nodes}
        nodes = explain(conn, QUERIES["oldest_pending_age"])
        assert not [n for n in nodes if n.node_type == "Seq Scan"]
        assert PENDING_INDEX in {n.index for n in nodes}

        # A whole run on the table: it updates the 1,000 stale rows and reads little else.
        # Statistics are flushed lazily: first make this session's own (the EXPLAINs
        # above) and the loader's visible, so that the baseline is complete.
        conn.run("SELECT pg_stat_force_next_flush()")
        wait_until(
            lambda: table_stats(conn)["n_tup_ins"] >= BIG_ROWS,
            "the loader's statistics were flushed",
            interval=0.05,
        )
        before = table_stats(conn)
        sweeper = build_sweeper(
            load_sweeper_settings(
                {"DATABASE_URL": big_table, "ARCHIVE_QUEUE_URL": "https://sqs.invalid/1/q"}
            )
        )
        queue = CountingQueue()
        sweeper.queue = queue
        try:
            summary = sweeper.run(remaining_ms=lambda: 600_000)
        finally:
            sweeper.records.db.close()  # its statistics are flushed when the session ends
        assert (summary.requeued, summary.failed, summary.expired_locks) == (800, 200, 600)
        assert sorted(map(int, queue.sent)) == list(range(1, 801))
        assert summary.pages == 10  # 600 expired locks and 400 lost messages, 100 a page

        wait_until(
            lambda: table_stats(conn)["n_tup_upd"] - before["n_tup_upd"] >= 1000,
            "the run's statistics were flushed",
            interval=0.1,
        )
        after = table_stats(conn)
        assert after["seq_scan"] == before["seq_scan"]
        assert after["n_tup_upd"] - before["n_tup_upd"] == 1000
        # Each stale row is read twice (partial index, then primary key for the UPDATE).
        assert after["idx_tup_fetch"] - before["idx_tup_fetch"] <= 2 * 1000 + 100, (before, after)
    finally:
        conn.close()


# -- a long backlog: queued rows are not lost rows ---------------------------------------


def test_rows_waiting_in_a_draining_backlog_are_not_re_sent(sweep: SweepHarness, db: Any) -> None:
    """30 rows sent 20 minutes ago wait behind each other while the lane drains slowly:
    through several grace periods, the sweeper re-sends none of them (their messages wait
    in the queue, which nothing has been received from), but still sends a row whose
    message never went out."""
    for record_id in range(1, 31):
        seed_record(db, record_id, image_url=URL, next_run_at=1200, enqueued_at=1200)
        sweep.sqs.send_message(QueueUrl=sweep.queues.url, MessageBody=encode(record_id))
    seed_record(db, 99, image_url=URL, next_run_at=1200, enqueued_at=None)  # never sent
    # The lane uploaded 3 images in the last 15 minutes: 30 queued need ~75 minutes.
    set_uploads(db, 3, within_seconds=540, ago=60)

    for _ in range(3):  # three sweeps: several grace periods of a real deployment
        summary = sweep.run()
        assert summary["requeue_interval_seconds"] > 1200

    assert sweep.drain().count(99) == 1
    rows = all_rows(db)
    assert all(seconds_ago(db, rows[i]["archive_enqueued_at"]) >= 1200 for i in range(1, 31))

    # With the old rule (the plain interval), the same rows would all have been re-sent.
    set_uploads(db, 0)
    db.run("DELETE FROM image_generation_records WHERE id = 99")
    assert sweep.run()["requeued"] == 30  # the queue is empty now: nothing is waiting


def test_the_last_rows_of_a_drained_backlog_are_not_sent_twice(
    sweep_env: Callable[..., None],
    sweep: SweepHarness,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
) -> None:
    """A plain backlog of 300, drained fast: at its end the queue ahead of the last two rows
    is short (two messages) while those rows were sent as long ago as the rest. The old rule
    (the depth now over the drain rate) re-sent both, and each was received twice. The
    queue has not moved past their send (nothing sent after them was received), and two
    messages wait: they are on their way."""
    sweep_env(ARCHIVE_REQUEUE_INTERVAL_SECONDS="2", ARCHIVE_SWEEP_GRACE_SECONDS="1")
    for record_id in range(1, 301):
        upstream.add(f"/gen/{record_id}.png", PNG)
    seed_record(db, 1, image_url=upstream.url("/gen/1.png"), next_run_at=0, enqueued_at=0)
    # The producer's first step for the other 299: PENDING, due and stamped now.
    db.run(
        "INSERT INTO image_generation_records (id, user_id, status, image_url, archive_status,"
        " archive_next_run_at, archive_enqueued_at)"
        " SELECT g, 1, 'SUCCEEDED', :base || '/gen/' || g || '.png', 'PENDING', now(), now()"
        " FROM generate_series(2, 300) AS g",
        base=upstream.base_url,
    )
    for first in range(1, 301, 10):
        sweep.sqs.send_message_batch(
            QueueUrl=sweep.queues.url,
            Entries=[{"Id": str(i), "MessageBody": encode(i)} for i in range(first, first + 10)],
        )
    stamps = {i: row["archive_enqueued_at"] for i, row in all_rows(db).items()}

    drained: list[int] = []
    while len(drained) < 298:
        event = archive.receive(max_messages=min(10, 298 - len(drained)))
        assert archive.invoke(event) == {"batchItemFailures": []}
        archive.settle(event, {"batchItemFailures": []})
        drained += [parse_record_id(record["body"]) for record in event["Records"]]
    last_two = sorted(set(range(1, 301)) - set(drained))
    assert len(last_two) == 2
    # The lane drained fast: the ledger's last 15 minutes say 3,000 uploads.
    set_uploads(db, 3000, within_seconds=600)
    # Both rows were sent longer ago than the interval and the grace period.
    wait_until(lambda: (db_now(db) - stamps[300]).total_seconds() > 4, "the interval passed")

    summary = sweep.run()

    assert summary["requeued"] == 0
    assert summary["queue_waiting"] == 2
    for record_id in last_two:
        row = fetch_record(db, record_id)
        assert (row["archive_status"], row["archive_enqueued_at"]) == ("PENDING", stamps[record_id])
    # Each of the two is received once, on its first receive, and archived; nothing is left.
    event = archive.receive(max_messages=10)
    records = event["Records"]
    assert sorted(parse_record_id(record["body"]) for record in records) == last_two
    assert {record["attributes"]["ApproximateReceiveCount"] for record in records} == {"1"}
    assert archive.invoke(event) == {"batchItemFailures": []}
    archive.settle(event, {"batchItemFailures": []})
    assert sweep.drain() == []
    assert all(row["archive_status"] == "SUCCEEDED" for row in all_rows(db).values())


def test_a_lost_message_on_a_quiet_lane_is_sent_again_whatever_is_held(
    sweep_env: Callable[..., None],
    sweep: SweepHarness,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
) -> None:
    """A quiet lane (no upload for an hour) with one record in backoff, its message held
    for an hour. A record whose SendMessage failed (stamped, no message) waited a day
    under the old rule (a depth of one that did not drain: the interval plus a day), long
    after its provider's URL expired. Nothing waits to be received: what is in flight is
    held on purpose, and the held row says until when. It is sent again now."""
    sweep_env(ARCHIVE_RETRY_DELAYS="3600")
    seed_record(
        db, 1, image_url=upstream.add("/gen/1.png", status=503), next_run_at=0, enqueued_at=0
    )
    assert len(archive.deliver(encode(1))["batchItemFailures"]) == 1  # retried after an hour
    held = fetch_record(db, 1)
    assert (held["archive_status"], held["archive_wait_reason"]) == ("PENDING", "backoff")
    assert archive.holds() == [3600]
    # The producer stamped row 2 and its SendMessage failed, 1,000 s ago.
    seed_record(db, 2, image_url=URL, next_run_at=1000, enqueued_at=1000)

    summary = sweep.run()

    assert summary["requeued"] == 1
    assert summary["queue_waiting"] == 0
    assert summary["requeue_interval_seconds"] == 900
    assert sweep.drain() == [2]
    assert archive.in_flight() == 1  # row 1's message, still held
    assert fetch_record(db, 1)["archive_enqueued_at"] == held["archive_enqueued_at"]
