"""The pure parts of `backfill`, `status` and `lane clear`: what pacing leaves live records
and a backfill, the schedule behind the ETAs, the backfill's next step, the progress line
and its fitting, the pause's words, status's lane section."""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime, timedelta

import pytest

from lib.cli import lane as lanes
from lib.cli.admission import LaneView, Step, decide
from lib.cli.pacing import (
    backfill_capacity,
    backfill_schedule,
    backlog_eta_seconds,
    per_minute,
    per_window,
    rate_text,
    schedule_end,
    window_name,
    window_uses,
)
from lib.cli.progress import Display, Meter, Progress, bar_line, duration, plain_line
from lib.cli.status import ArchiveCounts, Status, backlog, lane_report, render
from lib.state.lane import LaneState, LedgerEntry
from lib.state.operations import LaneDemand

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
WINDOW = 900
MINUTE, HOUR, DAY = 60, 3_600, 86_400
LSKY_DEFAULTS = ((MINUTE, 20), (HOUR, 100), (DAY, 300))


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def live(count: int, over: float, *, ending: float = 0.0) -> list[LedgerEntry]:
    """`count` live uploads spread evenly over `over` seconds, the last `ending` s ago."""
    return [LedgerEntry(-ending - over * (k + 0.5) / count, 1, 0) for k in range(count)]


def history(count: int, at: float) -> list[LedgerEntry]:
    return [LedgerEntry(at, 1, 1) for _ in range(count)]


# -- pacing: the windows, the share live demand leaves, the schedule ---------------------


def test_per_minute() -> None:
    assert per_minute(300, WINDOW) == 20.0
    assert per_minute(0, WINDOW) == 0.0


def test_words_for_windows_and_rates() -> None:
    assert [window_name(s) for s in (60, 3600, 86400, 10, 7200)] == [
        "minute",
        "hour",
        "day",
        "10 s",
        "2 h",
    ]
    assert per_window(300, DAY) == "300/day"
    assert per_window(24, 10) == "24/10 s"
    assert rate_text(20 / 60) == "20.0/min"
    assert rate_text(30 / 3600) == "30.0/h"
    assert rate_text(20 / 86400) == "20/day"
    assert rate_text(None) == rate_text(0.0) == "-/min"


def test_window_use_counts_live_and_history_and_keeps_a_margin_for_live() -> None:
    entries = [*live(120, DAY), *history(50, -600.0), LedgerEntry(30.0, 1, 1)]  # + a booking
    minute, hour, day = window_uses(LSKY_DEFAULTS, entries)
    assert (day.used, day.backfill, day.live) == (171, 51, 120)
    assert day.margin == 1 + 10  # one slot, and the square root of live demand
    assert day.backfill_share == 300 - 120 - 11
    assert day.room == day.backfill_share - 51
    assert (hour.used, hour.live, hour.backfill) == (56, 5, 51)
    assert minute.used == 1  # only the booking: no upload in the last minute
    assert minute.room == 20 - 0 - 1 - 1


def test_the_schedule_follows_every_window() -> None:
    assert schedule_end(20, ((MINUTE, 20),), []) == 0.0
    assert schedule_end(21, ((MINUTE, 20),), []) == 60.0
    # 100 in the first 4 minutes, then the hour's first uploads age out.
    assert schedule_end(100, ((MINUTE, 20), (HOUR, 100)), []) == 240.0
    assert schedule_end(101, ((MINUTE, 20), (HOUR, 100)), []) == 3600.0
    assert schedule_end(150, ((MINUTE, 20), (HOUR, 100)), []) == 3720.0
    # Uploads already in the windows: 100 made 10 minutes ago fill the hour for 50 more.
    made = [(-600.0, 100)]
    assert schedule_end(1, ((MINUTE, 20), (HOUR, 100)), made) == 3000.0
    assert schedule_end(0, ((MINUTE, 20),), made) == 0.0
    assert schedule_end(5, ((MINUTE, 0),), []) is None


def test_a_long_schedule_is_extended_at_the_steady_rate() -> None:
    end = schedule_end(1_000_000, LSKY_DEFAULTS, [])
    assert end is not None
    assert end == pytest.approx(1_000_000 / 300 * DAY, rel=0.01)


