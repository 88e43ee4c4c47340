"""`archive-ctl show ID`: one record's story on one screen. Its state, what it waits for and
until when (lib.cli.show_wait), its attempts and last failure, where its image is, then
its events in words (lib.cli.show_events), newest last (lib.state.stories).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from lib.cli import logs_insights
from lib.cli.args import positive_at_most, record_id
from lib.cli.context import EXIT_NOT_FOUND, EXIT_OK, Context
from lib.cli.progress import duration
from lib.cli.show_events import ORIGINAL_SOURCES, TEXT_LIMIT, describe
from lib.cli.show_wait import Timing, Wait, waiting_for, when
from lib.cli.words import plural
from lib.platform import config
from lib.platform.redact import outside_text
from lib.state.audits import AuditFindings, Keeping
from lib.state.claim import KeptOriginal
from lib.state.events import CONCLUDING
from lib.state.lane import LaneState
from lib.state.originals import OriginalStore
from lib.state.status import GENERATION_SUCCEEDED, ArchiveStatus
from lib.state.stories import Story, StoryRecords
from lib.transfer.lsky_upload import MAX_HOSTED_URL

# Events shown by default: with the header, one screen.
DEFAULT_EVENTS = 30
MAX_EVENTS = 1_000
RETENTION_SETTING = "ARCHIVE_EVENT_RETENTION_DAYS"

# -- the report ----------------------------------------------------------------------------


@dataclass
class Shown:
    story: Story
    lane: LaneState | None
    timing: Timing
    now: datetime
    logs: logs_insights.LogsReport | None = None
    keeping: Keeping | None = None  # its audit
    original: KeptOriginal | None = None  # its original, as kept

    @property
    def wait(self) -> Wait | None:
        row = self.story.row
        return None if row is None else waiting_for(row, self.lane, self.timing)

    def as_dict(self) -> dict[str, Any]:
        row, wait = self.story.row, self.wait
        data: dict[str, Any] = {"record_id": self.story.record_id, "found": row is not None}
        if row is not None and wait is not None:
            data |= {
                "state": row.archive_status,
                "generation_status": row.status,
                "waiting": {
                    "for": wait.what,
                    "until": None if wait.until is None else wait.until.isoformat(),
                    "words": wait.words,
                },
                "attempts": row.attempts,
                "max_attempts": self.timing.max_attempts,
                "last_error": row.error,
                "hosted_url": row.hosted_url,
                "staged_key": row.staged_key,
                "enqueued_at": _iso(row.enqueued_at),
                "next_run_at": _iso(row.next_run_at),
                "wait_reason": row.wait_reason,
                "failed_at": _iso(row.failed_at),
                "failed_at_estimated": row.failed_at_estimated,
                "backfilled": row.backfilled,
            }
        data["events_total"] = self.story.total
        data["events_note"] = story_note(self.story)
        data["events"] = [
            {
                "at": event.at.isoformat(),
                "ago_seconds": round((self.now - event.at).total_seconds(), 3),
                "attempt": event.attempt,
                "kind": event.kind,
                "detail": event.detail,
                "words": describe(event, self.now),
            }
            for event in self.story.events
        ]
        if self.logs is not None:
            data["logs"] = self.logs.as_dict()
        if self.keeping is not None:
            data["kept"] = {
                key: value.isoformat() if isinstance(value, datetime) else value
                for key, value in asdict(self.keeping).items()
            }
            data["original"] = None if self.original is None else asdict(self.original)
        return data


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def render(shown: Shown) -> str:
    """The text report: the record's state in a few lines, then its events."""
    story, row, now = shown.story, shown.story.row, shown.now
    if row is None:
        lines = [f"record {story.record_id}: no such record in image_generation_records"]
    else:
        wait = waiting_for(row, shown.lane, shown.timing)
        generation = "" if row.status == GENERATION_SUCCEEDED else f" (generation {row.status})"
        lines = [
            f"record {row.record_id}: {row.archive_status or 'never queued'}{generation}, "
            f"attempt {row.attempts} of {shown.timing.max_attempts}"
            + (", backfilled" if row.backfilled else ""),
            f"  waiting for  {wait.words}",
            f"  last error   {outside_text(row.error, TEXT_LIMIT) if row.error else '-'}",
        ]
        if row.hosted_url:
            altered = ", stored altered" if row.altered else ""
            lines.append(
                # As stored: a row an older release or a hand wrote may contain what no
                # answer passes now (lsky_upload.hosted_url); shown on one redacted line.
                f"  hosted       {outside_text(row.hosted_url, MAX_HOSTED_URL)}, "
                f"archived {when(row.archived_at, now)}{altered}"
            )
        if shown.keeping is not None:
            lines += _keeping_lines(shown.keeping, shown.original, now)
        if row.staged_key:
            size = f", {row.staged_bytes:,} bytes" if row.staged_bytes is not None else ""
            lines.append(
                f"  staged       {row.staged_key}{size}, staged {when(row.staged_at, now)}"
            )
    shown_count = len(story.events)
    if story.total > shown_count:
        lines.append(f"events: {story.total}, the newest {shown_count} (newest last)")
    else:
        lines.append(f"events: {story.total} (newest last)")
    for event in story.events:
        ago = duration((now - event.at).total_seconds())
        lines.append(f"  {ago:>9} ago  #{event.attempt:<2} {event.kind:<15} {describe(event, now)}")
    if (note := story_note(story)) is not None:
        lines.append(f"  ({note})")
    if shown.logs is not None:
        lines += _logs_lines(shown.logs)
    return "\n".join(lines)


