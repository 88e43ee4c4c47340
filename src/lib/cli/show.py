"""`archive-ctl show ID`: one record's story on one screen. Its state, what it waits for and
until when, its attempts and last failure, where its image is, then its events, newest
last (lib.state.stories). Pure: `waiting_for`, `describe` and `render`; `run` reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lib.cli import logs_insights
from lib.cli.context import EXIT_NOT_FOUND, EXIT_OK, Context, out
from lib.cli.progress import duration
from lib.platform import config
from lib.platform.redact import outside_text
from lib.state.lane import LaneState
from lib.state.status import ArchiveStatus, WaitReason
from lib.state.stories import RecordRow, StoredEvent, Story, StoryRecords

# Events shown by default: with the header, one screen.
DEFAULT_EVENTS = 30
MAX_EVENTS = 1_000
TEXT_LIMIT = 160  # a line's outside text (an error, a host's answer) at most


@dataclass(frozen=True)
class Timing:
    """The settings that say when a waiting record moves on."""

    max_attempts: int
    lock_ttl_seconds: int
    grace_seconds: int  # the sweeper sends a lost message this long past due
    interval_seconds: int  # and not within this long of the last send


@dataclass(frozen=True)
class Wait:
    """What a record waits for: `what` a short name (backoff, slot, lane, message, sweeper,
    lost, lock, takeover, retry, nothing, never_queued), until when, in words."""

    what: str
    until: datetime | None
    words: str


def _when(moment: datetime | None, now: datetime) -> str:
    """`12:03:10 (in 2 min)`, `2026-12-01 08:00:00 (3.2 d ago)`."""
    if moment is None:
        return "-"
    if not math.isfinite(moment.timestamp()):  # pragma: no cover - infinity is never read
        return "-"
    seconds = (moment - now).total_seconds()
    clock = moment.astimezone(now.tzinfo).strftime(
        "%H:%M:%S" if abs(seconds) < 43_200 else "%Y-%m-%d %H:%M:%S"
    )
    return f"{clock} ({'in ' + duration(seconds) if seconds >= 0 else duration(-seconds) + ' ago'})"


def _lane_words(lane: LaneState, now: datetime) -> tuple[datetime | None, str]:
    """The lane's pause end and how it reads: `rate_limit (hour) until 13:00:00 (in 40 min)`."""
    reason = lane.reason or "unknown"
    if lane.window:
        reason += f", window {lane.window}"
    if math.isinf(lane.paused_for_seconds):
        return None, f"the lane's pause ({reason}) until cleared"
    until = lane.now + timedelta(seconds=lane.paused_for_seconds)
    return until, f"the lane's pause ({reason}) until {_when(until, now)}"


def waiting_for(row: RecordRow, lane: LaneState | None, timing: Timing) -> Wait:
    """What the record waits for now, and until when (pure)."""
    now = row.now
    status = row.archive_status
    if status is None:
        return Wait("never_queued", None, "nothing: never queued (`archive-ctl enqueue` queues it)")
    if status == ArchiveStatus.SUCCEEDED:
        return Wait("nothing", None, f"nothing: archived {_when(row.archived_at, now)}")
    if status == ArchiveStatus.FAILED:
        copy = " from its staged copy" if row.staged_key else ""
        return Wait(
            "nothing",
            None,
            f"nothing: FAILED; `archive-ctl requeue --failed` gives it new attempts{copy}",
        )
    if status == ArchiveStatus.RUNNING:
        return _running(row, timing)
    return _pending(row, lane, timing)


def _running(row: RecordRow, timing: Timing) -> Wait:
    now = row.now
    if row.locked_at is None or row.lock_expired:
        expired = (
            row.locked_at + timedelta(seconds=timing.lock_ttl_seconds) if row.locked_at else None
        )
        last = row.attempts >= timing.max_attempts
        then = "FAILED (its last attempt)" if last else "sent again"
        return Wait(
            "takeover",
            None,
            f"a takeover: the lock of attempt {row.attempts} expired {_when(expired, now)}; "
            f"its message's next receive or the sweeper's next run takes it over ({then})",
        )
    until = row.locked_at + timedelta(seconds=timing.lock_ttl_seconds)
    return Wait(
        "lock",
        until,
        f"attempt {row.attempts} under way ({row.locked_by or '?'}), its lock held until "
        f"{_when(until, now)}",
    )


_RETRY_WORDS = {
    str(WaitReason.OWN_FAULT): "a retry after our own fault (configuration, a bug)",
    str(WaitReason.NO_TIME): "a retry: its invocation had no time left",
}


