"""The slot arithmetic (lib.ratelimit.slots, lib.ratelimit.limiter) against a reference of
Lsky's limiter (tests.limiter_model, from lsky-pro's rateLimiter): random records take,
book, upload (stored, answer lost, refused), give their slot back or vanish, the clock
moves and old hours roll up, under random windows from seconds to a month in two zones.
After every step: no upload Lsky refuses, no capacity lost beyond the clock margin, and
a window Lsky names frees when the reference says. The ledger's statements are
replayed in memory here (tests/integration/test_ledger_model.py runs the real ones)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from zoneinfo import ZoneInfo

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from lib.archive import pacing
from lib.ratelimit import limiter, margins, slots
from lib.ratelimit.slots import Entry, State
from tests.limiter_model import Window, free_range, latest_free, refuses
from tests.support import model_examples

ZONES = ("Asia/Shanghai", "Europe/Berlin")  # Lsky's default, and one with summer time
LSKY_UNITS = {
    "minute": 60,
    "hour": 3_600,
    "day": 86_400,
    "week": 604_800,
    "month": limiter.LONGEST_MONTH_SECONDS,
}
UPLOAD_UNDER_WAY = slots.UNDER_WAY_SECONDS
DAY = 86_400.0
ROLL_UP_AGE = 7_200  # the sweeper's roll_up_ledger: exact rows for two hours
UNBOUNDED = math.inf


@st.composite
def windows(draw: st.DrawFn) -> list[Window]:
    """One to three limits: Lsky's own windows or scaled ones of 1 to 120 seconds."""
    chosen: dict[int, Window] = {}
    for _ in range(draw(st.integers(1, 3))):
        unit = draw(st.sampled_from([None, *LSKY_UNITS]))
        seconds = LSKY_UNITS[unit] if unit else draw(st.integers(1, 120))
        chosen[seconds] = Window(unit, seconds, draw(st.integers(1, 5)))
    return sorted(chosen.values(), key=lambda w: w.seconds)


@dataclass
class Record:
    history: bool
    booking: float | None = None
    taken: float | None = None  # when its upload started
    fate: str = ""  # what its upload comes to: stored, lost, refused, none
    created: float | None = None  # when Lsky stores its image (stored and lost fates)


@dataclass
class Ledger:
    """image_archive_uploads and image_archive_upload_hours, as the statements leave them."""

    rows: list[Entry] = field(default_factory=list)

    def without(self, record_id: int, state: State | None = None) -> None:
        self.rows = [
            e
            for e in self.rows
            if not (e.record_id == record_id and (state is None or e.state is state))
        ]

    def settle(self, record_id: int, *, counted: bool, at: float) -> None:
        """settle_ledger: the record's slot is an upload dated `at`, or given back."""
        taken = [e for e in self.rows if e.record_id == record_id and e.state is State.TAKEN]
        self.without(record_id, State.TAKEN)
        if counted:
            self.rows += [replace(e, state=State.DONE, at=at) for e in taken]


