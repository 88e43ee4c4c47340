"""What went wrong during an attempt, as data: classified by lib.archive.retry, never by callers.

Every message here is written to the record's archive_error column and to logs, so
it must be readable and free of secrets, URLs with credentials, and response bodies.
"""

from __future__ import annotations

import enum
import math
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from lib.platform.errors import ServiceError


class Stage(enum.StrEnum):
    DOWNLOAD = "download"
    UPLOAD = "upload"
    LOOKUP = "lookup"  # looking for the record's image on Lsky before uploading it again
    RESTORE = "restore"  # a restore's own steps: the original read back, the damaged copy


class Kind(enum.StrEnum):
    HTTP_STATUS = "http_status"  # the peer answered with an error status
    TIMEOUT = "timeout"  # connect/read timeout or the attempt's deadline
    CONNECTION = "connection"  # refused, reset, DNS did not answer, dropped mid-body
    NO_SUCH_HOST = "no_such_host"  # DNS answered: the name does not exist (NXDOMAIN)
    REFUSED_URL = "refused_url"  # scheme, host name or address the downloader will not fetch
    NOT_IMAGE = "not_image"  # the bytes are not an image we know
    TOO_LARGE = "too_large"  # over ARCHIVE_MAX_IMAGE_BYTES
    REJECTED = "rejected"  # Lsky answered status:false
    BAD_RESPONSE = "bad_response"  # Lsky answered something we cannot read


@dataclass(frozen=True)
class Failure:
    stage: Stage
    kind: Kind
    message: str
    status: int | None = None
    retry_after: float | None = None  # seconds, when the peer said so
    # Lsky may have stored the image although the attempt failed (an upload whose answer
    # was lost): set by lib.archive.copier, recorded for the next attempt to look up.
    may_be_hosted: bool = False


class ArchiveFailure(ServiceError):
    """Raised by download/upload code; carries the Failure for lib.archive.retry to classify."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def fail(
    stage: Stage,
    kind: Kind,
    message: str,
    *,
    status: int | None = None,
    retry_after: float | None = None,
) -> ArchiveFailure:
    return ArchiveFailure(Failure(stage, kind, message, status=status, retry_after=retry_after))


# Retry-After is a peer's say-so: read at most this far (a day; callers cap it lower).
RETRY_AFTER_READ_LIMIT_SECONDS = 86_400.0
_DELAY_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """Retry-After as seconds from now, within [0, RETRY_AFTER_READ_LIMIT_SECONDS]: delay
    seconds (fractions tolerated) or an HTTP date (a past one is 0). None when absent or
    unreadable; never raises, however huge, negative or malformed the value."""
    if not value:
        return None
    text = value.strip()[:64]
    if _DELAY_SECONDS.fullmatch(text):
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
            seconds = when.timestamp() - (time.time() if now is None else now)
        except (TypeError, ValueError, OverflowError, IndexError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_READ_LIMIT_SECONDS)
