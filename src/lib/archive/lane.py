"""The host-aware lane's rules (pure): which answers pause every upload, for how long,
and when pacing lets the next upload go. docs/explanation/lane-and-pacing.md has the rationale.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from lib.ratelimit.limiter import LONGEST_MONTH_SECONDS
from lib.state.lane import PauseReason
from lib.transfer.failures import Failure, Kind, Stage

# Lsky Pro 2.x (ImageService::rateLimiter): "每{分钟|小时|天|周|月}内你最多可以上传 N 张图片".
_RATE_LIMIT = re.compile(r"每\s*(分钟|小时|天|周|月)\s*内.*?最多可以上传\s*(\d+)")
RATE_LIMIT_MARKER = "最多可以上传"
WINDOWS = {
    "分钟": ("minute", 60),
    "小时": ("hour", 3_600),
    "天": ("day", 86_400),
    "周": ("week", 604_800),
    "月": ("month", LONGEST_MONTH_SECONDS),  # PHP's "-1 month": 28 to 31 days (limiter)
}
# Wording we do not recognise: a pause long enough to matter, short enough to re-test soon.
SAFE_PAUSE_SECONDS = 900
# Where Lsky's clock is set back, the hour it repeats: a window's uploads of that hour count
# again at their second pass (lib.ratelimit.limiter.repeated).
REPEATED = timedelta(hours=1)
# A 429 without Retry-After (Laravel's throttle middleware counts per minute).
DEFAULT_429_SECONDS = 60
# Problems of the host account, not of a record: no retry can fix them, an operator can.
ACCOUNT_MESSAGES = (
    "储存空间不足",  # quota used up
    "管理员关闭了游客上传",  # guest uploads refused: our token was not applied
    "账户未验证",  # account not verified
    "账号状态异常",  # account suspended
)
ACCOUNT_STATUSES = frozenset({401, 403})
# Account states Lsky's profile endpoint does not show: only an operator clears these.
NOT_PROBEABLE = ("账户未验证", "账号状态异常")
# Spread the return of held messages so the containers do not all come back at once.
MAX_JITTER_SECONDS = 5.0


@dataclass(frozen=True)
class HostCondition:
    """An answer that concerns every upload of the account, not the record at hand."""

    reason: PauseReason
    detail: str
    window: str | None = None  # minute ... month; "unknown" for unrecognised wording
    window_seconds: int | None = None
    limit: int | None = None  # uploads allowed in the window, as Lsky said
    seconds: float | None = None  # a pause Lsky asked for (Retry-After)


def host_condition(failure: Failure) -> HostCondition | None:
    """The lane-wide meaning of a failure talking to Lsky (the upload, or the look-up
    before it), or None when it is the record's own."""
    if failure.stage not in (Stage.UPLOAD, Stage.LOOKUP):
        return None
    message = failure.message
    if RATE_LIMIT_MARKER in message or failure.status == 429:
        return _rate_limit(failure)
    if failure.kind is Kind.REJECTED and any(text in message for text in ACCOUNT_MESSAGES):
        return HostCondition(PauseReason.ACCOUNT, message)
    if failure.kind is Kind.HTTP_STATUS and failure.status in ACCOUNT_STATUSES:
        return HostCondition(PauseReason.ACCOUNT, message)
    if failure.retry_after is not None:
        return HostCondition(PauseReason.RETRY_AFTER, message, seconds=failure.retry_after)
    return None


def _rate_limit(failure: Failure) -> HostCondition:
    match = _RATE_LIMIT.search(failure.message)
    if match is not None:
        window, seconds = WINDOWS[match.group(1)]
        limit = int(match.group(2))
        return HostCondition(
            PauseReason.RATE_LIMIT, failure.message, window, seconds, limit or None
        )
    if failure.status == 429:
        seconds_asked = failure.retry_after or DEFAULT_429_SECONDS
        return HostCondition(PauseReason.RATE_LIMIT, failure.message, seconds=seconds_asked)
    return HostCondition(PauseReason.RATE_LIMIT, failure.message, "unknown")


def pause_until(
    condition: HostCondition,
    *,
    now: datetime,
    window_frees_at: datetime | None,
    max_retry_after_seconds: float,
) -> datetime | None:
    """When the lane may upload again; None: until an operator or the probe clears it.

    A Retry-After (or a 429's default) is capped at max_retry_after_seconds. A window Lsky
    named frees when the limit-th newest upload the ledger has leaves it, as Lsky counts
    (`window_frees_at`: lib.ratelimit.limiter.window_frees, through lib.state.lane_store;
    the whole window when the ledger has fewer, since other clients count too); a
    window the ledger could not date (or dates past now, or beyond two windows and the
    hour a clock set back repeats: Lsky's second and summer time lengthen one by an hour
    at most, and an upload of that hour counts again at its second pass) is waited out
    whole.
    """
    if condition.reason is PauseReason.ACCOUNT:
        return None
    if condition.seconds is not None:
        seconds = min(max(condition.seconds, 0.0), max_retry_after_seconds)
        return now + timedelta(seconds=seconds)
    if condition.window_seconds is None:
        return now + timedelta(seconds=SAFE_PAUSE_SECONDS)
    whole = timedelta(seconds=condition.window_seconds)
    if window_frees_at is not None and now < window_frees_at <= now + 2 * whole + REPEATED:
        return window_frees_at
    return now + whole


def probe_can_clear(detail: str | None) -> bool:
    """Whether a healthy profile answer proves an account pause over (a token refused,
    the API switched off, a full quota); an unverified or suspended account does not
    show in the profile, so its pause waits for `archive-ctl lane clear`."""
    return not any(text in (detail or "") for text in NOT_PROBEABLE)


def jitter(pause_seconds: float, rng: random.Random | None = None) -> float:
    """A random spread for a held message's return: a twentieth of the pause, at most
    MAX_JITTER_SECONDS, so short pauses stay short."""
    return (rng or random).uniform(0.0, min(MAX_JITTER_SECONDS, pause_seconds / 20))
