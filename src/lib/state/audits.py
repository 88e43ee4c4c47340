"""The audit's statements (lib/sql/queries.sql): the rotation, the walk that enrols older
archives, a batch's verdicts, originals kept by the audit, and restores. Only
`request_restores` writes the generation's row, through the archive's own states."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.state.claim import KeptOriginal
from lib.state.events import Actor, bounded_detail
from lib.state.queries import Statements
from lib.state.status import ArchiveStatus


@dataclass(frozen=True)
class AuditTarget:
    """One archived record as a check needs it."""

    record_id: int
    exists: bool
    archive_status: str | None
    hosted_url: str | None
    reported_sha1: str | None
    reported_size_kb: str | None
    sent_sha1: str | None
    altered: bool | None
    image_url: str | None
    verdict: str | None  # the last one
    lost: bool
    hosted_key: str | None
    original: KeptOriginal | None

    @property
    def archived(self) -> bool:
        return self.exists and self.archive_status == ArchiveStatus.SUCCEEDED

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> AuditTarget:
        (record_id, exists, status, url, sha1, size, sent, altered, image_url) = row[:9]
        verdict, lost, key = row[9:12]
        original = KeptOriginal.from_row(tuple(row[12:19]))
        return cls(
            int(record_id), bool(exists), status, url, sha1, size, sent, altered,
            image_url, verdict, bool(lost), key, original,
        )  # fmt: skip


@dataclass(frozen=True)
class AuditResult:
    """A check's result as recorded: verdict None is unreachable (no verdict)."""

    record_id: int
    verdict: str | None
    url: str | None
    lost: bool = False
    detail: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "record_id": self.record_id,
            "verdict": self.verdict,
            "url": self.url,
            "lost": self.lost,
            "detail": bounded_detail(self.detail or {}),
        }


@dataclass(frozen=True)
class Walked:
    """One step of the walk: whether it was this run's to take, what it enrolled."""

    walking: bool
    enrolled: int
    scanned: int
    finished: bool


class AuditRecords(Statements):
    def take_due(self, *, limit: int, lease_seconds: int) -> list[AuditTarget]:
        rows = self._run("take_audits", limit=limit, lease=lease_seconds)
        return [AuditTarget.from_row(row) for row in rows]

    def peek_due(self, *, limit: int) -> list[AuditTarget]:
        """What take_due would take, nothing written (a dry run)."""
        return [AuditTarget.from_row(row) for row in self._run("peek_audits", limit=limit)]

    def take_chosen(
        self,
        *,
        ids: Sequence[int] | None,
        since: datetime | None,
        after_id: int,
        limit: int,
        lease_seconds: int | None,
    ) -> list[AuditTarget]:
        """Archived records by id or archive time (lease None: a dry run, nothing written)."""
        rows = self._run(
            "take_audits_chosen",
            ids=None if ids is None else list(ids),
            since=since,
            after_id=after_id,
            limit=limit,
            lease=lease_seconds,
        )
        return [AuditTarget.from_row(row) for row in rows]

    def walk(self, *, batch: int, period_seconds: int) -> Walked:
        [(walking, enrolled, scanned, after)] = self._run(
            "enrol_archived", batch=batch, period=period_seconds
        )
        return Walked(bool(walking), int(enrolled), int(scanned), bool(walking) and after is None)

    def record(
        self, results: Sequence[AuditResult], *, period_seconds: int, retry_seconds: int
    ) -> list[int]:
        """Write a batch's results; returns the records that became lost on the host."""
        if not results:
            return []
        [(_, lost)] = self._run(
            "record_audits",
            results=json.dumps([r.as_json() for r in results], ensure_ascii=False),
            period=period_seconds,
            retry=retry_seconds,
        )
        return [int(record_id) for record_id in lost or []]

    def expire_events(self, *, retention_seconds: int, limit: int) -> int:
        """The audit's own events past the retention, `limit` at most; how many went."""
        [[removed]] = self._run("expire_audit_events", retention=retention_seconds, limit=limit)
        return int(removed)

    def release(self, record_ids: Sequence[int]) -> None:
        if record_ids:
            self._run("release_audits", ids=list(record_ids))

    def pass_over(self, record_ids: Sequence[int], *, period_seconds: int) -> None:
        if record_ids:
            self._run("pass_audits", ids=list(record_ids), period=period_seconds)

    def request_restores(
        self,
        requests: Sequence[tuple[int, str | None]],
        *,
        reason: str,
        by: Actor,
        need_original: bool = True,
    ) -> list[tuple[int, datetime]]:
        """(record id, hosted URL judged or None) pairs to archive again; returns the rows
        marked PENDING with their stamp (those whose URL changed meanwhile, or that are
        not archived now, are left alone)."""
        if not requests:
            return []
        rows = self._run(
            "request_restores",
            ids=[record_id for record_id, _ in requests],
            urls=[url for _, url in requests],
            reason=reason,
            by=str(by),
            need_original=need_original,
        )
        return [(int(record_id), stamp) for record_id, stamp in rows]


