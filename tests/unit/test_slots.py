"""The slot arithmetic alone (lib.ratelimit.slots, lib.ratelimit.limiter): Lsky's whole
seconds and month, gaps, holds, bookings, live records before history."""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.ratelimit import limiter, slots
from lib.ratelimit.slots import Ask, Entry, State
from tests.limiter_model import Window
from tests.limiter_model import frees as frees_by_lsky

NOW = 1_000_000.25  # epoch seconds, a quarter past a whole second
PRC = ZoneInfo("Asia/Shanghai")


def ask(windows: list[tuple[float, int]], **options: object) -> Ask:
    """At test scale: a 0.1 s margin, taken within 50 ms, booked within 15 min."""
    settings: dict[str, object] = {
        "margin": 0.1,
        "tolerance": 0.05,
        "stale": 120.0,
        "book_within": 900.0,
    }
    return Ask(windows=windows, **(settings | options))  # type: ignore[arg-type]


# -- Lsky's whole seconds -------------------------------------------------------------------


def test_an_upload_counts_until_its_second_plus_the_window_and_one_more() -> None:
    # Lsky dates it second 1000 and counts both ends: second 1061 is the first without it.
    assert limiter.counts_until(1000.9, 60, 0.0) == 1061.0
    # Lsky's clock up to 0.15 s ahead may date it 1001, and behind, see 1062 late.
    assert limiter.counts_until(1000.9, 60, 0.15) == pytest.approx(1062.15)
    assert limiter.counts_until(1000.5, 60, 0.15) == pytest.approx(1061.15)


@given(
    at=st.floats(1e9, 2e9),
    later=st.floats(0, 200),
    seconds=st.sampled_from([1, 3, 60, 3_600]),
    margin=st.sampled_from([0.0, 0.0025, 0.15, 2.0]),
)
def test_counts_from_is_the_inverse_of_counts_until(
    at: float, later: float, seconds: int, margin: float
) -> None:
    """An upload at t shares a window with a later one at b exactly when b is before t
    has left: t >= counts_from(b) <=> b < counts_until(t)."""
    b = at + later
    for t in (at, b - later / 2, math.nextafter(limiter.counts_from(b, seconds, margin), 0)):
        shares = b < limiter.counts_until(t, seconds, margin)
        assert shares == (t >= limiter.counts_from(b, seconds, margin))


# -- Lsky's month -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "start"),
    [
        ((2026, 3, 31, 12), (2026, 3, 3, 12)),  # "February 31": 28 days
        ((2028, 3, 31, 12), (2028, 3, 2, 12)),  # a leap year: 29 days
        ((2026, 4, 15, 9), (2026, 3, 15, 9)),  # 31 days
        ((2026, 1, 31, 8), (2025, 12, 31, 8)),
    ],
)
def test_lsky_s_month_reaches_back_as_far_as_the_month_before_is_long(
    now: tuple[int, ...], start: tuple[int, ...]
) -> None:
    at = datetime(*now, tzinfo=PRC)
    assert limiter.month_start(at) == datetime(*start, tzinfo=PRC)


def test_an_upload_leaves_lsky_s_month_when_the_month_s_start_passes_its_second() -> None:
    stored = datetime(2026, 3, 2, 12, 0, 0, 400_000, tzinfo=PRC).timestamp()
    now = datetime(2026, 3, 20, tzinfo=PRC).timestamp()
    # In March the window reaches back 28 days: on March 30 at 12:00:01 it starts at
    # March 2, 12:00:01 (February 30 being March 2).
    frees = limiter.month_frees(stored, now, PRC, 0.0)
    assert datetime.fromtimestamp(frees, PRC) == datetime(2026, 3, 30, 12, 0, 1, tzinfo=PRC)
    # Stored on January 31: February's window reaches back 31 days (to "January 28" on
    # February 28), so it leaves on March 3 (28 days after "January 31" is March 3).
    stored = datetime(2026, 1, 31, 8, tzinfo=PRC).timestamp()
    frees = limiter.month_frees(stored, stored, PRC, 0.0)
    assert datetime.fromtimestamp(frees, PRC) == datetime(2026, 3, 1, 0, 0, tzinfo=PRC)


