"""`archive-ctl backfill` against PostgreSQL and moto's SQS, on a fake clock with the rest of
the system modelled (tests.integration.lane_model): what it takes, dry runs, interruptions
and re-runs, rows another transaction held, live records first, its progress line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devkit.postgres import connect
from devkit.sqs import QueuePair
from lib.archive import enqueue
from lib.cli import main as cli
from lib.cli.context import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL, Context
from lib.platform.sqs import Queue
from tests.integration.lane_model import LaneModel, bulk_never_queued
from tests.integration.test_cli import REPO_ROOT, URL, drain, record_ids
from tests.support import fetch_record, queue_attrs, seed_record, set_uploads

DAY = 86400


@dataclass
class FakeTime:
    """The run's clock and sleep: sleeping advances the clock, and lets the rest of the
    system (`lane`, then `on_sleep`) do what it would meanwhile."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)
    lane: LaneModel | None = None
    on_sleep: Callable[[], None] | None = None
    max_sleeps: int = 100

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        assert len(self.sleeps) <= self.max_sleeps, "the backfill keeps waiting"
        self.now += seconds
        if self.lane is not None:
            self.lane.advance(seconds)
        if self.on_sleep is not None:
            self.on_sleep()


@dataclass
class Ctl:
    capsys: pytest.CaptureFixture[str]
    lane: LaneModel
    time: FakeTime = field(default_factory=FakeTime)
    code: int = 0
    out: str = ""
    err: str = ""

    def __post_init__(self) -> None:
        self.time.lane = self.lane

    def __call__(self, *argv: str) -> int:
        self.capsys.readouterr()
        self.code = cli.main(
            list(argv),
            make_context=lambda args: Context(args, sleep=self.time.sleep, clock=self.time.clock),
        )
        self.out, self.err = self.capsys.readouterr()
        self.lane.work(1.0)  # what the run sent last reaches the archive function too
        return self.code


@pytest.fixture
def ctl(
    cli_env: None, capsys: pytest.CaptureFixture[str], db: Any, sqs: Any, queues: QueuePair
) -> Ctl:
    """archive-ctl on a fake clock; meanwhile the archive function uploads every message."""
    return Ctl(capsys, LaneModel(db, sqs, queues))


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
    marked: dict[int, dict[str, Any]] = {}
    real_upload = ctl.lane._upload

    def upload(record_id: int, *, taken: bool) -> None:
        marked[record_id] = fetch_record(db, record_id)
        real_upload(record_id, taken=taken)

    ctl.lane._upload = upload  # type: ignore[method-assign]
    before = {i: fetch_record(db, i) for i in range(5, 10)}

    assert ctl("backfill") == EXIT_OK, ctl.err
    assert sorted(ctl.lane.received) == [1, 2, 3]
    assert sorted(marked) == [1, 2, 3]  # as each row arrived at the archive function:
    for row in marked.values():
        assert row["archive_status"] == "PENDING"
        assert row["archive_next_run_at"] == row["archive_enqueued_at"] is not None
        assert row["archive_attempts"] == 0
        assert row["archive_backfilled"] is True  # history: served after live records
    assert {i: fetch_record(db, i) for i in range(5, 10)} == before
    assert fetch_record(db, 4)["archive_backfilled"] is False
    assert "3 queued" in ctl.out
    assert "no never-queued SUCCEEDED generations left started before " in ctl.out
    assert "(counted again)" in ctl.out
    assert "pacing off (LSKY_RATE_LIMITS unset here)" in ctl.err

    assert ctl("backfill") == EXIT_OK  # again: nothing left
    assert "0 queued" in ctl.out
    assert drain(sqs, queues.url) == []


