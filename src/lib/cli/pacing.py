"""What the upload lane can take, and when (pure: no I/O).

Pacing on (LSKY_RATE_LIMITS): each window's uploads, live and backfilled (the ledger), the
share live demand leaves a backfill, and a schedule of the uploads to come for ETAs. Pacing
off: the rates the ledger shows. lib.cli.admission decides a backfill's next step from it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lib.cli.progress import duration
from lib.cli.words import plural, verb
from lib.ratelimit.margins import slot_margin
from lib.ratelimit.slots import history_share, live_demand, live_margin, lsky_span
from lib.state.lane import LedgerEntry

Limits = tuple[tuple[int, int], ...]  # (window seconds, uploads), as config.rate_limits

# The schedule is worked out upload by upload this far, then extended at the steady rate.
SCHEDULE_STEPS = 5_000
_UNITS = ((86_400, "day"), (3_600, "h"), (60, "min"), (1, "s"))


def per_minute(uploads: int, window_seconds: float) -> float:
    return uploads * 60.0 / window_seconds if window_seconds > 0 else 0.0


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


def window_name(seconds: int) -> str:
    """`minute`, `hour`, `day` for Lsky's windows; `10 s` or `2 h` for others."""
    names = {60: "minute", 3_600: "hour", 86_400: "day", 604_800: "week", 2_678_400: "month"}
    if seconds in names:
        return names[seconds]
    for size, unit in _UNITS:
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"  # pragma: no cover - every int is a multiple of 1


def per_window(count: float, seconds: int) -> str:
    """`300/day`, `100/h`, `20/min`, `24/10 s`: a count per the window's own unit."""
    for size, unit in _UNITS:
        if seconds == size:
            return f"{count:.0f}/{unit}"
    return f"{count:.0f}/{window_name(seconds)}"


def rate_text(per_second: float | None) -> str:
    """A rate in the unit that reads best: `12.5/min`, `7.0/h`, `168/day`; `-/min` unknown."""
    if per_second is None or per_second <= 0 or math.isnan(per_second):
        return "-/min"
    if per_second * 60 >= 1:
        return f"{per_second * 60:.1f}/min"
    if per_second * 3_600 >= 1:
        return f"{per_second * 3_600:.1f}/h"
    return f"{per_second * 86_400:.0f}/day"


@dataclass(frozen=True)
class WindowUse:
    """One pacing window as the ledger has it now."""

    seconds: int
    limit: int
    used: int  # uploads done or under way in the window, and booked slots
    backfill: int  # of them, backfilled records'
    live: int  # live records' measured demand (lib.ratelimit.slots.live_demand, as pacing)

    @property
    def margin(self) -> int:
        """Slots a backfill leaves free for live records beyond their measured demand
        (lib.ratelimit.slots.live_margin: pacing keeps it too)."""
        return live_margin(self.live)

    @property
    def backfill_share(self) -> int:
        """Uploads of backfilled records the window may have: what live demand and the
        margin leave of its limit (lib.ratelimit.slots.history_share)."""
        return history_share(self.limit, self.live)

    @property
    def room(self) -> int:
        """Uploads a backfill may add now (its share, less what it has)."""
        return max(self.backfill_share - self.backfill, 0)

    @property
    def free(self) -> int:
        return max(self.limit - self.used, 0)


def window_uses(limits: Limits, entries: Iterable[LedgerEntry]) -> list[WindowUse]:
    """Each window's use from the ledger's entries, the window as Lsky counts it (its whole
    second and the clocks' margin longer: as pacing does); booked slots count in every
    window, and live demand looks at the window before too (read two windows back)."""
    listed = list(entries)
    live = [(e.at, e.uploads - e.backfill) for e in listed]
    margin = slot_margin(limits) if limits else 0.0
    return [
        WindowUse(
            seconds=seconds,
            limit=limit,
            used=sum(e.uploads for e in listed if e.at > -lsky_span(seconds, margin)),
            backfill=sum(e.backfill for e in listed if e.at > -lsky_span(seconds, margin)),
            live=live_demand(live, now=0.0, seconds=seconds, margin=margin),
        )
        for seconds, limit in limits
    ]


def steady_rate(limits: Sequence[tuple[int, int]]) -> float:
    """Uploads a second the tightest window allows for good."""
    return min((limit / seconds for seconds, limit in limits), default=math.inf)


def schedule_end(
    count: int, limits: Sequence[tuple[int, int]], entries: Iterable[tuple[float, int]]
) -> float | None:
    """Seconds from now until the last of `count` more uploads may start, each window
    with at most its limit (take_slot's rule: the limit-th newest entry + the window);
    `entries` are (seconds from now, uploads) the windows already have. None: never (a
    window allows nothing). Past SCHEDULE_STEPS uploads, the steady rate extends it."""
    if count <= 0:
        return 0.0
    if any(limit <= 0 for _, limit in limits):
        return None
    held: list[list[float]] = []
    ordered = sorted(entries)
    for seconds, limit in limits:
        times = [at for at, n in ordered if at > -seconds for _ in range(n)]
        held.append(times[-limit:])
    last = 0.0
    steps = min(count, SCHEDULE_STEPS)
    for _ in range(steps):
        at = last
        for (seconds, limit), times in zip(limits, held, strict=True):
            if len(times) >= limit:
                at = max(at, times[-limit] + seconds)
        for (_, limit), times in zip(limits, held, strict=True):
            bisect.insort(times, at)
            if len(times) > limit:
                del times[0]
        last = at
    return last + (count - steps) / steady_rate(limits)


def backfill_schedule(
    count: int, uses: Sequence[WindowUse], entries: Iterable[LedgerEntry]
) -> float | None:
    """When the last of `count` more backfilled uploads may start, each window with at
    most its backfill share (live demand as measured now, the margin kept free)."""
    shares = [(use.seconds, use.backfill_share) for use in uses]
    return schedule_end(count, shares, [(e.at, e.backfill) for e in entries if e.backfill])


def backlog_schedule(count: int, limits: Limits, entries: Iterable[LedgerEntry]) -> float | None:
    """When the last of `count` more uploads of any record may start, at the full limits."""
    return schedule_end(count, limits, [(e.at, e.uploads) for e in entries])


def binding(uses: Sequence[WindowUse]) -> WindowUse | None:
    """The window whose backfill share is the smallest for its length: it sets the
    backfill's steady rate."""
    return min(uses, key=lambda use: use.backfill_share / use.seconds, default=None)


def backfill_capacity(uses: Sequence[WindowUse], rows: int, eta: float | None) -> str:
    """What pacing leaves a backfill, in numbers: `300/day allowed, live uses ~120/day,
    ~168/day left for a backfill: 10000 rows need ~60.0 d`."""
    use = binding(uses)
    if use is None:
        return "pacing off"
    allowed = per_window(use.limit, use.seconds)
    live = per_window(use.live, use.seconds)
    if use.backfill_share <= 0:
        return (
            f"{allowed} allowed, live uses ~{live}: nothing is left for a backfill "
            f"({use.margin} kept free for live records' ups and downs)"
        )
    share = per_window(use.backfill_share, use.seconds)
    words = f"{allowed} allowed, live uses ~{live}, ~{share} left for a backfill"
    return (
        f"{words}: {plural(rows, 'row')} {verb(rows, 'needs', 'need')} ~{duration(eta)}"
        if rows
        else words
    )
