"""A reference of Lsky's upload limiter for the ledger's model-based tests: whether Lsky
refuses an upload, and when a window frees, counted as lsky-pro 2.x ImageService::
rateLimiter's SQL runs (devkit.lsky_model.window_count: rows whose created_at text lies
between Carbon's "-1 {window}" and now as wall-clock text in Lsky's zone, whole seconds,
both ends; the month a calendar month back). Searches Lsky's whole seconds (every second
at which a count can change, or by halves): it shares no arithmetic with lib.archive's."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from devkit.lsky_model import window_count


@dataclass(frozen=True)
class Window:
    """A limit as Lsky counts it: `unit` minute ... month (Carbon's arithmetic), or None
    for a window of `seconds` elapsed (the scaled windows of tests, and the longest
    reading pacing keeps). `seconds`: as LSKY_RATE_LIMITS says (a month: 31 days)."""

    unit: str | None
    seconds: int
    limit: int

    def count(self, dated: Sequence[float], at: float, zone: tzinfo) -> int:
        """Rows this window counts at `at`, of rows dated `dated` (Lsky's clock)."""
        return window_count(dated, now=at, seconds=self.seconds, unit=self.unit, zone=zone)


def refuses(
    images: Sequence[float], at: float, windows: Sequence[Window], zone: tzinfo, offset: float
) -> bool:
    """Lsky refuses an upload checked at `at` (our clock; Lsky's is `offset` ahead): some
    window holds its limit of the rows stored by then (`images`, our clock)."""
    dated = [c + offset for c in images if c <= at]
    return any(w.count(dated, at + offset, zone) >= w.limit for w in windows)


def frees(
    images: Sequence[float], *, now: float, window: Window, zone: tzinfo, offset: float
) -> float:
    """The earliest time from `now` (our clock) from which `window` holds fewer than its
    limit of `images` (all stored by now; no upload added) and keeps holding fewer, Lsky's
    clock `offset` ahead of ours.

    The count only changes on Lsky's whole seconds, and only falls while the wall clock
    runs on: Carbon's month start jumps back at a month's turn, and with the clock where
    it is set back (the repeated hour). So each month is cut where the clock jumps, and
    each piece, from the month's last, searched for its first second that is not full."""
    dated = [c + offset for c in images]

    def full(at: float) -> bool:
        return window.count(dated, at, zone) >= window.limit

    if window.unit != "month":
        # The count changes only at the seconds `_changes` lists: the last of them, from
        # now's on, at which the window is full, is followed by the one that frees it.
        seconds = [math.floor(now + offset), *_changes(dated, now + offset, window, zone)]
        for index in reversed(range(len(seconds))):
            if full(seconds[index]):
                if index + 1 == len(seconds):
                    raise AssertionError("a window full for ever")
                return seconds[index + 1] - offset
        return now
    month = math.floor(now + offset)
    for _ in range(4):
        end = _month_end(month, zone)
        if full(end - 1):
            month = end
            continue
        free_from = end - 1
        for low in reversed(_clock_runs(month, end, zone)):
            free_from = _first_free(full, low, free_from)
            if free_from > low:
                break  # full just before, in this run of the clock
        if free_from <= now + offset:
            return now
        return free_from - offset
    raise AssertionError("no window stays full for four months")


BACK = {"day": 86_400, "week": 7 * 86_400}  # on the wall clock (Carbon's arithmetic)


def _changes(dated: Sequence[float], at: float, window: Window, zone: tzinfo) -> list[int]:
    """The seconds after `at` at which a window's count of rows `dated` may change (the
    text of now, or of the window's start, reaching a row's text: its first or second pass
    where the clock repeats it; or either text jumping where the clock is set back or on)."""
    back = BACK.get(window.unit or "", window.seconds)
    elapsed = window.unit not in BACK  # minute, hour, scaled: an elapsed span back
    cuts: set[int] = set()
    for second in {math.floor(c) for c in dated}:
        wall = _wall(second, zone)
        cuts |= _passes(wall, zone)  # now's text reaches the row's
        if elapsed:  # the start's text passes the row's
            cuts |= {p + back for p in _passes(wall + timedelta(seconds=1), zone)}
        else:
            cuts |= _passes(wall + timedelta(seconds=back + 1), zone)
    low = math.floor(at) - back - 86_400
    high = max(cuts, default=math.floor(at)) + back + 86_400
    for jump in _clock_runs(low, high, zone)[1:]:
        cuts |= {jump, jump + back}
        for wall in (_wall(jump - 1, zone) + timedelta(seconds=1), _wall(jump, zone)):
            cuts |= _passes(wall + timedelta(seconds=back), zone)
    return sorted(c for c in cuts if c > at)


def _wall(second: int, zone: tzinfo) -> datetime:
    return datetime.fromtimestamp(second, zone).replace(tzinfo=None)


def _passes(wall: datetime, zone: tzinfo) -> set[int]:
    """The instants the wall clock in `zone` shows `wall` (two where it repeats it; where
    it skips it, the readings on either side of the gap)."""
    return {math.floor(wall.replace(tzinfo=zone, fold=fold).timestamp()) for fold in (0, 1)}


def _first_free(full: Callable[[float], bool], low: int, high: int) -> int:
    """The first second in [low, high] from which `full` is false up to `high` (not
    full(high); `full` falls at most once there): a binary search."""
    while low < high:
        middle = (low + high) // 2
        if full(middle):
            low = middle + 1
        else:
            high = middle
    return low


def _clock_runs(low: int, end: int, zone: tzinfo) -> list[int]:
    """[low, end) cut into runs of seconds over which the zone's offset stays one (the
    wall clock runs on): each run's first second."""
    cuts = []
    step = 86_400  # no zone changes its offset twice in a day
    for at in range(low, end, step):
        after = min(at + step, end - 1)
        before = _offset(at, zone)
        if before != _offset(after, zone):  # the first second with the new offset
            cuts.append(_first_free(lambda s, b=before: _offset(s, zone) == b, at, after))
    return [low, *cuts]


def _offset(second: int, zone: tzinfo) -> timedelta | None:
    return datetime.fromtimestamp(second, zone).utcoffset()


def free_range(
    images: Sequence[float], *, now: float, window: Window, zone: tzinfo, margin: float
) -> tuple[float, float]:
    """The earliest and latest of `frees` over every offset of Lsky's clock within
    `margin` of ours: the ledger may free no earlier than the latest, and (keeping a
    margin) should free no later than two margins after it. The answer moves with the
    offset only at its ends and where the second of one of the limit newest images (the
    only ones whose leaving can free the window) turns over within the margin: those
    offsets are tried."""
    offsets = {-margin, margin}
    for c in sorted(images)[-window.limit :]:
        for second in range(math.floor(c - margin), math.floor(c + margin) + 1):
            if -margin <= second - c <= margin:
                offsets.add(second - c)
                offsets.add(max(-margin, second - c - 1e-6))
    answers = [frees(images, now=now, window=window, zone=zone, offset=o) for o in offsets]
    return min(answers), max(answers)


def latest_free(
    images: Sequence[float], *, now: float, window: Window, zone: tzinfo, margin: float
) -> float:
    return free_range(images, now=now, window=window, zone=zone, margin=margin)[1]


def _month_end(second: int, zone: tzinfo) -> int:
    """The first second of the calendar month (in `zone`) after the one holding `second`."""
    wall = datetime.fromtimestamp(second, zone)
    year, month = (wall.year, wall.month + 1) if wall.month < 12 else (wall.year + 1, 1)
    return math.ceil(datetime(year, month, 1, tzinfo=zone).timestamp())