def test_an_upload_lsky_s_month_takes_back_in_the_repeated_hour_leaves_at_its_last_pass() -> None:
    # Berlin sets its clocks back on 2029-10-28, 03:00 to 02:00. An upload stored on
    # September 28 at 02:25:11 leaves the month at 02:25:12 summer time, comes back in when
    # the clock shows 02:00 again (the window's start goes back an hour with it) and leaves
    # for good at 02:25:12 winter time. (Found by `make test-deep`: the model-based test's
    # reference, tests/limiter_model.py, counts every second of it.)
    berlin = ZoneInfo("Europe/Berlin")
    stored = datetime(2029, 9, 28, 2, 25, 11, tzinfo=berlin).timestamp()
    now = datetime(2029, 10, 1, tzinfo=berlin).timestamp()
    frees = limiter.month_frees(stored, now, berlin, 0.0)
    assert frees == datetime(2029, 10, 28, 2, 25, 12, fold=1, tzinfo=berlin).timestamp()
    once = Window("month", limiter.LONGEST_MONTH_SECONDS, 1)
    assert frees == frees_by_lsky([stored], now=now, window=once, zone=berlin, offset=0.0)
    # From inside the repeated hour's first pass, out then, the answer is the same.
    first_pass = datetime(2029, 10, 28, 2, 40, tzinfo=berlin).timestamp()
    assert limiter.month_frees(stored, first_pass, berlin, 0.0) == frees
    # And past it, now.
    later = frees + 60
    assert limiter.month_frees(stored, later, berlin, 0.0) == later


def test_an_upload_of_the_repeated_hour_counts_again_at_its_second_pass() -> None:
    # Berlin sets its clocks back on 2026-10-25 at 03:00 summer time. An upload answered
    # at 02:30 summer time leaves the minute's window at 02:31:01 and counts again from
    # the setback (when within the hour it was stored is not known) until 02:31:01 winter
    # time; the hour's window keeps it until 03:30:01 winter time, two hours on.
    berlin = ZoneInfo("Europe/Berlin")
    [(setback, shift)] = limiter.setbacks(berlin, 1.79e9, 1.8e9)
    assert datetime.fromtimestamp(setback, berlin) == datetime(
        2026, 10, 25, 2, 0, fold=1, tzinfo=berlin
    )
    assert shift == 3_600
    answered = setback - 1_800
    near = [(setback, shift)]
    again = limiter.repeated(answered, 900.0, seconds=60, margin=0.0, near=near)
    assert again == [(setback, answered + 3_600 + 61)]
    [(_, until)] = limiter.repeated(answered, 900.0, seconds=3_600, margin=0.0, near=near)
    assert until - answered == 2 * 3_600 + 1
    # One stored an hour before the first pass, or a day's window: counted once.
    assert limiter.repeated(setback - 9_000, 900.0, seconds=60, margin=0.0, near=near) == []
    assert limiter.repeated(answered, 900.0, seconds=86_400, margin=0.0, near=near) == []
    # Lsky's default zone never sets its clock back.
    assert limiter.setbacks(ZoneInfo("Asia/Shanghai"), 1.7e9, 1.9e9) == ()


def test_pacing_keeps_the_longest_window_lsky_may_count() -> None:
    limits = [(60, 20), (86_400, 300), (limiter.LONGEST_MONTH_SECONDS, 999)]
    assert limiter.pacing_windows(limits, "Asia/Shanghai") == (
        (60.0, 20),
        (86_400.0, 300),
        (31 * 86_400.0, 999),
    )
    # Where summer time turns, a day on the wall clock lasts up to 25 hours.
    assert limiter.pacing_windows(limits, "Europe/Berlin") == (
        (60.0, 20),
        (90_000.0, 300),
        (31 * 86_400.0 + 3_600, 999),
    )


