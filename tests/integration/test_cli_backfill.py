"""`archive-ctl backfill` against PostgreSQL and moto's SQS, on a fake clock: what it
takes, dry runs, interruptions and re-runs, pacing on the lane, its progress output."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devkit.sqs import QueuePair
from lib.archive.message import encode
from lib.cli import main as cli
from lib.cli.context import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL, Context
from lib.platform.sqs import Queue
from tests.integration.test_cli import REPO_ROOT, URL, drain, record_ids
from tests.support import fetch_record, queue_attrs, seconds_ago, seed_record, set_uploads

DAY = 86400


@dataclass
class FakeTime:
    """The run's clock and sleep: sleeping advances the clock, and may act (drain the
    queue, open the lane) the way the rest of the system would meanwhile."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)
    on_sleep: Callable[[], None] | None = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        assert len(self.sleeps) < 50, "the backfill keeps waiting"
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


@dataclass
class Ctl:
    capsys: pytest.CaptureFixture[str]
    time: FakeTime = field(default_factory=FakeTime)
    code: int = 0
    out: str = ""
    err: str = ""

    def __call__(self, *argv: str) -> int:
        self.capsys.readouterr()
        self.code = cli.main(
            list(argv),
            make_context=lambda args: Context(args, sleep=self.time.sleep, clock=self.time.clock),
        )
        self.out, self.err = self.capsys.readouterr()
        return self.code


@pytest.fixture
def ctl(cli_env: None, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


def seed_never_queued(db: Any, ids: range | list[int], **columns: Any) -> None:
    for record_id in ids:
        # Older ids started earlier: the backfill's order is the ids' order.
        columns.setdefault("started_at", None)
        started = columns["started_at"] or 3600 + (10_000 - record_id)
        seed_record(
            db,
            record_id,
            image_url=URL,
            archive_status=None,
            **{**columns, "started_at": started},
        )


def states(db: Any) -> dict[int, str | None]:
    return dict(db.run("SELECT id, archive_status FROM image_generation_records ORDER BY id"))


def queued(db: Any) -> list[int]:
    return [i for i, state in states(db).items() if state is not None]


def pause_lane(db: Any, *, seconds: float | None, reason: str, detail: str | None = None) -> None:
    """Pause the lane for `seconds` (None: until cleared), as the worker would."""
    db.run(
        "UPDATE image_archive_lane SET paused_until = CASE"
        "  WHEN CAST(:seconds AS double precision) IS NULL THEN 'infinity'"
        "  ELSE now() + make_interval(secs => CAST(:seconds AS double precision)) END,"
        " pause_reason = :reason, pause_detail = :detail,"
        " paused_since = now() - interval '1 hour', version = version + 1",
        seconds=seconds,
        reason=reason,
        detail=detail,
    )


def take_all(sqs: Any, queues: QueuePair) -> list[int]:
    """What the archive function would do with the queue: receive and delete every message."""
    messages = drain(sqs, queues.url)
    for message in messages:
        sqs.delete_message(QueueUrl=queues.url, ReceiptHandle=message["ReceiptHandle"])
    return record_ids(messages)


# -- what it takes --------------------------------------------------------------------------


def test_backfill_queues_exactly_the_never_queued_succeeded_generations(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, [1, 2, 3])
    seed_record(db, 4, image_url=URL, archive_status="PENDING", next_run_at=10)
    seed_record(db, 5, image_url=URL, archive_status="FAILED", attempts=3)
    seed_record(db, 6, image_url=URL, archive_status="SUCCEEDED")
    seed_record(db, 7, image_url=URL, archive_status="RUNNING", locked_by="x", locked_at=5)
    seed_record(db, 8, image_url=URL, archive_status=None, status="FAILED")
    seed_record(db, 9, image_url=URL, archive_status=None, status="RUNNING")
    before = {i: fetch_record(db, i) for i in range(4, 10)}

    assert ctl("backfill") == EXIT_OK, ctl.err
    assert record_ids(drain(sqs, queues.url)) == [1, 2, 3]
    for record_id in (1, 2, 3):
        row = fetch_record(db, record_id)
        assert row["archive_status"] == "PENDING"
        assert row["archive_next_run_at"] == row["archive_enqueued_at"] is not None
        assert row["archive_attempts"] == 0
    assert {i: fetch_record(db, i) for i in range(4, 10)} == before
    assert "3 queued" in ctl.out
    assert "no never-queued SUCCEEDED generations left" in ctl.out

    assert ctl("backfill") == EXIT_OK  # again: nothing left
    assert "0 queued" in ctl.out
    assert drain(sqs, queues.url) == []


def test_backfill_takes_the_started_at_range_and_the_user(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, [1], started_at=10 * DAY)
    seed_never_queued(db, [2], started_at=5 * DAY)
    seed_never_queued(db, [3], started_at=2 * DAY)
    seed_never_queued(db, [4], started_at=2 * DAY, user_id=2, username="bob")
    seed_never_queued(db, [5], started_at=3600)

    assert ctl("backfill", "--since", "7d", "--until", "1d") == EXIT_OK, ctl.err
    assert record_ids(drain(sqs, queues.url)) == [2, 3, 4]

    assert ctl("backfill", "--user", "2") == EXIT_OK  # 4 is queued already
    assert drain(sqs, queues.url) == []
    seed_never_queued(db, [6, 7], started_at=DAY, user_id=2)
    assert ctl("backfill", "--user", "2") == EXIT_OK
    assert record_ids(drain(sqs, queues.url)) == [6, 7]
    assert queued(db) == [2, 3, 4, 6, 7]

    # ISO bounds: [since, until)
    since = (datetime.now(UTC) - timedelta(days=11)).isoformat()
    until = fetch_record(db, 5)["started_at"].isoformat()
    assert ctl("backfill", "--since", since, "--until", until) == EXIT_OK
    assert record_ids(drain(sqs, queues.url)) == [1]

    assert ctl("backfill", "--since", "1d", "--until", "2d") == EXIT_ERROR
    assert "is not before --until" in ctl.err


def test_backfill_limit_takes_the_oldest_generations_first(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 8))
    taken: list[int] = []
    ctl.time.on_sleep = lambda: taken.extend(take_all(sqs, queues))  # pages of 2: paced
    assert ctl("backfill", "--limit", "3", "--page-size", "2") == EXIT_OK, ctl.err
    assert taken + take_all(sqs, queues) == [1, 2, 3]
    assert "--limit 3 reached" in ctl.out