def test_what_pacing_leaves_a_backfill_in_numbers() -> None:
    # Lsky's defaults, and live records uploading ~120 a day (5 an hour).
    entries = live(120, DAY)
    uses = window_uses(LSKY_DEFAULTS, entries)
    eta = backfill_schedule(10_000, uses, entries)
    assert eta is not None
    share = 300 - 120 - 11  # the day binds
    assert eta == pytest.approx(10_000 / share * DAY, rel=0.02)
    assert backfill_capacity(uses, 10_000, eta) == (
        "300/day allowed, live uses ~120/day, ~169/day left for a backfill: "
        f"10000 rows need ~{duration(eta)}"
    )
    busy = live(300, DAY)
    assert backfill_capacity(window_uses(LSKY_DEFAULTS, busy), 5, None) == (
        "300/day allowed, live uses ~300/day: nothing is left for a backfill "
        "(18 kept free for live records' ups and downs)"
    )
    assert backfill_schedule(1, window_uses(LSKY_DEFAULTS, busy), busy) is None


def test_backlog_eta() -> None:
    assert backlog_eta_seconds(0, 0.0) == 0.0
    assert backlog_eta_seconds(120, 60.0) == 120.0
    assert backlog_eta_seconds(120, 0.0) is None  # nothing drained lately
    assert backlog_eta_seconds(120, 60.0, paused_for_seconds=600) == 720.0
    assert backlog_eta_seconds(120, 60.0, paused_for_seconds=math.inf) is None


# -- a backfill's next step -------------------------------------------------------------

IDLE = LaneDemand(live_waiting=0, live_due=0, backfill_queued=0, backfill_unslotted=0)


def view(
    *,
    limits: tuple[tuple[int, int], ...] = (),
    entries: list[LedgerEntry] | None = None,
    demand: LaneDemand = IDLE,
    recent: int = 0,
    paused_for: float = 0.0,
    booked_ahead: float = 0.0,
) -> LaneView:
    return LaneView(
        paused_for=paused_for,
        pause_words="paused until cleared: account" if paused_for else "",
        booked_ahead=booked_ahead,
        limits=limits,
        entries=tuple(entries or ()),
        recent_uploads=recent,
        demand=demand,
    )


def step(lane: LaneView, *, page: int = 100, ahead: float = 10, room: int | None = None) -> Step:
    return decide(lane, page_size=page, ahead_seconds=ahead, room_left=room)


def test_nothing_is_sent_while_the_host_paused_the_lane() -> None:
    waiting = step(view(paused_for=math.inf))
    assert waiting.rows == 0
    assert waiting.note(0) == "waiting: the upload lane is paused until cleared: account"
    timed = step(view(paused_for=20.0))
    assert (timed.rows, timed.look_in) == (0, 5.0)
    assert timed.note(3).endswith("; opens in 17 s")


def test_live_records_waiting_for_the_lane_come_first() -> None:
    demand = LaneDemand(live_waiting=3, live_due=0, backfill_queued=0, backfill_unslotted=0)
    waiting = step(view(demand=demand, recent=60))
    assert waiting.rows == 0
    assert waiting.why == "waiting: live records first: 3 waiting for the lane"


def test_no_history_while_slots_are_booked_ahead() -> None:
    waiting = step(view(booked_ahead=2.5, limits=((MINUTE, 20),)))
    assert (waiting.rows, waiting.look_in) == (0, 2.5)
    assert waiting.note(1.0) == "waiting: no spare upload slot: slots are booked ahead; free in 2 s"


def test_history_in_the_lane_is_kept_to_a_few_seconds_of_uploads() -> None:
    # An idle lane: two at a time, so that its speed can show.
    assert step(view()).rows == 2
    # 60 uploads in the last minute: 1 a second, so 10 s of them is 10 records.
    assert step(view(recent=60)).rows == 10
    assert step(view(recent=60), room=4).rows == 4  # --limit
    assert step(view(recent=6000), page=50).rows == 50  # never more than a page at once
    # Uploads under way are not ahead of a live record: only the queued ones count.
    running = LaneDemand(live_waiting=0, live_due=0, backfill_queued=0, backfill_unslotted=6)
    assert step(view(recent=60, demand=running)).rows == 10
    full = LaneDemand(live_waiting=0, live_due=0, backfill_queued=10, backfill_unslotted=0)
    waiting = step(view(recent=60, demand=full))
    assert (waiting.rows, waiting.look_in) == (0, 1.0)
    assert waiting.why.startswith("waiting: 10 backfilled records queued, at most 10 ahead")


