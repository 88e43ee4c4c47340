"""After a failed attempt: may Lsky have stored an image for it that the row does not point at,
and is a listed image one it can adopt? Pure; the copier applies both, the row keeps
archive_may_be_hosted. docs/explanation/one-stored-copy.md has the reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from lib.archive.retry import LSKY_PERMANENT_MESSAGES, LSKY_TRANSIENT_MESSAGES
from lib.state.claim import SentImage
from lib.transfer.failures import Failure, Kind, Stage

# hosted_response is Lsky's `data`; our own notes about it go under this key.
RESPONSE_KEY = "_archive"

# Lsky's catch-all answer: users report it for files that were stored.
CATCH_ALL_MESSAGE = "服务异常"
# Answers that mean no image row was kept: checks before the store, the rate limiter, a
# failed write (图片上传失败), a row that could not be saved, a flagged image deleted again.
_NOTHING_KEPT = tuple(
    m for m in LSKY_PERMANENT_MESSAGES + LSKY_TRANSIENT_MESSAGES if m != CATCH_ALL_MESSAGE
)
# No answer, or one we cannot read, after the whole request went out.
_NO_ANSWER = frozenset({Kind.TIMEOUT, Kind.CONNECTION, Kind.BAD_RESPONSE})


def may_be_hosted(failure: Failure, *, body_complete: bool) -> bool:
    """Whether Lsky may have stored an image for the attempt that failed with `failure`.

    body_complete: an upload request was started and, as far as we know, every byte of it
    went out. False when none was started or a streamed body broke off: Lsky stores
    nothing from an incomplete request (docs/explanation/transfers.md, "Multipart bodies").
    """
    if failure.stage is Stage.LOOKUP:
        # The look-up that should have settled the earlier attempt did not: still unknown.
        return True
    if failure.stage is not Stage.UPLOAD or not body_complete:
        return False
    match failure.kind:
        case Kind.HTTP_STATUS:
            # 3xx/4xx come from the framework before the upload code; a 5xx (or a gateway
            # giving up on a slow PHP) may come after the file was stored.
            return failure.status is None or failure.status >= 500
        case Kind.REJECTED:
            message = failure.message
            if CATCH_ALL_MESSAGE in message:
                return True
            # An answer we do not know: assume the worst, it costs one look-up.
            return not any(known in message for known in _NOTHING_KEPT)
        case _:
            return failure.kind in _NO_ANSWER


# Lsky lists an image's `date` as created_at in the app's time zone (config/app.php:
# 'timezone' => 'PRC', unless the admin changed it: LSKY_TIMEZONE).
DEFAULT_HOST_TIMEZONE = "Asia/Shanghai"
# How far Lsky's clock may be behind the database's before a fresh upload looks older
# than the claim that made it.
CLOCK_SKEW_SECONDS = 300
SKEW = timedelta(seconds=CLOCK_SKEW_SECONDS)


def not_ours(
    item: Mapping[str, Any],
    *,
    first_claimed_at: datetime | None,
    sent: SentImage | None,
    host_timezone: tzinfo,
) -> str | None:
    """Why a listed image with the record's name cannot be this record's upload, or None
    when it can: stored after the record's first claim (by any reading of its listed
    time), and having the bytes we send (the same sha1: the host kept them) or,
    re-encoded, the same dimensions."""
    readings = listed_instants(item.get("date"), host_timezone)
    earliest = None if first_claimed_at is None else first_claimed_at - SKEW
    if readings and earliest is not None and readings[-1] < earliest:
        stored = " or ".join(reading.isoformat() for reading in readings)
        return f"stored at {stored}, before the record's first claim"
    if sent is None:
        return None  # nothing in hand to compare: the name and the time decide
    if isinstance(item.get("sha1"), str) and item["sha1"].strip().lower() == sent.sha1:
        return None
    width, height = item.get("width"), item.get("height")
    if isinstance(width, int) and isinstance(height, int) and sent.dimensions is not None:
        ours_w, ours_h = sent.dimensions
        if (width, height) != (ours_w, ours_h):
            return f"{width}x{height}, the image is {ours_w}x{ours_h}"
    return None


def why_ours(item: Mapping[str, Any], *, sent: SentImage | None) -> str:
    """Why a listed image `not_ours` accepts can be this record's upload (the story's
    `looked_up`): its name and time, and what else matched."""
    named = "the record's name, stored after its first claim"
    if sent is None:
        return f"{named} (no bytes in hand to compare)"
    if isinstance(item.get("sha1"), str) and item["sha1"].strip().lower() == sent.sha1:
        return f"{named}, the sha1 of the bytes sent"
    if sent.dimensions is not None and isinstance(item.get("width"), int):
        width, height = sent.dimensions
        return f"{named}, {width}x{height} as the image sent (the host re-encoded it)"
    return f"{named} (the host lists no size to compare)"


def listed_instants(value: Any, zone: tzinfo) -> tuple[datetime, ...]:
    """Every instant Lsky's listed local time (`Y-m-d H:i:s` in its app zone) can stand
    for, earliest first: one, or two for a time the zone's clocks show twice (the hour
    they fall back: either may be ours) and for one they skip (spring forward: only a
    wrong clock writes it; read with the offsets on both sides). Empty when unreadable."""
    if not isinstance(value, str):
        return ()
    try:
        local = datetime.strptime(value.strip()[:19], "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return ()
    try:
        readings = {local.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)}
    except (OverflowError, ValueError):  # year 1 or 9999 moved past the calendar's ends
        return ()
    return tuple(sorted(readings))
