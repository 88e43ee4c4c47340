"""The pure parts of `backfill`, `status` and `lane clear`: pacing on the lane's drain
rate, the backlog ETA, the progress meter and its two renderings, the pause's words."""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime, timedelta

import pytest

from lib.cli import lane as lanes
from lib.cli.pacing import (
    MAX_WAIT_SECONDS,
    MIN_WAIT_SECONDS,
    Pace,
    backlog_eta_seconds,
    pace,
    per_minute,
)
from lib.cli.progress import Display, Meter, bar_line, duration, plain_line
from lib.cli.status import ArchiveCounts, Status, backlog, lane_report, render
from lib.state.lane import LaneState

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
WINDOW = 900


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


# -- the drain rate and pacing -----------------------------------------------------------


def test_per_minute() -> None:
    assert per_minute(300, WINDOW) == 20.0
    assert per_minute(0, WINDOW) == 0.0


def step(depth: int, uploads: int, *, minutes: float = 15, page: int = 100) -> Pace:
    return pace(
        depth=depth, uploads=uploads, window_seconds=WINDOW, max_minutes=minutes, page_size=page
    )


def test_an_idle_lane_gets_one_page_to_bootstrap() -> None:
    assert step(0, 0) == Pace(rows=100, wait_seconds=0.0, allowed_depth=100, drain_per_minute=0)
    assert step(40, 0).rows == 60


def test_an_idle_lane_with_a_full_page_queued_is_looked_at_again_later() -> None:
    assert step(100, 0) == Pace(0, MAX_WAIT_SECONDS, 100, 0.0)
    assert step(5000, 0).wait_seconds == MAX_WAIT_SECONDS


def test_the_queue_is_filled_to_what_the_lane_drains_in_max_minutes() -> None:
    # 300 uploads in 15 min: 20 a minute, so 15 minutes' worth is 300 messages.
    assert step(0, 300) == Pace(100, 0.0, 300, 20.0)  # never more than a page at once
    assert step(250, 300).rows == 50
    assert step(290, 300).rows == 10


def test_it_waits_for_room_for_one_batch_at_the_drain_rate() -> None:
    # 295 queued of 300: room for 5, a batch is 10, so 5 more must drain: 15 s at 20/min.
    assert step(295, 300) == Pace(0, 15.0, 300, 20.0)
    assert step(300, 300).wait_seconds == 30.0  # depth at the bound: wait too


def test_waits_are_bounded() -> None:
    assert step(10_000, 300).wait_seconds == MAX_WAIT_SECONDS  # far over: look again soon
    # 9000 uploads in 15 min is 600 a minute: a batch drains in a second.
    assert step(595, 9000, minutes=1).wait_seconds == MIN_WAIT_SECONDS


def test_a_small_page_is_also_the_smallest_send() -> None:
    assert step(0, 0, page=5) == Pace(5, 0.0, 5, 0.0)
    assert step(1, 0, page=5).rows == 0  # room for 4: wait for a whole page of 5
    assert step(10, 150, minutes=1, page=5) == Pace(0, 30.0, 10, 10.0)


def test_a_fractional_max_queue_rounds_down() -> None:
    assert step(0, 900, minutes=0.5, page=1).allowed_depth == 30


def test_backlog_eta() -> None:
    assert backlog_eta_seconds(0, 0.0) == 0.0
    assert backlog_eta_seconds(120, 60.0) == 120.0
    assert backlog_eta_seconds(120, 0.0) is None  # nothing drained lately
    assert backlog_eta_seconds(120, 60.0, paused_for_seconds=600) == 720.0
    assert backlog_eta_seconds(120, 60.0, paused_for_seconds=math.inf) is None


# -- the progress meter and its renderings ---------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (math.inf, "never"),
        (0.4, "0 s"),
        (89, "89 s"),
        (720, "12 min"),
        (6480, "1 h 48 min"),
        (7200, "2 h"),
        (86400 * 3.2, "3.2 d"),
    ],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_meter_rate_and_eta() -> None:
    meter = Meter(total=1000, started=0.0)
    assert meter.per_minute(0.0) is None
    assert meter.eta_seconds(0.0) is None
    meter.add(100, 30.0)
    meter.add(100, 60.0)
    assert meter.per_minute(60.0) == 200.0
    assert meter.eta_seconds(60.0) == 240.0  # 800 left at 200/min
    # The lane drains 40 a minute: pacing holds the sends to that, so the ETA follows it.
    assert meter.eta_seconds(60.0, drain_per_minute=40.0) == 1200.0


def test_meter_rate_follows_the_last_few_minutes() -> None:
    meter = Meter(total=None, started=0.0)
    meter.add(1000, 10.0)  # a fast start
    for minute in range(1, 11):
        meter.add(10, 60.0 * minute + 10)  # then 10 a minute
    assert meter.per_minute(610.0) == pytest.approx(10.0)
    assert meter.eta_seconds(610.0) is None  # no total: no ETA
    assert meter.remaining() is None


