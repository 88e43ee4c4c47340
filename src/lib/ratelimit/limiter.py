"""Lsky's upload limiter as the ledger reads it (pure), from lsky-pro 2.x
ImageService::rateLimiter: an image counts in whole seconds, both ends of a window,
compared as wall-clock text (an hour the clock repeats counts twice), the month is PHP's
"-1 month" (28 to 31 days); when an upload leaves a window, the longest windows pacing
keeps, and when a window Lsky named frees. docs/explanation/lane-and-pacing.md says why.
"""

from __future__ import annotations

import calendar
import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

from lib.platform.env_values import RATE_WINDOWS

# Lsky's clock counts in whole seconds (created_at and both ends of a window).
LSKY_SECOND = 1.0
DAY_SECONDS = 86_400
# PHP's "-1 month" reaches back as far as the month before is long: 28 to 31 days
# (LSKY_RATE_LIMITS reads "month" as the longest).
LONGEST_MONTH_SECONDS = RATE_WINDOWS["month"]
MONTH = "month"
# How long before its date an upload the ledger holds may have been stored: one answered
# within 15 minutes of its start, or an hour's roll-up (dated at the hour's end).
REPEATS_STORED_WITHIN = 3_600.0 + 900.0


def counts_until(at: float, seconds: float, margin: float) -> float:
    """The first time (epoch seconds, our clock) at which an upload the ledger dates `at`
    (no earlier than Lsky stored it) has left a window of `seconds`, as Lsky counts it,
    with Lsky's clock within `margin` of ours: its whole second, plus the window, plus
    one second (both ends count)."""
    return math.floor(at + margin) + seconds + LSKY_SECOND + margin


def counts_surely_until(at: float, seconds: float, margin: float) -> float:
    """The earliest time after which an upload the ledger dates `at` may have left a window
    of `seconds`: Lsky's clock `o` ahead of ours (|o| <= margin, the same offset when it
    stored the upload and when it counts) lets it go at floor(at + o) + seconds + 1 - o,
    whose least is just after a second turns within the margin, else at o = margin."""
    turns = math.floor(at + margin) > at - margin  # a whole second of Lsky's within reach
    base = at - LSKY_SECOND if turns else math.floor(at + margin) - margin
    return base + seconds + LSKY_SECOND


def counts_from(at: float, seconds: float, margin: float) -> float:
    """The earliest time at which an upload would still count in the window of a later one
    dated `at`: t counts there exactly when at < counts_until(t) (the inverse)."""
    return math.floor(at - seconds - LSKY_SECOND - margin) + LSKY_SECOND - margin


@functools.lru_cache(maxsize=8)
def dst_shift(zone: str) -> float:
    """How far the zone's clock moves in a year (an hour where it keeps summer time, 0 for
    Lsky's default PRC): a day, week or month on the wall clock lasts that much longer."""
    here = ZoneInfo(zone)
    year = datetime.now(UTC).year
    offsets = {
        datetime(year, month, day, tzinfo=here).utcoffset()
        for month in range(1, 13)
        for day in (1, 15)
    }
    seconds = [offset.total_seconds() for offset in offsets if offset is not None]
    return max(seconds) - min(seconds) if seconds else 0.0


@functools.lru_cache(maxsize=64)
def _setbacks_in(zone: tzinfo, year: int) -> tuple[tuple[float, float], ...]:
    """Where the zone's clock is set back in `year` (UTC): (the instant, by how many
    seconds), found a day at a time (no zone changes its offset twice in a day)."""
    found = []
    day = datetime(year, 1, 1, tzinfo=UTC).timestamp()
    end = datetime(year + 1, 1, 1, tzinfo=UTC).timestamp()
    while day < end:
        before, after = _offset(day, zone), _offset(day + DAY_SECONDS, zone)
        if after < before:
            low, high = int(day), int(day) + DAY_SECONDS  # the first second of the new offset
            while low < high:
                middle = (low + high) // 2
                low, high = (middle + 1, high) if _offset(middle, zone) == before else (low, middle)
            found.append((float(low), before - after))
        day += DAY_SECONDS
    return tuple(found)


