"""`archive-ctl status`'s upload lane: its pause, its drain (the ledger's last 15 minutes,
or with pacing on what LSKY_RATE_LIMITS allows from now: lib.cli.pacing), the backlog's
ETA, and what pacing leaves a backfill after live demand."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lib.cli import lane as lanes
from lib.cli.pacing import (
    Limits,
    backfill_capacity,
    backfill_schedule,
    backlog_eta_seconds,
    backlog_schedule,
    per_minute,
    per_window,
    steady_rate,
    window_name,
    window_uses,
)
from lib.cli.progress import duration
from lib.cli.words import plural
from lib.state.lane import DRAIN_WINDOW_SECONDS, LaneState, LedgerEntry
from lib.state.operations import LiveCounts

# `status` counts the never-queued generations (a backfill's work) up to this many.
NEVER_QUEUED_LIMIT = 100_000


@dataclass(frozen=True)
class WindowReport:
    """One pacing window now: its uploads (live and backfilled) and booked slots."""

    window: str
    seconds: int
    limit: int
    used: int
    live: int
    backfill: int
    free: int
    backfill_share: int  # what live demand and its margin leave a backfill


@dataclass(frozen=True)
class PacingReport:
    limits: str  # e.g. 20/min, 100/h, 300/day
    windows: list[WindowReport]
    never_queued: int  # counted up to never_queued_limit
    never_queued_limit: int
    backfill: str  # what pacing leaves a backfill, in words
    backfill_eta_seconds: float | None  # for the never-queued rows; None: never


@dataclass(frozen=True)
class LaneReport:
    """The upload lane: its pause (fields None while open) and its drain rate."""

    name: str
    paused: bool
    paused_until: str | None  # ISO time, or "infinity": until cleared
    paused_for_seconds: float | None  # None while open or until cleared
    reason: str | None
    window: str | None
    paused_since: str | None
    detail: str | None
    recent_uploads: int  # in the last drain_window_seconds
    drain_window_seconds: int
    drain_per_minute: float  # pacing on: what the limits allow the backlog from now
    drain_basis: str = "ledger"  # ledger: the last 15 min; limits: LSKY_RATE_LIMITS
    pacing: PacingReport | None = None


@dataclass(frozen=True)
class Backlog:
    """Rows still to upload (PENDING or RUNNING), and how long they take after the current
    pause (at the drain rate, or by the pacing limits' schedule); None when it cannot be
    told."""

    records: int
    eta_seconds: float | None


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def lane_report(
    lane: LaneState,
    *,
    backlog_records: int = 0,
    limits: Limits = (),
    entries: Sequence[LedgerEntry] = (),
    never_queued: int = 0,
) -> LaneReport:
    pause = lanes.pause_of(lane)
    recent = lane.drain_uploads
    drain = per_minute(recent, DRAIN_WINDOW_SECONDS)
    pacing = None
    if limits:
        drain = _paced_drain(backlog_records, limits, entries)
        pacing = _pacing(limits, entries, never_queued, max(lane.paused_for_seconds, 0))
    return LaneReport(
        name=lanes.LANE,
        paused=pause is not None,
        paused_until=pause.until if pause else None,
        paused_for_seconds=(
            round(pause.remaining_seconds, 1)
            if pause and math.isfinite(pause.remaining_seconds)
            else None
        ),
        reason=pause.reason if pause else None,
        window=pause.window if pause else None,
        paused_since=pause.since if pause else None,
        detail=pause.detail if pause else None,
        recent_uploads=recent,
        drain_window_seconds=DRAIN_WINDOW_SECONDS,
        drain_per_minute=round(drain, 2),
        drain_basis="limits" if limits else "ledger",
        pacing=pacing,
    )


def _paced_drain(records: int, limits: Limits, entries: Sequence[LedgerEntry]) -> float:
    """Uploads a minute the limits allow a backlog of `records` on average from now; with
    nothing to wait for (or no backlog), the tightest window's steady rate."""
    end = backlog_schedule(records, limits, entries) if records else 0.0
    if end:
        return records * 60.0 / end
    return steady_rate(limits) * 60.0


def _pacing(
    limits: Limits, entries: Sequence[LedgerEntry], never_queued: int, paused_for: float
) -> PacingReport:
    uses = window_uses(limits, entries)
    eta = backfill_schedule(never_queued, uses, entries)
    if eta is not None:
        eta += paused_for
    return PacingReport(
        limits=", ".join(per_window(limit, seconds) for seconds, limit in limits),
        windows=[
            WindowReport(
                window=window_name(use.seconds),
                seconds=use.seconds,
                limit=use.limit,
                used=use.used,
                live=use.live,
                backfill=use.backfill,
                free=use.free,
                backfill_share=use.backfill_share,
            )
            for use in uses
        ],
        never_queued=never_queued,
        never_queued_limit=NEVER_QUEUED_LIMIT,
        backfill=backfill_capacity(uses, never_queued, eta),
        backfill_eta_seconds=_round(eta if math.isfinite(paused_for) else None),
    )


def backlog(
    archive: LiveCounts,
    lane: LaneState,
    *,
    limits: Limits = (),
    entries: Sequence[LedgerEntry] = (),
) -> Backlog:
    # Rows, not messages: a queued row's message is in the queue as well (counting both
    # would count it twice), and a parked row has none but still needs its upload.
    records = archive.pending + archive.running
    paused_for = max(lane.paused_for_seconds, 0)
    if not limits:
        rate = per_minute(lane.drain_uploads, DRAIN_WINDOW_SECONDS)
        return Backlog(
            records, _round(backlog_eta_seconds(records, rate, paused_for_seconds=paused_for))
        )
    end = backlog_schedule(records, limits, entries)
    if end is None or math.isinf(paused_for):
        return Backlog(records, None)
    return Backlog(records, _round(paused_for + end if records else 0.0))


def lane_lines(lane: LaneReport | None, work: Backlog | None) -> list[str]:
    if lane is None:
        return []
    lines = [f"upload lane ({lane.name})"]
    if lane.paused and lane.paused_until is not None:
        pause = lanes.Pause(
            until=lane.paused_until,
            reason=lane.reason,
            window=lane.window,
            since=lane.paused_since,
            detail=lane.detail,
            remaining_seconds=math.inf
            if lane.paused_for_seconds is None
            else lane.paused_for_seconds,
        )
        lines.append("  " + lanes.describe(pause))
        if lane.detail:
            lines.append(f"  detail: {lane.detail}")
    else:
        lines.append("  open")
    uploads = (
        f"{lane.recent_uploads} upload{'' if lane.recent_uploads == 1 else 's'} in the last "
        f"{duration(lane.drain_window_seconds)}"
    )
    recent = per_minute(lane.recent_uploads, lane.drain_window_seconds)
    if lane.pacing is None:
        lines.append(f"  drain: {uploads} ({lane.drain_per_minute:.1f}/min)")
    else:
        lines += _pacing_lines(lane.pacing)
        lines.append(
            f"  drain: {lane.drain_per_minute:.1f}/min by the pacing limits, from now "
            f"({uploads}, {recent:.1f}/min)"
        )
    if work is not None:
        if work.eta_seconds is not None:
            eta = duration(work.eta_seconds)
        elif lane.paused_until == lanes.UNTIL_CLEARED:
            eta = "- (the lane is paused until cleared)"
        else:
            eta = f"- (nothing uploaded in the last {duration(lane.drain_window_seconds)})"
        lines.append(f"  backlog: {plural(work.records, 'record')} PENDING or RUNNING, ETA {eta}")
    if lane.pacing is not None:
        counted = lane.pacing
        never = (
            f"{counted.never_queued}{'+' * (counted.never_queued >= counted.never_queued_limit)}"
        )
        lines.append(f"  backfill: {never} never queued; {counted.backfill}")
    return lines


def _pacing_lines(pacing: PacingReport) -> list[str]:
    windows = "; ".join(
        f"{w.window}: {w.used} of {w.limit} ({w.live} live, {w.backfill} backfill), {w.free} free"
        for w in pacing.windows
    )
    return [f"  pacing {pacing.limits} (LSKY_RATE_LIMITS)", f"    {windows}"]
