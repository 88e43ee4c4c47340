"""When a record may run next, and why (pure): the verdicts for a message that must wait
(backoff, a paused lane, a pacing slot, no time left) and hold versus park, every hold
a visibility SQS accepts. docs/explanation/lane-and-pacing.md draws the states.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from datetime import datetime

from lib.archive.lane import HostCondition, jitter
from lib.archive.outcome import Message, Outcome, Verdict
from lib.platform.redact import outside_text
from lib.platform.sqs import MAX_VISIBILITY_SECONDS
from lib.state.claim import (
    ClaimSnapshot,
    StagedCopy,
    blocked_by_lane,
    early_delay,
    skip_reason,
)
from lib.state.lane import PauseReason
from lib.state.status import WaitReason

# An attempt needs at least this much of the invocation left to be worth starting;
# with less, the row is given back without spending an attempt.
MIN_ATTEMPT_MS = 25_000
# How soon a message comes back after the invocation ran out of time.
NO_TIME_RETRY_SECONDS = 5
# A wait up to this long holds the message (its visibility); a longer one, or a message
# received this often already, parks the row instead (no message out; the sweeper sends
# one when it is due), so a long wait costs no receives (each counts to maxReceiveCount).
HOLD_LIMIT_SECONDS = 900
HOLD_LIMIT_RECEIVES = 3
# SQS refuses a visibility that ends more than 12 h after the message was received; the
# receive was a little before the invocation began, so keep this much in hand.
RECEIVE_SAFETY_SECONDS = 60
# Text from outside (a host's answer) kept in a row or a log line: redacted, then bounded.
DETAIL_LIMIT = 300
# How soon a message comes back after our own fault (configuration, a bug): soon enough
# that a fix applies within minutes, slow enough not to spin.
OWN_FAULT_RETRY_SECONDS = 300


def max_hold_seconds(received_at: float, now: float | None = None) -> int:
    """The longest visibility SQS accepts now for a message received at `received_at`
    (time.monotonic(), the invocation's start): 12 h from the receive, less a margin."""
    elapsed = (time.monotonic() if now is None else now) - received_at
    return max(0, math.floor(MAX_VISIBILITY_SECONDS - RECEIVE_SAFETY_SECONDS - elapsed))


def parks(seconds: float, message: Message) -> bool:
    """Whether a wait of `seconds` parks the row rather than holding its message."""
    return (
        not math.isfinite(seconds)
        or seconds > HOLD_LIMIT_SECONDS
        or message.receive_count >= HOLD_LIMIT_RECEIVES
    )


def too_late_to_start(remaining_ms: int) -> Verdict | None:
    """Checked before the claim: too little of the invocation left to finish a transfer."""
    if remaining_ms >= MIN_ATTEMPT_MS:
        return None
    return Verdict(
        Outcome.RELEASED,
        "not enough time left",
        NO_TIME_RETRY_SECONDS,
        wait_reason=WaitReason.NO_TIME,
        log="not enough time left to start; redelivering",
    )


def no_time_for_transfer() -> Verdict:
    """Claimed, but the transfer could not fit: given back before anything is fetched."""
    return Verdict(
        Outcome.RELEASED,
        "not enough time left",
        NO_TIME_RETRY_SECONDS,
        wait_reason=WaitReason.NO_TIME,
    )


def not_claimed(snapshot: ClaimSnapshot, message: Message) -> Verdict:
    """The claim did not win: a copy that came early waits for the row's due time, a
    paused lane is waited for, anything else is a duplicate or a stray (or the claim
    itself failed the row: an expired lock on the last attempt)."""
    due_in = early_delay(snapshot)
    if due_in is not None:
        return early(due_in, message, booked=snapshot.booked_at is not None)
    if blocked_by_lane(snapshot) and snapshot.lane is not None:
        return wait_for_lane(snapshot.lane.paused_for_seconds, message)
    reason = skip_reason(snapshot)
    if snapshot.exhausted:
        return Verdict(Outcome.FAILED, reason, fields={"error": reason})
    return Verdict(Outcome.DUPLICATE, reason, fields={"reason": reason})


def early(due_in_seconds: int, message: Message, *, booked: bool = False) -> Verdict:
    """A message for a PENDING row that is not due yet (a copy during its backoff, or its
    pacing slot): held until due, or, for a long wait, acknowledged with the row parked.
    `booked`: the row holds a booked slot, so its own message is held for it (this one is
    a copy): keeps_booking says so to a hold SQS refuses (lib.archive.conclusion)."""
    if parks(due_in_seconds, message):
        return Verdict(
            Outcome.PARKED,
            f"due in {due_in_seconds} s",
            due_in_seconds,
            fields={"due_in_seconds": due_in_seconds},
            log="message arrived long before the row is due; record parked",
        )
    return Verdict(
        Outcome.EARLY, f"due in {due_in_seconds} s", due_in_seconds, keeps_booking=booked
    )


def copy_left(verdict: Verdict) -> Verdict | None:
    """A hold SQS refused for a copy of a booked row's message (`early`, keeps_booking):
    the row's own message is held for its slot, so this one is acknowledged and the row
    left as it is (parked, it would lose its booking and its message stamp: the sweeper
    would send a third message once due). None: not such a copy."""
    if verdict.outcome is not Outcome.EARLY or not verdict.keeps_booking:
        return None
    log = "message visibility refused; a copy acknowledged, the row's own is held for its slot"
    return replace(verdict, outcome=Outcome.DUPLICATE, log=log)


def wait_for_lane(
    seconds: float,
    message: Message,
    *,
    condition: HostCondition | None = None,
    may_be_hosted: bool | None = None,
    staged: StagedCopy | None = None,
) -> Verdict:
    """Wait `seconds` (inf: until cleared) for a paused lane without spending the attempt:
    the message is held for a short pause, the row parked for a long one."""
    park = parks(seconds, message)
    paused_for = None if math.isinf(seconds) else round(seconds)
    if park:
        # The row's due time: the end of the pause (0 for a pause until cleared: the
        # sweeper sends parked rows only once the lane is open again).
        delay = max(1, math.ceil(seconds)) if math.isfinite(seconds) else 0
    else:
        delay = min(math.ceil(seconds + jitter(seconds)), HOLD_LIMIT_SECONDS)
    detail = (
        outside_text(f"lane paused ({condition.reason}): {condition.detail}", DETAIL_LIMIT)
        if condition is not None
        else "lane paused"
    )
    fields: dict[str, object] = {"paused_for_seconds": paused_for}
    if condition is not None:
        fields |= {
            "reason": str(condition.reason),
            "window": condition.window,
            "detail": outside_text(condition.detail, DETAIL_LIMIT),
        }
    return Verdict(
        Outcome.PARKED if park else Outcome.PAUSED,
        detail,
        delay,
        may_be_hosted=may_be_hosted,
        staged=staged,
        wait_reason=WaitReason.PAUSED,
        metrics=_condition_metrics(condition),
        fields=fields,
    )


def wait_for_slot(
    seconds: float,
    message: Message,
    *,
    booked: bool,
    early: float = 0.0,
    staged: StagedCopy | None = None,
    may_be_hosted: bool | None = None,
) -> Verdict:
    """Pacing: the next upload slot is `seconds` away. A booked slot holds the message until
    then, less `early` (the fetch and the queue's pickup, so the bytes are in hand when
    the slot comes, and the tolerance a slot is taken within); a slot too far to book
    parks the row until about then, to queue afresh (a parked row keeps no booking: its
    message is gone, and the sweeper sends a new one about then)."""
    # take_slot dates a held message's booking whole seconds from now plus its lead (up to
    # the tolerance later): the database's microseconds must not round that to a second more.
    delay = max(1, math.ceil(round(seconds - max(early, 0.0), 3)))
    park = not booked or parks(seconds, message)
    return Verdict(
        Outcome.PARKED if park else Outcome.PAUSED,
        f"paced: the next upload slot is in {delay} s",
        delay,
        may_be_hosted=may_be_hosted,
        staged=staged,
        wait_reason=WaitReason.PACED,
        keeps_booking=not park,
        fields={"paced_for_seconds": delay, "booked": booked},
        log=(
            "paced: record parked until its upload slot"
            if park
            else "paced: message held until its upload slot"
        ),
    )


def paused_for(until: datetime | None, now: datetime) -> float:
    """Seconds from `now` to the end of a pause (inf: until cleared)."""
    return (until - now).total_seconds() if until is not None else math.inf


def _condition_metrics(condition: HostCondition | None) -> tuple[str, ...]:
    if condition is None or condition.reason is PauseReason.PACING:
        return ()
    if condition.reason is PauseReason.ACCOUNT:
        return ("AccountProblem",)
    return ("RateLimited",)
