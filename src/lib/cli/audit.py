"""`archive-ctl audit` (a pass of the audit now, with progress) and `archive-ctl restore`
(archive records again from their originals): lib.audit's work, from an operator's shell."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from lib.audit.auditor import Auditor, AuditSummary, Choice
from lib.audit.repair import Restorer
from lib.audit.runtime import build_auditor
from lib.cli.args import parse_since, positive
from lib.cli.context import EXIT_OK, EXIT_PARTIAL, Context, UsageError
from lib.cli.words import plural
from lib.platform import config
from lib.state.audits import AuditFindings, AuditRecords
from lib.state.events import Actor
from lib.state.status import ArchiveStatus

# An operator's pass has no invocation's end: its clock never runs out (Ctrl-C stops it).
NO_END_MS = 10**12
RESTORE_PAGE = 500
# Where a dry run's auditor would send restores: it sends none.
NO_QUEUE = "https://sqs.invalid/dry-run"


AUDIT_SUMMARY = "check hosted copies now (the audit function's pass), with progress"
AUDIT_DESCRIPTION = (
    "Reads each archived record's hosted copy (the download's guard, deadline and size "
    "cap) and judges it against what Lsky reported at upload: intact, missing (404, 410, "
    "or not an image) or altered (other bytes); unreachable is no verdict. Without "
    "--id or --since it takes the audit function's rotation (what is due), else the "
    "records chosen, due or not. It acts as the audit function does: keeps an original "
    "from an intact copy when none is kept, asks for a restore of a damaged one that has "
    "an original (or whose provider URL still gives the bytes first sent), marks it lost "
    "otherwise. At most ARCHIVE_AUDIT_RATE GETs a second. Ctrl-C stops it; what was "
    "checked is recorded batch by batch."
)
AUDIT_FOUND = (
    EXIT_PARTIAL,
    "something is not intact (missing, altered, lost), or the host seemed down",
)
RESTORE_SUMMARY = "archive records again from their originals"
RESTORE_DESCRIPTION = (
    "Each record chosen goes back to PENDING with a fresh attempt budget, keeping its "
    "hosted URL, and is archived again through the archive function from its original "
    "(read back and checked against its SHA-256 first): the lane, pacing and the look-up "
    "as any archive. The success write replaces the hosted URL and names the old one "
    "and its key in the record's story. Nothing is deleted on the host. A record "
    "without an original is left alone (it is lost on the host)."
)


def add_audit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", dest="ids", type=positive, nargs="+", metavar="ID", help="these records")
    p.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="records archived since WHEN: a duration (24h, 7d) or an ISO date/time",
    )
    p.add_argument("--limit", type=positive, metavar="N", help="at most N records (default: all)")
    p.add_argument(
        "--dry-run", action="store_true", help="check and judge, write and repair nothing"
    )


def add_restore_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--id", dest="ids", type=positive, nargs="+", metavar="ID", help="these records"
    )
    which.add_argument(
        "--missing", action="store_true", help="every record the audit last found missing"
    )
    p.add_argument(
        "--altered", action="store_true", help="every record the audit last found altered"
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be restored")


def _auditor(ctx: Context, *, dry_run: bool) -> Auditor:
    """The audit function's auditor, from this shell's environment and options."""
    queue_url = ctx.queue_url()
    if queue_url is None and not dry_run:
        raise UsageError("no queue URL: set ARCHIVE_QUEUE_URL or pass --queue-url")
    settings = config.load_audit_settings(queue_url=queue_url or NO_QUEUE)
    auditor = build_auditor(settings, db=ctx.database())
    if dry_run:
        auditor.restorer = None
    return auditor


def run_audit(ctx: Context) -> int:
    args = ctx.args
    ids = tuple(dict.fromkeys(args.ids)) if args.ids else None
    if ids is not None and args.since is not None:
        raise UsageError("--id and --since choose records two ways: give one")
    chosen = ids is not None or args.since is not None
    auditor = _auditor(ctx, dry_run=args.dry_run)
    shown = [ctx.clock()]

    def progress(summary: AuditSummary) -> None:
        if ctx.clock() - shown[0] >= 1.0:
            shown[0] = ctx.clock()
            ctx.progress(f"  {counts(summary)}")

    summary = auditor.run(
        lambda: NO_END_MS,
        choice=Choice(ids, args.since, args.limit) if chosen else None,
        limit=None if chosen else args.limit,
        dry_run=args.dry_run,
        progress=progress,
        by=Actor.AUDIT,
    )
    _report_audit(ctx, summary)
    wrong = summary.missing + summary.altered + summary.lost
    return EXIT_PARTIAL if wrong or summary.host_down else EXIT_OK


def counts(summary: AuditSummary) -> str:
    return (
        f"{plural(summary.checked, 'copy', 'copies')} checked: {summary.intact} intact,"
        f" {summary.missing} missing, {summary.altered} altered;"
        f" {summary.unreachable} unreachable"
    )


def _report_audit(ctx: Context, summary: AuditSummary) -> None:
    dry = summary.dry_run
    ctx.say(("audit (dry run: nothing written): " if dry else "audit: ") + counts(summary))
    if summary.host_down:
        ctx.say("  stopped: most GETs of a batch got no answer; the host seems down")
    for found in summary.found:
        key = f"; its key on the host: {found['hosted_key']}" if found.get("hosted_key") else ""
        ctx.say(f"  #{found['record_id']:<6} {found['verdict']:<8} {found['why']}{key}")
        ctx.say(f"          {found.get('repair', '')}")
    if summary.enrolled:
        ctx.say(f"  {plural(summary.enrolled, 'older archive')} enrolled in the rotation")
    if summary.originals_kept or summary.restores or summary.lost:
        ctx.say(
            f"  originals {'to keep' if dry else 'kept'}: {summary.originals_kept};"
            f" restores {'to request' if dry else 'requested'}: {summary.restores};"
            f" lost on the host: {summary.lost}"
        )
    ctx.answer(summary.as_dict())


@dataclass
class RestorePlan:
    """What `restore` takes, and what it leaves with why."""

    take: list[tuple[int, str | None]] = field(default_factory=list)
    left: dict[int, str] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)


def _plan(findings: AuditFindings, ctx: Context) -> RestorePlan:
    args, plan = ctx.args, RestorePlan()
    if args.ids:
        for row in findings.restorable(list(dict.fromkeys(args.ids))):
            if isinstance(row, int):
                plan.missing.append(row)
            elif not (row.has_original or row.restoring):
                plan.left[row.record_id] = "no original kept: nothing to restore it from"
            elif row.archive_status == ArchiveStatus.SUCCEEDED or (
                row.restoring and row.archive_status == ArchiveStatus.FAILED
            ):
                plan.take.append((row.record_id, None))
            else:
                plan.left[row.record_id] = f"archive is {row.archive_status}: not archived now"
        return plan
    verdicts = [v for v, asked in (("missing", args.missing), ("altered", args.altered)) if asked]
    for verdict in verdicts:
        after = 0
        while page := findings.found(verdict, after_id=after, limit=RESTORE_PAGE):
            for row in page:
                if row.has_original:
                    plan.take.append((row.record_id, row.url))
                else:
                    plan.left[row.record_id] = "no original kept: lost on the host"
            after = page[-1].record_id
    return plan


def run_restore(ctx: Context) -> int:
    args = ctx.args
    if not (args.ids or args.missing or args.altered):
        raise UsageError("say which: --id ID..., --missing or --altered")
    if args.ids and (args.missing or args.altered):
        raise UsageError("--id and --missing/--altered choose records two ways: give one")
    plan = _plan(AuditFindings(ctx.database()), ctx)
    answer: dict[str, Any] = {"dry_run": args.dry_run, "not_found": plan.missing}
    if args.dry_run:
        answer["restore"] = [record_id for record_id, _ in plan.take]
        ctx.say(f"would restore {plural(len(plan.take), 'record')} from their originals")
        for record_id, _ in plan.take:
            ctx.say(f"  #{record_id}")
    elif plan.take:
        report = Restorer(
            audits=AuditRecords(ctx.database()),
            operator=ctx.records(),
            sender=ctx.queue,
            queue_url=ctx.required_queue_url(),
        ).restore(plan.take, reason="operator", by=Actor.RESTORE)
        for record_id in report.left:
            plan.left[record_id] = "changed meanwhile: not archived now, or another URL"
        answer.update(sent=report.sent, unsent={str(k): v for k, v in report.unsent.items()})
        ctx.say(
            f"restoring {plural(report.requested, 'record')}: PENDING again, archived from"
            " the original; the hosted URL is replaced once the new copy is stored"
        )
        for record_id, error in report.unsent.items():
            ctx.say(f"  #{record_id}: message not sent ({error}); the sweeper sends it")
    else:
        ctx.say("nothing to restore")
    answer["left"] = {str(k): v for k, v in plan.left.items()}
    for record_id, why in plan.left.items():
        ctx.say(f"  #{record_id}: left alone: {why}")
    for record_id in plan.missing:
        ctx.say(f"  #{record_id}: no such record")
    ctx.answer(answer)
    return EXIT_PARTIAL if plan.left or plan.missing or answer.get("unsent") else EXIT_OK
