"""The upload lane as PostgreSQL holds it: a shared pause and the recent upload times."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

# The drain rate is the lane's uploads over this window (the sweeper, status, backfill).
DRAIN_WINDOW_SECONDS = 900


class PauseReason(enum.StrEnum):
    """image_archive_lane.pause_reason."""

    RATE_LIMIT = "rate_limit"  # Lsky's upload-count window, or HTTP 429
    RETRY_AFTER = "retry_after"  # Lsky asked for a pause (Retry-After on an error)
    ACCOUNT = "account"  # token, API switch, quota, account state: until cleared or probed
    PACING = "pacing"  # our own spacing (LSKY_RATE_LIMITS)


def uploads_within(times: Iterable[datetime], now: datetime, seconds: float) -> int:
    """How many of the lane's upload times fall in the last `seconds` before `now`."""
    since = now - timedelta(seconds=seconds)
    return sum(1 for moment in times if since < moment <= now)


def drain_per_second(times: Iterable[datetime], now: datetime) -> float:
    """Uploads per second over the last DRAIN_WINDOW_SECONDS."""
    return uploads_within(times, now, DRAIN_WINDOW_SECONDS) / DRAIN_WINDOW_SECONDS


@dataclass(frozen=True)
class LaneState:
    """image_archive_lane as one statement saw it (`now` is the database's clock)."""

    now: datetime
    paused_for_seconds: float = 0.0  # > 0 while paused
    reason: str | None = None  # rate_limit | retry_after | account | pacing
    window: str | None = None  # minute, hour, day, week, month, unknown
    upload_times: tuple[datetime, ...] = field(default=(), repr=False)
    version: int = 0
    detail: str | None = None
    paused_since: datetime | None = None

    @property
    def paused(self) -> bool:
        return self.paused_for_seconds > 0


def lane_state(row: Sequence[Any]) -> LaneState:
    """From the columns (paused_for, reason, window, upload_times, version, now[, until,
    since, detail]) that the claim and `lane_state` select."""
    paused_for, reason, window, times, version, now = row[:6]
    since, detail = (row[7], row[8]) if len(row) >= 9 else (None, None)
    return LaneState(
        now=now,
        paused_for_seconds=float(paused_for) if paused_for is not None else 0.0,
        reason=reason,
        window=window,
        upload_times=tuple(times or ()),
        version=int(version or 0),
        detail=detail,
        paused_since=since,
    )