# -- a named window frees when its limit-th newest upload leaves ---------------------------------


def test_a_window_frees_when_its_limit_th_newest_upload_leaves_not_its_oldest() -> None:
    # 400 uploads, one every 3 minutes; Lsky allows 300 a day. The oldest left long ago;
    # the 300th newest was stored 897 minutes ago and leaves 24 h after its second.
    uploads = [NOW - 180 * k for k in range(400)]
    frees = limiter.window_frees(uploads, now=NOW, seconds=86_400, limit=300, margin=0.0)
    assert frees == math.floor(NOW - 180 * 299) + 86_401
    assert (frees - NOW) / 3_600 == pytest.approx(9.05, abs=0.01)
    # Holding fewer than the limit (other clients count too): the whole window.
    frees = limiter.window_frees(uploads[:10], now=NOW, seconds=86_400, limit=300, margin=0.0)
    assert frees == math.floor(NOW) + 86_401


def test_an_upload_that_may_have_left_by_lsky_s_clock_does_not_name_the_reopening() -> None:
    # An hour, one upload, Lsky's clock within 2 s of ours (the same offset when it stored
    # the upload and when it counts). Stored at a whole second t0, the upload leaves Lsky's
    # hour 3601 s after it whatever the offset; our bound for it keeps two margins more.
    t0, hour = 1_700_000_000.0, 3_600
    assert limiter.counts_surely_until(t0, hour, 2.0) == t0 + 3_600
    assert limiter.counts_until(t0, hour, 2.0) == t0 + 3_605
    # Still inside for every offset: the window frees when it leaves (our bound).
    still = limiter.window_frees([t0], now=t0 + 3_600, seconds=hour, limit=1, margin=2.0)
    assert still == t0 + 3_605
    # It may have left: Lsky's refusal then counts others' uploads, one made now frees last.
    gone = limiter.window_frees([t0], now=t0 + 3_601, seconds=hour, limit=1, margin=2.0)
    assert gone == limiter.counts_until(t0 + 3_601, hour, 2.0)
    # With no margin both bounds are Lsky's own second.
    assert limiter.counts_surely_until(NOW, hour, 0.0) == limiter.counts_until(NOW, hour, 0.0)


# -- slots: gaps, holds, bookings -------------------------------------------------------------


def test_a_record_due_now_goes_and_one_after_it_is_held_whole_seconds_to_the_free_time() -> None:
    first = slots.decide([], now=NOW, mine=None, ask=ask([(3, 1)]))
    assert (first.go, first.at) == (True, NOW)
    # The first answered at NOW: dated second 1000000, it counts until 1000004 (+0.1).
    held = slots.decide([Entry(NOW)], now=NOW, mine=None, ask=ask([(3, 1)], lead=0.5))
    assert (held.go, held.book) == (False, True)
    # Its message comes back whole seconds from now and its upload 0.5 s later: 4.75 s.
    assert held.at == pytest.approx(NOW + 4.5)
    assert held.at >= limiter.counts_until(NOW, 3, 0.1)
    # One that may sleep for it is booked at the free time itself.
    sleeper = slots.decide([Entry(NOW)], now=NOW, mine=None, ask=ask([(3, 1)], sleep_within=5))
    assert sleeper.at == pytest.approx(limiter.counts_until(NOW, 3, 0.1))