def _keeping_lines(kept: Keeping, original: KeptOriginal | None, now: datetime) -> list[str]:
    """The original and the last audit, when there is either."""
    lines = []
    if original is not None:
        source = ORIGINAL_SOURCES.get(str(original.source), str(original.source))
        confirmed = "" if original.confirmed else "; not confirmed by S3 yet"
        lines.append(
            f"  original     {original.key}, {original.bytes:,} bytes from {source}{confirmed}"
        )
    if kept.checked_at is not None:
        lost = ", lost on the host" if kept.lost else ""
        since = f" since {when(kept.verdict_since, now)}" if kept.verdict_since else ""
        lines.append(
            f"  audit        {kept.verdict}{since}{lost}; last checked"
            f" {when(kept.checked_at, now)}, next {when(kept.due_at, now)}"
        )
    elif kept.due_at is not None:
        lines.append(f"  audit        not checked yet; due {when(kept.due_at, now)}")
    if kept.unreachable_since is not None:
        lines.append(
            f"               no answer from the host since {when(kept.unreachable_since, now)}"
        )
    return lines


def story_note(story: Story) -> str | None:
    """What the events alone would tell wrongly (pure): a record nothing has touched yet,
    or a concluded record whose story the retention removed (all of it, or, as an older
    release left it, all but what came after its conclusion)."""
    row = story.row
    if row is None or row.archive_status is None:
        return None
    concluded = row.archive_status in (ArchiveStatus.SUCCEEDED, ArchiveStatus.FAILED)
    if not story.events:
        if concluded:
            return (
                f"none: removed by the retention ({RETENTION_SETTING} after its conclusion), "
                "or never written (a release before stories were kept concluded it)"
            )
        return (
            f"none yet: queued {when(row.enqueued_at or row.next_run_at, row.now)} by the "
            "producer, inferred from the row; its first claim writes that down"
        )
    kinds = {event.kind for event in story.events}
    if concluded and story.total == len(story.events) and not kinds & set(CONCLUDING):
        return (
            f"its story up to its conclusion ({row.archive_status}) is gone, removed by the "
            f"retention ({RETENTION_SETTING}) or never written; these events came after it"
        )
    return None


