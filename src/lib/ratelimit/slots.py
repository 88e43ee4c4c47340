"""Pacing's upload slots (pure): from the ledger's entries, the earliest time a record's
upload may start under LSKY_RATE_LIMITS and what it books. LaneStore.take_slot reads the
ledger, asks `decide`, and writes the answer under the lane's version;
docs/explanation/lane-and-pacing.md ("When a record runs") gives each rule's reason."""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from lib.ratelimit.limiter import LSKY_SECOND, counts_from, counts_until, repeated

# An upload under way counts from now until it answers, never past an invocation's 15 min.
UNDER_WAY_SECONDS = 900.0
# How long before its date an entry's uploads may have been stored: an upload before it
# answered; an hour's roll-up (no record, dated at the hour's end) within that hour.
ROLLED_UP_WITHIN = 3_600.0 + UNDER_WAY_SECONDS


class State(enum.StrEnum):
    """image_archive_uploads.state."""

    DONE = "done"  # Lsky answered (dated then), or may have stored it (a lost answer)
    TAKEN = "taken"  # under way: dated when it started
    BOOKED = "booked"  # a future upload time kept for one record


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of the ledger: `at` in epoch seconds (our database's clock); `n` uploads
    (an hour's roll-up: many, dated at the hour's end); `history`: a backfilled record's."""

    at: float
    n: int = 1
    state: State = State.DONE
    history: bool = False
    record_id: int | None = None


@dataclass(frozen=True)
class Ask:
    """What an attempt asks for (seconds): `windows` (span, limit) as long as Lsky may count
    them (limiter.pacing_windows); `margin` for the two clocks; taken at once when due within
    `tolerance`; a booking missed by more than `stale` is given up; booked only within
    `book_within`; `sleep_within`: the attempt may sleep that long for it (booked as it
    is); `lead`: a held message's upload follows its return by this much; `upload`: how
    long an upload takes to answer; `history`: the record is a backfill's; `setbacks`:
    where Lsky's zone sets its clock back within reach (limiter.setbacks)."""

    windows: Sequence[tuple[float, int]]
    margin: float
    tolerance: float
    stale: float
    book_within: float
    sleep_within: float = 0.0
    lead: float = 0.0
    upload: float = 0.0
    history: bool = False
    setbacks: Sequence[tuple[float, float]] = ()


@dataclass(frozen=True)
class Decision:
    """`go`: upload now (`at` is now). Else `at` is the slot, and `book` whether the record
    keeps it booked (within book_within); `displaced`: backfilled records whose bookings
    this live record's slot takes over (they book again when they come back)."""

    go: bool
    at: float
    book: bool
    displaced: tuple[int, ...] = ()


def count_time(entry: Entry, now: float, upload: float) -> float:
    """The latest time Lsky can count `entry`: a done upload when Lsky answered; one under
    way when it should answer, and not before now (never past UNDER_WAY_SECONDS); a booked
    slot when its upload should answer."""
    if entry.state is State.DONE:
        return entry.at
    if entry.state is State.TAKEN:
        return max(entry.at + upload, min(now, entry.at + UNDER_WAY_SECONDS))
    return entry.at + upload


def live_margin(live: int) -> int:
    """Slots kept free for live records beyond their measured demand: one, plus the square
    root of that demand (its usual ups and downs)."""
    return 1 + math.isqrt(max(live, 0))


def lsky_span(seconds: float, margin: float) -> float:
    """How long back an upload may still count in a window of `seconds` as Lsky counts it:
    its whole second and both ends add one, the clocks' margin one on each side."""
    return seconds + LSKY_SECOND + 2 * margin


def live_demand(
    live: Iterable[tuple[float, int]], *, now: float, seconds: float, margin: float
) -> int:
    """Live records' demand on a window: their entries (time, uploads) in the window as
    Lsky counts it (its second and the margin longer) up to now and booked after, or in
    the window before if more (live records a window apart share one such window)."""
    span = lsky_span(seconds, margin)
    listed = list(live)
    recent = sum(n for at, n in listed if at > now - span)
    before = sum(n for at, n in listed if now - 2 * span < at <= now - span)
    return max(recent, before)


def history_share(limit: int, live: int) -> int:
    """Uploads of backfilled records a window may have: what live demand (`live` entries
    of live records in it) and the live margin leave of its limit."""
    return max(limit - live - live_margin(live), 0)


def decide(entries: Sequence[Entry], *, now: float, mine: float | None, ask: Ask) -> Decision:
    """The slot for one record, `mine` its booking (None: none). The lower bound is now, or
    its booking when that stands (missed by no more than ask.stale): a standing booking is
    measured against the uploads made so far only (the bookings after it were measured from
    it, and yield). A live record does not count backfilled records' bookings: it takes
    the slot and they are `displaced`. A backfilled record keeps within each window's
    backfill share (history_share) as well as its limit."""
    standing = mine is not None and mine >= now - ask.stale
    low = max(mine, now) if standing and mine is not None else now
    counted, displaceable = _units(entries, now=now, standing=standing, ask=ask)
    blocked: list[tuple[float, float]] = []
    for seconds, limit in ask.windows:
        units = _counted_again(counted, seconds, ask)
        blocked += [(start, end) for start, end, _, _ in _runs(units, seconds, limit, ask.margin)]
        if ask.history:
            blocked += _history_blocked(units, now=now, seconds=seconds, limit=limit, ask=ask)
    islands = _islands([(start, end) for start, end in blocked if end > low])
    exact = _free_from(islands, low)
    go = exact <= now + ask.tolerance
    if go:
        at = now
    elif exact <= now + ask.sleep_within or (standing and exact == mine):
        at = exact
    else:
        at = _held(islands, exact, origin=now + ask.lead, tolerance=ask.tolerance)
    book = not go and at <= now + ask.book_within
    displaced: tuple[int, ...] = ()
    if displaceable and (go or book):
        displaced = _displace(counted, displaceable, at=at, ask=ask)
    return Decision(go=go, at=at, book=book, displaced=displaced)


# -- the blocked times ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Unit:
    time: float  # count_time (a second pass's: from when it may count again)
    n: int
    history: bool
    booked: bool
    record_id: int | None
    until: float | None = None  # a second pass's: when it has left for good


def _counted_again(units: list[_Unit], seconds: float, ask: Ask) -> list[_Unit]:
    """The units with those Lsky counts again where its clock is set back (a window shorter
    than a day compares wall-clock texts: limiter.repeated), each a unit of its own."""
    again = [
        _Unit(start, u.n, u.history, u.booked, u.record_id, until)
        for u in units
        for start, until in repeated(
            u.time,
            UNDER_WAY_SECONDS if u.record_id is not None else ROLLED_UP_WITHIN,
            seconds=seconds,
            margin=ask.margin,
            near=ask.setbacks,
        )
    ]
    return sorted([*units, *again], key=lambda u: u.time) if again else units


def _units(
    entries: Sequence[Entry], *, now: float, standing: bool, ask: Ask
) -> tuple[list[_Unit], list[_Unit]]:
    """The entries that count for this record, by time, and (for a live record) the
    backfilled records' bookings it may take over."""
    oldest = now - 2 * (
        max((seconds for seconds, _ in ask.windows), default=0.0) + LSKY_SECOND + 2 * ask.margin
    )  # history looks two windows back; an upload the clock shows twice, its hour more
    oldest -= max((shift for _, shift in ask.setbacks), default=0.0)
    counted: list[_Unit] = []
    displaceable: list[_Unit] = []
    for entry in entries:
        if standing and entry.at > now:
            continue
        booked = entry.state is State.BOOKED
        unit = _Unit(
            count_time(entry, now, ask.upload), entry.n, entry.history, booked, entry.record_id
        )
        if unit.time <= oldest:
            continue
        if booked and entry.history and not ask.history and entry.record_id is not None:
            displaceable.append(unit)
        else:
            counted.append(unit)
    counted.sort(key=lambda u: u.time)
    displaceable.sort(key=lambda u: u.time)
    return counted, displaceable


def _runs(
    units: Sequence[_Unit], seconds: float, limit: int, margin: float
) -> Iterator[tuple[float, float, int, int]]:
    """Each run of `limit` uploads sharing one Lsky window of `seconds`, from unit i to unit
    j (the first whose running count reaches i's count before it plus the limit: an hour's
    roll-up is never counted out one upload at a time), as the times it blocks:
    [counts_from(j), counts_until(i))."""
    if limit <= 0:
        yield -math.inf, math.inf, 0, len(units) - 1
        return
    upto: list[int] = []
    total = 0
    for unit in units:
        total += unit.n
        upto.append(total)
    j = 0
    for i, unit in enumerate(units):
        target = upto[i] - unit.n + limit
        while j < len(units) and upto[j] < target:
            j += 1
        if j == len(units):
            return
        until = counts_until(unit.time, seconds, margin) if unit.until is None else unit.until
        if units[j].time < until:
            yield counts_from(units[j].time, seconds, margin), until, i, j


def _history_blocked(
    counted: Sequence[_Unit], *, now: float, seconds: float, limit: int, ask: Ask
) -> list[tuple[float, float]]:
    """A backfilled record's further bound: backfilled records' uploads within the window's
    backfill share, live demand measured as `live_demand` measures it."""
    live = [(u.time, u.n) for u in counted if not u.history]
    share = history_share(limit, live_demand(live, now=now, seconds=seconds, margin=ask.margin))
    if share <= 0:
        # Nothing is left for backfilled records now: look again once a window has passed.
        return [(-math.inf, now + seconds + LSKY_SECOND + 2 * ask.margin)]
    history = [u for u in counted if u.history]
    return [(start, end) for start, end, _, _ in _runs(history, seconds, share, ask.margin)]


def _islands(blocked: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The blocked times merged into disjoint stretches [start, end), in order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(blocked):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _inside(islands: Sequence[tuple[float, float]], at: float) -> tuple[float, float] | None:
    """The stretch with `at` in it, if any."""
    index = bisect.bisect_right(islands, (at, math.inf)) - 1
    if index >= 0 and islands[index][0] <= at < islands[index][1]:
        return islands[index]
    return None


def _free_from(islands: Sequence[tuple[float, float]], low: float) -> float:
    """The earliest free time at or after `low`: it, or the end of the stretch it is in."""
    stretch = _inside(islands, low)
    return low if stretch is None else stretch[1]


def _held(
    islands: Sequence[tuple[float, float]], exact: float, *, origin: float, tolerance: float
) -> float:
    """The earliest free time a held message's upload can land on: `origin` plus whole
    seconds, at or after a free time (the exact slot, or the end of a blocked stretch after
    it). Landing within `tolerance` before that time, the upload takes it (a slot due
    within the tolerance is taken), so the booking is dated at it."""
    ends = [end for _, end in islands if end > exact]
    for free in (exact, *ends):
        landing = max(free, origin + math.ceil(free - origin - tolerance))
        if _inside(islands, landing) is None:
            return landing
    raise AssertionError("past the last stretch nothing is blocked")  # pragma: no cover


def _displace(
    counted: Sequence[_Unit], displaceable: Sequence[_Unit], *, at: float, ask: Ask
) -> tuple[int, ...]:
    """The backfilled records' bookings a live slot at `at` takes over: while a window's run
    of entries around `at` includes such bookings, the latest of them gives way."""
    kept = list(displaceable)
    displaced: list[int] = []
    while kept:
        units = sorted([*counted, *kept], key=lambda u: u.time)
        loser = _blocking_booking(units, at=at, ask=ask)
        if loser is None:
            break
        kept.remove(loser)
        if loser.record_id is not None:
            displaced.append(loser.record_id)
    return tuple(displaced)


def _blocking_booking(units: Sequence[_Unit], *, at: float, ask: Ask) -> _Unit | None:
    for seconds, limit in ask.windows:
        for start, end, i, j in _runs(units, seconds, limit, ask.margin):
            if start <= at < end:
                bookings = [u for u in units[i : j + 1] if u.booked and u.history]
                if bookings:
                    return bookings[-1]
    return None
