"""Pacing (LSKY_RATE_LIMITS): reserve an upload slot in the lane's shared log before an
upload, optimistically, sleeping through short waits (docs/archive.md says why)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from lib.archive.copier import can_start
from lib.archive.lane import next_upload_at, upload_time_margin
from lib.state.lane import LaneState
from lib.state.lane_store import LaneStore

# Pacing: a wait up to this long is slept through (when the invocation has the time) rather
# than paid for with a second invocation; the event source's MaximumConcurrency keeps the
# other messages in the queue meanwhile, unreceived.
PACING_SLEEP_SECONDS = 60.0
# Optimistic reservations retried this often before the attempt gives way.
RESERVE_TRIES = 20
# After a reservation lost to another container: a short random pause before reading the
# lane again, so two containers do not collide in step; a contention that outlasts every
# try closes the lane this long.
CONTENTION_PAUSE_SECONDS = (0.01, 0.1)
CONTENTION_GIVE_WAY_SECONDS = 1.0


def reserve_upload(
    lanes: LaneStore,
    limits: Sequence[tuple[int, int]],
    lane: LaneState,
    claimed_at: float,
    deadline: float,
) -> datetime | None:
    """Pacing: take an upload slot (None) or say until when the lane is closed. Short
    waits are slept through; the log is shared through the lane row, optimistically."""
    longest_window = max(seconds for seconds, _ in limits)
    longest = timedelta(seconds=longest_window + upload_time_margin(longest_window))
    for _ in range(RESERVE_TRIES):
        now = db_now(lane, claimed_at)
        free = next_upload_at(lane.upload_times, limits, now)
        recent = [t for t in lane.upload_times if t > now - longest]
        if free <= now:
            if lanes.reserve_upload(
                version=lane.version, upload_times=[*recent, now], closed_until=None
            ):
                return None
            time.sleep(random.uniform(*CONTENTION_PAUSE_SECONDS))  # noqa: S311 - spread, not secret
        elif (free - now).total_seconds() <= PACING_SLEEP_SECONDS and can_start(
            deadline - (free - now).total_seconds()
        ):
            time.sleep((free - now).total_seconds())
        elif lanes.reserve_upload(version=lane.version, upload_times=recent, closed_until=free):
            return free
        lane, claimed_at = lanes.state(), time.monotonic()
    # Contention on every try: give way briefly rather than overrun the limits.
    return db_now(lane, claimed_at) + timedelta(seconds=CONTENTION_GIVE_WAY_SECONDS)


def db_now(lane: LaneState, since: float) -> datetime:
    """The database's clock (read by the claim) moved on by the time elapsed here."""
    return lane.now + timedelta(seconds=time.monotonic() - since)
