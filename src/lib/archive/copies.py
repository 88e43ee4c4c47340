"""The bytes in hand from a copy we keep, not from the provider: the row's staged copy, or
a restore's original, read back and checked against what was kept; a copy that is not what
was kept is never published (docs/explanation/staging-and-originals.md,
docs/explanation/audit-and-repair.md)."""

from __future__ import annotations

from typing import Protocol

from lib.archive import story
from lib.archive.originals import OriginalMismatch, OriginalMissing, Originals, OriginalsError
from lib.archive.outcome import Verdict
from lib.archive.staging import StagedCopyMismatch, Staging, mismatched
from lib.platform.observability import logger
from lib.platform.s3 import StagedCopyMissing
from lib.state.claim import KeptOriginal, Task
from lib.state.events import EventLog
from lib.transfer.failures import Failure, Kind, Stage
from lib.transfer.held import HeldImage


class Attempt(Protocol):
    """What of an attempt reading a copy back uses, and what it notes of where it came from."""

    task: Task
    deadline: float
    events: EventLog
    restage: bool
    from_staged: bool
    from_original: bool


def kept_copy(
    staging: Staging, originals: Originals, at: Attempt
) -> HeldImage | Verdict | Failure | None:
    """A restore's original, else the row's staged copy, read back: the bytes in hand, the
    verdict or failure on a copy that is not what was kept; None: use the source."""
    restore = at.task.restore
    if restore is not None and restore.original is not None:
        return original_copy(originals, restore.original, at)
    if at.task.staged_key is not None:
        return staged_copy(staging, at)
    return None


def staged_copy(staging: Staging, at: Attempt) -> HeldImage | Verdict | None:
    """The row's staged copy read back, or the verdict on a copy that is not what was
    captured; None: use the source (staging is off, or the copy is gone)."""
    if not staging.enabled:
        logger.warning("the row has a staged copy but staging is off; using the source")
        return None
    try:
        held = staging.read_back(at.task, at.deadline)
    except StagedCopyMissing as error:
        # Expired by the lifecycle rule, or deleted: the source may still work.
        logger.warning("staged copy missing; using the source", error=str(error))
        story.staged_copy_failed(at.events, str(error))
        at.restage = True
        return None
    except StagedCopyMismatch as error:
        story.staged_copy_failed(at.events, str(error))
        return mismatched(str(error))
    at.from_staged = True
    return held


def original_copy(originals: Originals, original: KeptOriginal, at: Attempt) -> HeldImage | Failure:
    """A restore's original read back, its length and SHA-256 checked; else the restore's
    failure: an object replaced, truncated or gone does not change by itself (permanent),
    the bucket not answering may (transient)."""
    try:
        held = originals.read_back(original, at.deadline)
    except (OriginalMismatch, OriginalMissing) as error:
        failure = Failure(Stage.RESTORE, Kind.NOT_IMAGE, f"{error}: not published")
    except OriginalsError as error:
        failure = Failure(Stage.RESTORE, Kind.CONNECTION, str(error))
    else:
        at.from_original = True
        return held
    story.original_failed(at.events, failure.message)
    logger.error("a restore's original could not be read back", error=failure.message)
    return failure
