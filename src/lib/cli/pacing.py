"""How fast the upload lane drains, and what that allows (pure: no I/O).

The drain rate is the lane's uploads over the last DRAIN_WINDOW_SECONDS, from
LaneState.upload_times; `backfill` paces its pages on it and `status` estimates the
backlog's ETA from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.platform.sqs import MAX_BATCH_ENTRIES

# Bounds on one wait between two looks at the queue: often enough to follow the lane,
# rarely enough that a long wait costs a few requests a minute.
MIN_WAIT_SECONDS = 5.0
MAX_WAIT_SECONDS = 60.0


def per_minute(uploads: int, window_seconds: float) -> float:
    return uploads * 60.0 / window_seconds if window_seconds > 0 else 0.0


@dataclass(frozen=True)
class Pace:
    """What a backfill does next: send `rows` now, or look again in `wait_seconds`."""

    rows: int
    wait_seconds: float
    allowed_depth: int  # the deepest queue it fills to
    drain_per_minute: float


def pace(
    *, depth: int, uploads: int, window_seconds: float, max_minutes: float, page_size: int
) -> Pace:
    """Keep the queue no deeper than the lane drains in `max_minutes`.

    `depth` counts every message (visible, in flight, delayed); `uploads` is the lane's
    upload count over the last `window_seconds`. A measured rate is also capped by what
    was queued (an idle lane uploads nothing, a trickle a trickle), so one page of depth
    is always allowed: that bootstraps the run and lets the real rate show. It sends at
    least one SendMessageBatch worth of rows, or waits for the lane to make that room.
    """
    rate = per_minute(uploads, window_seconds)
    allowed = max(math.floor(rate * max_minutes), page_size)
    room = allowed - depth
    smallest = min(page_size, MAX_BATCH_ENTRIES)
    if room >= smallest:
        return Pace(min(room, page_size), 0.0, allowed, rate)
    # Until the lane has made the room; when nothing drains, just look again now and then.
    wait = (smallest - room) * 60.0 / rate if rate > 0 else MAX_WAIT_SECONDS
    return Pace(0, min(max(wait, MIN_WAIT_SECONDS), MAX_WAIT_SECONDS), allowed, rate)


def backlog_eta_seconds(
    backlog: int, drain_per_minute: float, *, paused_for_seconds: float = 0.0
) -> float | None:
    """How long `backlog` uploads take at the drain rate, after the current pause ends;
    None when it cannot be told (nothing drained lately, or paused until cleared)."""
    if backlog <= 0:
        return 0.0
    if drain_per_minute <= 0 or math.isinf(paused_for_seconds):
        return None
    return max(paused_for_seconds, 0.0) + backlog * 60.0 / drain_per_minute
