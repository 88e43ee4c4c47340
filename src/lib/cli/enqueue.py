"""`archive-ctl enqueue` and `archive-ctl requeue`: lib.archive.enqueue does the work (row
first, then message); this module reads the ids and the selection and prints the report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from lib.archive import enqueue as enqueueing
from lib.cli import listing
from lib.cli.args import record_id, selection_of
from lib.cli.context import EXIT_OK, EXIT_PARTIAL, Context, UsageError
from lib.cli.words import plural
from lib.state.events import Actor
from lib.state.selection import Selection


def _read_ids(values: Sequence[str]) -> list[int]:
    words = sys.stdin.read().split() if list(values) == ["-"] else list(values)
    try:
        return [record_id(word) for word in words]
    except argparse.ArgumentTypeError as error:
        raise UsageError(str(error)) from None


def _report_json(report: enqueueing.EnqueueReport) -> dict[str, Any]:
    return {
        "sent": report.sent,
        "skipped": {str(k): v for k, v in report.skipped.items()},
        "missing": report.missing,
        "unsent": {str(k): v for k, v in report.unsent.items()},
    }


def _left_lines(ctx: Context, report: enqueueing.EnqueueReport) -> None:
    for record, reason in report.skipped.items():
        ctx.say(f"{'skipped':<9} {record}: {reason}")
    for record in report.missing:
        ctx.say(f"{'missing':<9} {record}: no such record")


def _print_report(ctx: Context, report: enqueueing.EnqueueReport, verb: str) -> int:
    ctx.answer(_report_json(report))
    for record in report.sent:
        ctx.say(f"{verb:<9} {record}")
    _left_lines(ctx, report)
    for record, reason in report.unsent.items():
        ctx.say(f"{'NOT SENT':<9} {record}: {reason}")
    ctx.say(
        f"{len(report.sent)} sent, {len(report.skipped)} skipped, "
        f"{len(report.missing)} not found, {len(report.unsent)} not sent"
    )
    if report.unsent:
        ctx.say(
            "the records not sent are PENDING: the sweeper sends them once they are past its "
            "grace period, or run this command again"
        )
    return EXIT_OK if report.ok else EXIT_PARTIAL


def run_enqueue(ctx: Context) -> int:
    ids = _read_ids(ctx.args.record_ids)
    if not ids:
        raise UsageError("no record ids given")
    queue_url = ctx.required_queue_url()  # checked before any row is written
    report = enqueueing.enqueue(ctx.records(), ctx.queue, queue_url, ids, by=Actor.ENQUEUE)
    return _print_report(ctx, report, "sent")


def requeue_selection(args: argparse.Namespace) -> Selection:
    """What `requeue` takes: FAILED records the filters name; --failed alone takes them all.
    Without either, the command line says nothing to requeue: a usage error."""
    selection = selection_of(args)
    if not args.failed and selection == Selection():
        raise UsageError(
            "say what to requeue: --failed (every FAILED record), --id, --failed-since, "
            "--error, --error-class or an id range"
        )
    return selection


def run_requeue(ctx: Context) -> int:
    args = ctx.args
    selection = requeue_selection(args)
    bounds = listing.describe(selection)
    records = ctx.records()
    if args.dry_run:
        return _dry_requeue(ctx, selection, bounds)
    queue_url = ctx.required_queue_url()
    report = enqueueing.requeue_failed(records, ctx.queue, queue_url, selection, limit=args.limit)
    if not report.sent and not report.unsent and not selection.ids:
        ctx.answer(_report_json(report))
        ctx.say(f"no FAILED records{bounds}")
        return EXIT_OK
    ctx.say(f"reset to PENDING with 0 attempts{bounds}:")
    return _print_report(ctx, report, "requeued")


def _dry_requeue(ctx: Context, selection: Selection, bounds: str) -> int:
    """What `requeue` would take, and of the ids named, what it would leave and why: the
    real run's report without the sends, and its exit code (3 when an id does not exist)."""
    args, records = ctx.args, ctx.records()
    total = records.count_failed(selection, requeuable=True)
    shown = records.list_records(
        selection, after=None, limit=min(args.limit, args.show), requeuable=True
    )
    left = enqueueing.EnqueueReport()
    if selection.ids:
        named = len(set(selection.ids))
        would = records.list_records(
            selection, after=None, limit=min(args.limit, named), requeuable=True
        )
        enqueueing.not_taken(records, selection, {r.record_id for r in would}, left)
    ctx.answer(
        {
            "dry_run": True,
            "matched": total,
            "limit": args.limit,
            "records": [listing.as_json(record) for record in shown],
            "skipped": {str(k): v for k, v in left.skipped.items()},
            "missing": left.missing,
        }
    )
    ctx.say(
        f"{plural(total, 'FAILED record')}{bounds} of SUCCEEDED generations, newest failure "
        f"first; --limit {args.limit}"
    )
    for line in listing.lines(shown, width=listing.terminal_width()):
        ctx.say(line)
    if min(total, args.limit) > len(shown):
        ctx.say(f"  ... and {min(total, args.limit) - len(shown)} more")
    _left_lines(ctx, left)
    if selection.ids:
        ctx.say(
            f"would requeue {min(total, args.limit)}, skip {len(left.skipped)}; "
            f"{len(left.missing)} not found"
        )
    ctx.say("dry run: nothing changed")
    return EXIT_OK if left.ok else EXIT_PARTIAL
