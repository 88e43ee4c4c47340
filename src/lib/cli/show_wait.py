"""What a record is waiting for, and until when (`archive-ctl show`'s second line): pure,
from its row, the upload lane and the settings that say when a waiting record moves on."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from lib.archive.retry import ErrorClass
from lib.cli.progress import duration
from lib.state.error_classes import error_class
from lib.state.lane import LaneState
from lib.state.status import ArchiveStatus, WaitReason
from lib.state.stories import RecordRow
from lib.transfer.failures import Stage


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


def when(moment: datetime | None, now: datetime) -> str:
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
    return until, f"the lane's pause ({reason}) until {when(until, now)}"


def waiting_for(row: RecordRow, lane: LaneState | None, timing: Timing) -> Wait:
    """What the record waits for now, and until when (pure)."""
    now = row.now
    status = row.archive_status
    if status is None:
        return Wait("never_queued", None, "nothing: never queued (`archive-ctl enqueue` queues it)")
    if status == ArchiveStatus.SUCCEEDED:
        return Wait("nothing", None, f"nothing: archived {when(row.archived_at, now)}")
    if status == ArchiveStatus.FAILED:
        estimated = " (estimated: an older release did not record it)" * row.failed_at_estimated
        return Wait(
            "nothing", None, f"nothing: FAILED {when(row.failed_at, now)}{estimated}; {_after(row)}"
        )
    if status == ArchiveStatus.RUNNING:
        return _running(row, timing)
    return _pending(row, lane, timing)


# A failure's error text ends with where it was in the attempt budget (retry.error_summary).
_BUDGET = re.compile(r"\[attempt (\d+)/(\d+)\]$")


def failed_for_good(row: RecordRow) -> bool:
    """Whether a requeue would fail the same way: the failure was permanent, as its last
    `failed` event says; without one, when it failed before its last attempt, which only a
    permanent failure does."""
    if row.failed_class is not None:
        return row.failed_class == ErrorClass.PERMANENT
    budget = _BUDGET.search(row.error or "")
    return budget is not None and int(budget[1]) < int(budget[2])


def _after(row: RecordRow) -> str:
    """What an operator can do about a FAILED record."""
    requeue = f"`archive-ctl requeue --id {row.record_id}`"
    copy = " from its staged copy" if row.staged_key else ""
    if not failed_for_good(row):
        return f"{requeue} gives it new attempts{copy}"
    stage = error_class(row.error)
    if stage == Stage.DOWNLOAD:
        return (
            f"it failed for good: the provider's answer will not change (its URL gone or "
            f"refused, or not an image), so {requeue} would fail the same way unless the "
            "source has changed; check the image at its URL, or have it generated again "
            "(a new record)"
        )
    if stage == Stage.UPLOAD:
        return (
            f"it failed for good: Lsky refused it and would again, so first fix that on "
            f"the Lsky side (the group's size limit or file types, the storage strategy, "
            f"the quota, the token), then {requeue}{copy}"
        )
    return f"it failed for good: {requeue} would fail the same way unless its cause changed"


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
            f"a takeover: the lock of attempt {row.attempts} expired {when(expired, now)}; "
            f"its message's next receive or the sweeper's next run takes it over ({then})",
        )
    until = row.locked_at + timedelta(seconds=timing.lock_ttl_seconds)
    return Wait(
        "lock",
        until,
        f"attempt {row.attempts} under way ({row.locked_by or '?'}), its lock held until "
        f"{when(until, now)}",
    )


_RETRY_WORDS = {
    str(WaitReason.OWN_FAULT): "a retry after our own fault (configuration, a bug)",
    str(WaitReason.NO_TIME): "a retry: its invocation had no time left",
}


def _pending(row: RecordRow, lane: LaneState | None, timing: Timing) -> Wait:
    now, due = row.now, row.next_run_at
    held = row.enqueued_at is not None
    message = (
        f"its message held (sent {when(row.enqueued_at, now)})"
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
                f"its backoff until {when(due, now)}, then attempt {row.attempts + 1} "
                f"of {timing.max_attempts}"
            )
            return Wait("backoff", due, f"{words}; {message}{copy}")
        if reason == WaitReason.PACED:
            slot = row.booked_at or due
            booked = "its booked upload slot" if row.booked_at else "an upload slot (pacing)"
            return Wait("slot", slot, f"{booked} at {when(slot, now)}; {message}{copy}")
        if reason == WaitReason.PAUSED:
            return Wait("lane", due, f"the lane's pause, until {when(due, now)}; {message}{copy}")
        why = _RETRY_WORDS.get(reason or "", "its due time")
        return Wait("retry", due, f"{why}, at {when(due, now)}; {message}{copy}")
    due_for = (now - due).total_seconds() if due is not None else 0.0
    if not held:
        if due_for > timing.grace_seconds:
            return Wait(
                "lost",
                None,
                f"nothing: no message is out for it (due {when(due, now)}); the sweeper "
                f"sends one on its next run{copy}",
            )
        sends_at = (due or now) + timedelta(seconds=timing.grace_seconds)
        return Wait(
            "sweeper",
            sends_at,
            f"the sweeper: no message is out for it; it sends one by {when(sends_at, now)}{copy}",
        )
    sent_ago = (now - row.enqueued_at).total_seconds() if row.enqueued_at else 0.0
    if due_for > timing.grace_seconds and sent_ago > timing.interval_seconds:
        return Wait(
            "lost",
            None,
            f"nothing: its message (sent {when(row.enqueued_at, now)}) looks lost; the "
            f"sweeper sends it again on its next run{copy}",
        )
    return Wait(
        "message",
        None,
        f"its message (sent {when(row.enqueued_at, now)}) to reach the archive function{copy}",
    )
