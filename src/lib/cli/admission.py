"""What a backfill does next, from one look at the lane (pure: no I/O).

Live records first: backfilled records go only while the lane is open, no live record waits
for it, no slot is booked ahead, and (pacing on) every window keeps live demand's share
free. Few are queued at a time, so a live record is never queued behind much."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lib.cli.pacing import (
    Limits,
    WindowUse,
    backfill_schedule,
    per_window,
    window_name,
    window_uses,
)
from lib.cli.progress import duration
from lib.cli.words import plural
from lib.state.lane import LedgerEntry
from lib.state.operations import LaneDemand

# A backfill looks at the lane this often while it sends, and at least this often while it
# waits for a time it knows (the end of a pause, a window's room).
LOOK_SECONDS = 1.0
WAIT_LOOK_SECONDS = 5.0
# The lane's speed is its uploads over this many seconds (the ledger).
SPEED_WINDOW_SECONDS = 60
# Queued backfilled records are kept to what the lane uploads in --ahead-seconds, and at least this.
MIN_AHEAD = 2


@dataclass(frozen=True)
class LaneView:
    """One look at the lane: its pause, its ledger, and the records it has."""

    paused_for: float  # > 0: a host pause (inf: until cleared)
    pause_words: str  # how `lane.brief` reads it ('' when open)
    booked_ahead: float  # seconds the booked slots reach past now (0: none)
    limits: Limits  # LSKY_RATE_LIMITS; empty: pacing off
    entries: tuple[LedgerEntry, ...]  # pacing on: the longest window's entries
    recent_uploads: int  # uploads in the last SPEED_WINDOW_SECONDS
    demand: LaneDemand
    uses: list[WindowUse] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uses", window_uses(self.limits, self.entries))

    @property
    def paced(self) -> bool:
        return bool(self.limits)

    def ahead(self, seconds: float) -> int:
        """Backfilled records that may be queued (received or not, not yet running): the
        lane's uploads in `seconds` at its speed. A live record finds no more ahead of it
        than these and the uploads under way."""
        speed = self.recent_uploads / SPEED_WINDOW_SECONDS
        return max(MIN_AHEAD, math.floor(speed * seconds))

    def backfill_eta(self, remaining: int) -> float | None:
        """Seconds until the last of `remaining` unsent rows (and those sent but with no
        slot yet) may upload, pacing on; None: never, or pacing off."""
        if not self.paced or math.isinf(self.paused_for):
            return None
        count = remaining + self.demand.backfill_unslotted
        end = backfill_schedule(count, self.uses, self.entries)
        return None if end is None else max(self.paused_for, 0.0) + end


@dataclass(frozen=True)
class Step:
    """Send `rows` now, or wait: look again in `look_in` seconds; `why` says what for,
    and the lane is expected to open `opens_in` seconds after the look (None: unknown)."""

    rows: int
    look_in: float
    why: str = ""
    opens_in: float | None = None
    opens: str = "room in"  # what happens at `opens_in`

    def note(self, elapsed: float) -> str:
        """The reason it waits, `elapsed` seconds after the look."""
        if self.opens_in is None:
            return self.why
        return f"{self.why}; {self.opens} {duration(max(self.opens_in - elapsed, 0.0))}"


def _wait(why: str, opens_in: float | None = None, opens: str = "room in") -> Step:
    look = WAIT_LOOK_SECONDS
    if opens_in is not None:
        look = min(max(opens_in, LOOK_SECONDS), WAIT_LOOK_SECONDS)
    return Step(0, look, f"waiting: {why}", opens_in, opens)


def decide(view: LaneView, *, page_size: int, ahead_seconds: float, room_left: int | None) -> Step:
    """The next step of a backfill: the lane's closures first, then how much it may send."""
    demand = view.demand
    if view.paused_for > 0:
        return _wait(f"the upload lane is {view.pause_words}", _finite(view.paused_for), "opens in")
    if demand.live_waiting:
        return _wait(f"live records first: {demand.live_waiting} waiting for the lane")
    if view.booked_ahead > 0:
        return _wait("no spare upload slot: slots are booked ahead", view.booked_ahead, "free in")
    ahead = view.ahead(ahead_seconds)
    free = ahead - demand.backfill_queued
    if free <= 0:
        return Step(
            0,
            LOOK_SECONDS,
            f"waiting: {plural(demand.backfill_queued, 'backfilled record')} queued, at most "
            f"{ahead} ahead of live records (--ahead-seconds {ahead_seconds:g})",
        )
    rows = min(page_size, free, page_size if room_left is None else room_left)
    if view.paced:
        room = min(use.room for use in view.uses) - demand.backfill_unslotted - demand.live_due
        if room <= 0:
            return _window_wait(view)
        rows = min(rows, room)
    return Step(rows, LOOK_SECONDS)


def _finite(seconds: float) -> float | None:
    return seconds if math.isfinite(seconds) else None


def _window_wait(view: LaneView) -> Step:
    """Pacing leaves a backfill no room now: which window, and when it has some."""
    use = min(view.uses, key=lambda u: (u.room, -u.seconds))
    if use.backfill_share <= 0:
        return _wait(
            f"live records use what pacing allows: {per_window(use.limit, use.seconds)} "
            f"allowed, live uses ~{per_window(use.live, use.seconds)}"
        )
    opens_in = view.backfill_eta(1)
    if use.room > 0:
        demand = view.demand
        held = demand.backfill_unslotted + demand.live_due
        taken = f"the room pacing leaves is taken by {plural(held, 'record')} in the lane"
        return _wait(taken, opens_in)
    return _wait(
        f"pacing: the {window_name(use.seconds)} window holds {use.used} of {use.limit} "
        f"({use.live} live, {use.margin} kept free for live)",
        opens_in,
    )