class PacedLane(RuleBasedStateMachine):
    @initialize(
        limits=windows(),
        zone=st.sampled_from(ZONES),
        clocks=st.sampled_from(["same", "skewed"]),
        start=st.floats(1.7e9, 1.9e9),  # 2023 to 2030: months of every length, DST turns
        skew=st.floats(-1.0, 1.0),
    )
    def setup(
        self, limits: list[Window], zone: str, clocks: str, start: float, skew: float
    ) -> None:
        self._set_up(limits, zone, clocks, start, skew)

    def _set_up(
        self, limits: list[Window], zone: str, clocks: str, start: float, skew: float
    ) -> None:
        self.windows = limits
        self.zone_name, self.zone = zone, ZoneInfo(zone)
        self.spans = limiter.pacing_windows([(w.seconds, w.limit) for w in limits], zone)
        if clocks == "same":
            self.margin = self.tolerance = 0.0
        else:
            self.margin = margins.slot_margin(self.spans)
            self.tolerance = margins.slot_tolerance(self.spans)
        # Lsky's clock: ours plus this, within what the margin leaves after the tolerance.
        self.skew = skew * (self.margin - self.tolerance)
        self.now = start
        self.ledger = Ledger()
        self.records: dict[int, Record] = {}
        self.images: list[float] = []  # Lsky's rows: when each was stored (our clock)
        self.uploads = 0

    # -- records ---------------------------------------------------------------------------

    @rule(history=st.booleans())
    def arrive(self, history: bool) -> None:
        self.records[len(self.records) + 1] = Record(history)

    @precondition(lambda self: self._waiting())
    @rule(
        data=st.data(),
        sleep_within=st.sampled_from([0.0, 1.0, 5.0]),
        lead=st.sampled_from([0.0, 0.3, 0.75, 2.0]),
        upload=st.sampled_from([0.0, 0.2]),
    )
    def take(self, data: st.DataObject, sleep_within: float, lead: float, upload: float) -> None:
        record_id = data.draw(st.sampled_from(self._waiting()))
        record = self.records[record_id]
        ask = slots.Ask(
            windows=self.spans,
            margin=self.margin,
            tolerance=self.tolerance,
            stale=pacing.BOOKING_STALE_SECONDS,
            book_within=pacing.BOOK_WITHIN_SECONDS,
            sleep_within=sleep_within,
            lead=lead,
            upload=upload,
            history=record.history,
            setbacks=self._setbacks(),
        )
        decision = slots.decide(self._others(record_id), now=self.now, mine=record.booking, ask=ask)
        assert decision.at >= self.now
        event("take: " + ("go" if decision.go else "booked" if decision.book else "wait"))
        if decision.displaced:
            event("take: a live slot displaced a backfilled booking")
        self.ledger.without(record_id, State.BOOKED)
        record.booking = None
        for loser in decision.displaced:
            assert not record.history
            assert self.records[loser].history
            assert self.records[loser].booking is not None
            self.ledger.without(loser, State.BOOKED)
            self.records[loser].booking = None
        if decision.go:
            # The one rule that matters: Lsky never refuses an upload pacing lets go.
            assert not refuses(self.images, self.now, self.windows, self.zone, self.skew), (
                self.now,
                decision,
            )
            record.taken = self.now
            record.fate = data.draw(st.sampled_from(["stored", "lost", "refused", "none"]))
            if record.fate in ("stored", "lost"):
                # Lsky stores it after its check, before it answers (at most 15 minutes).
                record.created = self.now + data.draw(st.floats(0.0, 5.0))
                self.images.append(record.created)
            self.ledger.rows.append(Entry(self.now, 1, State.TAKEN, record.history, record_id))
            self.uploads += 1
        elif decision.book:
            record.booking = decision.at
            self.ledger.rows.append(Entry(decision.at, 1, State.BOOKED, record.history, record_id))

    @rule(count=st.integers(1, 3))
    def unpaced(self, count: int) -> None:
        """Uploads logged without a slot (pacing was off, or another window): the ledger
        may hold more than a window's limit, as Lsky may (its deleted images, say)."""
        self.ledger.rows += [Entry(self.now) for _ in range(count)]
        self.images += [self.now] * count

    @rule(jitter=st.floats(0.0, 1.0))
    def until_the_next_slot(self, jitter: float) -> None:
        """The clock runs to the earliest slot the ledger has for a live record: the edge
        where a window frees, which the next take then tries."""
        self.now = max(self.now, self._earliest_slot()) + jitter * self.tolerance

    @precondition(lambda self: self._uploading())
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        """The upload ends: stored (or stored and its answer lost), refused for the record's
        own reason, or no upload was sent after all (the download failed, the image was
        adopted, the look-up failed, the staged copy did not match)."""
        record_id = data.draw(st.sampled_from(self._uploading()))
        record = self.records[record_id]
        assert record.taken is not None
        counted = record.created is not None
        if counted and record.created is not None:
            self.now = max(self.now, record.created)
        self.ledger.settle(record_id, counted=counted, at=self.now)
        record.taken = record.created = None

    @precondition(lambda self: self._uploading())
    @rule(data=st.data())
    def vanish(self, data: st.DataObject) -> None:
        """The container died mid-attempt; the claim or the sweeper takes the row over
        once its lock expired: its slot may have been counted."""
        record_id = data.draw(st.sampled_from(self._uploading()))
        record = self.records[record_id]
        assert record.taken is not None
        if record.created is not None:
            self.now = max(self.now, record.created)
        self.ledger.settle(
            record_id, counted=True, at=min(self.now, record.taken + UPLOAD_UNDER_WAY)
        )
        record.taken = record.created = None

    @precondition(lambda self: self._booked())
    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        """Retried, FAILED, parked, cancelled: the booking goes with the attempt."""
        record_id = data.draw(st.sampled_from(self._booked()))
        self.ledger.without(record_id, State.BOOKED)
        self.records[record_id].booking = None

    @precondition(lambda self: self._booked())
    @rule(data=st.data(), late=st.floats(-0.05, 1.0))
    def come_back(self, data: st.DataObject, late: float) -> None:
        """A booked record's message returns about when its slot comes."""
        booking = self.records[data.draw(st.sampled_from(self._booked()))].booking
        assert booking is not None
        self.now = max(self.now, booking + late)

    @rule()
    def roll_up(self) -> None:
        """roll_up_ledger: uploads older than two hours into counts at their hour's end,
        bookings missed by an hour dropped."""
        rows, hours = [], {}
        for e in self.ledger.rows:
            if e.state is State.BOOKED and e.at < self.now - 3_600 and e.record_id:
                self.records[e.record_id].booking = None
            elif e.state is not State.BOOKED and e.at < self.now - ROLL_UP_AGE:
                end = (math.floor(e.at / 3_600) + 1) * 3_600.0
                hours[(end, e.history)] = hours.get((end, e.history), 0) + e.n
            else:
                rows.append(e)
        rows += [Entry(at, n, State.DONE, history) for (at, history), n in hours.items()]
        self.ledger.rows = rows

    @rule(
        seconds=st.one_of(
            st.floats(0.001, 3.0),
            st.floats(3.0, 200.0),
            st.sampled_from([3_600.0, 86_400.0, 8 * 86_400.0, 29.5 * 86_400]),
        )
    )
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    # -- what must hold after every step ---------------------------------------------------

    @invariant()
    def no_capacity_is_lost(self) -> None:
        """With no upload under way and nothing booked, a live record's earliest slot is no
        earlier than Lsky frees every window (as long as pacing keeps each) by its count of
        the ledger's dates, whatever Lsky's clock within the margin, and no later than two
        margins after."""
        if not self._settled() or self._repeats_near():
            return  # (there the test is that Lsky refuses no upload pacing lets go)
        slot = self._earliest_slot()
        dates = [e.at for e in self.ledger.rows for _ in range(e.n)]
        lsky = max(
            latest_free(
                dates,
                now=self.now,
                window=Window(None, round(span), limit),
                zone=self.zone,
                margin=self.margin,
            )
            for span, limit in self.spans
        )
        assert lsky - 1e-6 <= slot <= lsky + 2 * self.margin + 1e-6, (slot, lsky)

    @invariant()
    def a_named_window_frees_as_lsky_counts(self) -> None:
        """lib.ratelimit.limiter.window_frees (a pause's end once Lsky named the window) frees
        no earlier than Lsky's own count of the ledger's uploads would, and no later than
        two margins after; a window the ledger holds fewer than its limit of (Lsky counts
        other clients too), when an upload made now has left it."""
        if not self._settled():
            return
        dates = [e.at for e in self.ledger.rows for _ in range(e.n)]
        for window, (span, limit) in zip(self.windows, self.spans, strict=True):
            answer = limiter.window_frees(
                dates,
                now=self.now,
                seconds=span,
                limit=limit,
                margin=self.margin,
                window=window.unit,
                zone=self.zone,
            )
            # Lsky's own window; a day or week where summer time turns: the longest.
            lsky = window
            if window.unit != "month" and span != window.seconds:
                lsky = Window(None, round(span), limit)
            first, last = free_range(
                dates, now=self.now, window=lsky, zone=self.zone, margin=self.margin
            )
            if first <= self.now < last:
                continue  # full or not, depending on Lsky's clock: either answer may be
            held = dates if first > self.now else [self.now] * limit
            expected = latest_free(
                held, now=self.now, window=lsky, zone=self.zone, margin=self.margin
            )
            assert expected - 1e-6 <= answer, (window, self.now, answer, expected)
            if not self._repeats_near():
                assert answer <= expected + 2 * self.margin + 1e-6, (answer, expected)

    # -- helpers ---------------------------------------------------------------------------

    def _earliest_slot(self) -> float:
        """The exact earliest slot for a new live record: no rounding, no sleep limit."""
        ask = slots.Ask(
            windows=self.spans,
            margin=self.margin,
            tolerance=0.0,
            stale=0.0,
            book_within=UNBOUNDED,
            sleep_within=UNBOUNDED,
            setbacks=self._setbacks(),
        )
        return slots.decide(self._others(0), now=self.now, mine=None, ask=ask).at

    def _setbacks(self) -> tuple[tuple[float, float], ...]:
        """Where Lsky's clock is set back within the windows' reach (as LaneStore reads it)."""
        reach = 2 * max(span for span, _ in self.spans) + 2 * DAY
        return limiter.setbacks(self.zone, self.now - reach, self.now + 2 * DAY)

    def _repeats_near(self) -> bool:
        """Whether an upload of an hour the clock repeats may count for a window shorter
        than a day now: there pacing counts it from the setback on (limiter.repeated), as
        the hour's first pass or its second may hold it, so it keeps slots Lsky would give."""
        reach = max(span for span, _ in self.spans) + 3 * 3_600
        return any(
            span < DAY and self.now - reach <= at <= self.now + 3 * 3_600 + span
            for at, _ in self._setbacks()
            for span, _ in self.spans
        )

    def _others(self, record_id: int) -> list[Entry]:
        """What slot_ledger reads for a record: every entry but its own booking or slot."""
        return [e for e in self.ledger.rows if e.record_id != record_id or e.state is State.DONE]

    def _waiting(self) -> list[int]:
        return [i for i, r in self.records.items() if r.taken is None]

    def _uploading(self) -> list[int]:
        return [i for i, r in self.records.items() if r.taken is not None]

    def _booked(self) -> list[int]:
        return [i for i, r in self.records.items() if r.booking is not None]

    def _settled(self) -> bool:
        """Set up, with no upload under way and nothing booked: the ledger holds uploads."""
        rows = getattr(self, "ledger", Ledger()).rows
        return hasattr(self, "ledger") and all(e.state is State.DONE for e in rows)


