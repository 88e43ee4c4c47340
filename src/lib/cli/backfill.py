"""`archive-ctl backfill`: queue the SUCCEEDED generations that were never queued, a page
at a time (lib.archive.enqueue.backfill_page: rows first, then messages), paced so that
the queue holds no more than the upload lane drains in --max-queue-minutes (lib.cli.pacing).
Ctrl-C stops after the page being sent; running it again goes on where it stopped.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType

import pg8000.exceptions

from lib.archive.enqueue import BackfillScope, PageInterrupted, backfill_page
from lib.cli import lane as lanes
from lib.cli.context import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    PROG,
    CommandError,
    Context,
    out,
)
from lib.cli.pacing import (
    MAX_WAIT_SECONDS,
    MIN_WAIT_SECONDS,
    pace,
    per_minute,
)
from lib.cli.progress import Display, Meter, duration
from lib.cli.status import queue_depth
from lib.platform.db import describe
from lib.state.lane import DRAIN_WINDOW_SECONDS, PauseReason
from lib.state.lane_store import LaneStore
from lib.state.operations import OperatorRecords

# The lane's own pacing pauses last seconds and come and go with every upload slot: the
# queue depth check already follows that rhythm, so only the other pauses stop a backfill.
OWN_RHYTHM = PauseReason.PACING


def scope_of(ctx: Context) -> BackfillScope:
    args = ctx.args
    # Without --until the run takes what existed when it started: new generations are
    # the producer's to queue, and the run has an end.
    until = args.until or datetime.now(UTC)
    if args.since is not None and args.since >= until:
        raise CommandError(
            f"--since {_iso(args.since)} is not before --until {_iso(until)}: nothing to take"
        )
    return BackfillScope(since=args.since, until=until, user_id=args.user)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def _describe_scope(scope: BackfillScope) -> str:
    words = []
    if scope.since is not None:
        words.append(f"since {_iso(scope.since)}")
    if scope.until is not None:
        words.append(f"before {_iso(scope.until)}")
    if scope.user_id is not None:
        words.append(f"of user {scope.user_id}")
    return " started " + " ".join(words) if words else ""


def _count(records: OperatorRecords, scope: BackfillScope) -> int:
    return records.count_backfill(since=scope.since, until=scope.until, user_id=scope.user_id)


def dry_run(ctx: Context, records: OperatorRecords, scope: BackfillScope) -> int:
    args = ctx.args
    total = _count(records, scope)
    would = total if args.limit is None else min(total, args.limit)
    limit = "" if args.limit is None else f"; --limit {args.limit}"
    out(f"{total} SUCCEEDED generations never queued{_describe_scope(scope)}{limit}")
    out(f"would queue {would}, {args.page_size} a page, oldest generation first")
    rows = records.preview_backfill(
        since=scope.since, until=scope.until, user_id=scope.user_id, limit=min(would, args.show)
    )
    for record_id, started, user_id in rows:
        out(f"  {record_id:>12}  {_iso(started)}  user {user_id}")
    if would > len(rows):
        out(f"  ... and {would - len(rows)} more")
    pause = lanes.pause_of(ctx.lanes().state())
    if pause is not None:
        out(f"the upload lane is {lanes.describe(pause)}")
    out("dry run: nothing changed")
    return EXIT_OK


@contextmanager
def held_interrupts(warn: Callable[[str], None]) -> Iterator[Callable[[], bool]]:
    """Hold a Ctrl-C until the block (a page: rows marked, then sent) is through; yields
    whether one came. A second Ctrl-C stops at once (backfill_page settles the page)."""
    requested = False

    def came() -> bool:
        return requested

    if threading.current_thread() is not threading.main_thread():
        yield came  # signal handlers belong to the main thread; nothing to hold
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


@dataclass
class Outcome:
    """What the run did, for its last lines."""

    taken: int = 0  # rows marked
    unsent: dict[int, str] = field(default_factory=dict)
    finished: bool = False  # nothing left in the range


class Backfill:
    """One run: look at the lane and the queue, send a page or wait, until done."""

    def __init__(
        self,
        ctx: Context,
        records: OperatorRecords,
        queue_url: str,
        scope: BackfillScope,
        display: Display,
    ) -> None:
        self.ctx = ctx
        self.args = ctx.args
        self.records = records
        self.scope = scope
        self.display = display
        self.queue_url = queue_url
        self.outcome = Outcome()
        self.meter = Meter(total=None, started=ctx.clock())
        self.after: tuple[datetime, int] | None = None

    def _room(self) -> int | None:
        return None if self.args.limit is None else self.args.limit - self.outcome.taken

    def run(self) -> None:
        self.meter.total = self._total()
        while (room := self._room()) is None or room > 0:
            lane = self.ctx.lanes().state()
            uploads = lane.drain_uploads
            drain = per_minute(uploads, DRAIN_WINDOW_SECONDS)
            pause = lanes.pause_of(lane)
            if pause is not None and pause.reason != OWN_RHYTHM:
                wait = min(max(pause.remaining_seconds, MIN_WAIT_SECONDS), MAX_WAIT_SECONDS)
                self._wait(wait, drain, f"waiting: the upload lane is {lanes.describe(pause)}")
                continue
            depth = queue_depth(self.ctx.sqs, "queue", self.queue_url).total
            step = pace(
                depth=depth,
                uploads=uploads,
                window_seconds=DRAIN_WINDOW_SECONDS,
                max_minutes=self.args.max_queue_minutes,
                page_size=self.args.page_size,
            )
            if step.rows == 0:
                self._wait(
                    step.wait_seconds,
                    drain,
                    f"waiting for the queue to drain: {depth} queued, at most "
                    f"{step.allowed_depth} ({drain:.1f}/min for "
                    f"{self.args.max_queue_minutes:g} min)",
                )
                continue
            if not self._page(step.rows if room is None else min(step.rows, room), drain):
                return

    def _total(self) -> int | None:
        try:
            total = _count(self.records, self.scope)
        except pg8000.exceptions.DatabaseError as error:
            if not describe(error).startswith("57014"):
                raise
            # A count over a huge range can outlast the statement timeout; the run does
            # not need it, only the percentage and the ETA do.
            self.display.message("too many rows to count in time: progress without a total")
            return None
        return total if self.args.limit is None else min(total, self.args.limit)

    def _page(self, rows: int, drain: float) -> bool:
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
                self.outcome.taken += len(stopped.sent) + len(stopped.left_pending)
                self.meter.add(len(stopped.sent), self.ctx.clock())
                raise
        self.outcome.taken += len(page.marked)
        self.outcome.unsent.update(page.report.unsent)
        self.meter.add(len(page.report.sent), self.ctx.clock())
        if not page.marked:
            self.outcome.finished = True
            return False
        self.after = page.last
        self.display.show(self.meter, self.ctx.clock(), drain)
        if interrupted():
            raise KeyboardInterrupt
        # A short page: nothing unlocked is left after the keyset.
        self.outcome.finished = len(page.marked) < rows
        # SQS trouble: stop rather than mark more rows that would not be sent either.
        return not (self.outcome.finished or page.report.unsent)

    def _wait(self, seconds: float, drain: float, why: str) -> None:
        self.display.show(
            self.meter, self.ctx.clock(), drain, f"{why}; next look in {duration(seconds)}"
        )
        self.ctx.sleep(seconds)


def _account_pause_check(lane_store: LaneStore, *, force: bool) -> None:
    pause = lanes.pause_of(lane_store.state())
    if pause is None or pause.reason != PauseReason.ACCOUNT or force:
        return
    detail = f" ({pause.detail})" if pause.detail else ""
    raise CommandError(
        f"the upload lane is {lanes.describe(pause)}{detail}: nothing would be uploaded. "
        f"Fix the Lsky token or quota, then `{PROG} lane clear`; or pass --force to start "
        "anyway (it waits until the lane opens)"
    )


def run(ctx: Context) -> int:
    args = ctx.args
    records = ctx.records()
    scope = scope_of(ctx)
    if args.dry_run:
        return dry_run(ctx, records, scope)
    queue_url = ctx.required_queue_url()  # checked before any row is written
    _account_pause_check(ctx.lanes(), force=args.force)
    tty = sys.stderr.isatty()
    display = Display(sys.stderr, tty=tty, width=shutil.get_terminal_size().columns)
    backfill = Backfill(ctx, records, queue_url, scope, display)
    try:
        backfill.run()
    except PageInterrupted as stopped:
        display.finish()
        _report(backfill)
        if stopped.put_back:
            out(
                f"{len(stopped.put_back)} rows of the page being sent were put back: never "
                "queued, the next run takes them"
            )
        if stopped.left_pending:
            out(
                f"{len(stopped.left_pending)} rows of that page are PENDING without a "
                "message: the sweeper sends them"
            )
        return _interrupted()
    except KeyboardInterrupt:
        display.finish()
        _report(backfill)
        return _interrupted()
    finally:
        display.finish()  # so that an error's line starts on a line of its own
    return _report(backfill)


def _interrupted() -> int:
    out(f"interrupted: run the same `{PROG} backfill` again to go on (no row is queued twice)")
    print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _report(backfill: Backfill) -> int:
    outcome = backfill.outcome
    sent = backfill.meter.done
    for record_id, reason in outcome.unsent.items():
        out(f"{'NOT SENT':<9} {record_id}: {reason}")
    scope = _describe_scope(backfill.scope)
    out(f"{sent} queued{scope}, {len(outcome.unsent)} not sent")
    if outcome.finished:
        out(f"no never-queued SUCCEEDED generations left{scope}")
    elif backfill.args.limit is not None and outcome.taken >= backfill.args.limit:
        out(f"--limit {backfill.args.limit} reached")
    if outcome.unsent:
        out(
            "the records not sent are PENDING: the sweeper sends them once they are past "
            "its grace period"
        )
        return EXIT_PARTIAL
    return EXIT_OK
