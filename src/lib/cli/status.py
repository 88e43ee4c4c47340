"""`archive-ctl status`: archive states in PostgreSQL, queue depths in SQS.

The default query reads only the partial indexes of archive_migration.sql, so it is cheap
on millions of rows; SUCCEEDED and never-queued rows have none, so `--all` scans the table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from lib.cli.context import EXIT_ERROR, EXIT_OK, CommandError, Context, describe_error, out
from lib.platform.config import lock_ttl_seconds
from lib.state.records import ArchiveRecords, LiveCounts, StagedSummary

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


@dataclass(frozen=True)
class ArchiveCounts(LiveCounts):
    # Every state including SUCCEEDED and never queued; only with --all.
    all_states: dict[str, int] | None = None


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
    staged: StagedSummary | None = None  # images captured to the staging bucket

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for queue, depth in zip(data["queues"], self.queues, strict=True):
            queue["total"] = depth.total
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def archive_counts(
    records: ArchiveRecords, *, lock_ttl_seconds: int, include_all: bool
) -> ArchiveCounts:
    live = records.live_counts(lock_ttl_seconds=lock_ttl_seconds)
    return ArchiveCounts(**asdict(live), all_states=records.all_counts() if include_all else None)


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


def render(status: Status) -> str:
    """The human-readable report."""
    a = status.archive
    lines = [
        "archive states (PostgreSQL)",
        f"  PENDING     {a.pending:>8}   due now: {a.pending_due}, "
        f"oldest due for: {_age(a.oldest_pending_age_seconds) if a.pending_due else '-'}",
        f"  RUNNING     {a.running:>8}   lock expired: {a.running_expired}",
        f"  FAILED      {a.failed:>8}   generated in the last 24 h: {a.failed_last_24h}",
    ]
    if (staged := status.staged) is not None:
        lines.append(
            f"  staged      {staged.waiting:>8}   oldest staged for: "
            f"{_age(staged.oldest_age_seconds) if staged.waiting else '-'}, "
            f"FAILED keeping a copy: {staged.failed_keeping_copy}"
        )
    if a.all_states is not None:
        lines.append("  all states (full scan):")
        lines += [f"    {state:<11} {count:>8}" for state, count in a.all_states.items()]
    if status.queues:
        lines.append("queues (SQS, approximate)")
        lines.append(f"  {'':<6} {'visible':>8} {'in flight':>10} {'delayed':>8}   url")
        lines += [
            f"  {q.name:<6} {q.visible:>8} {q.in_flight:>10} {q.delayed:>8}   {q.url}"
            for q in status.queues
        ]
    lines += [f"note: {note}" for note in status.notes]
    return "\n".join(lines)


def run(ctx: Context) -> int:
    args = ctx.args
    lock_ttl = lock_ttl_seconds()
    records = ctx.records()
    report = Status(
        archive=archive_counts(records, lock_ttl_seconds=lock_ttl, include_all=args.all),
        staged=records.staged_summary(),
    )
    code = EXIT_OK
    queue_url = ctx.queue_url()
    if queue_url is None:
        report.notes.append("queue depths not shown: set ARCHIVE_QUEUE_URL or pass --queue-url")
    else:
        try:
            report.queues.append(queue_depth(ctx.sqs, "queue", queue_url))
            report.queues.append(queue_depth(ctx.sqs, "DLQ", ctx.dlq_url()))
        except (CommandError, BotoCoreError, ClientError) as error:
            report.notes.append(f"queue depths incomplete: {describe_error(error)}")
            code = EXIT_ERROR
    out(report.to_json() if args.json else render(report))
    return code
