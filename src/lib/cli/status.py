"""`archive-ctl status`: archive states in PostgreSQL, the upload lane, queue depths in SQS.

The default queries read only the partial indexes of archive_migration.sql and the lane's
one row, so they are cheap on millions of rows; `--all` also counts SUCCEEDED and
never-queued rows, which have no index, so it scans the table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pg8000.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from lib.cli.context import EXIT_OK, EXIT_PARTIAL, CommandError, Context, describe_error, out
from lib.cli.status_lane import (
    NEVER_QUEUED_LIMIT,
    Backlog,
    LaneReport,
    backlog,
    lane_lines,
    lane_report,
)
from lib.platform.config import lock_ttl_seconds, pacing_limits
from lib.platform.grants import is_permission_denied
from lib.state.audits import AuditCoverage, AuditFindings
from lib.state.operations import AlteredCounts, LiveCounts, OperatorRecords
from lib.state.outbox import OutboxStore, OutboxSummary
from lib.state.sweeps import StagedSummary

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


@dataclass(frozen=True)
class ArchiveCounts(LiveCounts):
    # Every state including SUCCEEDED and never queued; only with --all.
    all_states: dict[str, int] | None = None
    # Archives whose bytes Lsky changed (re-encoded, watermarked): a partial index read.
    altered: AlteredCounts | None = None
    # PENDING rows not due yet, by why they wait: {reason: {"held": n, "parked": n}}.
    waiting: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueDepth:
    name: str
    url: str
    visible: int
    in_flight: int
    delayed: int

    @property
    def total(self) -> int:
        return self.visible + self.in_flight + self.delayed


@dataclass
class Status:
    archive: ArchiveCounts
    queues: list[QueueDepth] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lane: LaneReport | None = None
    backlog: Backlog | None = None
    staged: StagedSummary | None = None  # images captured to the staging bucket
    audit: AuditCoverage | None = None  # the audit's and the originals' coverage
    outbox: OutboxSummary | None = None  # completion events not published yet

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for queue, depth in zip(data["queues"], self.queues, strict=True):
            queue["total"] = depth.total
        if self.audit is not None:
            audit = data["audit"]
            audit["without_original"] = self.audit.without_original
            checked = self.audit.oldest_check
            audit["oldest_check"] = None if checked is None else checked.isoformat()
        if self.staged is not None and not self.staged.waiting:
            # The sweeper's metric reads 0 then (its alarm's input); here it is no age at all.
            data["staged"]["oldest_age_seconds"] = None
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def archive_counts(
    records: OperatorRecords, *, lock_ttl_seconds: int, include_all: bool
) -> ArchiveCounts:
    live = records.live_counts(lock_ttl_seconds=lock_ttl_seconds)
    waiting: dict[str, dict[str, int]] = {}
    for count in records.waiting_counts():
        kind = "parked" if count.parked else "held"
        waiting.setdefault(count.reason, {"held": 0, "parked": 0})[kind] = count.rows
    return ArchiveCounts(
        **asdict(live),
        all_states=records.all_counts() if include_all else None,
        altered=records.altered_counts(),
        waiting=waiting,
    )


def queue_depth(client: SQSClient, name: str, url: str) -> QueueDepth:
    attributes = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return QueueDepth(
        name=name,
        url=url,
        visible=int(attributes.get("ApproximateNumberOfMessages", 0)),
        in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
        delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
    )


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _count(value: int, limit: int) -> str:
    return f"{limit}+" if value >= limit else str(value)


def render(status: Status) -> str:
    """The human-readable report."""
    a = status.archive
    lines = [
        "archive states (PostgreSQL)",
        f"  PENDING     {a.pending:>8}   due now: {a.pending_due}, "
        f"oldest due for: {_age(a.oldest_pending_age_seconds)}",
        f"  RUNNING     {a.running:>8}   lock expired: {a.running_expired}",
        f"  FAILED      {a.failed:>8}   failed in the last 24 h: {a.failed_last_24h}",
    ]
    for reason, kinds in a.waiting.items():
        lines.append(
            f"  waiting     {kinds['held'] + kinds['parked']:>8}   {reason}: "
            f"{kinds['held']} held (message out), {kinds['parked']} parked (no message)"
        )
    if a.altered is not None:
        changed = a.altered
        lines.append(
            f"  altered     {_count(changed.total, changed.limit):>8}   "
            f"stored re-encoded or watermarked by Lsky; archived in the last 24 h: "
            f"{_count(changed.last_24h, changed.limit)}"
        )
    if (staged := status.staged) is not None:
        lines.append(
            f"  staged      {staged.waiting:>8}   oldest staged for: "
            f"{_age(staged.oldest_age_seconds) if staged.waiting else '-'}, "
            f"FAILED keeping a copy: {staged.failed_keeping_copy}"
        )
    if (outbox := status.outbox) is not None:
        lines.append(
            f"  outbox      {_count(outbox.waiting, outbox.limit):>8}   completion events not "
            f"published yet, oldest waiting for: "
            f"{_age(outbox.oldest_age_seconds) if outbox.waiting else '-'}"
        )
    if (audit := status.audit) is not None:
        lines += _audit_lines(audit)
    if a.all_states is not None:
        lines.append("  all states (full scan):")
        lines += [f"    {state:<11} {count:>8}" for state, count in a.all_states.items()]
    lines += lane_lines(status.lane, status.backlog)
    if status.queues:
        lines.append("queues (SQS, approximate)")
        lines.append(f"  {'':<6} {'visible':>8} {'in flight':>10} {'delayed':>8}   url")
        lines += [
            f"  {q.name:<6} {q.visible:>8} {q.in_flight:>10} {q.delayed:>8}   {q.url}"
            for q in status.queues
        ]
    lines += [f"note: {note}" for note in status.notes]
    return "\n".join(lines)


def _audit_lines(audit: AuditCoverage) -> list[str]:
    oldest = audit.oldest_check.isoformat(timespec="seconds") if audit.oldest_check else "-"
    return [
        "hosted copies (the audit)",
        f"  archived    {audit.archived:>8}   with an original: {audit.with_original},"
        f" without: {audit.without_original}; unconfirmed: {audit.unconfirmed}"
        + (f" (oldest {_age(audit.oldest_unconfirmed_seconds)})" if audit.unconfirmed else ""),
        f"  checked     {audit.archived - audit.never_checked:>8}   never yet:"
        f" {audit.never_checked}, oldest check: {oldest}",
        f"  verdicts    {audit.intact + audit.missing + audit.altered:>8}   intact"
        f" {audit.intact}, missing {audit.missing}, altered {audit.altered}, lost {audit.lost};"
        f" unreachable lately: {audit.unreachable}",
        f"  due now     {audit.due:>8}   longest due for: "
        f"{_age(audit.oldest_due_seconds) if audit.due else '-'};"
        f" restores under way: {audit.restoring}",
    ]


def run(ctx: Context) -> int:
    args = ctx.args
    lock_ttl = lock_ttl_seconds()
    records = ctx.records()
    report = Status(
        archive=archive_counts(records, lock_ttl_seconds=lock_ttl, include_all=args.all),
        staged=ctx.sweeps().staged_summary(),
        audit=AuditFindings(ctx.database()).coverage(),
        outbox=OutboxStore(ctx.database()).summary(),
    )
    code = EXIT_OK
    limits = pacing_limits()
    try:
        lane_store = ctx.lanes()
        lane = lane_store.state()
        longest = max((seconds for seconds, _ in limits), default=0)
        entries = lane_store.ledger(2 * longest + 2) if limits else []
        never_queued = records.count_never_queued(limit=NEVER_QUEUED_LIMIT) if limits else 0
    except pg8000.exceptions.DatabaseError as error:
        hint = "" if is_permission_denied(error) else " (run `archive-ctl migrate`)"
        report.notes.append(
            f"upload lane not shown: {describe_error(error, database=ctx.connected)}{hint}"
        )
        code = EXIT_PARTIAL
    else:
        work = backlog(report.archive, lane, limits=limits, entries=entries)
        report.lane = lane_report(
            lane,
            backlog_records=work.records,
            limits=limits,
            entries=entries,
            never_queued=never_queued,
        )
        report.backlog = work
    queue_url = ctx.queue_url()
    if queue_url is None:
        report.notes.append("queue depths not shown: set ARCHIVE_QUEUE_URL or pass --queue-url")
    else:
        try:
            report.queues.append(queue_depth(ctx.sqs, "queue", queue_url))
            report.queues.append(queue_depth(ctx.sqs, "DLQ", ctx.dlq_url()))
        except (CommandError, BotoCoreError, ClientError) as error:
            report.notes.append(f"queue depths incomplete: {describe_error(error)}")
            code = EXIT_PARTIAL
    out(report.to_json() if args.json else render(report))
    return code