def test_pacing_gives_history_only_the_room_live_demand_leaves() -> None:
    limits = ((10, 24),)
    quiet = step(view(limits=limits, recent=600))
    assert quiet.rows == 24 - 1  # the margin: one slot free for a live record
    # 5 live uploads in the window: they and their margin (1 + 2) stay free.
    busy = view(limits=limits, entries=live(5, 10), recent=600)
    assert step(busy).rows == 24 - 5 - 3
    # Records sent but not holding a slot yet, live or history, take their room first.
    demand = LaneDemand(live_waiting=0, live_due=2, backfill_queued=4, backfill_unslotted=4)
    assert step(view(limits=limits, entries=live(5, 10), recent=600, demand=demand)).rows == 10
    # A window full for history: wait until its history ages out.
    full = view(limits=limits, entries=[*live(5, 10), *history(16, -4.0)], recent=600)
    waiting = step(full)
    assert waiting.rows == 0
    assert (
        waiting.why
        == "waiting: pacing: the 10 s window holds 21 of 24 (5 live, 3 kept free for live)"
    )
    assert waiting.opens_in == pytest.approx(6.0)
    assert waiting.note(2.0).endswith("; room in 4 s")


def test_when_live_demand_takes_all_pacing_allows_history_waits() -> None:
    lane = view(limits=((10, 6),), entries=live(5, 10), recent=60)
    waiting = step(lane)
    assert waiting.rows == 0
    assert waiting.why == (
        "waiting: live records use what pacing allows: 6/10 s allowed, live uses ~5/10 s"
    )


def test_the_backfill_eta_follows_the_schedule_and_the_pause() -> None:
    lane = view(limits=((MINUTE, 20), (HOUR, 100)), recent=60)
    # Each window keeps one slot free: 19 a minute, 99 of the hour's 100.
    assert lane.backfill_eta(99) == 300.0
    paused = view(limits=((MINUTE, 20), (HOUR, 100)), paused_for=30.0)
    assert paused.backfill_eta(19) == 30.0
    assert view(recent=60).backfill_eta(10) is None  # pacing off: the run's own rate


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


def test_meter_rate_follows_the_last_few_minutes() -> None:
    meter = Meter(total=None, started=0.0)
    assert meter.per_second(0.0) is None
    meter.add(1000, 10.0)  # a fast start
    for minute in range(1, 11):
        meter.add(10, 60.0 * minute + 10)  # then 10 a minute
    assert meter.per_second(610.0) == pytest.approx(10 / 60)
    assert meter.remaining() is None


PROGRESS = Progress(
    done=250,
    total=1000,
    rate="12.5/min",
    eta=3600.0,
    note="waiting: pacing: the hour window holds 100 of 100 (4 live, 3 kept free for live)",
)


def test_bar_line_shows_count_rate_eta_and_reason() -> None:
    assert bar_line(PROGRESS) == (
        "[######..................] 250/1000 sent (25%)  12.5/min  ETA 60 min  " + PROGRESS.note
    )


@pytest.mark.parametrize("width", [200, 130, 110, 100, 95, 85, 80, 40])
def test_bar_line_fits_the_width_and_keeps_the_reason_to_the_last(width: int) -> None:
    line = bar_line(PROGRESS, width)
    assert len(line) <= width
    if width >= len(PROGRESS.note):
        assert line.endswith(PROGRESS.note)  # the other parts went first
    else:
        assert line == PROGRESS.note[: width - 1] + "…"
    if width >= len(PROGRESS.note) + len("250/1000  ETA 60 min  "):
        assert "ETA 60 min" in line


