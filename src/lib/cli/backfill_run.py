"""One `archive-ctl backfill` run: look at the lane every second or so, send a page when
lib.cli.admission allows, redraw the progress line every second, and at the range's end
count it again, so rows another transaction locked (SKIP LOCKED) are taken or reported.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType

import pg8000.exceptions

from lib.archive.enqueue import BackfillScope, PageInterrupted, backfill_page
from lib.cli import lane as lanes
from lib.cli.admission import LOOK_SECONDS, SPEED_WINDOW_SECONDS, LaneView, Step, decide
from lib.cli.context import Context
from lib.cli.pacing import Limits, rate_text
from lib.cli.progress import Display, Meter, Progress
from lib.platform.db import describe
from lib.state.operations import OperatorRecords

# At the range's end, rows still never queued (locked by another transaction when their page
# was marked) are looked for again this many times, a second apart, before they are reported.
MAX_EMPTY_PASSES = 10


@contextmanager
def held_interrupts(warn: Callable[[str], None]) -> Iterator[Callable[[], bool]]:
    """Delay a Ctrl-C until the block (a page: rows marked, then sent) is through; yields
    whether one came. A second Ctrl-C stops at once (backfill_page settles the page).
    An ignored SIGINT stays ignored: a shell starts a background job so, that the
    terminal's Ctrl-C leaves it running, and the run keeps to that during a page too."""
    requested = False

    def came() -> bool:
        return requested

    if threading.current_thread() is not threading.main_thread():
        yield came  # signal handlers belong to the main thread; nothing to delay
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield came
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        if requested:
            raise KeyboardInterrupt
        requested = True
        warn("finishing the page being sent, then stopping (Ctrl-C again: stop now)")

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, previous)


def look(ctx: Context, records: OperatorRecords, limits: Limits) -> LaneView:
    """The lane as a backfill decides on it: its pause, booked slots, ledger and records."""
    lane_store = ctx.lanes()
    state = lane_store.state()
    pause = lanes.pause_of(state)
    longest = max((seconds for seconds, _ in limits), default=0)
    booked_ahead = 0.0
    if state.queue_end is not None:
        booked_ahead = max((state.queue_end - state.now).total_seconds(), 0.0)
    return LaneView(
        paused_for=pause.remaining_seconds if pause else 0.0,
        pause_words=lanes.brief(pause) if pause else "",
        booked_ahead=booked_ahead,
        limits=limits,
        entries=tuple(lane_store.ledger(2 * longest + 2)) if longest else (),
        recent_uploads=lane_store.uploads_within(SPEED_WINDOW_SECONDS),
        demand=records.lane_demand(),
    )


@dataclass
class Outcome:
    """What the run did, for its last lines."""

    taken: int = 0  # rows marked
    unsent: dict[int, str] = field(default_factory=dict)
    finished: bool = False  # the range was counted again at its end: nothing left
    left: int | None = None  # rows still never queued after the last pass (locked elsewhere)
    uncounted: bool = False  # the count at the range's end outlasted the statement timeout