def setbacks(zone: tzinfo, low: float, high: float) -> tuple[tuple[float, float], ...]:
    """The instants from `low` to `high` (epoch seconds) at which the zone's clock is set
    back from summer time, each with the seconds it goes back: the hour the wall clock
    then shows twice (none in Lsky's default PRC)."""
    first, last = (datetime.fromtimestamp(t, UTC).year for t in (low, high))
    return tuple(
        (at, shift)
        for year in range(first, last + 1)
        for at, shift in _setbacks_in(zone, year)
        if low <= at <= high
    )


def repeated(
    at: float,
    stored_within: float,
    *,
    seconds: float,
    margin: float,
    near: Sequence[tuple[float, float]],
) -> list[tuple[float, float]]:
    """Where a window shorter than a day (PHP's "-1 minute", "-1 hour": an elapsed span
    back, its ends bound as wall-clock text) counts an upload dated `at` (stored no more
    than `stored_within` before) again: one the clock set back (`near`: setbacks) shows
    twice counts at its second pass too, until the window's start has passed that as
    well. Each as (from, until), our clock: from the setback (when within the hour it was
    stored is not known) or once it has left the window as counted so far, until as one
    stored at its second pass (one upload: its stretches never overlap)."""
    if seconds >= DAY_SECONDS:
        return []  # a day's or longer start moves the wall clock: pacing_windows' hour
    first = counts_until(at, seconds, margin)
    again = [
        (max(back - margin, first), counts_until(min(at, back + margin) + shift, seconds, margin))
        for back, shift in near
        if back - shift - margin <= at and at - stored_within < back + margin
    ]
    return [(start, until) for start, until in again if start < until]


def pacing_windows(limits: Sequence[tuple[int, int]], zone: str) -> tuple[tuple[float, int], ...]:
    """The windows pacing keeps for LSKY_RATE_LIMITS: each as long as Lsky may count it.
    A month is already its longest (31 days, lib.platform.env_values); a window of whole
    days is counted on the wall clock, so it gains the zone's summer-time hour."""
    shift = dst_shift(zone)
    return tuple(
        (float(seconds) + (shift if seconds % DAY_SECONDS == 0 else 0.0), uploads)
        for seconds, uploads in limits
    )


def month_start(at: datetime) -> datetime:
    """Lsky's month window starts here at `at` (aware, in the app's zone): the wall clock a
    month back, the days the month before lacks running on (t less the length of the
    calendar month before t's month, on the wall clock)."""
    wall = at.replace(tzinfo=None, fold=0)
    return _zoned(wall - timedelta(days=_days_before(wall.year, wall.month)), at.tzinfo)


def month_frees(at: float, now: float, zone: tzinfo, margin: float) -> float:
    """The first time from `now` from which an upload the ledger dates `at` has left Lsky's
    month window for good (the month's start has passed its whole second), Lsky's clock
    within `margin` of ours. Within a calendar month the start only moves on, but for an
    hour the clock repeats, so the answer is the first month whose start reaches past it,
    at the latest of that month's first instant, `now`, and the last pass of the upload's
    second plus the month before's length on the wall clock."""
    target = math.floor(at + margin) + LSKY_SECOND
    earliest = max(now - margin, target)
    wall_target = datetime.fromtimestamp(target, zone).replace(tzinfo=None)
    start = datetime.fromtimestamp(earliest, zone)
    year, month = start.year, start.month
    for _ in range(4):
        first = datetime(year, month, 1)
        year, month = (year, month + 1) if month < 12 else (year + 1, 1)
        following = _zoned(datetime(year, month, 1), zone).timestamp()
        reach = wall_target + timedelta(days=_days_before(first.year, first.month))
        # The upload is out while the wall clock is past `reach`; where the clock is set
        # back over it, the repeated hour brings it back in, out for good at its last pass.
        candidate = max(_last_pass(reach, zone), _zoned(first, zone).timestamp(), earliest)
        if candidate < following:
            return candidate + margin
    raise AssertionError("a month always frees within four")  # pragma: no cover


