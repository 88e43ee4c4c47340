"""When a record may run next, and why (pure): the verdicts for a message that must wait
(backoff, a paused or paced lane, no time left), and hold versus park.

docs/archive.md ("When a record runs") has the rationale and the state diagram.
"""

from __future__ import annotations

import math
from datetime import datetime

from lib.archive.lane import HostCondition, jitter
from lib.archive.outcome import Message, Outcome, Verdict
from lib.platform.sqs import MAX_VISIBILITY_SECONDS
from lib.state.claim import ClaimSnapshot, blocked_by_lane, early_delay, skip_reason
from lib.state.lane import PauseReason

# An attempt needs at least this much of the invocation left to be worth starting;
# with less, the row is given back without spending an attempt.
MIN_ATTEMPT_MS = 25_000
# How soon a message comes back after the invocation ran out of time.
NO_TIME_RETRY_SECONDS = 5
# A paused lane holds a message (its visibility) for pauses up to this long; longer ones,
# or a message received this often already, park the row instead, so that a long pause
# costs no receives (each one counts towards maxReceiveCount).
HOLD_LIMIT_SECONDS = 900
HOLD_LIMIT_RECEIVES = 3
# How soon a message comes back after our own fault (configuration, a bug): soon enough
# that a fix applies within minutes, slow enough not to spin.
OWN_FAULT_RETRY_SECONDS = 300


def too_late_to_start(remaining_ms: int) -> Verdict | None:
    """Checked before the claim: too little of the invocation left to finish a transfer."""
    if remaining_ms >= MIN_ATTEMPT_MS:
        return None
    return Verdict(
        Outcome.RELEASED,
        "not enough time left",
        NO_TIME_RETRY_SECONDS,
        log="not enough time left to start; redelivering",
    )


def no_time_for_transfer() -> Verdict:
    """Claimed, but the transfer could not fit: given back before anything is fetched."""
    return Verdict(Outcome.RELEASED, "not enough time left", NO_TIME_RETRY_SECONDS)


def not_claimed(snapshot: ClaimSnapshot, message: Message) -> Verdict:
    """The claim did not win: a copy that came early is held back, a paused lane is
    waited for, anything else is a duplicate or a stray (or the claim failed the row)."""
    hold = early_delay(snapshot)
    if hold is not None:
        return Verdict(Outcome.EARLY, f"due in {hold} s", hold)
    if blocked_by_lane(snapshot) and snapshot.lane is not None:
        return wait_for_lane(snapshot.lane.paused_for_seconds, message)
    reason = skip_reason(snapshot)
    if snapshot.exhausted:
        # The claim itself concluded the row: a failure, not a duplicate.
        return Verdict(Outcome.FAILED, reason, fields={"error": reason})
    return Verdict(Outcome.DUPLICATE, reason, fields={"reason": reason})


def wait_for_lane(
    seconds: float,
    message: Message,
    *,
    condition: HostCondition | None = None,
    may_be_hosted: bool | None = None,
    staged_key: str | None = None,
) -> Verdict:
    """Wait `seconds` (inf: until cleared) for the lane without spending the attempt: the
    message is held (its visibility) for a short pause, the row parked for a long one."""
    park = seconds > HOLD_LIMIT_SECONDS or message.receive_count >= HOLD_LIMIT_RECEIVES
    paused_for = None if math.isinf(seconds) else round(seconds)
    if park:
        # The row's due time: the end of the pause (0 for a pause until cleared: the
        # sweeper sends parked rows only once the lane is open again).
        delay = max(1, math.ceil(seconds)) if math.isfinite(seconds) else 0
    else:
        delay = min(math.ceil(seconds + jitter(seconds)), MAX_VISIBILITY_SECONDS)
    detail = (
        f"lane paused ({condition.reason}): {condition.detail}"[:300]
        if condition is not None
        else "lane paused"
    )
    return Verdict(
        Outcome.PARKED if park else Outcome.PAUSED,
        detail,
        delay,
        may_be_hosted=may_be_hosted,
        staged_key=staged_key,
        metrics=_condition_metrics(condition),
        fields={"paused_for_seconds": paused_for}
        | (_condition_fields(condition) if condition is not None else {}),
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


def _condition_fields(condition: HostCondition) -> dict[str, object]:
    return {
        "reason": str(condition.reason),
        "window": condition.window,
        "detail": condition.detail[:200],
    }