def test_backfill_takes_the_started_at_range_and_the_user(ctl: Ctl, db: Any) -> None:
    seed_never_queued(db, [1], started_at=10 * DAY)
    seed_never_queued(db, [2], started_at=5 * DAY)
    seed_never_queued(db, [3], started_at=2 * DAY)
    seed_never_queued(db, [4], started_at=2 * DAY, user_id=2, username="bob")
    seed_never_queued(db, [5], started_at=3600)

    assert ctl("backfill", "--since", "7d", "--until", "1d") == EXIT_OK, ctl.err
    assert sorted(ctl.lane.received) == [2, 3, 4]

    assert ctl("backfill", "--user", "2") == EXIT_OK  # 4 is queued already
    assert sorted(ctl.lane.received) == [2, 3, 4]
    seed_never_queued(db, [6, 7], started_at=DAY, user_id=2)
    assert ctl("backfill", "--user", "2") == EXIT_OK
    assert sorted(ctl.lane.received) == [2, 3, 4, 6, 7]
    assert queued(db) == [2, 3, 4, 6, 7]

    # ISO bounds: [since, until)
    since = (datetime.now(UTC) - timedelta(days=11)).isoformat()
    until = fetch_record(db, 5)["started_at"].isoformat()
    assert ctl("backfill", "--since", since, "--until", until) == EXIT_OK
    assert ctl.lane.received[-1] == 1

    assert ctl("backfill", "--since", "1d", "--until", "2d") == EXIT_ERROR
    assert "is not before --until" in ctl.err


def test_backfill_limit_takes_the_oldest_generations_first(ctl: Ctl, db: Any) -> None:
    seed_never_queued(db, range(1, 8))
    assert ctl("backfill", "--limit", "3", "--page-size", "2") == EXIT_OK, ctl.err
    assert ctl.lane.received == [1, 2, 3]
    assert "--limit 3 reached" in ctl.out


def test_dry_run_counts_lists_and_changes_nothing(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
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

    # With pacing, it says what the limits leave a backfill after live demand.
    monkeypatch.setenv("LSKY_RATE_LIMITS", "20/minute,100/hour")
    set_uploads(db, 10, within_seconds=3000)  # live: 10 in the last hour
    assert ctl("backfill", "--dry-run", "--limit", "12") == EXIT_OK, ctl.err
    assert ctl.out.splitlines()[-2] == (
        "pacing: 100/h allowed, live uses ~10/h, ~86/h left for a backfill: 12 rows need ~0 s"
    )


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
    ("cut", "uncertain"),
    [
        # Between two calls: the first batch went out, the second was never asked for.
        ("between", []),
        # In a call (in the test before it reached SQS, which the run cannot know): its
        # rows stay PENDING, SQS may have taken them.
        ("in_call", list(range(11, 21))),
    ],
)
def test_an_interrupted_page_is_settled_and_a_rerun_sends_every_row_once(
    ctl: Ctl,
    db: Any,
    sqs: Any,
    queues: QueuePair,
    monkeypatch: pytest.MonkeyPatch,
    cut: str,
    uncertain: list[int],
) -> None:
    seed_never_queued(db, range(1, 36))
    set_uploads(db, 600, within_seconds=60)  # a fast lane: room for every page at once
    ctl.lane.speed = 0  # nothing taken meanwhile: the queue shows what was sent
    with monkeypatch.context() as patch:
        if cut == "in_call":
            failing_sender(patch, after_calls=1, action=raise_interrupt)
        else:
            real_encode = enqueue.encode

            def encode(record_id: int) -> str:
                if record_id == 11:  # the second call's entries, before it is made
                    raise KeyboardInterrupt
                return real_encode(record_id)

            patch.setattr(enqueue, "encode", encode)
        assert ctl("backfill", "--page-size", "30") == EXIT_INTERRUPTED
    first = record_ids(drain(sqs, queues.url))
    assert first == list(range(1, 11))
    # Sent rows stay PENDING, and so do the cut call's; the rest of the page is
    # never-queued again.
    assert queued(db) == first + uncertain
    assert fetch_record(db, 21)["archive_backfilled"] is False
    assert f"{20 - len(uncertain)} rows of the page being sent were put back" in ctl.out
    assert ctl.err.endswith("archive-ctl: interrupted\n")

    assert ctl("backfill", "--page-size", "30") == EXIT_OK, ctl.err
    second = record_ids(drain(sqs, queues.url))
    # Every row put back, none twice; the uncertain ones are the sweeper's (lost messages).
    assert second == [i for i in range(11, 36) if i not in uncertain]
    assert queued(db) == list(range(1, 36))


