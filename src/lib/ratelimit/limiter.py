"""Lsky's upload limiter as the ledger reads it (pure), from lsky-pro 2.x
ImageService::rateLimiter: an image counts in whole seconds, both ends of a window, the
month is PHP's "-1 month" (28 to 31 days); when an upload leaves a window, the longest
windows pacing keeps, and when a window Lsky named frees.
docs/explanation/lane-and-pacing.md says why."""

from __future__ import annotations

import calendar
import functools
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
    if window == MONTH:
        start = month_start(datetime.fromtimestamp(now, zone)).timestamp()
        inside = [t for t in counted if math.floor(t + margin) >= math.floor(start)]
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


def _days_before(year: int, month: int) -> int:
    """Days in the calendar month before (year, month)."""
    return calendar.monthrange(year - (month == 1), 12 if month == 1 else month - 1)[1]


def _zoned(wall: datetime, zone: tzinfo | None) -> datetime:
    """A wall-clock time in `zone` (an hour the clock repeats: its first occurrence)."""
    return wall.replace(tzinfo=zone, fold=0)


def _last_pass(wall: datetime, zone: tzinfo) -> float:
    """The last instant the wall clock in `zone` shows `wall`: in an hour it repeats (set
    back from summer time), the second pass; in one it skips, the reading after the gap."""
    return max(wall.replace(tzinfo=zone, fold=fold).timestamp() for fold in (0, 1))
