"""The upload lane's statements: its pause (image_archive_lane) and its ledger of uploads
and booked slots (image_archive_uploads, image_archive_upload_hours)."""

from __future__ import annotations

import enum
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from lib.platform.errors import ServiceError
from lib.platform.redact import outside_text
from lib.state.lane import DRAIN_WINDOW_SECONDS, LaneState, LedgerEntry, lane_state
from lib.state.queries import Statements

# A slot lost to another container is asked for again this often, after a short random
# pause; past that the attempt gives way (LaneContention: our side, no attempt spent).
SLOT_TRIES = 20
CONTENTION_PAUSE_SECONDS = (0.005, 0.05)
# The lane's pause_detail holds a host's answer: redacted, then bounded (lib.platform.redact).
PAUSE_DETAIL_LIMIT = 200
# Uploads older than the ledger's exact rows move to hourly counts this many at a time.
ROLL_UP_ROWS = 10_000


class LaneContention(ServiceError):
    """So many containers took slots at once that this one never got to read a still
    lane: nothing was taken, the attempt is given back."""


class SlotAnswer(enum.StrEnum):
    GO = "go"  # the slot is taken: upload now
    BOOKED = "booked"  # a later slot is kept for the record: come back then
    WAIT = "wait"  # a later slot would be free, none was booked
    PAUSED = "paused"  # the lane is paused: no slot at all


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
        limits: Sequence[tuple[int, int]],
        margin: float,
        tolerance: float,
        stale: float,
        book_within: float,
        sleep_within: float = 0.0,
        lead: float = 0.0,
        upload: float = 0.0,
    ) -> Slot:
        """An upload slot for `record_id` under `limits` ((seconds, uploads) pairs); see
        the take_slot statement for the rules. A slot another container took meanwhile
        makes it read the lane again (briefly, at random, so two do not collide in step)."""
        for _ in range(SLOT_TRIES):
            [[paused, go, at, now, booked, won]] = self._run(
                "take_slot",
                record_id=record_id,
                windows=[float(seconds) for seconds, _ in limits],
                limits=[int(uploads) for _, uploads in limits],
                margin=margin,
                tolerance=tolerance,
                stale=stale,
                book_within=book_within,
                sleep_within=sleep_within,
                lead=lead,
                upload=upload,
            )
            if won:
                break
            time.sleep(random.uniform(*CONTENTION_PAUSE_SECONDS))  # noqa: S311 - spread
        else:
            raise LaneContention(f"no upload slot after {SLOT_TRIES} tries: the lane is busy")
        if paused:
            answer = SlotAnswer.PAUSED
        elif go:
            answer = SlotAnswer.GO
        else:
            answer = SlotAnswer.BOOKED if booked else SlotAnswer.WAIT
        return Slot(answer, at, now)

    def settle_slot(self, record_id: int, *, counted: bool) -> None:
        """After a failed upload: its slot counts as an upload (`counted`), or is given
        back (a rate-limit refusal stored nothing)."""
        self._run("settle_slot", record_id=record_id, counted=counted)

    def cancel_booking(self, record_id: int) -> None:
        self._run("cancel_booking", record_id=record_id)

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

    def window_frees_at(self, seconds: float, limit: int) -> datetime | None:
        """When the ledger says a window Lsky named frees a slot; None: not known."""
        [[at]] = self._run("window_frees_at", seconds=seconds, limit=limit, record_id=None)
        return at if isinstance(at, datetime) else None

    def roll_up(self, *, limit: int = ROLL_UP_ROWS) -> tuple[int, int]:
        """Old uploads into hourly counts; returns (rolled up, missed bookings dropped)."""
        [[rolled, missed]] = self._run("roll_up_ledger", limit=limit)
        return int(rolled), int(missed)
