"""What went wrong during an attempt, as data: classified by lib.archive.retry, never by callers.

Every message here is written to the record's archive_error column and to logs, so
it must be readable and free of secrets, URLs with credentials, and response bodies.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from lib.platform.errors import ServiceError


class Stage(enum.StrEnum):
    DOWNLOAD = "download"
    UPLOAD = "upload"
    LOOKUP = "lookup"  # looking for the record's image on Lsky before uploading it again


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


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: a number, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