def window_frees(
    counted: Iterable[float],
    *,
    now: float,
    seconds: float,
    limit: int,
    margin: float,
    window: str | None = None,
    zone: tzinfo = UTC,
) -> float:
    """When a window Lsky named (`window`: minute ... month; `seconds` long) frees its next
    slot by the ledger's uploads (`counted`: each upload's latest count time, epoch seconds):
    the limit-th newest upload still in it leaves it. When the ledger has fewer (other
    clients of the account count too), or that one may have left already, the whole
    window: an upload made now leaves it."""
    near = setbacks(zone, now - seconds - DAY_SECONDS, now + DAY_SECONDS)
    if window != MONTH and seconds < DAY_SECONDS and near:
        times = list(counted)
        return _frees_counted_again(
            times, now=now, seconds=seconds, limit=limit, margin=margin, near=near
        )
    if window == MONTH:
        start = month_start(datetime.fromtimestamp(now, zone)).timestamp()
        inside = [t for t in counted if _may_count_from(t, start, margin)]
    else:
        inside = [t for t in counted if counts_until(t, seconds, margin) > now]
    inside.sort(reverse=True)
    newest = inside[limit - 1] if 0 < limit <= len(inside) else now
    if window == MONTH:
        return month_frees(newest, now, zone, margin)
    if counts_surely_until(newest, seconds, margin) < now:
        # It may have left already, by Lsky's clock: then others' uploads fill the window
        # Lsky named, and one made now may be the one it waits for.
        newest = now
    return counts_until(newest, seconds, margin)


def _frees_counted_again(
    counted: list[float],
    *,
    now: float,
    seconds: float,
    limit: int,
    margin: float,
    near: Sequence[tuple[float, float]],
) -> float:
    """window_frees where Lsky's clock is set back within reach: each upload counts until
    it leaves, and again at its second pass if it may have one (`repeated`). The window
    frees at the end of the last stretch from now on that holds the limit (ended sooner,
    Lsky would refuse again in the next); and when the uploads that surely still count now
    (no second pass assumed) do not fill it (others' uploads do), no sooner than an upload
    made now has left it for good."""

    def spans(at: float) -> list[tuple[float, float]]:
        again = repeated(at, REPEATS_STORED_WITHIN, seconds=seconds, margin=margin, near=near)
        return [(-math.inf, counts_until(at, seconds, margin)), *again]

    end = _last_full([s for t in counted for s in spans(t)], now, limit)
    made_now = max(until for _, until in spans(now))
    if end is None:
        return made_now
    explained = sum(
        1
        for t in counted
        if counts_until(t, seconds, margin) > now and counts_surely_until(t, seconds, margin) >= now
    )
    return end if explained >= limit else max(end, made_now)


def _may_count_from(at: float, start: float, margin: float) -> bool:
    """Whether an upload dated `at` may be counted by a window starting at `start` (our
    clock), Lsky's clock `o` ahead (|o| <= margin; the same when it stored the upload and
    when it counts, so both move): whole seconds, floor(at + o) >= floor(start + o)."""
    behind = start - at
    if behind <= 0:
        return True
    low, high = start - margin, start + margin
    turn = math.floor(high)
    if turn > low:  # a second turns within reach: `start + o` just before it, all but one
        return behind < 1.0
    return behind <= high - turn  # else the fraction of a second at its latest


def _last_full(spans: list[tuple[float, float]], now: float, limit: int) -> float | None:
    """The end of the last stretch from `now` on in which `limit` of `spans` [from, until)
    overlap, or None."""
    points = sorted({now, *(p for span in spans for p in span if now < p < math.inf)})
    last = None
    for at, following in itertools.pairwise(points):
        if sum(1 for start, until in spans if start <= at < until) >= limit:
            last = following
    return last


def _days_before(year: int, month: int) -> int:
    """Days in the calendar month before (year, month)."""
    return calendar.monthrange(year - (month == 1), 12 if month == 1 else month - 1)[1]


def _zoned(wall: datetime, zone: tzinfo | None) -> datetime:
    """A wall-clock time in `zone` (an hour the clock repeats: its first occurrence)."""
    return wall.replace(tzinfo=zone, fold=0)


def _offset(at: float, zone: tzinfo) -> float:
    offset = datetime.fromtimestamp(at, zone).utcoffset()
    return offset.total_seconds() if offset is not None else 0.0


def _last_pass(wall: datetime, zone: tzinfo) -> float:
    """The last instant the wall clock in `zone` shows `wall`: in an hour it repeats (set
    back from summer time), the second pass; in one it skips, the reading after the gap."""
    return max(wall.replace(tzinfo=zone, fold=fold).timestamp() for fold in (0, 1))
