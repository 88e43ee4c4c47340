"""An attempt's story in its steps' words: what each step notes in the attempt's EventLog
(lib.state.events; written by the statement that concludes it), and what a verdict adds
to that statement's own event. docs/reference/database.md lists the kinds and their details."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lib.archive.copier import LookUp
from lib.archive.lane import HostCondition
from lib.archive.outcome import Copied, Verdict
from lib.archive.schedule import DETAIL_LIMIT
from lib.platform.redact import outside_text
from lib.state.claim import StagedCopy
from lib.state.events import EventKind, EventLog
from lib.state.lane_store import Slot, SlotAnswer
from lib.transfer.failures import Failure
from lib.transfer.held import HeldImage


def fetched(
    events: EventLog,
    held: HeldImage,
    *,
    from_staged: bool,
    seconds: float,
    from_original: bool = False,
) -> None:
    source = "original" if from_original else "staged copy" if from_staged else "provider"
    events.note(
        EventKind.FETCHED,
        source=source,
        bytes=held.size,
        type=held.image_type.mime_type,
        seconds=seconds,
    )


def original_failed(events: EventLog, error: str) -> None:
    events.note(EventKind.FETCHED, source="original", error=error)


def staged_copy_failed(events: EventLog, error: str) -> None:
    events.note(EventKind.FETCHED, source="staged copy", error=error)


def source_failed(events: EventLog, failure: Failure) -> None:
    events.note(EventKind.FETCHED, source="provider", error=failure.message, status=failure.status)


def staged(events: EventLog, copy: StagedCopy | None, why: str) -> None:
    if copy is not None:
        events.note(EventKind.STAGED, key=copy.key, sha256=copy.sha256, bytes=copy.size, why=why)


def slot(events: EventLog, answer: Slot) -> None:
    paused = answer.answer is SlotAnswer.PAUSED
    waits = None if paused else answer.wait_seconds
    events.note(EventKind.SLOT, answer=str(answer.answer), at=answer.at, wait_seconds=waits)


def looked_up(events: EventLog, found: LookUp | str) -> None:
    """The look-up for an earlier attempt's image: what was adopted and why, what was not
    and why, or the failure (a text)."""
    if isinstance(found, str):
        events.note(EventKind.LOOKED_UP, error=found)
        return
    adopted = found.adopted
    events.note(
        EventKind.LOOKED_UP,
        adopted=None if adopted is None else str(adopted.hosted.data.get("key", "")),
        why=found.why or None,
        duplicates=list(adopted.duplicates) if adopted is not None else [],
        refused=[f"{key}: {why}" for key, why in found.refused],
    )


def upload_answered(events: EventLog, copied: Copied, *, seconds: float) -> None:
    key = str(copied.hosted.data.get("key", ""))
    events.note(EventKind.UPLOAD_ANSWERED, status=200, key=key, bytes=copied.size, seconds=seconds)


def upload_failed(events: EventLog, failure: Failure, *, seconds: float) -> None:
    events.note(
        EventKind.UPLOAD_ANSWERED,
        status=failure.status,
        error=failure.message,
        failure=str(failure.kind),
        may_be_hosted=failure.may_be_hosted,
        seconds=seconds,
    )


def lane_paused(
    events: EventLog, condition: HostCondition, until: datetime | None
) -> dict[str, Any]:
    """This attempt's answer from Lsky paused the lane until `until` (None: until cleared);
    returns the fields its log line says it with."""
    ends = until.isoformat() if until is not None else "until cleared"
    detail = outside_text(condition.detail, DETAIL_LIMIT)
    reason, window = str(condition.reason), condition.window
    events.note(EventKind.LANE_PAUSED, reason=reason, window=window, until=ends, detail=detail)
    return {"reason": reason, "window": window, "detail": detail, "paused_until": ends}


# What a verdict's log fields add to the event its statement writes (the error itself,
# the wait's reason and length are the statement's own).
_VERDICT_FIELDS = (
    "error_class",
    "reason",
    "window",
    "booked",
    "paced_for_seconds",
    "due_in_seconds",
)


def verdict_detail(verdict: Verdict) -> dict[str, Any]:
    fields = {key: verdict.fields[key] for key in _VERDICT_FIELDS if key in verdict.fields}
    return {"outcome": str(verdict.outcome), **fields}


def archived_detail(copied: Copied) -> dict[str, Any]:
    """What `archived` adds to the URL: what went as usual is left out."""
    return {
        "key": str(copied.hosted.data.get("key", "")),
        "adopted": copied.adopted or None,
        "duplicates": list(copied.duplicates) or None,
        "duplicate_possible": copied.duplicate_possible or None,
        "original": None if copied.original is None else copied.original.key,
        "original_missing": copied.original_missing,
    }