def test_dry_run_counts_lists_and_changes_nothing(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 16))
    seed_record(db, 99, image_url=URL, archive_status="FAILED")

    assert ctl("backfill", "--dry-run", "--limit", "12") == EXIT_OK, ctl.err
    lines = ctl.out.splitlines()
    assert lines[0].startswith("15 SUCCEEDED generations never queued started before 20")
    assert lines[0].endswith("; --limit 12")
    assert lines[1] == "would queue 12, 100 a page, oldest generation first"
    assert [int(line.split()[0]) for line in lines[2:12]] == list(range(1, 11))
    assert lines[12] == "  ... and 2 more"
    assert lines[-1] == "dry run: nothing changed"
    assert queued(db) == [99]
    assert queue_attrs(sqs, queues.url).visible == 0


# -- interruptions and re-runs ----------------------------------------------------------------


def failing_sender(
    monkeypatch: pytest.MonkeyPatch, *, after_calls: int, action: Callable[[], None]
) -> list[int]:
    """Queue.send_batch that does `action` on its call number `after_calls` + 1 (the
    calls before go through); returns the list of call numbers made."""
    calls: list[int] = []
    real = Queue.send_batch

    def send_batch(self: Queue, queue_url: str, entries: Any) -> dict[str, str]:
        calls.append(len(calls) + 1)
        if len(calls) == after_calls + 1:
            action()
        return real(self, queue_url, entries)

    monkeypatch.setattr(Queue, "send_batch", send_batch)
    return calls


