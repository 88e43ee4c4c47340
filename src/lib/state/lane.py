"""The upload lane as PostgreSQL keeps it: a shared pause, booked slots, the drain rate."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The drain rate is the lane's uploads over this window (status, backfill).
DRAIN_WINDOW_SECONDS = 900


class PauseReason(enum.StrEnum):
    """image_archive_lane.pause_reason."""

    RATE_LIMIT = "rate_limit"  # Lsky's upload-count window, or HTTP 429
    RETRY_AFTER = "retry_after"  # Lsky asked for a pause (Retry-After on an error)
    ACCOUNT = "account"  # token, API switch, quota, account state: until cleared or probed
    PACING = "pacing"  # our own spacing (LSKY_RATE_LIMITS): a booked slot, not a pause


@dataclass(frozen=True)
class LaneState:
    """image_archive_lane as one statement saw it (`now` is the database's clock)."""

    now: datetime
    paused_for_seconds: float = 0.0  # > 0 while paused
    reason: str | None = None  # rate_limit | retry_after | account
    window: str | None = None  # minute, hour, day, week, month, unknown
    detail: str | None = None
    paused_since: datetime | None = None
    queue_end: datetime | None = None  # the last slot pacing has booked, if any
    booked: int = 0  # slots booked and not used yet (lane_state only)
    drain_uploads: int = 0  # uploads in the last DRAIN_WINDOW_SECONDS (lane_state only)

    @property
    def paused(self) -> bool:
        return self.paused_for_seconds > 0

    @property
    def queued(self) -> bool:
        """Slots are booked ahead of now: records wait for slots already."""
        return self.queue_end is not None and self.queue_end > self.now


@dataclass(frozen=True)
class LedgerEntry:
    """Uploads the ledger has at one time (an hour's count at the hour's end), or a booked
    slot: `at` in seconds from now (negative: done or under way; positive: booked)."""

    at: float
    uploads: int
    backfill: int  # of them, uploads of backfilled records (history); the rest is live


def settled(
    *, counted: bool, paced: bool, keep_booking: bool = False, vanished: bool = False
) -> dict[str, bool]:
    """The parameters of settle_ledger (lib/sql/queries.sql), the ledger's side of every
    statement that ends an attempt: whether its upload may have been counted by Lsky (its
    slot kept as an upload, else given back; unpaced, `paced` False, it took none and is
    entered as it ends), whether the record comes back for its booking (else it goes), and
    whether the attempt vanished (dated the latest it could answer)."""
    return {"counted": counted, "paced": paced, "keep_booking": keep_booking, "vanished": vanished}


def lane_state(row: Sequence[Any]) -> LaneState:
    """From the columns (paused_for, reason, window, now, detail, since, queue_end[, until,
    booked, drain_uploads]) that the claim and `lane_state` select."""
    paused_for, reason, window, now, detail, since, queue_end = row[:7]
    booked, drain = (row[8], row[9]) if len(row) >= 10 else (0, 0)
    return LaneState(
        now=now,
        paused_for_seconds=float(paused_for) if paused_for is not None else 0.0,
        reason=reason,
        window=window,
        detail=detail,
        paused_since=since,
        queue_end=queue_end,
        booked=int(booked or 0),
        drain_uploads=int(drain or 0),
    )
