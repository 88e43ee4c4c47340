"""The words of one attempt: the message, what became of it (Outcome), what the steps
decided before it is concluded (Verdict), and what the handler is told (Result)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lib.archive.fidelity import Digest, Fidelity, compare
from lib.platform.errors import ServiceError
from lib.state.claim import KeptOriginal, SentImage, StagedCopy
from lib.state.status import WaitReason
from lib.transfer.lsky_upload import HostedImage


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
    UNCONCLUDED = "unconcluded"  # nothing could be written (database unreachable): SQS redelivers
    OWN_FAULT = "own_fault"  # our configuration or code stopped it: attempt given back
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
        Outcome.OWN_FAULT,
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
    sent_at: datetime | None = None  # SentTimestamp (SQS's clock); None when unreadable

    @property
    def queue_mark(self) -> datetime | None:
        """What this receive says of how far the queue has been read: on a message's first
        receive, that a message sent at `sent_at` came out (the sweeper's lost-message rule
        reads the newest). A later receive says nothing of the messages sent after it."""
        return self.sent_at if self.receive_count == 1 else None


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    record_id: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Copied:
    """An image now on Lsky: uploaded by this attempt, or adopted from an earlier one."""

    hosted: HostedImage
    size: int  # bytes sent to Lsky (0 when adopted)
    # Adopted: an earlier attempt had stored it, nothing was sent. `duplicates`: the keys
    # of further images with the record's name (stored before this fix, or by hand).
    adopted: bool = False
    duplicates: tuple[str, ...] = ()
    sent: Digest | None = None  # md5/sha1/size of the bytes sent (None when adopted)
    # Uploaded although the look-up for an earlier attempt's image could not be answered.
    duplicate_possible: bool = False
    # The original kept beside it (lib.archive.originals), or why none was (originals on).
    original: KeptOriginal | None = None
    original_missing: str | None = None

    @property
    def fidelity(self) -> Fidelity | None:
        """The bytes sent against those Lsky says it stored (None when adopted)."""
        return None if self.sent is None else compare(self.sent, self.hosted.data)


@dataclass(frozen=True)
class Verdict:
    """What an attempt came to, for lib.archive.conclusion to carry out.

    detail: the reason or error summary (stored in archive_error where the write keeps one).
    delay_seconds: when the row (and its message, if held) is next due.
    may_be_hosted: what the row records for the next attempt; None keeps the claim's.
    staged: a copy staged during this attempt; keep_staged: a FAILED row keeps it;
    forget_staged: the row's own copy is dropped (it did not match what was captured).
    wait_reason: why a row given back waits (archive-ctl status counts them).
    counted: this attempt sent an upload Lsky may have counted (its pacing slot stays in
    the ledger as an upload; otherwise the statement gives it back);
    keeps_booking: the row comes back for its booked slot (every other outcome frees it).
    """

    outcome: Outcome
    detail: str = ""
    delay_seconds: int = 0
    may_be_hosted: bool | None = None
    staged: StagedCopy | None = None
    keep_staged: bool = False
    forget_staged: bool = False
    wait_reason: WaitReason | None = None
    counted: bool = False
    keeps_booking: bool = False
    sent: SentImage | None = None  # what this attempt's upload sent, when it may be kept
    copied: Copied | None = None
    metrics: tuple[str, ...] = ()  # counted besides the outcome's own metric
    fields: Mapping[str, Any] = field(default_factory=dict)  # logged with the outcome
    log: str | None = None  # the log line's text when it says more than the table's


def archived(copied: Copied) -> Verdict:
    """The verdict of an image now on Lsky (uploaded, or adopted)."""
    return Verdict(
        Outcome.ARCHIVED,
        copied.hosted.url,
        copied=copied,
        fields={"bytes": copied.size, "mime_type": copied.hosted.mime_type},
    )