def raise_interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("page_size", "sent_first"),
    [
        (10, 10),  # between pages: page 1 went out, page 2 is cut off before its first batch
        (20, 10),  # inside a page: its first batch went out, its second is cut off
    ],
)
def test_an_interrupted_page_is_settled_and_a_rerun_sends_every_row_once(
    ctl: Ctl,
    db: Any,
    sqs: Any,
    queues: QueuePair,
    monkeypatch: pytest.MonkeyPatch,
    page_size: int,
    sent_first: int,
) -> None:
    seed_never_queued(db, range(1, 26))
    set_uploads(db, 900)  # a busy lane: 60 a minute, room for every page at once
    with monkeypatch.context() as patch:
        failing_sender(patch, after_calls=1, action=raise_interrupt)
        assert ctl("backfill", "--page-size", str(page_size)) == EXIT_INTERRUPTED
    first = record_ids(drain(sqs, queues.url))
    assert first == list(range(1, sent_first + 1))
    # Sent rows stay PENDING; the rest of the cut page is never-queued again.
    assert queued(db) == first
    assert "10 rows of the page being sent were put back" in ctl.out
    assert ctl.err.endswith("archive-ctl: interrupted\n")

    assert ctl("backfill", "--page-size", str(page_size)) == EXIT_OK, ctl.err
    second = record_ids(drain(sqs, queues.url))
    assert second == list(range(sent_first + 1, 26))  # every remaining row, none twice
    assert queued(db) == list(range(1, 26))


def test_ctrl_c_during_a_page_finishes_it_then_stops(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_never_queued(db, range(1, 31))
    set_uploads(db, 900)
    handler = signal.getsignal(signal.SIGINT)
    # A real SIGINT while page 1 (two batches) is being sent.
    failing_sender(monkeypatch, after_calls=0, action=lambda: os.kill(os.getpid(), signal.SIGINT))

    assert ctl("backfill", "--page-size", "20") == EXIT_INTERRUPTED
    assert record_ids(drain(sqs, queues.url)) == list(range(1, 21))  # the whole page
    assert queued(db) == list(range(1, 21))
    assert "finishing the page being sent, then stopping" in ctl.err
    assert "20 queued" in ctl.out
    assert signal.getsignal(signal.SIGINT) is handler  # put back


def test_a_limited_run_in_two_steps_never_queues_a_row_twice(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 10))
    assert ctl("backfill", "--limit", "4") == EXIT_OK
    assert ctl("backfill", "--limit", "4") == EXIT_OK
    assert ctl("backfill") == EXIT_OK
    assert record_ids(drain(sqs, queues.url)) == list(range(1, 10))  # each exactly once


def test_a_send_that_fails_leaves_the_page_pending_for_the_sweeper_and_stops(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_never_queued(db, range(1, 21))
    set_uploads(db, 900)

    def refuse() -> None:
        raise RuntimeError("SQS is down")

    failing_sender(monkeypatch, after_calls=1, action=refuse)
    assert ctl("backfill", "--page-size", "10") == EXIT_PARTIAL
    assert record_ids(drain(sqs, queues.url)) == list(range(1, 11))
    assert "NOT SENT  11: RuntimeError: SQS is down" in ctl.out
    assert queued(db) == list(range(1, 21))  # page 2 is PENDING, unstamped: the sweeper's
    assert fetch_record(db, 11)["archive_enqueued_at"] is None


# -- pacing -----------------------------------------------------------------------------------


def fill_queue(sqs: Any, queues: QueuePair, count: int) -> None:
    for n in range(count):
        sqs.send_message(QueueUrl=queues.url, MessageBody=encode(100_000 + n))


def test_it_waits_while_the_queue_is_deeper_than_allowed(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 13))
    fill_queue(sqs, queues, 5)  # the idle lane allows one page (5): already full
    taken: list[int] = []

    def lane_drains() -> None:
        taken.extend(take_all(sqs, queues))

    ctl.time.on_sleep = lane_drains

    assert ctl("backfill", "--page-size", "5", "--max-queue-minutes", "1") == EXIT_OK, ctl.err
    taken += take_all(sqs, queues)
    assert sorted(t for t in taken if t < 100_000) == list(range(1, 13))
    # Full at the start, then after each page of 5 (the last page of 2 ends the run).
    assert ctl.time.sleeps == [60.0, 60.0, 60.0]
    assert ctl.err.count("waiting for the queue to drain: 5 queued, at most 5") == 3
    assert "\r" not in ctl.err  # not a terminal: plain lines
    assert "backfill: 5/12 sent (42%)" in ctl.err
    assert "backfill: 12/12 sent (100%)" in ctl.err


