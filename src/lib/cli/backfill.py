"""`archive-ctl backfill`: queue the SUCCEEDED generations that were never queued, a page
at a time (lib.archive.enqueue.backfill_page: rows first, then messages), live records
first: only into the room the lane leaves them (lib.cli.admission, lib.cli.backfill_run).
Ctrl-C stops after the page being sent; running it again goes on where it stopped.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from datetime import UTC, datetime

from lib.archive.enqueue import BackfillScope, PageInterrupted
from lib.cli import lane as lanes
from lib.cli.admission import LaneView
from lib.cli.backfill_run import Backfill, look
from lib.cli.context import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    PROG,
    CommandError,
    Context,
)
from lib.cli.pacing import Limits, backfill_capacity
from lib.cli.progress import Display
from lib.cli.words import plural, verb
from lib.platform.config import pacing_limits
from lib.state.lane import PauseReason
from lib.state.lane_store import LaneStore
from lib.state.operations import OperatorRecords


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


def dry_run(ctx: Context, records: OperatorRecords, scope: BackfillScope, limits: Limits) -> int:
    args = ctx.args
    total = records.count_backfill(since=scope.since, until=scope.until, user_id=scope.user_id)
    would = total if args.limit is None else min(total, args.limit)
    rows = records.preview_backfill(
        since=scope.since, until=scope.until, user_id=scope.user_id, limit=min(would, args.show)
    )
    pause = lanes.pause_of(ctx.lanes().state())
    pacing = None
    if limits:
        view = look(ctx, records, limits)
        pacing = backfill_capacity(view.uses, would, view.backfill_eta(would))
    ctx.answer(
        {
            "dry_run": True,
            "never_queued": total,
            "would_queue": would,
            "page_size": args.page_size,
            "records": [
                {"id": record_id, "started_at": started, "user_id": user_id}
                for record_id, started, user_id in rows
            ],
            "lane_pause": None if pause is None else lanes.as_json(pause),
            "pacing": pacing,
        }
    )
    limit = "" if args.limit is None else f"; --limit {args.limit}"
    never = plural(total, "SUCCEEDED generation")
    ctx.say(f"{never} never queued{_describe_scope(scope)}{limit}")
    ctx.say(f"would queue {would}, {args.page_size} a page, oldest generation first")
    for record_id, started, user_id in rows:
        ctx.say(f"  {record_id:>12}  {_iso(started)}  user {user_id}")
    if would > len(rows):
        ctx.say(f"  ... and {would - len(rows)} more")
    if pause is not None:
        ctx.say(f"the upload lane is {lanes.describe(pause)}")
    if pacing is not None:
        ctx.say(f"pacing: {pacing}")
    ctx.say("dry run: nothing changed")
    return EXIT_OK


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


def announce(display: Display, limits: Limits, backfill: Backfill) -> Callable[[LaneView], None]:
    """The capacity the run can count on, in numbers, from its first look at the lane."""

    def say(view: LaneView) -> None:
        if not limits:
            display.message(
                "pacing off (LSKY_RATE_LIMITS unset here): live records first within the "
                f"lane's speed (history kept to ~{backfill.args.ahead_seconds:g} s of uploads "
                "ahead of them), but no room is kept within the host's own limits; set "
                "LSKY_RATE_LIMITS as the archive function has it"
            )
            return
        rows = backfill.meter.remaining() or 0
        eta = view.backfill_eta(rows) if rows else None
        display.message(f"pacing: {backfill_capacity(view.uses, rows, eta)}")

    return say


def run(ctx: Context) -> int:
    args = ctx.args
    records = ctx.records()
    scope = scope_of(ctx)
    limits = pacing_limits()  # read before any row is written: a bad value stops here
    if args.dry_run:
        return dry_run(ctx, records, scope, limits)
    queue_url = ctx.required_queue_url()  # checked before any row is written
    _account_pause_check(ctx.lanes(), force=args.force)
    tty = sys.stderr.isatty()
    display = Display(sys.stderr, tty=tty, width=lambda: shutil.get_terminal_size().columns)
    backfill = Backfill(ctx, records, queue_url, scope, display, limits=limits)
    try:
        backfill.run(on_first_look=announce(display, limits, backfill))
    except PageInterrupted as stopped:
        display.finish()
        _report(backfill, stopped=stopped)
        if put_back := len(stopped.put_back):
            ctx.say(
                f"{plural(put_back, 'row')} of the page being sent "
                f"{verb(put_back, 'was', 'were')} put back: never queued, the next run takes "
                f"{verb(put_back, 'it', 'them')}"
            )
        if uncertain := len(stopped.uncertain):
            ctx.say(
                f"{plural(uncertain, 'row')} of that page {verb(uncertain, 'was', 'were')} in "
                "the batch whose answer never came (SQS may have taken it): left PENDING, not "
                "put back; the sweeper sends any whose message did not arrive (its "
                "lost-message rule)"
            )
        if pending := len(stopped.left_pending):
            ctx.say(
                f"{plural(pending, 'row')} of that page {verb(pending, 'is', 'are')} PENDING "
                f"without a message: the sweeper sends {verb(pending, 'it', 'them')}"
            )
        return _interrupted(ctx)
    except KeyboardInterrupt:
        display.finish()
        _report(backfill, interrupted=True)
        return _interrupted(ctx)
    finally:
        display.finish()  # so that an error's line starts on a line of its own
    return _report(backfill)


def _interrupted(ctx: Context) -> int:
    ctx.say(f"interrupted: run the same `{PROG} backfill` again to go on (no row is queued twice)")
    print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _report(
    backfill: Backfill, *, interrupted: bool = False, stopped: PageInterrupted | None = None
) -> int:
    ctx = backfill.ctx
    outcome = backfill.outcome
    sent = backfill.meter.done
    limit = backfill.args.limit
    limit_reached = limit is not None and outcome.taken >= limit
    uncertain = [] if stopped is None else stopped.uncertain
    ctx.answer(
        {
            "queued": sent,
            "unsent": {str(k): v for k, v in outcome.unsent.items()},
            "uncertain": uncertain,
            "finished": outcome.finished,
            "limit_reached": limit_reached,
            "left": outcome.left,
            "uncounted": outcome.uncounted,
            "interrupted": interrupted or stopped is not None,
            "put_back": [] if stopped is None else stopped.put_back,
        }
    )
    for record_id, reason in outcome.unsent.items():
        ctx.say(f"{'NOT SENT':<9} {record_id}: {reason}")
    scope = _describe_scope(backfill.scope)
    maybe = f", {len(uncertain)} uncertain (sent or not: its answer never came)" * bool(uncertain)
    ctx.say(f"{sent} queued{scope}, {len(outcome.unsent)} not sent{maybe}")
    code = EXIT_OK
    if outcome.finished:
        ctx.say(f"no never-queued SUCCEEDED generations left{scope} (counted again)")
    elif limit_reached:
        ctx.say(f"--limit {limit} reached")
    elif outcome.left is not None:
        ctx.say(
            f"{plural(outcome.left, 'never-queued SUCCEEDED generation')} still left{scope}: "
            f"another transaction held {verb(outcome.left, 'it', 'them')} each time "
            f"{verb(outcome.left, 'it was', 'they were')} looked for; run the same backfill "
            f"again to take {verb(outcome.left, 'it', 'them')}"
        )
        code = EXIT_PARTIAL
    elif outcome.uncounted:
        ctx.say("the range could not be counted again in time: run the same backfill to check")
        code = EXIT_PARTIAL
    if outcome.unsent:
        ctx.say(
            "the records not sent are PENDING: the sweeper sends them once they are past "
            "its grace period"
        )
        code = EXIT_PARTIAL
    return code