def _logs_lines(logs: logs_insights.LogsReport) -> list[str]:
    lines = [
        f"logs: CloudWatch Logs Insights over {', '.join(logs.log_groups)}, "
        f"{logs.start.isoformat(timespec='seconds')} to {logs.end.isoformat(timespec='seconds')}:",
        *("    " + line for line in logs.query.splitlines()),
    ]
    if logs.why_not:
        lines.append(f"  not run: {logs.why_not}" if not logs.ran else f"  {logs.why_not}")
    if logs.ran:
        lines.append(f"  {plural(len(logs.results), 'line')}")
        lines += [logs_insights.result_line(row) for row in logs.results]
    return lines


# -- the command -----------------------------------------------------------------------------

SUMMARY = "one record's story: its state, what it waits for, its events"
DESCRIPTION = (
    "Prints on one screen the record's state, what it is waiting for and until when (its "
    "backoff, a booked upload slot, the lane's pause, its message, the sweeper; nothing when "
    "its message looks lost), its attempts and last error, its hosted URL or staged copy, "
    "then its events (image_archive_events) in order, newest last, with relative times. "
    "Exit 4 when there is no such record."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`show`'s options (lib.cli.parser registers the command; --json is every command's)."""
    parser.add_argument("record_id", type=record_id, metavar="RECORD_ID", help="the record's id")
    parser.add_argument(
        "--logs",
        action="store_true",
        help="add the CloudWatch Logs Insights query for the record's log lines, and run it "
        "over both functions' log groups when AWS credentials are present",
    )
    parser.add_argument(
        "--events",
        type=positive_at_most(MAX_EVENTS),
        default=DEFAULT_EVENTS,
        metavar="N",
        help=f"show the newest N events (default {DEFAULT_EVENTS})",
    )
    parser.add_argument(
        "--stack",
        metavar="NAME",
        help="the stack whose log groups --logs reads (default: "
        f"{logs_insights.DEFAULT_STACK}, samconfig.toml's stack name)",
    )


def timing() -> Timing:
    return Timing(
        max_attempts=config.max_attempts(),
        lock_ttl_seconds=config.lock_ttl_seconds(),
        grace_seconds=config.sweep_grace_seconds(),
        interval_seconds=config.requeue_interval_seconds(),
    )


def _logs(ctx: Context, story: Story, now: datetime) -> logs_insights.LogsReport:
    times = [event.at for event in story.events]
    if story.row is not None:
        times += [t for t in (story.row.started_at, story.row.enqueued_at) if t is not None]
    start = min(times, default=now - timedelta(days=1)) - logs_insights.MARGIN
    stack = ctx.args.stack or logs_insights.DEFAULT_STACK
    report = logs_insights.LogsReport(
        query=logs_insights.query_for(story.record_id),
        log_groups=logs_insights.log_groups(stack),
        start=start,
        end=now,
    )
    missing = logs_insights.credentials_missing()
    if missing is not None:
        report.why_not = missing
        return report
    logs_insights.run_query(report, ctx.logs_client(), sleep=ctx.sleep, clock=ctx.clock)
    return report


def run(ctx: Context) -> int:
    args = ctx.args
    settings = timing()
    story = StoryRecords(ctx.database()).story(
        args.record_id, lock_ttl_seconds=settings.lock_ttl_seconds, limit=args.events
    )
    lane = ctx.lanes().state()
    now = story.row.now if story.row is not None else lane.now
    shown = Shown(story, lane, settings, now)
    if story.row is not None:
        shown.keeping = AuditFindings(ctx.database()).keeping(args.record_id)
        shown.original = OriginalStore(ctx.database()).of(args.record_id)
    if args.logs:
        shown.logs = _logs(ctx, story, now)
    ctx.answer(shown.as_dict())
    ctx.say(render(shown))
    return EXIT_OK if story.row is not None else EXIT_NOT_FOUND