def test_the_allowed_depth_follows_the_lane_drain_rate(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 4))
    set_uploads(db, 150)  # 10 a minute: 1 minute's worth is 10 messages
    fill_queue(sqs, queues, 8)  # room for 2, a page is 5: wait until 3 more drained

    def lane_takes_three() -> None:
        for message in sqs.receive_message(QueueUrl=queues.url, MaxNumberOfMessages=3)["Messages"]:
            sqs.delete_message(QueueUrl=queues.url, ReceiptHandle=message["ReceiptHandle"])

    ctl.time.on_sleep = lane_takes_three
    assert ctl("backfill", "--page-size", "5", "--max-queue-minutes", "1") == EXIT_OK, ctl.err
    assert ctl.time.sleeps == [18.0]  # 3 messages at 10 a minute
    assert "8 queued, at most 10 (10.0/min for 1 min)" in ctl.err
    assert queued(db) == [1, 2, 3]


# -- the lane's pause -------------------------------------------------------------------------


def test_an_account_pause_refuses_to_start_without_force(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 4))
    pause_lane(db, seconds=None, reason="account", detail="HTTP 401: Authentication failed.")

    assert ctl("backfill") == EXIT_ERROR
    assert ctl.err.startswith(
        "archive-ctl: error: the upload lane is paused until cleared: reason account"
    )
    assert "HTTP 401" in ctl.err
    assert "`archive-ctl lane clear`" in ctl.err
    assert "--force" in ctl.err
    assert queued(db) == []

    assert ctl("backfill", "--dry-run") == EXIT_OK  # a dry run says so and goes on
    assert "the upload lane is paused until cleared: reason account" in ctl.out


def test_with_force_it_waits_while_the_lane_is_paused(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 4))
    pause_lane(db, seconds=None, reason="account")
    sleeps_before_clear = 2

    def operator_clears() -> None:
        if len(ctl.time.sleeps) == sleeps_before_clear:
            db.run("UPDATE image_archive_lane SET paused_until = NULL, pause_reason = NULL")

    ctl.time.on_sleep = operator_clears
    assert ctl("backfill", "--force") == EXIT_OK, ctl.err
    assert ctl.time.sleeps == [60.0, 60.0]
    assert "waiting: the upload lane is paused until cleared: reason account" in ctl.err
    assert record_ids(drain(sqs, queues.url)) == [1, 2, 3]


def test_a_short_pause_is_waited_out_and_pacing_pauses_are_not(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 4))
    pause_lane(db, seconds=20, reason="retry_after")
    [[until]] = db.run("SELECT paused_until FROM image_archive_lane")
    left_before = -seconds_ago(db, until)

    def time_passes() -> None:
        db.run(
            "UPDATE image_archive_lane SET paused_until = now() + interval '3 seconds',"
            " pause_reason = 'pacing'"
        )

    ctl.time.on_sleep = time_passes
    assert ctl("backfill") == EXIT_OK, ctl.err
    left_after = -seconds_ago(db, until)
    # One wait: what was left of the 20 s pause when the backfill looked.
    [slept] = ctl.time.sleeps
    assert left_after - 0.5 <= slept <= left_before + 0.5
    assert "reason retry_after" in ctl.err
    assert record_ids(drain(sqs, queues.url)) == [1, 2, 3]


# -- output on a terminal ---------------------------------------------------------------------


def test_on_a_terminal_progress_is_one_line_with_rate_and_eta(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_never_queued(db, range(1, 7))
    set_uploads(db, 900)  # no pacing wait: the child runs on the real clock
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [str(REPO_ROOT / "scripts" / "archive-ctl"), "backfill", "--page-size", "2"],
            stdout=subprocess.PIPE,
            stderr=follower,
            env={**os.environ, "PYTHON": sys.executable},
        )
        os.close(follower)
        stdout, _ = process.communicate(timeout=60)
        terminal = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child side is closed and drained
                break
            if not chunk:
                break
            terminal += chunk
    finally:
        os.close(leader)
    assert process.returncode == EXIT_OK, terminal
    text = terminal.decode().replace("\r\n", "\n")  # the terminal's own line ends
    redraws = text.split("\r")[1:]
    assert len(redraws) == 3  # one per page, on the same line
    assert redraws[0].startswith("[########................] 2/6 sent (33%)  ")
    assert "/min  ETA " in redraws[0]
    assert redraws[-1].startswith("[########################] 6/6 sent (100%)")
    assert "ETA 0 s" in redraws[-1]
    assert "\n" not in text.rstrip("\r\n")  # no line of its own before the end
    assert b"6 queued" in stdout
    assert record_ids(drain(sqs, queues.url)) == [1, 2, 3, 4, 5, 6]
