"""`archive-ctl status`: archive states in PostgreSQL, the upload lane, queue depths in SQS.

The default queries read only the partial indexes of archive_migration.sql and the lane's
one row, so they are cheap on millions of rows; `--all` also counts SUCCEEDED and
never-queued rows, which have no index, so it scans the table.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pg8000.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from lib.cli import lane as lanes
from lib.cli.context import EXIT_ERROR, EXIT_OK, CommandError, Context, describe_error, out
from lib.cli.pacing import backlog_eta_seconds, per_minute
from lib.cli.progress import duration
from lib.platform.config import lock_ttl_seconds
from lib.platform.db import describe
from lib.state.lane import DRAIN_WINDOW_SECONDS, LaneState
from lib.state.operations import AlteredCounts, LiveCounts, OperatorRecords
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


@dataclass(frozen=True)
class LaneReport:
    """The upload lane: its pause (fields None while open) and its drain rate."""

    name: str
    paused: bool
    paused_until: str | None  # ISO time, or "infinity": until cleared
    paused_for_seconds: float | None  # None while open or until cleared
    reason: str | None
    window: str | None
    paused_since: str | None
    detail: str | None
    recent_uploads: int  # in the last drain_window_seconds
    drain_window_seconds: int
    drain_per_minute: float


@dataclass(frozen=True)
class Backlog:
    """Rows still to upload (PENDING or RUNNING), and how long they take at the drain
    rate after the current pause; None when that cannot be told."""

    records: int
    eta_seconds: float | None


@dataclass
class Status:
    archive: ArchiveCounts
    queues: list[QueueDepth] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lane: LaneReport | None = None
    backlog: Backlog | None = None
    staged: StagedSummary | None = None  # images captured to the staging bucket

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for queue, depth in zip(data["queues"], self.queues, strict=True):
            queue["total"] = depth.total
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


def lane_report(lane: LaneState) -> LaneReport:
    pause = lanes.pause_of(lane)
    recent = lane.drain_uploads
    return LaneReport(
        name=lanes.LANE,
        paused=pause is not None,
        paused_until=pause.until if pause else None,
        paused_for_seconds=(
            round(pause.remaining_seconds, 1)
            if pause and math.isfinite(pause.remaining_seconds)
            else None
        ),
        reason=pause.reason if pause else None,
        window=pause.window if pause else None,
        paused_since=pause.since if pause else None,
        detail=pause.detail if pause else None,
        recent_uploads=recent,
        drain_window_seconds=DRAIN_WINDOW_SECONDS,
        drain_per_minute=round(per_minute(recent, DRAIN_WINDOW_SECONDS), 2),
    )


def backlog(archive: LiveCounts, lane: LaneState) -> Backlog:
    # Rows, not messages: a queued row's message is in the queue as well (counting both
    # would count it twice), and a parked row has none but still needs its upload.
    records = archive.pending + archive.running
    rate = per_minute(lane.drain_uploads, DRAIN_WINDOW_SECONDS)
    eta = backlog_eta_seconds(records, rate, paused_for_seconds=max(lane.paused_for_seconds, 0))
    return Backlog(records=records, eta_seconds=None if eta is None else round(eta, 1))


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
        f"oldest due for: {_age(a.oldest_pending_age_seconds) if a.pending_due else '-'}",
        f"  RUNNING     {a.running:>8}   lock expired: {a.running_expired}",
        f"  FAILED      {a.failed:>8}   generated in the last 24 h: {a.failed_last_24h}",
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
    if a.all_states is not None:
        lines.append("  all states (full scan):")
        lines += [f"    {state:<11} {count:>8}" for state, count in a.all_states.items()]
    lines += _lane_lines(status.lane, status.backlog)
    if status.queues:
        lines.append("queues (SQS, approximate)")
        lines.append(f"  {'':<6} {'visible':>8} {'in flight':>10} {'delayed':>8}   url")
        lines += [
            f"  {q.name:<6} {q.visible:>8} {q.in_flight:>10} {q.delayed:>8}   {q.url}"
            for q in status.queues
        ]
    lines += [f"note: {note}" for note in status.notes]
    return "\n".join(lines)


def _lane_lines(lane: LaneReport | None, work: Backlog | None) -> list[str]:
    if lane is None:
        return []
    lines = [f"upload lane ({lane.name})"]
    if lane.paused and lane.paused_until is not None:
        pause = lanes.Pause(
            until=lane.paused_until,
            reason=lane.reason,
            window=lane.window,
            since=lane.paused_since,
            detail=lane.detail,
            remaining_seconds=math.inf
            if lane.paused_for_seconds is None
            else lane.paused_for_seconds,
        )
        lines.append("  " + lanes.describe(pause))
        if lane.detail:
            lines.append(f"  detail: {lane.detail}")
    else:
        lines.append("  open")
    lines.append(
        f"  drain: {lane.recent_uploads} upload{'' if lane.recent_uploads == 1 else 's'} "
        "in the last "
        f"{duration(lane.drain_window_seconds)} ({lane.drain_per_minute:.1f}/min)"
    )
    if work is not None:
        if work.eta_seconds is not None:
            eta = duration(work.eta_seconds)
        elif lane.paused_until == lanes.UNTIL_CLEARED:
            eta = "- (the lane is paused until cleared)"
        else:
            eta = f"- (nothing uploaded in the last {duration(lane.drain_window_seconds)})"
        lines.append(f"  backlog: {work.records} records PENDING or RUNNING, ETA {eta}")
    return lines


def run(ctx: Context) -> int:
    args = ctx.args
    lock_ttl = lock_ttl_seconds()
    records = ctx.records()
    report = Status(
        archive=archive_counts(records, lock_ttl_seconds=lock_ttl, include_all=args.all),
        staged=ctx.sweeps().staged_summary(),
    )
    code = EXIT_OK
    try:
        lane = ctx.lanes().state()
    except pg8000.exceptions.DatabaseError as error:
        report.notes.append(f"upload lane not shown: {describe(error)} (run `archive-ctl migrate`)")
        code = EXIT_ERROR
    else:
        report.lane = lane_report(lane)
        report.backlog = backlog(report.archive, lane)
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
