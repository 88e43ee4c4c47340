"""`archive-ctl enqueue` and `archive-ctl requeue --failed`: lib.archive.enqueue does the
work (row first, then message); this module reads the ids and prints the report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lib.archive import enqueue as enqueueing
from lib.cli.args import record_id
from lib.cli.context import EXIT_OK, EXIT_PARTIAL, CommandError, Context, out
from lib.platform.redact import outside_text
from lib.state.events import Actor
from lib.state.records import ERROR_LIMIT


def _read_ids(values: Sequence[str]) -> list[int]:
    words = sys.stdin.read().split() if list(values) == ["-"] else list(values)
    try:
        return [record_id(word) for word in words]
    except argparse.ArgumentTypeError as error:
        raise CommandError(str(error)) from None


def _print_report(report: enqueueing.EnqueueReport, verb: str) -> int:
    for record in report.sent:
        out(f"{verb:<9} {record}")
    for record, reason in report.skipped.items():
        out(f"{'skipped':<9} {record}: {reason}")
    for record in report.missing:
        out(f"{'missing':<9} {record}: no such record")
    for record, reason in report.unsent.items():
        out(f"{'NOT SENT':<9} {record}: {reason}")
    out(
        f"{len(report.sent)} sent, {len(report.skipped)} skipped, "
        f"{len(report.missing)} not found, {len(report.unsent)} not sent"
    )
    if report.unsent:
        out(
            "the records not sent are PENDING: the sweeper sends them once they are past its "
            "grace period, or run this command again"
        )
    return EXIT_OK if report.ok else EXIT_PARTIAL


def run_enqueue(ctx: Context) -> int:
    ids = _read_ids(ctx.args.record_ids)
    if not ids:
        raise CommandError("no record ids given")
    queue_url = ctx.required_queue_url()  # checked before any row is written
    report = enqueueing.enqueue(ctx.records(), ctx.queue, queue_url, ids, by=Actor.ENQUEUE)
    return _print_report(report, "sent")


def run_requeue(ctx: Context) -> int:
    args = ctx.args
    if not args.failed:
        raise CommandError("say what to requeue: --failed (rows whose archive is FAILED)")
    since = f" since {args.since.isoformat(timespec='seconds')}" if args.since else ""
    if args.dry_run:
        total, rows = enqueueing.preview_failed(
            ctx.records(), since=args.since, limit=min(args.limit, args.show)
        )
        out(f"{total} FAILED records{since} (generation SUCCEEDED); --limit {args.limit}")
        for row in rows:
            started = row.started_at.isoformat(timespec="seconds") if row.started_at else "-"
            error = outside_text(row.error or "", ERROR_LIMIT)
            out(f"  {row.record_id:>12}  {started}  attempts {row.attempts}  {error}")
        if total > len(rows):
            out(f"  ... and {total - len(rows)} more")
        out("dry run: nothing changed")
        return EXIT_OK
    queue_url = ctx.required_queue_url()
    report = enqueueing.requeue_failed(
        ctx.records(), ctx.queue, queue_url, since=args.since, limit=args.limit
    )
    if not report.sent and not report.unsent:
        out(f"no FAILED records{since}")
        return EXIT_OK
    out(f"reset to PENDING with 0 attempts{since}:")
    return _print_report(report, "requeued")