def test_bar_line_shows_count_rate_and_eta() -> None:
    meter = Meter(total=1000, started=0.0)
    meter.add(250, 60.0)
    assert bar_line(meter, 60.0) == (
        "[######..................] 250/1000 sent (25%)  250.0/min  ETA 3 min"
    )
    assert bar_line(meter, 60.0, 0.0, "waiting").endswith("ETA 3 min  waiting")


def test_plain_line() -> None:
    meter = Meter(total=1000, started=0.0)
    meter.add(100, 60.0)
    assert plain_line(meter, 60.0, 20.0) == "backfill: 100/1000 sent (10%), 100.0/min, ETA 45 min"
    unknown = Meter(total=None, started=0.0)
    assert plain_line(unknown, 0.0) == "backfill: 0 sent, -/min, ETA -"


def test_terminal_display_redraws_one_line_and_ends_it() -> None:
    stream = io.StringIO()
    display = Display(stream, tty=True, width=200)
    meter = Meter(total=10, started=0.0)
    meter.add(5, 60.0)
    display.show(meter, 60.0, 0.0, "waiting for the queue to drain")
    display.show(meter, 60.0, 0.0)
    display.finish()
    first, second = stream.getvalue().split("\r")[1:]
    assert first.endswith("waiting for the queue to drain")
    assert second.startswith("[############............] 5/10 sent (50%)  5.0/min  ETA 60 s")
    assert second.endswith(" \n")  # padded over the longer first line, then ended
    assert len(second) == len(first) + 1


def test_plain_display_prints_lines() -> None:
    stream = io.StringIO()
    display = Display(stream, tty=False)
    meter = Meter(total=10, started=0.0)
    display.show(meter, 1.0, 0.0, "waiting for the queue to drain")
    display.message("a note")
    display.finish()
    assert stream.getvalue() == (
        "backfill: 0/10 sent (0%), 0.0/min, ETA -; waiting for the queue to drain\na note\n"
    )


# -- the lane's pause in words, status's lane section --------------------------------------


def lane(**fields: object) -> LaneState:
    return LaneState(now=NOW, **fields)  # type: ignore[arg-type]


def test_an_open_lane_has_no_pause() -> None:
    assert lanes.pause_of(lane()) is None
    assert lanes.pause_of(lane(paused_for_seconds=-5.0, reason="rate_limit")) is None


def test_a_pause_until_cleared() -> None:
    pause = lanes.pause_of(
        lane(
            paused_for_seconds=math.inf,
            reason="account",
            paused_since=ago(7200),
            detail="账号状态异常",
        )
    )
    assert pause is not None
    assert pause.until == lanes.UNTIL_CLEARED
    assert lanes.describe(pause) == (
        "paused until cleared: reason account, since 2026-12-02T10:00:00+00:00"
    )


def test_a_pause_until_a_time() -> None:
    pause = lanes.pause_of(
        lane(paused_for_seconds=1800.0, reason="rate_limit", window="hour", paused_since=ago(60))
    )
    assert pause is not None
    assert lanes.describe(pause) == (
        "paused until 2026-12-02T12:30:00+00:00 (for 30 min more): reason rate_limit, "
        "window hour, since 2026-12-02T11:59:00+00:00"
    )


COUNTS = ArchiveCounts(
    pending=55,
    pending_due=50,
    oldest_pending_age_seconds=30.0,
    running=5,
    running_expired=0,
    failed=0,
    failed_last_24h=0,
)


def test_the_backlog_counts_rows_and_drains_at_the_lane_rate() -> None:
    uploads = 300  # in 15 min: 20 a minute
    assert backlog(COUNTS, lane(drain_uploads=uploads)).records == 60
    assert backlog(COUNTS, lane(drain_uploads=uploads)).eta_seconds == 180.0
    paused = lane(drain_uploads=uploads, paused_for_seconds=600.0, reason="retry_after")
    assert backlog(COUNTS, paused).eta_seconds == 780.0
    assert backlog(COUNTS, lane()).eta_seconds is None


def test_status_renders_the_lane_and_the_backlog_eta() -> None:
    state = lane(
        paused_for_seconds=math.inf,
        reason="account",
        paused_since=ago(7200),
        detail="HTTP 401: Authentication failed.",
        drain_uploads=1,
    )
    status = Status(archive=COUNTS, lane=lane_report(state), backlog=backlog(COUNTS, state))
    text = render(status)
    assert (
        "upload lane (lsky)\n  paused until cleared: reason account, since 2026-12-02T10:00" in text
    )
    assert "  detail: HTTP 401: Authentication failed." in text
    assert "  drain: 1 upload in the last 15 min (0.1/min)" in text
    assert (
        "  backlog: 60 records PENDING or RUNNING, ETA - (the lane is paused until cleared)" in text
    )
    data = status.as_dict()
    assert data["lane"]["paused_until"] == "infinity"
    assert data["lane"]["paused_for_seconds"] is None
    assert data["backlog"] == {"records": 60, "eta_seconds": None}
