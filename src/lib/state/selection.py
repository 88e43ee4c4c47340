"""Which records `archive-ctl list` and `requeue` take: the filters (Selection), the keyset
cursor that pages through them while rows change (Cursor), and a listed row (ListedRecord).
Pure: lib.state.operations runs the statements (queries.sql: record_selection, list_*)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lib.state.status import ArchiveStatus

MIN_ID = 0
MAX_ID = 2**63 - 1  # BIGINT: ids are positive, so [MIN_ID, MAX_ID] is every record
# A record never queued (archive_status NULL), as `list --state` names it.
NEVER_QUEUED = "none"
STATES = (*(str(s) for s in ArchiveStatus), NEVER_QUEUED)
# What `list --audit` finds: the audit's last verdict, or lost (wrong, nothing to restore from).
AUDIT_FINDINGS = ("missing", "altered", "lost")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def like_pattern(text: str) -> str:
    """`%text%` for ILIKE, with LIKE's own wildcards in `text` taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True)
class Selection:
    """Filters; None (or empty) filters nothing. A failure-time bound or the FAILED state
    makes it a selection of failures, listed newest failure first."""

    state: str | None = None  # an ArchiveStatus name or NEVER_QUEUED
    ids: tuple[int, ...] = ()
    id_from: int | None = None
    id_to: int | None = None
    error_text: str | None = None  # a substring of archive_error, any case
    error_patterns: tuple[str, ...] = ()  # LIKE patterns of an error class
    waiting: str | None = None  # a WaitReason (or "unknown"): PENDING rows not due yet
    failed_since: datetime | None = None
    failed_until: datetime | None = None
    audit: str | None = None  # one of AUDIT_FINDINGS: archived records the audit found so

    @property
    def failures(self) -> bool:
        """Rows that failed: ordered and paged by failure time."""
        return (
            self.state == ArchiveStatus.FAILED
            or self.failed_since is not None
            or self.failed_until is not None
        )

    def conflict(self) -> str | None:
        """Why no row can match, when the filters contradict each other (a usage error)."""
        if self.failures and self.state not in (None, ArchiveStatus.FAILED):
            return f"--failed-since/--failed-until select FAILED records, not {self.state}"
        if self.waiting is not None and self.state not in (None, ArchiveStatus.PENDING):
            return f"--waiting selects PENDING records, not {self.state}"
        if self.waiting is not None and self.failures:
            return "--waiting (PENDING records) and a failure filter select nothing together"
        if self.audit is not None and (self.failures or self.waiting is not None):
            return "--audit selects archived records, not failed or waiting ones"
        if self.id_from is not None and self.id_to is not None and self.id_from > self.id_to:
            return f"--from-id {self.id_from} is above --to-id {self.id_to}"
        if self.failed_since and self.failed_until and self.failed_since >= self.failed_until:
            return "--failed-since is not before --failed-until"
        return None

    def params(self) -> dict[str, Any]:
        """record_selection's parameters (and failed_selection's time range)."""
        return {
            "ids": list(self.ids) or None,
            "id_from": MIN_ID if self.id_from is None else self.id_from,
            "id_to": MAX_ID if self.id_to is None else self.id_to,
            "error": None if self.error_text is None else like_pattern(self.error_text),
            "error_patterns": list(self.error_patterns) or None,
            "waiting": self.waiting,
            "audit": self.audit,
        }

    def failure_range(self) -> dict[str, Any]:
        return {
            "since": self.failed_since or "-infinity",
            "until": self.failed_until or "infinity",
        }


_CURSOR = re.compile(r"(?:t(-?\d{1,19})_)?(\d{1,19})")


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: below this (failure time, id), or this id. Keyset, not
    offset: rows that come and go meanwhile shift nothing, and none is listed twice."""

    record_id: int
    failed_at: datetime | None = None

    def encode(self) -> str:
        """`t<microseconds since the epoch>_<id>` or `<id>`: shell-safe, no quoting."""
        if self.failed_at is None:
            return str(self.record_id)
        micros = (self.failed_at - EPOCH) // timedelta(microseconds=1)
        return f"t{micros}_{self.record_id}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        match = _CURSOR.fullmatch(text.strip())
        if match is None or int(match.group(2)) > MAX_ID:
            raise ValueError(f"{text!r} is not a cursor this command printed")
        record_id = int(match.group(2))
        if match.group(1) is None:
            return cls(record_id)
        try:
            moment = EPOCH + timedelta(microseconds=int(match.group(1)))
        except OverflowError:
            raise ValueError(f"{text!r} is not a cursor this command printed") from None
        return cls(record_id, moment)


@dataclass(frozen=True)
class ListedRecord:
    """A row as `archive-ctl list` shows it (queries.sql: listed_record)."""

    record_id: int
    status: str | None  # the generation's
    archive_status: str | None
    attempts: int
    wait_reason: str | None
    parked: bool  # no message out for it
    next_run_at: datetime | None
    locked_at: datetime | None
    error: str | None
    archived_at: datetime | None
    hosted_url: str | None
    started_at: datetime | None
    failed_at: datetime | None  # FAILED rows only
    failed_at_estimated: bool  # an older release failed it: failed_at is a lower bound
    audit: str | None = None  # the audit's last verdict, "lost" when nothing can restore it
    hosted_key: str | None = None  # the hosted copy's key on Lsky

    @classmethod
    def from_row(cls, row: list[Any]) -> ListedRecord:
        (record_id, status, archive_status, attempts, reason, parked, due, locked) = row[:8]
        (error, archived, hosted, started, failed, estimated) = row[8:14]
        audit, key = row[14:16] if len(row) > 14 else (None, None)
        return cls(
            int(record_id),
            status,
            archive_status,
            int(attempts),
            reason,
            bool(parked),
            due,
            locked,
            error,
            archived,
            hosted,
            started,
            failed,
            bool(estimated),
            audit,
            key,
        )

    def cursor(self, *, by_failure: bool) -> Cursor:
        return Cursor(self.record_id, self.failed_at if by_failure else None)