def test_plain_line() -> None:
    assert plain_line(PROGRESS) == (
        "backfill: 250/1000 sent (25%), 12.5/min, ETA 60 min; " + PROGRESS.note
    )
    unknown = Progress(done=0, total=None, rate="-/min", eta=None)
    assert plain_line(unknown) == "backfill: 0 sent, -/min, ETA -"


def test_terminal_display_redraws_one_line_in_the_width_and_ends_it() -> None:
    stream = io.StringIO()
    display = Display(stream, tty=True, width=lambda: 81)
    display.show(PROGRESS, 0.0)
    display.show(Progress(done=5, total=10, rate="5.0/min", eta=60.0), 1.0)
    display.finish()
    first, second = stream.getvalue().split("\r")[1:]
    assert len(first) <= 80
    assert first.endswith(PROGRESS.note)
    assert second.startswith("[############............] 5/10 sent (50%)  5.0/min  ETA 60 s")
    assert second.endswith(" \n")  # padded over the longer first line, then ended
    assert len(second) == len(first) + 1


def test_plain_display_prints_a_line_every_ten_seconds_and_the_last() -> None:
    stream = io.StringIO()
    display = Display(stream, tty=False)
    for second in range(25):
        display.show(Progress(done=second, total=30, rate="60.0/min", eta=None), float(second))
    display.message("a note")
    display.finish()
    assert stream.getvalue().splitlines() == [
        "backfill: 0/30 sent (0%), 60.0/min, ETA -",
        "backfill: 10/30 sent (33%), 60.0/min, ETA -",
        "backfill: 20/30 sent (67%), 60.0/min, ETA -",
        "a note",
        "backfill: 24/30 sent (80%), 60.0/min, ETA -",
    ]


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


def test_with_pacing_the_backlog_drains_by_the_limits_not_the_last_15_minutes() -> None:
    # 104 uploads in the last 15 min filled the hour: the backlog of 60 waits for them.
    made = [LedgerEntry(-900 + 8.0 * k, 1, 0) for k in range(104)]
    limits = ((MINUTE, 20), (HOUR, 100))
    state = lane(drain_uploads=104)
    work = backlog(COUNTS, state, limits=limits, entries=made)
    # The hour frees as those uploads age out, 8 s apart, from 2,700 s on.
    assert work.eta_seconds == pytest.approx(2700 + 8 * 63, abs=1)
    report = lane_report(state, backlog_records=60, limits=limits, entries=made, never_queued=0)
    assert report.drain_basis == "limits"
    assert report.drain_per_minute == pytest.approx(60 * 60 / (2700 + 8 * 63), rel=0.01)
    unpaced = lane_report(state)
    assert unpaced.drain_per_minute == pytest.approx(6.93, abs=0.01)  # 104 in 15 min


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


def test_status_with_pacing_says_what_live_uses_and_what_a_backfill_gets() -> None:
    entries = live(120, DAY)
    state = lane(drain_uploads=1)
    status = Status(
        archive=COUNTS,
        lane=lane_report(
            state, backlog_records=60, limits=LSKY_DEFAULTS, entries=entries, never_queued=10_000
        ),
        backlog=backlog(COUNTS, state, limits=LSKY_DEFAULTS, entries=entries),
    )
    text = render(status)
    assert "  pacing 20/min, 100/h, 300/day (LSKY_RATE_LIMITS)\n" in text
    assert "    minute: 0 of 20 (0 live, 0 backfill), 20 free; hour: 5 of 100" in text
    # 60 records: 20 now, 20 in a minute, 20 in two.
    assert "  drain: 30.0/min by the pacing limits, from now (1 upload in the last 15 min" in text
    assert "  backlog: 60 records PENDING or RUNNING, ETA 2 min\n" in text
    assert (
        "  backfill: 10000 never queued; 300/day allowed, live uses ~120/day, ~169/day left "
        "for a backfill: 10000 rows need ~58.6 d" in text
    )
    pacing = status.as_dict()["lane"]["pacing"]
    assert pacing["windows"][2]["backfill_share"] == 169
    assert pacing["backfill_eta_seconds"] == pytest.approx(10_000 / 169 * DAY, rel=0.02)