@dataclass(frozen=True)
class Found:
    """A record the audit found wrong (`audit_found`), or one an operator names
    (`restorable`): whether a restore can take it, and from what."""

    record_id: int
    url: str | None  # the hosted URL judged (None: any)
    has_original: bool
    lost: bool = False
    archive_status: str | None = None
    restoring: bool = False  # a restore is under way (or failed): it may be asked again


@dataclass(frozen=True)
class AuditCoverage:
    """How far the audit and the originals cover the archive (`archive-ctl status`)."""

    archived: int  # records in the rotation: every archived one, once the walk is through
    never_checked: int
    oldest_check: datetime | None  # the least recently checked record's check
    intact: int
    missing: int
    altered: int
    lost: int
    unreachable: int  # whose last checks got no answer
    due: int  # due now: waiting for a run
    oldest_due_seconds: float | None  # how long the longest-waiting one has been due
    with_original: int
    restoring: int
    unconfirmed: int = 0  # originals S3's answer has not confirmed yet
    oldest_unconfirmed_seconds: float | None = None  # old ones: no container, no audit confirmed

    @property
    def without_original(self) -> int:
        return self.archived - self.with_original


@dataclass(frozen=True)
class Keeping:
    """One record's audit, as `archive-ctl show` tells it."""

    checked_at: datetime | None
    verdict: str | None
    verdict_since: datetime | None
    lost: bool
    due_at: datetime | None  # None: not in the rotation (not archived, or not enrolled yet)
    unreachable_since: datetime | None


class AuditFindings(Statements):
    """What `archive-ctl restore`, `status` and `show` read of the audit."""

    def keeping(self, record_id: int) -> Keeping:
        [row] = self._run("record_keeping", record_id=record_id)
        checked, verdict, since, lost, due, unreachable = row
        return Keeping(checked, verdict, since, bool(lost), due, unreachable)

    def coverage(self) -> AuditCoverage:
        [row] = self._run("audit_coverage")
        (archived, never, oldest, intact, missing, altered, lost, unreachable, due) = row[:9]
        oldest_due, with_original, restoring, unconfirmed, oldest_unconfirmed = row[9:14]
        return AuditCoverage(
            archived=int(archived),
            never_checked=int(never),
            oldest_check=oldest,
            intact=int(intact),
            missing=int(missing),
            altered=int(altered),
            lost=int(lost),
            unreachable=int(unreachable),
            due=int(due),
            oldest_due_seconds=None if oldest_due is None else float(oldest_due),
            with_original=int(with_original),
            restoring=int(restoring),
            unconfirmed=int(unconfirmed),
            oldest_unconfirmed_seconds=None
            if oldest_unconfirmed is None
            else float(oldest_unconfirmed),
        )

    def found(self, verdict: str, *, after_id: int, limit: int) -> list[Found]:
        rows = self._run("audit_found", verdict=verdict, after_id=after_id, limit=limit)
        return [
            Found(int(r), url, bool(original), bool(lost), ArchiveStatus.SUCCEEDED)
            for r, url, original, lost in rows
        ]

    def restorable(self, record_ids: Sequence[int]) -> list[Found | int]:
        """Each id as a restore would take it, or the id alone when there is no record."""
        rows = self._run("restorable", ids=list(record_ids))
        return [
            Found(int(r), None, bool(original), False, status, bool(restoring))
            if exists
            else int(r)
            for r, exists, status, original, restoring in rows
        ]
