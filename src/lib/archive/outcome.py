"""What became of one message: the outcome the worker reports, and the one rule that
says whether SQS delivers it again."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lib.platform.errors import ServiceError


class Outcome(enum.StrEnum):
    ARCHIVED = "archived"
    RETRY = "retry"
    FAILED = "failed"
    DUPLICATE = "duplicate"
    EARLY = "early"  # a copy that came during the row's backoff: held until due
    MALFORMED = "malformed"  # moved to the DLQ with its reason
    # Malformed, but the DLQ send failed: redelivered at once, so the redrive policy parks it.
    MALFORMED_LEFT = "malformed_left"
    RELEASED = "released"  # given back unspent: not enough time left
    UNCONCLUDED = "unconcluded"  # database unreachable or our own fault: SQS redelivers
    LOST_LOCK = "lost_lock"  # the lock passed on before our write: the new holder concludes
    PAUSED = "paused"  # the upload lane is paused: held until it opens, no attempt spent
    PARKED = "parked"  # paused for longer than a hold: the sweeper sends it when due

    @property
    def redelivers(self) -> bool:
        """The one ack-or-redeliver rule: SQS delivers these again after the visibility
        the worker set; every other outcome is acknowledged (deleted)."""
        return self in _REDELIVERED


_REDELIVERED = frozenset(
    {
        Outcome.RETRY,
        Outcome.EARLY,
        Outcome.RELEASED,
        Outcome.UNCONCLUDED,
        Outcome.MALFORMED_LEFT,
        Outcome.PAUSED,
    }
)


class Redelivered(ServiceError):
    """Raised for Powertools' batch processor: report the message as a batch item failure."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.outcome}: {result.detail}")
        self.result = result


@dataclass(frozen=True)
class Message:
    message_id: str
    body: str
    receipt_handle: str
    queue_arn: str
    receive_count: int = 1


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    record_id: int | None = None
    detail: str = ""
