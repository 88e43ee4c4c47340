"""After a failed attempt: may Lsky hold an image for it that the row does not point at?

Pure; the copier applies it to every failure it raises, the state machine records it
(archive_may_be_hosted), and the next attempt looks the image up first when it is set.
docs/archive.md ("Exactly one stored copy") has the reasoning.
"""

from __future__ import annotations

from lib.archive.retry import LSKY_PERMANENT_MESSAGES, LSKY_TRANSIENT_MESSAGES
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
    nothing from an incomplete request (docs/transfer.md, "Multipart bodies").
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