def test_a_batch_sqs_took_whose_answer_never_came_is_not_sent_again(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A double Ctrl-C during SendMessageBatch, after SQS accepted the batch: its rows were
    put back as never queued, and the next run sent them a second message."""
    seed_never_queued(db, range(1, 31))
    set_uploads(db, 600, within_seconds=60)
    ctl.lane.speed = 0
    real = Queue.send_batch
    calls: list[int] = []

    def accepted_then_interrupted(self: Queue, queue_url: str, entries: Any) -> dict[str, str]:
        failed = real(self, queue_url, entries)  # SQS took the batch ...
        calls.append(len(entries))
        if len(calls) == 2:  # ... and Ctrl-C twice before its answer was read
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return failed

    monkeypatch.setattr(Queue, "send_batch", accepted_then_interrupted)
    with sigint(signal.default_int_handler):
        assert ctl("backfill", "--page-size", "30") == EXIT_INTERRUPTED
    assert record_ids(drain(sqs, queues.url)) == list(range(1, 21))
    assert "10 queued" in ctl.out
    assert "10 uncertain (sent or not: its answer never came)" in ctl.out
    assert "10 rows of that page were in the batch whose answer never came" in ctl.out
    assert "10 rows of the page being sent were put back" in ctl.out
    assert queued(db) == list(range(1, 21))  # the uncertain ones stay PENDING

    assert ctl("backfill", "--page-size", "30", "--json") == EXIT_OK, ctl.err
    assert record_ids(drain(sqs, queues.url)) == list(range(21, 31))  # none of 11-20 again
    assert json.loads(ctl.out)["queued"] == 10


@contextlib.contextmanager
def sigint(handler: Any) -> Iterator[None]:
    """SIGINT handled as `handler` in this process for the block, whatever the test run
    was started with: default_int_handler as in a terminal's foreground command, SIG_IGN
    as in a shell's background job."""
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_page_finishes_it_then_stops(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_never_queued(db, range(1, 31))
    set_uploads(db, 600, within_seconds=60)
    ctl.lane.speed = 0
    # A real SIGINT while page 1 (two batches) is being sent.
    failing_sender(monkeypatch, after_calls=0, action=lambda: os.kill(os.getpid(), signal.SIGINT))

    with sigint(signal.default_int_handler):
        assert ctl("backfill", "--page-size", "20") == EXIT_INTERRUPTED
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert record_ids(drain(sqs, queues.url)) == list(range(1, 21))  # the whole page
    assert queued(db) == list(range(1, 21))
    assert "finishing the page being sent, then stopping" in ctl.err
    assert "20 queued" in ctl.out


def test_an_ignored_sigint_stays_ignored_during_a_page(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell starts a background job with SIGINT ignored, so that the terminal's Ctrl-C
    leaves it running: the backfill does not take it up while it sends a page."""
    seed_never_queued(db, range(1, 31))
    set_uploads(db, 600, within_seconds=60)
    ctl.lane.speed = 0
    failing_sender(monkeypatch, after_calls=0, action=lambda: os.kill(os.getpid(), signal.SIGINT))

    with sigint(signal.SIG_IGN):
        assert ctl("backfill", "--page-size", "20") == EXIT_OK, ctl.err
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert record_ids(drain(sqs, queues.url)) == list(range(1, 31))  # both pages
    assert "finishing the page being sent" not in ctl.err


def test_a_limited_run_in_two_steps_never_queues_a_row_twice(ctl: Ctl, db: Any) -> None:
    seed_never_queued(db, range(1, 10))
    assert ctl("backfill", "--limit", "4") == EXIT_OK
    assert ctl("backfill", "--limit", "4") == EXIT_OK
    assert ctl("backfill") == EXIT_OK
    assert ctl.lane.received == list(range(1, 10))  # each exactly once


def test_a_send_that_fails_leaves_the_page_pending_for_the_sweeper_and_stops(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_never_queued(db, range(1, 21))
    set_uploads(db, 600, within_seconds=60)
    ctl.lane.speed = 0

    def refuse() -> None:
        raise RuntimeError("SQS is down")

    failing_sender(monkeypatch, after_calls=1, action=refuse)
    assert ctl("backfill", "--page-size", "10") == EXIT_PARTIAL
    assert record_ids(drain(sqs, queues.url)) == list(range(1, 11))
    assert "NOT SENT  11: RuntimeError: SQS is down" in ctl.out
    assert queued(db) == list(range(1, 21))  # page 2 is PENDING, unstamped: the sweeper's
    assert fetch_record(db, 11)["archive_enqueued_at"] is None


# -- issue 18 item 8: rows another transaction held ------------------------------------------


@pytest.fixture
def other_session(pg_dsn: str) -> Iterator[Any]:
    """Another session (a writer of the generation service, say)."""
    other = connect(pg_dsn)
    yield other
    with contextlib.suppress(Exception):
        other.run("ROLLBACK")
    other.close()


def hold_row(session: Any, record_id: int) -> None:
    session.run("BEGIN")
    session.run("SELECT id FROM image_generation_records WHERE id = :id FOR UPDATE", id=record_id)


def test_a_row_held_by_another_transaction_is_taken_once_it_is_free(
    ctl: Ctl, db: Any, other_session: Any
) -> None:
    seed_never_queued(db, range(1, 6))
    hold_row(other_session, 2)
    ctl.time.on_sleep = lambda: other_session.run("COMMIT") if len(ctl.time.sleeps) == 3 else None

    assert ctl("backfill", "--page-size", "10") == EXIT_OK, ctl.err
    assert sorted(ctl.lane.received) == [1, 2, 3, 4, 5]
    assert ctl.lane.received[-1] == 2  # looked for again once the range's end was reached
    assert "no never-queued SUCCEEDED generations left" in ctl.out


def test_a_row_held_all_along_is_reported_not_called_done(
    ctl: Ctl, db: Any, other_session: Any
) -> None:
    seed_never_queued(db, range(1, 6))
    hold_row(other_session, 2)

    assert ctl("backfill", "--page-size", "10") == EXIT_PARTIAL, ctl.err
    assert sorted(ctl.lane.received) == [1, 3, 4, 5]
    assert "no never-queued SUCCEEDED generations left" not in ctl.out
    assert "1 never-queued SUCCEEDED generation still left started before " in ctl.out
    assert "another transaction held it each time" in ctl.out
    assert len(ctl.time.sleeps) <= 15  # a bounded number of looks, a second apart
    assert states(db)[2] is None


# -- the lane's pause -------------------------------------------------------------------------


def test_an_account_pause_refuses_to_start_without_force(ctl: Ctl, db: Any) -> None:
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


def test_with_force_it_waits_while_the_lane_is_paused(ctl: Ctl, db: Any) -> None:
    seed_never_queued(db, range(1, 4))
    pause_lane(db, seconds=None, reason="account")

    def operator_clears() -> None:
        if len(ctl.time.sleeps) == 12:
            db.run("UPDATE image_archive_lane SET paused_until = NULL, pause_reason = NULL")

    ctl.time.on_sleep = operator_clears
    assert ctl("backfill", "--force") == EXIT_OK, ctl.err
    assert set(ctl.time.sleeps) == {1.0}
    assert ctl.lane.received == [1, 2, 3]
    assert not [u for u in ctl.lane.uploads.values() if u < 12]  # nothing sent meanwhile
    assert "waiting: the upload lane is paused until cleared: account" in ctl.err


def test_every_host_pause_is_waited_out(ctl: Ctl, db: Any) -> None:
    """Whatever its reason: the old backfill let `pacing` pauses through."""
    seed_never_queued(db, range(1, 4))
    ctl.lane.shift = True  # the pause ends as the fake clock goes on
    pause_lane(db, seconds=20, reason="rate_limit")

    assert ctl("backfill") == EXIT_OK, ctl.err
    assert ctl.lane.received == [1, 2, 3]
    assert min(ctl.lane.uploads.values()) >= 20
    assert "waiting: the upload lane is paused: rate_limit" in ctl.err


# -- issue 21 item 6: live records first ----------------------------------------------------------


def live_every(seconds: float, first_id: int) -> Callable[[LaneModel], None]:
    """A producer: a live record each `seconds` of the fake clock."""
    ids = iter(range(first_id, first_id + 100_000))

    def produce(lane: LaneModel) -> None:
        while len(lane.arrived) * seconds <= lane.now:
            lane.add_live(next(ids))

    return produce


def stop_at(ctl: Ctl, seconds: float) -> None:
    def stop() -> None:
        if ctl.time.now - 1000.0 >= seconds:
            raise KeyboardInterrupt

    ctl.time.on_sleep = stop


@pytest.mark.parametrize("backfill", [False, True])
def test_with_pacing_live_records_never_wait_behind_history(
    ctl: Ctl, db: Any, monkeypatch: pytest.MonkeyPatch, backfill: bool
) -> None:
    """Live records arrive every 2 s while a backfill of 2,000 rows runs: each one's upload
    slot is free when it comes, as without the backfill; no history row waits for a slot
    either. The old backfill filled the queue with pages of history, whose slots every live
    record then queued behind."""
    monkeypatch.setenv("LSKY_RATE_LIMITS", "8/5 seconds,30/30 seconds")
    ctl.lane.limits = ((5, 8), (30, 30))
    ctl.lane.shift = True
    ctl.lane.speed = 5
    ctl.lane.producer = live_every(2.0, first_id=100_000)
    # Live demand before the run: 15 uploads in the last 30 s.
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        " SELECT 'lsky', now() - g * interval '2 s' + interval '1 s', 'done'"
        " FROM generate_series(1, 15) AS g"
    )
    bulk_never_queued(db, 1, 2_000)
    if backfill:
        stop_at(ctl, 60)
        assert ctl("backfill") == EXIT_INTERRUPTED, ctl.err
    else:
        for _ in range(60):
            ctl.time.sleep(1.0)  # the same minute, without a backfill

    lane = ctl.lane
    waits = lane.live_waits()
    assert len(waits) >= 29
    assert set(waits.values()) == {0.0}  # every live record uploaded the second it came
    assert [i for _, i in lane.refused if i >= 100_000] == []  # never a slot behind history
    history = [i for i in lane.uploads if i < 100_000]
    if backfill:
        # The backfill got what live demand left: (30 - 15 live - 4 kept free) per 30 s.
        assert 15 <= len(history) <= 30
        # And history rows seldom waited for a slot: the backfill plans by the windows
        # ending now, a slot keeps history's share in every window around it.
        assert len(lane.refused) <= 2
        assert "pacing: 30/30 s allowed, live uses ~15/30 s, ~11/30 s left" in ctl.err
    else:
        assert history == []


# -- output -------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_redrawn_every_second_in_its_width_with_the_reason(
    ctl: Ctl, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 item 7: the line was cut at the terminal's width (the reason it waits was
    never seen) and redrawn only between pages, its rate and ETA frozen for up to a minute."""
    seed_never_queued(db, range(1, 4))
    ctl.lane.shift = True
    pause_lane(db, seconds=30, reason="retry_after")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr("shutil.get_terminal_size", lambda: os.terminal_size((72, 24)))

    assert ctl("backfill") == EXIT_OK, terminal.getvalue()
    redraws = terminal.getvalue().split("\r")[1:]
    assert set(ctl.time.sleeps) == {1.0}  # a look at the clock every second...
    assert len(redraws) == len(ctl.time.sleeps) + 1  # ...and a redraw for each
    waiting = [line.rstrip() for line in redraws if "waiting" in line]
    assert len(waiting) >= 25
    assert all(len(line) <= 71 for line in redraws)
    # The reason fits whole; the count and ETA give way to it.
    assert all("waiting: the upload lane is paused: retry_after" in line for line in waiting)
    assert waiting[0].endswith("; opens in 30 s")
    assert waiting[10].endswith("; opens in 20 s")  # counting down between two looks


def test_on_a_terminal_progress_is_one_line_with_rate_and_eta(
    cli_env: None, db: Any, sqs: Any, queues: QueuePair
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
    first, progress = text.split("\n", 1)
    assert first.startswith("pacing off (LSKY_RATE_LIMITS unset here)")
    redraws = progress.split("\r")[1:]
    assert len(redraws) >= 3  # one a second, on the same line
    assert redraws[0].startswith("[########................] 2/6 sent (33%)  ")
    assert "/min  ETA " in redraws[0]
    assert redraws[-1].startswith("[########################] 6/6 sent (100%)")
    assert "ETA 0 s" in redraws[-1]
    assert "\n" not in progress.rstrip("\n ")  # no line of its own before the end
    assert b"6 queued" in stdout
    assert record_ids(drain(sqs, queues.url)) == [1, 2, 3, 4, 5, 6]


# -- issue 21 item 7: the rate and ETA it shows are what then happens ---------------------------

ETA = re.compile(r"ETA ((?:\d+(?:\.\d+)? (?:s|min|h|d) ?)+)")


def seconds_of(text: str) -> float:
    units = {"s": 1, "min": 60, "h": 3600, "d": 86400}
    parts = text.split()
    return sum(float(n) * units[u] for n, u in zip(parts[::2], parts[1::2], strict=True))


def etas(err: str) -> list[float | None]:
    """The ETA of each plain progress line (None: not known yet), one every ten seconds of
    the run's clock."""
    return [
        seconds_of(match.group(1)) if (match := ETA.search(line)) else None
        for line in err.splitlines()
        if line.startswith("backfill: ")
    ]


def assert_etas_within_twice_what_happened(ctl: Ctl) -> None:
    ended = ctl.time.now - 1000.0  # fake seconds from the start to the end of the run
    shown = etas(ctl.err)
    checked = 0
    for index, eta in enumerate(shown):
        at = 10.0 * index  # plain lines come every 10 s from the start
        left = ended - at
        if at < 60 or left < 20:  # from the first minute on, while there is a while to go
            continue
        assert eta is not None, shown
        checked += 1
        assert left / 2 <= eta <= left * 2, (at, eta, left, shown)
    assert checked >= 2, shown


def test_with_pacing_the_eta_follows_the_limits_from_the_first_minute(
    ctl: Ctl, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bursts of a short window, then a longer one's wait: the old ETA took the drain of
    the last 15 minutes (1.9/min here) and was 15 times too long."""
    limits = "10/10 seconds,30/minute"
    monkeypatch.setenv("LSKY_RATE_LIMITS", limits)
    ctl.lane.limits = ((10, 10), (60, 30))
    ctl.lane.shift = True
    ctl.time.max_sleeps = 400
    seed_never_queued(db, range(1, 76))

    assert ctl("backfill") == EXIT_OK, ctl.err
    assert sorted(ctl.lane.uploads) == list(range(1, 76))
    assert ctl.lane.refused == []  # every row found its slot free: none waited, none parked
    assert ctl.err.startswith(
        "pacing: 30/min allowed, live uses ~0/min, ~29/min left for a backfill: 75 rows need ~"
    )
    assert_etas_within_twice_what_happened(ctl)


def test_without_pacing_the_eta_follows_the_lane_from_the_first_minute(ctl: Ctl, db: Any) -> None:
    ctl.lane.speed = 2  # uploads a second
    ctl.lane.shift = True
    ctl.time.max_sleeps = 400
    seed_never_queued(db, range(1, 201))

    assert ctl("backfill") == EXIT_OK, ctl.err
    assert "200 queued" in ctl.out
    assert_etas_within_twice_what_happened(ctl)
