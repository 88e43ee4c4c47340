"""A reference of Lsky's upload limiter for the ledger's model-based tests: whether Lsky
refuses an upload, and when a window frees, counted as lsky-pro 2.x ImageService::
rateLimiter counts (devkit.lsky_model.window_count: rows created between Carbon's "-1
{window}" and now, whole seconds, both ends; the month a calendar month back). Searches
by brute force over Lsky's whole seconds, so it shares no arithmetic with lib.archive's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo

from devkit.lsky_model import window_count


@dataclass(frozen=True)
class Window:
    """A limit as Lsky counts it: `unit` minute ... month (Carbon's arithmetic), or None
    for a window of `seconds` elapsed (the scaled windows of tests). `seconds` is what
    LSKY_RATE_LIMITS says (a month: 31 days)."""

    unit: str | None
    seconds: int
    limit: int

    def count(self, images: Sequence[float], at: float, zone: tzinfo) -> int:
        """Rows this window counts at `at` (Lsky's clock) of those created by then."""
        made = [c for c in images if c <= at]
        return window_count(made, now=at, seconds=self.seconds, unit=self.unit, zone=zone)


def refuses(images: Sequence[float], at: float, windows: Sequence[Window], zone: tzinfo) -> bool:
    """Lsky, checking an upload at `at` on its clock, refuses it: a window holds its limit."""
    return any(w.count(images, at, zone) >= w.limit for w in windows)


def frees(
    images: Sequence[float], *, now: float, window: Window, zone: tzinfo, skew: float = 0.0
) -> float:
    """The earliest time from `now` (our clock) at which `window` holds fewer than its limit
    of `images` (no upload added), Lsky reading each image `skew` later and checking
    `skew` earlier than our clock says: its clock within `skew` of ours either way.

    The count only changes on Lsky's whole seconds, and only falls within a calendar month
    (Carbon's month start jumps back at a month's turn): a binary search over the whole
    seconds of each month, from now."""
    read = [c + skew for c in images]
    start = now - skew

    def full(at: float) -> bool:
        return window.count(read, at, zone) >= window.limit

    if not full(start):
        return now
    second = math.floor(start) + 1
    for _ in range(4):
        end = _month_end(second, zone) if window.unit == "month" else second + 10**9
        if full(end - 1):
            second = end
            continue
        low, high = second, end - 1  # full(low - 1); not full(high)
        while low < high:
            middle = (low + high) // 2
            if full(middle):
                low = middle + 1
            else:
                high = middle
        return low + skew
    raise AssertionError("no window stays full for four months")


def _month_end(second: int, zone: tzinfo) -> int:
    """The first second of the calendar month (in `zone`) after the one holding `second`."""
    wall = datetime.fromtimestamp(second, zone)
    year, month = (wall.year, wall.month + 1) if wall.month < 12 else (wall.year + 1, 1)
    return math.ceil(datetime(year, month, 1, tzinfo=zone).timestamp())
