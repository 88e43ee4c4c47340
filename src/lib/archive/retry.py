"""Pure decisions: error class, retry delay, next state. No I/O here, so every rule
can be tested from a table without servers."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from lib.platform.sqs import MAX_VISIBILITY_SECONDS
from lib.transfer.failures import Failure, Kind, Stage

# Lsky Pro 2.x answers almost every upload error with HTTP 200 and status:false;
# only its message tells a bad file from a busy server. Substrings of those messages.
LSKY_PERMANENT_MESSAGES = (
    "不支持的文件类型",  # unsupported file type
    "图片大小超出限制",  # image too large for the group
    "选定的策略不存在",  # strategy does not exist
    "储存空间不足",  # quota used up
    "管理员关闭了游客上传",  # guest uploads disabled (token not applied)
    "账户未验证",  # account not verified
    "账号状态异常",  # account suspended
    "图片涉嫌违规",  # flagged by moderation
)
LSKY_TRANSIENT_MESSAGES = (
    "最多可以上传",  # upload-count window (每...内你最多可以上传 N 张图片)
    "图片上传失败",  # storage write failed
    "图片记录保存失败",  # database write failed
    "服务异常",  # the catch-all "service error, try again later"
    "Too Many Attempts",
)

# Upstream statuses that will not change on retry: the provider's temporary URL
# is gone or was never ours to read.
DOWNLOAD_PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 405, 410, 414, 451})
# Lsky: bad token, API disabled, file too large for nginx/PHP, unprocessable.
UPLOAD_PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 419, 422})


class ErrorClass(enum.StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"


def classify(failure: Failure) -> ErrorClass:
    """The one place that decides whether a failure can succeed on retry."""
    if failure.stage is Stage.LOOKUP:
        # Never fail a record on a look-up: its image may well be on the host already.
        return ErrorClass.TRANSIENT
    if failure.stage is Stage.RESTORE:
        # An original that is not what was kept, or a damaged copy Lsky would reuse, does
        # not change by itself; the bucket or the host not answering may.
        transient = failure.kind in (Kind.TIMEOUT, Kind.CONNECTION)
        return ErrorClass.TRANSIENT if transient else ErrorClass.PERMANENT
    match failure.kind:
        case Kind.REFUSED_URL | Kind.NO_SUCH_HOST | Kind.NOT_IMAGE | Kind.TOO_LARGE:
            return ErrorClass.PERMANENT
        case Kind.TIMEOUT | Kind.CONNECTION | Kind.BAD_RESPONSE:
            return ErrorClass.TRANSIENT
        case Kind.HTTP_STATUS:
            permanent = (
                DOWNLOAD_PERMANENT_STATUSES
                if failure.stage is Stage.DOWNLOAD
                else UPLOAD_PERMANENT_STATUSES
            )
            return ErrorClass.PERMANENT if failure.status in permanent else ErrorClass.TRANSIENT
        case Kind.REJECTED:
            return classify_lsky_message(failure.message)
    raise AssertionError(f"unclassified failure kind {failure.kind}")  # pragma: no cover


def classify_lsky_message(message: str) -> ErrorClass:
    # Transient patterns first: the catch-all must not be read as permanent.
    if any(pattern in message for pattern in LSKY_TRANSIENT_MESSAGES):
        return ErrorClass.TRANSIENT
    if any(pattern in message for pattern in LSKY_PERMANENT_MESSAGES):
        return ErrorClass.PERMANENT
    # Unknown text: retrying is bounded by the attempt limit, failing at once is not undoable.
    return ErrorClass.TRANSIENT


def retry_delay(attempt: int, delays: tuple[int, ...]) -> int:
    """Seconds to wait after attempt N (1-based) failed; the last delay repeats."""
    return delays[min(max(attempt, 1), len(delays)) - 1]


class Action(enum.StrEnum):
    RETRY = "retry"
    FAIL = "fail"


@dataclass(frozen=True)
class Decision:
    action: Action
    error_class: ErrorClass
    delay_seconds: int = 0


def decide(
    failure: Failure,
    *,
    attempt: int,
    max_attempts: int,
    delays: tuple[int, ...],
    max_retry_after: float = MAX_VISIBILITY_SECONDS,
) -> Decision:
    """What to do after attempt `attempt` failed with `failure`; a Retry-After longer than
    the backoff is honoured up to `max_retry_after` seconds."""
    error_class = classify(failure)
    if error_class is ErrorClass.PERMANENT or attempt >= max_attempts:
        return Decision(Action.FAIL, error_class)
    delay = retry_delay(attempt, delays)
    if failure.retry_after is not None:
        asked = min(failure.retry_after, max_retry_after, MAX_VISIBILITY_SECONDS)
        delay = max(delay, math.ceil(max(asked, 0.0)))
    return Decision(Action.RETRY, error_class, min(delay, MAX_VISIBILITY_SECONDS))


def error_summary(failure: Failure, *, attempt: int, max_attempts: int) -> str:
    """The text stored in archive_error: stage, reason and where in the attempt budget."""
    status = f" (HTTP {failure.status})" if failure.status is not None else ""
    return f"{failure.stage} failed{status}: {failure.message} [attempt {attempt}/{max_attempts}]"


def redelivery_delay(lock_ttl: int) -> int:
    """Visibility for a message whose attempt could not be concluded (database down).

    The claim may have committed before the connection died, so the message must not
    come back before that lock expires, or it would be acknowledged as a duplicate.
    """
    return min(lock_ttl + 5, MAX_VISIBILITY_SECONDS)