def test_a_gap_a_held_booking_leaves_is_the_next_record_s_slot() -> None:
    uploads = [Entry(NOW), Entry(NOW)]  # two uploads, two a window
    third = slots.decide(uploads, now=NOW, mine=None, ask=ask([(3, 2)], lead=0.6))
    assert third.at == pytest.approx(NOW + 4.6)  # free at 4.1 s: whole seconds + 0.6
    booked = [*uploads, Entry(third.at, state=State.BOOKED, record_id=3)]
    # The fourth comes back 0.2 s after whole seconds: 4.2 s is free (the window after
    # the first two holds the third alone), so it gets that, not a place after the third.
    fourth = slots.decide(booked, now=NOW, mine=None, ask=ask([(3, 2)], lead=0.2))
    assert fourth.at == pytest.approx(NOW + 4.2)
    assert fourth.at < third.at


def test_a_held_booking_never_lands_in_a_gap_too_short_for_its_whole_seconds() -> None:
    # Bookings at 4.1 s and 8.1 s + ... for one a window: a gap from where one leaves to
    # where the next would share its window is too short for a landing whole seconds
    # from now plus 0.5 s, so the record goes after the last booking instead.
    entries = [Entry(NOW), Entry(NOW + 3.9, state=State.BOOKED, record_id=2)]
    slot = slots.decide(entries, now=NOW, mine=None, ask=ask([(3, 1)], lead=0.5))
    assert slot.at >= limiter.counts_until(NOW + 3.9, 3, 0.1)
    landing = slot.at - (NOW + 0.5)
    assert landing == pytest.approx(round(landing))


def test_a_standing_booking_keeps_its_date_and_later_bookings_yield() -> None:
    mine = NOW + 2.0
    entries = [Entry(NOW - 5), Entry(NOW + 2.5, state=State.BOOKED, record_id=9)]
    again = slots.decide(entries, now=NOW, mine=mine, ask=ask([(3, 1)], lead=0.7))
    assert (again.book, again.at) == (True, mine)
    # Missed by more than `stale`: a fresh slot from now.
    late = slots.decide(entries, now=NOW + 200, mine=mine, ask=ask([(3, 1)]))
    assert late.go


def test_an_hour_rolled_up_is_never_counted_out_one_upload_at_a_time() -> None:
    hour = Entry(NOW - 3 * 3_600, n=300)
    slot = slots.decide([hour], now=NOW, mine=None, ask=ask([(86_400, 300)]))
    assert not slot.go
    assert slot.at >= limiter.counts_until(hour.at, 86_400, 0.1)


# -- live records before history ---------------------------------------------------------------


def test_a_live_record_takes_the_slot_a_backfilled_record_booked() -> None:
    entries = [
        Entry(NOW - 1),
        Entry(NOW + 1, state=State.BOOKED, history=True, record_id=7),
        Entry(NOW + 2, state=State.BOOKED, history=True, record_id=8),
    ]
    live = slots.decide(entries, now=NOW, mine=None, ask=ask([(10, 3)]))
    assert live.go
    assert live.displaced == (8,)  # the later booking gives way; one is enough
    history = slots.decide(entries, now=NOW, mine=None, ask=ask([(10, 3)], history=True))
    assert not history.go
    assert history.displaced == ()
    # Two a window: both bookings would share one with the upload before and this one.
    assert slots.decide(entries, now=NOW, mine=None, ask=ask([(10, 2)])).displaced == (7, 8)


def test_history_keeps_within_what_live_demand_leaves_of_each_window() -> None:
    # 20 a window; 6 live uploads in it: history may hold 20 - 6 - (1 + 2) = 11.
    assert slots.history_share(20, 6) == 11
    live = [Entry(NOW - 10 - k) for k in range(6)]
    history = [Entry(NOW - 30 - k / 10, history=True) for k in range(10)]
    backfill = ask([(60, 20)], history=True)
    assert slots.decide([*live, *history], now=NOW, mine=None, ask=backfill).go
    full = [*history, Entry(NOW - 1, history=True)]
    waits = slots.decide([*live, *full], now=NOW, mine=None, ask=backfill)
    assert not waits.go
    # A live record still goes: the share left it room.
    assert slots.decide([*live, *full], now=NOW, mine=None, ask=ask([(60, 20)])).go