class Backfill:
    """One run: look at the lane, send a page or wait, until the range is done."""

    def __init__(
        self,
        ctx: Context,
        records: OperatorRecords,
        queue_url: str,
        scope: BackfillScope,
        display: Display,
        *,
        limits: Limits,
    ) -> None:
        self.ctx = ctx
        self.args = ctx.args
        self.records = records
        self.scope = scope
        self.display = display
        self.queue_url = queue_url
        self.limits = limits
        self.outcome = Outcome()
        self.meter = Meter(total=None, started=ctx.clock())
        self.after: tuple[datetime, int] | None = None
        self.view: LaneView | None = None
        self._eta_at_look: float | None = None
        self._marked_this_pass = 0
        self._empty_passes = 0

    def _room(self) -> int | None:
        return None if self.args.limit is None else self.args.limit - self.outcome.taken

    def count_range(self) -> int | None:
        """Never-queued rows in the range now; None when the count outlasts the statement
        timeout (a huge range: the run does not need it, only the percentage and ETA do)."""
        scope = self.scope
        try:
            return self.records.count_backfill(
                since=scope.since, until=scope.until, user_id=scope.user_id
            )
        except pg8000.exceptions.DatabaseError as error:
            if not describe(error).startswith("57014"):
                raise
            return None

    def run(self, on_first_look: Callable[[LaneView], None]) -> None:
        total = self.count_range()
        if total is None:
            self.display.message("too many rows to count in time: progress without a total")
        self.meter.total = (
            total if total is None or self.args.limit is None else min(total, self.args.limit)
        )
        step = Step(0, 0.0)
        looked_at = -math.inf
        while (room := self._room()) is None or room > 0:
            now = self.ctx.clock()
            if now - looked_at >= step.look_in:
                first = self.view is None
                self.view = look(self.ctx, self.records, self.limits)
                looked_at = now
                if first:
                    on_first_look(self.view)
                step = decide(
                    self.view,
                    page_size=self.args.page_size,
                    ahead_seconds=self.args.ahead_seconds,
                    room_left=room,
                )
                if step.rows and (not self._page(step.rows) or self._room() == 0):
                    break
                self._eta_at_look = self.view.backfill_eta(self.meter.remaining() or 0)
            self.display.show(self._progress(step, self.ctx.clock() - looked_at), self.ctx.clock())
            self.ctx.sleep(LOOK_SECONDS)
        self.display.show(self._progress(Step(0, 0.0), 0.0), self.ctx.clock())  # as it ends

    def _progress(self, step: Step, elapsed: float) -> Progress:
        remaining = self.meter.remaining()
        eta: float | None = None
        if self.limits:
            rate = None
            if self._eta_at_look is not None:
                eta = max(self._eta_at_look - elapsed, 0.0)
                rate = remaining / eta if remaining and eta > 0 else None
        else:
            rate = self.meter.per_second(self.ctx.clock())
            if remaining is not None and rate:
                eta = remaining / rate
            elif remaining == 0:
                eta = 0.0
        return Progress(
            done=self.meter.done,
            total=self.meter.total,
            rate=rate_text(rate),
            eta=0.0 if remaining == 0 else eta,
            note=step.note(elapsed),
        )

    def _page(self, rows: int) -> bool:
        """Mark and send one page; False when the run is over."""
        with held_interrupts(self.display.message) as interrupted:
            try:
                page = backfill_page(
                    self.records,
                    self.ctx.queue,
                    self.queue_url,
                    self.scope,
                    after=self.after,
                    limit=rows,
                )
            except PageInterrupted as stopped:
                kept = len(stopped.sent) + len(stopped.left_pending) + len(stopped.uncertain)
                self.outcome.taken += kept
                self.meter.add(len(stopped.sent), self.ctx.clock())
                raise
        self.outcome.taken += len(page.marked)
        self.outcome.unsent.update(page.report.unsent)
        self.meter.add(len(page.report.sent), self.ctx.clock())
        self._marked_this_pass += len(page.marked)
        if page.last is not None:
            self.after = page.last
        if interrupted():
            raise KeyboardInterrupt
        if page.report.unsent:
            # SQS trouble: stop rather than mark more rows that would not be sent either.
            return False
        # A short page: the keyset reached the range's end (or skipped locked rows).
        return len(page.marked) == rows or self._range_end()

    def _range_end(self) -> bool:
        """Count the range again: nothing left ends the run; rows left (another transaction
        locked them, or they joined the range) are looked for from the start again, until a
        bounded number of passes found none of them."""
        left = self.count_range()
        if left == 0:
            self.outcome.finished = True
            return False
        self._empty_passes = 0 if self._marked_this_pass else self._empty_passes + 1
        self._marked_this_pass = 0
        if left is None:
            self.outcome.uncounted = True
            return False
        self.outcome.left = left
        if self._empty_passes >= MAX_EMPTY_PASSES:
            return False
        self.after = None
        return True
