"""`archive-ctl audit` (a pass of the audit now, with progress) and `archive-ctl restore`
(archive records again from their originals): lib.audit's work, from an operator's shell."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from lib.archive import runtime
from lib.audit.auditor import Auditor, AuditSummary, Choice
from lib.audit.repair import Restorer
from lib.cli.context import EXIT_OK, EXIT_PARTIAL, Context, UsageError
from lib.platform import config
from lib.state.audits import AuditFindings, AuditRecords
from lib.state.events import Actor
from lib.state.status import ArchiveStatus

# An operator's pass has no invocation's end: its clock never runs out (Ctrl-C stops it).
NO_END_MS = 10**12
RESTORE_PAGE = 500
# Where a dry run's auditor would send restores: it sends none.
NO_QUEUE = "https://sqs.invalid/dry-run"


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


def _auditor(ctx: Context, *, dry_run: bool) -> Auditor:
    """The audit function's auditor, from this shell's environment and options."""
    queue_url = ctx.queue_url()
    if queue_url is None and not dry_run:
        raise UsageError("no queue URL: set ARCHIVE_QUEUE_URL or pass --queue-url")
    env = {**os.environ, "ARCHIVE_QUEUE_URL": queue_url or NO_QUEUE}
    auditor = runtime.build_auditor(config.load_audit_settings(env), db=ctx.database())
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
