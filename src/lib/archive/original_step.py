"""The original's part in an attempt (lib.archive.originals): its write starts with the
upload (beside a relayed one, or from the bytes in hand; a staged copy copied in), is
kept once Lsky has taken the image, dropped when it has not; an adoption keeps the bytes
in hand. What the record's `archived` event says of it comes from here too."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from lib.archive.budget import time_left
from lib.archive.originals import WAIT_SECONDS, Keeping, Originals
from lib.archive.outcome import Copied, Outcome, Verdict
from lib.archive.staging import Staging
from lib.state.claim import Task
from lib.transfer.held import HeldImage
from lib.transfer.relay import Beside, Reader, Relay

# Why an archived record has no original, in its `archived` event (S3's own failures are
# logged with the error, and counted).
NOT_IN_HAND = "adopted without the bytes in hand: the audit keeps it"
NOT_WRITTEN = "not written: S3 refused or was late (logged); the audit keeps it"


class Attempt(Protocol):
    """What of an attempt the step reads, and where it keeps the write under way."""

    task: Task
    deadline: float
    from_staged: bool
    from_original: bool  # a restore's original: it is the record's original already
    keeping: Keeping | None


class OriginalStep:
    def __init__(self, originals: Originals, staging: Staging) -> None:
        self.originals = originals
        self.staging = staging

    def relayed(self, at: Attempt) -> Beside | None:
        """What starts the original's write beside a relayed upload, reading the download
        as it lands (Copier.fetch); None when originals are off."""
        if not self.originals.enabled:
            return None

        def start(relay: Relay) -> Reader:
            keeping = self.originals.beside(at.task.record_id, relay, relay.image_type, at.deadline)
            if keeping is None:  # pragma: no cover - enabled was checked
                raise AssertionError("originals are on")
            at.keeping = keeping
            return keeping

        return start

    def start(self, at: Attempt, held: HeldImage) -> None:
        """The upload is about to read the bytes in hand: the original's write reads them
        beside it (a staged copy is copied in instead). Stopped before the spool's release."""
        if at.keeping is not None or at.from_original or not self.originals.enabled:
            return  # under way beside the relay already, the original itself, or off
        task, bucket = at.task, self.staging.bucket
        if at.from_staged and bucket is not None and task.staged_key is not None:
            at.keeping = self.originals.copied_in(
                task.record_id, bucket.name, task.staged_key, held, at.deadline
            )
        if at.keeping is None:  # not a staged copy (or one read back without its ETag)
            at.keeping = self.originals.beside(task.record_id, held, held.image_type, at.deadline)
        if at.keeping is not None:
            held.readers.append(at.keeping.stop)

    def kept(self, at: Attempt, copied: Copied) -> Copied:
        """Lsky has taken the image: `copied` with its original, unconfirmed when its body
        has gone out whole and S3 has not answered yet (the next claim records the answer);
        else waited for at most WAIT_SECONDS (never past the attempt's deadline); or why
        there is none."""
        if not self.originals.enabled:
            return copied
        if at.from_original and at.task.restore is not None:
            return replace(copied, original=at.task.restore.original)
        if at.keeping is None:
            return replace(copied, original_missing=NOT_IN_HAND)
        wait = min(WAIT_SECONDS, time_left(at.deadline))
        original = at.keeping.kept(wait, later=self.originals.confirmations)
        if original is None:
            return replace(copied, original_missing=NOT_WRITTEN)
        return replace(copied, original=original)

    def dropped(self, at: Attempt) -> None:
        """Lsky has not taken the image: no original is recorded for this attempt."""
        if at.keeping is not None:
            at.keeping.drop()

    def adopted(self, at: Attempt, verdict: Verdict, held: HeldImage | None) -> Verdict:
        """The look-up ended the attempt: an adopted image keeps the bytes in hand as its
        original (nothing was uploaded to write beside); without them it has none."""
        copied = verdict.copied
        if verdict.outcome is not Outcome.ARCHIVED or copied is None:
            return verdict
        if held is not None:
            self.start(at, held)
        return replace(verdict, copied=self.kept(at, copied))
