"""The upload lane's statements: its pause (image_archive_lane) and its ledger of uploads
and booked slots (image_archive_uploads, image_archive_upload_hours)."""

from __future__ import annotations

import enum
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from lib.platform.errors import ServiceError
from lib.platform.redact import outside_text
from lib.ratelimit import limiter, margins, slots
from lib.state.lane import DRAIN_WINDOW_SECONDS, LaneState, LedgerEntry, lane_state
from lib.state.queries import Statements

# A slot lost to another container is asked for again this often, after a short random
# pause; past that the attempt gives way (LaneContention: our side, no attempt spent).
SLOT_TRIES = 20
CONTENTION_PAUSE_SECONDS = (0.005, 0.05)
# The lane's pause_detail has a host's answer: redacted, then bounded (lib.platform.redact).
PAUSE_DETAIL_LIMIT = 200
# Uploads older than the ledger's exact rows move to hourly counts this many at a time.
ROLL_UP_ROWS = 10_000
DAY = float(limiter.DAY_SECONDS)


class LaneContention(ServiceError):
    """So many containers took slots at once that this one never got to read a still
    lane: nothing was taken, the attempt is given back."""


class SlotAnswer(enum.StrEnum):
    GO = "go"  # the slot is taken: upload now
    BOOKED = "booked"  # a later slot is kept for the record: come back then
    WAIT = "wait"  # a later slot would be free, none was booked
    PAUSED = "paused"  # the lane is paused: no slot at all


@dataclass(frozen=True)
class _Ledger:
    """slot_ledger's read: the lane, the database's clock (`now`, and as epoch seconds), the
    record's booking and whether it is a backfill's, and the entries."""

    paused: bool
    paused_until: datetime | None
    version: int
    now: datetime
    epoch: float
    mine: float | None
    history: bool
    entries: tuple[slots.Entry, ...]


def _entry(fields: list[str]) -> slots.Entry:
    """One entry of slot_ledger's text: epoch seconds, uploads, state, history, record."""
    at, n, state, history, record = fields
    return slots.Entry(float(at), int(n), slots.State(state), history == "1", int(record) or None)


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


@dataclass(frozen=True)
class Slot:
    answer: SlotAnswer
    at: datetime | None  # when the upload may start (now for GO; None: paused until cleared)
    now: datetime  # the database's clock when it was decided

    @property
    def wait_seconds(self) -> float:
        """Seconds to the slot (inf: a pause until cleared)."""
        if self.at is None:
            return math.inf
        return max(0.0, (self.at - self.now).total_seconds())