def _pending(row: RecordRow, lane: LaneState | None, timing: Timing) -> Wait:
    now, due = row.now, row.next_run_at
    held = row.enqueued_at is not None
    message = (
        f"its message held (sent {_when(row.enqueued_at, now)})"
        if held
        else "no message out: the sweeper sends one once it is due"
    )
    copy = f"; published from its staged copy {row.staged_key}" if row.staged_key else ""
    if (
        lane is not None
        and lane.paused
        and (due is None or due <= now or row.wait_reason == WaitReason.PAUSED)
    ):
        until, words = _lane_words(lane, now)
        return Wait("lane", until, f"{words}; {message}{copy}")
    if due is not None and due > now:
        reason = row.wait_reason
        if reason == WaitReason.BACKOFF:
            words = (
                f"its backoff until {_when(due, now)}, then attempt {row.attempts + 1} "
                f"of {timing.max_attempts}"
            )
            return Wait("backoff", due, f"{words}; {message}{copy}")
        if reason == WaitReason.PACED:
            slot = row.booked_at or due
            booked = "its booked upload slot" if row.booked_at else "an upload slot (pacing)"
            return Wait("slot", slot, f"{booked} at {_when(slot, now)}; {message}{copy}")
        if reason == WaitReason.PAUSED:
            return Wait("lane", due, f"the lane's pause, until {_when(due, now)}; {message}{copy}")
        why = _RETRY_WORDS.get(reason or "", "its due time")
        return Wait("retry", due, f"{why}, at {_when(due, now)}; {message}{copy}")
    due_for = (now - due).total_seconds() if due is not None else 0.0
    if not held:
        if due_for > timing.grace_seconds:
            return Wait(
                "lost",
                None,
                f"nothing: no message is out for it (due {_when(due, now)}); the sweeper "
                f"sends one on its next run{copy}",
            )
        sends_at = (due or now) + timedelta(seconds=timing.grace_seconds)
        return Wait(
            "sweeper",
            sends_at,
            f"the sweeper: no message is out for it; it sends one by {_when(sends_at, now)}{copy}",
        )
    sent_ago = (now - row.enqueued_at).total_seconds() if row.enqueued_at else 0.0
    if due_for > timing.grace_seconds and sent_ago > timing.interval_seconds:
        return Wait(
            "lost",
            None,
            f"nothing: its message (sent {_when(row.enqueued_at, now)}) looks lost; the "
            f"sweeper sends it again on its next run{copy}",
        )
    return Wait(
        "message",
        None,
        f"its message (sent {_when(row.enqueued_at, now)}) to reach the archive function{copy}",
    )


# -- events in words ---------------------------------------------------------------------


def _text(detail: dict[str, Any], key: str) -> str:
    return outside_text(detail.get(key, ""), TEXT_LIMIT)


def _at(value: Any, now: datetime) -> str:
    if not isinstance(value, str):
        return "-"
    try:
        return _when(datetime.fromisoformat(value), now)
    except ValueError:
        return outside_text(value, 40)