PacedLane.TestCase.settings = settings(max_examples=model_examples(200), stateful_step_count=50)
test_slots_against_lsky_s_limiter = pytest.mark.model(PacedLane.TestCase)

# Where Berlin sets its clocks back (03:00 summer time is 02:00 again), 2024 to 2030.
BERLIN = ZoneInfo("Europe/Berlin")
SETBACKS = [at for at, _ in limiter.setbacks(BERLIN, 1.7e9, 1.9e9)]


@st.composite
def short_windows(draw: st.DrawFn) -> list[Window]:
    """One to three windows shorter than a day: Lsky's minute and hour, or scaled ones."""
    chosen: dict[int, Window] = {}
    for _ in range(draw(st.integers(1, 3))):
        unit = draw(st.sampled_from([None, "minute", "hour"]))
        seconds = LSKY_UNITS[unit] if unit else draw(st.integers(1, 120))
        chosen[seconds] = Window(unit, seconds, draw(st.integers(1, 5)))
    return sorted(chosen.values(), key=lambda w: w.seconds)


class PacedLaneWhereTheClockIsSetBack(PacedLane):
    """The same lane in Europe/Berlin from around the hour its clock repeats: Lsky compares
    wall-clock texts, so an upload of the hour's first pass counts again in its second,
    and after it the hour's window holds uploads up to two hours old."""

    @initialize(
        limits=short_windows(),
        clocks=st.sampled_from(["same", "skewed"]),
        setback=st.sampled_from(SETBACKS),
        before=st.floats(-5_400.0, 3_600.0),
        skew=st.floats(-1.0, 1.0),
    )
    def setup_where_the_clock_is_set_back(
        self, limits: list[Window], clocks: str, setback: float, before: float, skew: float
    ) -> None:
        self._set_up(limits, "Europe/Berlin", clocks, setback + before, skew)

    def setup(  # PacedLane's own (any zone, any time) is not drawn here
        self, limits: list[Window], zone: str, clocks: str, start: float, skew: float
    ) -> None:
        raise AssertionError("not a rule of this machine")


PacedLaneWhereTheClockIsSetBack.TestCase.settings = settings(
    max_examples=model_examples(200), stateful_step_count=50
)
test_slots_where_lsky_s_clock_is_set_back = pytest.mark.model(
    PacedLaneWhereTheClockIsSetBack.TestCase
)