class LaneStore(Statements):
    def state(self) -> LaneState:
        [row] = self._run("lane_state", drain_seconds=DRAIN_WINDOW_SECONDS)
        return lane_state(row)

    def pause(self, *, until: datetime | str, reason: str, window: str | None, detail: str) -> None:
        self._run(
            "pause_lane",
            until=until,
            reason=reason,
            window=window,
            detail=outside_text(detail, PAUSE_DETAIL_LIMIT),
        )

    def clear(self, *, reason: str | None = None) -> str | None:
        """Open the lane; returns the reason of the pause cleared, None if it was open."""
        rows = self._run("clear_pause", reason=reason)
        return str(rows[0][0]) if rows else None

    def unpark(self, *, spread_seconds: float, by: str, limit: int = 5_000) -> list[int]:
        """Rows parked by a pause become due within `spread_seconds`; returns their ids
        (call again until none). `by`: who reopened the lane (their `unparked` event)."""
        return [
            int(row[0])
            for row in self._run("unpark_paused", spread=spread_seconds, by=by, limit=limit)
        ]

    # -- pacing: the ledger's slots -------------------------------------------------------

    def take_slot(
        self,
        record_id: int,
        *,
        limits: Sequence[tuple[float, int]],
        margin: float,
        tolerance: float,
        stale: float,
        book_within: float,
        sleep_within: float = 0.0,
        lead: float = 0.0,
        upload: float = 0.0,
        zone: str = "UTC",
    ) -> Slot:
        """An upload slot for `record_id` under `limits` ((span seconds, uploads) pairs, as
        long as Lsky may count each: limiter.pacing_windows; `zone`: Lsky's): the ledger is
        read, the slot decided (lib.ratelimit.slots), and written only if no other slot or
        pause came meanwhile; else read again (briefly, at random, so two do not collide)."""
        # Two of the longest window back: a backfill's share looks at the window before;
        # where Lsky's clock is set back, an upload of the hour it repeats counts again.
        reach = 2 * max(seconds for seconds, _ in limits)
        guess = time.time()  # the database's clock is read with the ledger
        near = limiter.setbacks(ZoneInfo(zone), guess - reach - DAY, guess + DAY)
        reach += max((shift for _, shift in near), default=0.0)
        for _ in range(SLOT_TRIES):
            ledger = self._ledger(record_id, reach)
            if ledger.paused:
                return Slot(SlotAnswer.PAUSED, ledger.paused_until, ledger.now)
            ask = slots.Ask(
                windows=tuple(limits),
                margin=margin,
                tolerance=tolerance,
                stale=stale,
                book_within=book_within,
                sleep_within=sleep_within,
                lead=lead,
                upload=upload,
                history=ledger.history,
                setbacks=near,
            )
            decision = slots.decide(ledger.entries, now=ledger.epoch, mine=ledger.mine, ask=ask)
            kept = decision.go or decision.book
            if not kept and ledger.mine is None:
                # Nothing to write: a slot further away than a booking, none held.
                return Slot(SlotAnswer.WAIT, _at(decision.at), ledger.now)
            state = slots.State.TAKEN if decision.go else slots.State.BOOKED
            [[won, written]] = self._run(
                "take_slot",
                version=ledger.version,
                record_id=record_id,
                state=str(state) if kept else None,
                at=decision.at,
                displaced=list(decision.displaced),
            )
            if won:
                break
            time.sleep(random.uniform(*CONTENTION_PAUSE_SECONDS))  # noqa: S311 - spread
        else:
            raise LaneContention(f"no upload slot after {SLOT_TRIES} tries: the lane is busy")
        if decision.go:
            return Slot(SlotAnswer.GO, ledger.now, ledger.now)
        answer = SlotAnswer.BOOKED if decision.book else SlotAnswer.WAIT
        at = written if isinstance(written, datetime) else _at(decision.at)
        return Slot(answer, at, ledger.now)

    def window_frees_at(
        self,
        seconds: float,
        limit: int,
        *,
        margin: float | None = None,
        window: str | None = None,
        zone: str = "UTC",
        record_id: int | None = None,
    ) -> datetime:
        """When the ledger says a window Lsky named (`window`, `seconds` long; a day's or a
        week's as long as Lsky's zone makes it) frees a slot, by Lsky's arithmetic
        (lib.ratelimit.limiter.window_frees; the whole window when it has fewer than the
        limit), Lsky's clock within `margin` (default: pacing's). `record_id`: the record
        Lsky just refused, whose own slot is no upload."""
        [(seconds, limit)] = limiter.pacing_windows([(int(seconds), limit)], zone)
        if margin is None:
            margin = margins.slot_margin([(seconds, limit)])
        # A window shorter than a day counts an upload of the hour the clock repeats again.
        again = limiter.dst_shift(zone) + limiter.REPEATS_STORED_WITHIN if seconds < DAY else 0.0
        ledger = self._ledger(record_id, seconds + again)
        counted = [
            slots.count_time(entry, ledger.epoch, 0.0)
            for entry in ledger.entries
            if entry.state is not slots.State.BOOKED
            for _ in range(entry.n)
        ]
        at = limiter.window_frees(
            counted,
            now=ledger.epoch,
            seconds=seconds,
            limit=limit,
            margin=margin,
            window=window,
            zone=ZoneInfo(zone),
        )
        return _at(at)

    def _ledger(self, record_id: int | None, seconds: float) -> _Ledger:
        [row] = self._run("slot_ledger", record_id=record_id, seconds=seconds)
        paused, paused_until, version, now, epoch, mine, history, text = row
        entries = tuple(_entry(item.split(" ")) for item in str(text).split(";") if item)
        return _Ledger(
            paused=bool(paused),
            paused_until=paused_until,
            version=int(version),
            now=now,
            epoch=float(epoch),
            mine=None if mine is None else float(mine),
            history=bool(history),
            entries=entries,
        )

    def uploads_within(self, seconds: float) -> int:
        [[count]] = self._run("uploads_within", seconds=seconds, record_id=None)
        return int(count)

    def ledger(self, seconds: float) -> list[LedgerEntry]:
        """The ledger's entries of the last `seconds` and its booked slots, oldest first,
        with how many of each are backfilled records' (status and backfill, with pacing)."""
        return [
            LedgerEntry(at=float(at), uploads=int(uploads), backfill=int(backfill))
            for at, uploads, backfill in self._run("lane_ledger", seconds=seconds)
        ]

    def roll_up(self, *, limit: int = ROLL_UP_ROWS) -> tuple[int, int]:
        """Old uploads into hourly counts; returns (rolled up, missed bookings dropped)."""
        [[rolled, missed]] = self._run("roll_up_ledger", limit=limit)
        return int(rolled), int(missed)