def _enqueued(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"by {_text(d, 'by') or '?'}"
    if d.get("inferred"):
        words += " (inferred from the row: the producer writes no event)"
    if d.get("why"):
        words += f": {_text(d, 'why')}"
    if d.get("was"):
        words += f", was {_text(d, 'was')} after {d.get('attempts', '?')} attempts"
    if d.get("message_id"):
        words += f", message {_text(d, 'message_id')}"
    return words


def _received(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"message {_text(d, 'message_id') or '?'}, receive {d.get('receive_count', '?')}"
    if d.get("claimed") is not False:
        return words
    why = [f"archive {d.get('archive_status') or 'never queued'}"]
    due_in = d.get("due_in_seconds")
    if d.get("lane_paused"):
        why.append("the lane paused")
    elif isinstance(due_in, int | float) and due_in > 0:
        why.append(f"due in {duration(due_in)}")
    return f"{words}; not claimed ({', '.join(why)})"


def _fetched(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    if d.get("error"):
        return f"from the {_text(d, 'source')} failed: {_text(d, 'error')}"
    return (
        f"{d.get('bytes', '?')} bytes ({_text(d, 'type')}) from the {_text(d, 'source')} "
        f"in {d.get('seconds', '?')} s"
    )


def _looked_up(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    if d.get("error"):
        return f"could not be answered: {_text(d, 'error')}"
    if d.get("adopted"):
        return f"adopted {_text(d, 'adopted')}: {_text(d, 'why')}"
    refused = "; ".join(outside_text(r, 80) for r in d.get("refused") or [])
    return "nothing of ours found" + (f" (not ours: {refused})" if refused else "")


def _upload_answered(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    if not d.get("error"):
        return f"HTTP {d.get('status', '?')}, key {_text(d, 'key')}"
    status = f"HTTP {d['status']}: " if d.get("status") else ""
    hosted = ", may be stored" if d.get("may_be_hosted") else ""
    return f"failed: {status}{_text(d, 'error')}{hosted}"


def _waited(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"{_text(d, 'why') or '?'} until {_at(d.get('until') or d.get('next_run_at'), now)}"
    if d.get("given_back"):
        words += ", attempt given back"
    if d.get("error"):
        words += f": {_text(d, 'error')}"
    if d.get("visibility_refused"):
        words += " (SQS refused to hold its message)"
    return words


def _archived(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = _text(d, "url")
    if d.get("adopted"):
        words += ", adopted (an earlier attempt had stored it)"
    if d.get("altered"):
        words += ", stored altered (re-encoded or watermarked)"
    if d.get("recorded") is False:
        words += "; not recorded: the row was already archived"
    return words


def _lane_paused(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    window = f", window {_text(d, 'window')}" if d.get("window") else ""
    return f"{_text(d, 'reason')}{window} until {_text(d, 'until')}: {_text(d, 'detail')}"


def _retried(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    cls = f"{_text(d, 'error_class')}: " if d.get("error_class") else ""
    return f"{cls}{_text(d, 'error')}; next run {_at(d.get('next_run_at'), now)}"


def _slot(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    answer = _text(d, "answer")
    return f"{answer} for {_at(d.get('at'), now)}" if d.get("at") else answer


def _by(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    return f"by {_text(d, 'by') or '?'}" + (f": {_text(d, 'why')}" if d.get("why") else "")


_WORDS: dict[str, Callable[[dict[str, Any], StoredEvent, datetime], str]] = {
    "enqueued": _enqueued,
    "received": _received,
    "claimed": lambda d, e, now: (
        f"attempt {e.attempt} by {_text(d, 'owner')}"
        + (", from its staged copy" if d.get("staged") else "")
    ),
    "lock_taken_over": lambda d, e, now: (
        f"from {_text(d, 'owner') or '?'} (locked "
        f"{_at(d.get('locked_at'), now)}) by {_text(d, 'by')}"
    ),
    "lock_lost": lambda d, e, now: (
        f"its {_text(d, 'write')} was not recorded: the lock had passed on"
    ),
    "fetched": _fetched,
    "staged": lambda d, e, now: (
        f"{_text(d, 'key')} ({d.get('bytes', '?')} bytes): {_text(d, 'why')}"
    ),
    "slot": _slot,
    "lane_paused": _lane_paused,
    "looked_up": _looked_up,
    "upload_answered": _upload_answered,
    "held": _waited,
    "parked": _waited,
    "unparked": lambda d, e, now: f"by {_text(d, 'by')}, due {_at(d.get('due_at'), now)}",
    "retried": _retried,
    "failed": lambda d, e, now: f"by {_text(d, 'by') or '?'}: {_text(d, 'error')}",
    "archived": _archived,
    "unsent": lambda d, e, now: (
        f"its message did not go out ({_text(d, 'error') or 'refused'}); by {_text(d, 'by')}"
    ),
    "dequeued": _by,
    "dated": _by,
}


def describe(event: StoredEvent, now: datetime) -> str:
    """An event's detail in a few words (any detail, an older release's too: a kind this
    release does not know is shown as its fields)."""
    words = _WORDS.get(event.kind)
    if words is None:
        fields = ", ".join(f"{key}={value}" for key, value in event.detail.items())
        return outside_text(fields, TEXT_LIMIT)
    return words(event.detail, event, now)


# -- the report ----------------------------------------------------------------------------


@dataclass
class Shown:
    story: Story
    lane: LaneState | None
    timing: Timing
    now: datetime
    logs: logs_insights.LogsReport | None = None

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
                "backfilled": row.backfilled,
            }
        data["events_total"] = self.story.total
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
        generation = "" if row.status == "SUCCEEDED" else f" (generation {row.status})"
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
                f"  hosted       {row.hosted_url}, archived {_when(row.archived_at, now)}{altered}"
            )
        if row.staged_key:
            size = f", {row.staged_bytes:,} bytes" if row.staged_bytes is not None else ""
            lines.append(
                f"  staged       {row.staged_key}{size}, staged {_when(row.staged_at, now)}"
            )
    shown_count = len(story.events)
    if story.total > shown_count:
        lines.append(f"events: {story.total}, the newest {shown_count} (newest last)")
    else:
        lines.append(f"events: {story.total} (newest last)")
    for event in story.events:
        ago = duration((now - event.at).total_seconds())
        lines.append(f"  {ago:>9} ago  #{event.attempt:<2} {event.kind:<15} {describe(event, now)}")
    if not story.events and row is not None and row.archive_status is not None:
        lines.append(
            f"  (none yet: queued {_when(row.enqueued_at or row.next_run_at, now)} by the "
            "producer, inferred from the row; its first claim writes that down)"
        )
    if shown.logs is not None:
        lines += _logs_lines(shown.logs)
    return "\n".join(lines)


def _logs_lines(logs: logs_insights.LogsReport) -> list[str]:
    lines = [
        f"logs: CloudWatch Logs Insights over {', '.join(logs.log_groups)}, "
        f"{logs.start.isoformat(timespec='seconds')} to {logs.end.isoformat(timespec='seconds')}:",
        *("    " + line for line in logs.query.splitlines()),
    ]
    if logs.why_not:
        lines.append(f"  not run: {logs.why_not}" if not logs.ran else f"  {logs.why_not}")
    if logs.ran:
        lines.append(f"  {len(logs.results)} lines")
        lines += [logs_insights.result_line(row) for row in logs.results]
    return lines


# -- the command -----------------------------------------------------------------------------


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
    if args.logs:
        shown.logs = _logs(ctx, story, now)
    out(json.dumps(shown.as_dict(), indent=2, default=str) if args.json else render(shown))
    return EXIT_OK if story.row is not None else EXIT_NOT_FOUND
