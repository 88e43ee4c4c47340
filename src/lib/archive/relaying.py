"""Whether an attempt's upload may start with its download and read it as it lands (the
relayed copy, docs/explanation/transfers.md): only where the upload would start as soon as the bytes
are in hand anyway, so every rule of the transfer step (look-up, slot, upload) stands."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from lib.archive import pacing, story
from lib.platform.config import Settings
from lib.ratelimit import limiter, margins
from lib.state.claim import Task
from lib.state.events import EventLog
from lib.state.lane import LaneState
from lib.state.lane_store import LaneStore, SlotAnswer


class Attempt(Protocol):
    """What of an attempt the gate reads, and sets once the upload starts."""

    task: Task
    lane: LaneState  # as the claim saw it
    events: EventLog
    looked_up: bool
    slot_taken: bool
    upload_started: float | None


class Step(Protocol):
    """What of the transfer step the gate uses: pacing's settings, ledger and timings."""

    settings: Settings
    lanes: LaneStore
    timings: pacing.Timings


def relay_gate(at: Attempt, step: Step) -> Callable[[], bool] | None:
    """The gate Copier.fetch asks once the source's type and length are known, or None
    where the upload would not start at once: a look-up needs the bytes first (the row
    may be hosted and what was sent is unknown), or, paced, the record is booked (its slot
    is ahead: it came back early to fetch first) or queued for one before fetching."""
    task = at.task
    if task.may_be_hosted and not at.looked_up:
        return None
    paced = bool(step.settings.rate_limits)
    if paced and not at.slot_taken and (task.booked_at is not None or at.lane.queued):
        return None
    return RelayGate(at, step)


@dataclass
class RelayGate:
    """Whether the upload starts now: paced, only with the record's slot due now, taken;
    if not, nothing is written (no booking, no sleep) and the download is spooled whole, and
    the transfer step takes the slot or waits with the bytes in hand, as ever."""

    at: Attempt
    step: Step

    def __call__(self) -> bool:
        at, settings, timings = self.at, self.step.settings, self.step.timings
        if settings.rate_limits and not at.slot_taken:
            limits = limiter.pacing_windows(settings.rate_limits, settings.lsky_timezone)
            slot = self.step.lanes.take_slot(
                at.task.record_id,
                limits=limits,
                margin=margins.slot_margin(limits),
                tolerance=margins.slot_tolerance(limits),
                stale=pacing.BOOKING_STALE_SECONDS,
                book_within=0.0,  # the record has no booking (relay_gate): none is made
                lead=timings.lead(),
                upload=timings.upload + pacing.ANSWER_SLACK_SECONDS,
                zone=settings.lsky_timezone,
            )
            if slot.answer is not SlotAnswer.GO:
                return False
            story.slot(at.events, slot)
            at.slot_taken = True
        at.upload_started = time.monotonic()
        return True
