"""The audit run: archived records in rotation (or chosen by an operator), a batch at a
time: each hosted copy read and judged, at most ARCHIVE_AUDIT_RATE GETs a second, within
the invocation's time, then what each verdict calls for. A batch whose checks mostly got
no answer judges nothing: the host seems down (docs/explanation/audit-and-repair.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.originals import Originals
from lib.audit.check import Checked, check_hosted, refetch
from lib.audit.confirm import look_at_unconfirmed
from lib.audit.pace import Pace
from lib.audit.repair import Restorer
from lib.audit.verdict import AuditVerdict, Repair, host_down, repair_for
from lib.platform.observability import logger, metrics
from lib.state.audits import AuditRecords, AuditResult, AuditTarget
from lib.state.claim import OriginalSource
from lib.state.events import Actor
from lib.state.originals import OriginalStore
from lib.transfer.download import Downloader
from lib.transfer.held import HeldImage

# Records taken (and judged, or not) together: the host-down rule is a batch's majority.
BATCH = 10
# Stop taking checks this long before the invocation's end: recording the batch is left.
RESERVE_MS = 10_000
# One GET's deadline (the hosted file, or the provider's URL again).
CHECK_SECONDS = 30.0
# A taken row is due again after this unless its check is recorded first (a run that dies).
LEASE_SECONDS = 900
# An unreachable check is tried again after this (the next runs).
RETRY_SECONDS = 900
# The walk enrols older archives this many rows a statement, and a few statements a run.
WALK_BATCH = 5_000
WALK_STEPS = 20
# The audit's own events past the retention removed a run at most (each run a batch).
EXPIRY_EVENTS = 5_000


@dataclass(frozen=True)
class Choice:
    """An operator's pass (`archive-ctl audit`): these ids, or archived since a time; at
    most `limit` records. None of them: the rotation."""

    ids: tuple[int, ...] | None = None
    since: datetime | None = None
    limit: int | None = None


@dataclass
class AuditSummary:
    checked: int = 0
    intact: int = 0
    missing: int = 0
    altered: int = 0
    unreachable: int = 0
    originals_kept: int = 0
    originals_confirmed: int = 0  # unconfirmed ones S3 holds (a HEAD)
    originals_absent: int = 0  # unconfirmed ones S3 does not hold: the row went
    restores: int = 0
    lost: int = 0
    passed: int = 0  # not archived now (a restore or requeue under way, a deleted row)
    enrolled: int = 0  # older archives the walk enrolled
    events_removed: int = 0  # the audit's own events past the retention
    host_down: bool = False
    dry_run: bool = False
    found: list[dict[str, object]] = field(default_factory=list)  # what was not intact

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Auditor:
    def __init__(
        self,
        *,
        audits: AuditRecords,
        downloader: Downloader,
        originals: Originals,
        restorer: Restorer | None,
        period_seconds: int,
        rate: float,
        retention_seconds: int = 30 * 86_400,
    ) -> None:
        self.retention_seconds = retention_seconds
        self.audits = audits
        self.kept = OriginalStore(audits.db)
        self.downloader = downloader
        self.originals = originals
        self.restorer = restorer
        self.period_seconds = period_seconds
        self.rate = rate

    def run(
        self,
        remaining_ms: Callable[[], int],
        *,
        choice: Choice | None = None,
        limit: int | None = None,
        dry_run: bool = False,
        progress: Callable[[AuditSummary], None] | None = None,
        by: Actor = Actor.AUDITOR,
    ) -> AuditSummary:
        summary = AuditSummary(dry_run=dry_run)
        run = _Run(self, summary, remaining_ms, Pace(self.rate), dry_run=dry_run, by=by)
        if choice is None and not dry_run:
            summary.events_removed = self.audits.expire_events(
                retention_seconds=self.retention_seconds, limit=EXPIRY_EVENTS
            )
            summary.enrolled = run.walk()
            looked = look_at_unconfirmed(self.kept, self.originals, run.time_left, run.deadline)
            summary.originals_confirmed, summary.originals_absent = looked.confirmed, looked.absent
        after_id, left = 0, limit if choice is None else choice.limit
        while run.time_left():
            size = BATCH if left is None else min(BATCH, left)
            if dry_run and choice is None:
                size = left or BATCH  # the rotation's next rows, read once: nothing moves on
            if size <= 0:
                break
            targets = run.take(choice, after_id, size)
            if not targets:
                break
            after_id = targets[-1].record_id
            if not run.batch(targets):
                break
            if left is not None:
                left -= len(targets)
            if progress is not None:
                progress(summary)
            if dry_run and choice is None:
                break  # a dry run of the rotation reads one batch: nothing moves it on
        counts = {k: v for k, v in summary.as_dict().items() if k != "found"}
        logger.info("audit finished", **counts)
        return summary


class _Run:
    """One run's state: its clock, its pace, its summary."""

    def __init__(
        self,
        auditor: Auditor,
        summary: AuditSummary,
        remaining_ms: Callable[[], int],
        pace: Pace,
        *,
        dry_run: bool,
        by: Actor,
    ) -> None:
        self.a = auditor
        self.summary = summary
        self.remaining_ms = remaining_ms
        self.pace = pace
        self.dry_run = dry_run
        self.by = by
        # Restores a batch calls for: (record id, URL judged, verdict, original needed).
        self.restores: list[tuple[int, str | None, str, bool]] = []

    def time_left(self) -> bool:
        return self.remaining_ms() > RESERVE_MS

    def deadline(self) -> float:
        left = (self.remaining_ms() - RESERVE_MS) / 1000
        return time.monotonic() + max(0.0, min(CHECK_SECONDS, left))

    def walk(self) -> int:
        enrolled = 0
        for _ in range(WALK_STEPS):
            if not self.time_left():
                break
            step = self.a.audits.walk(batch=WALK_BATCH, period_seconds=self.a.period_seconds)
            enrolled += step.enrolled
            if not step.walking or step.finished:
                break
        return enrolled

    def take(self, choice: Choice | None, after_id: int, size: int) -> list[AuditTarget]:
        audits = self.a.audits
        if choice is None:
            if self.dry_run:
                return audits.peek_due(limit=size)
            return audits.take_due(limit=size, lease_seconds=LEASE_SECONDS)
        return audits.take_chosen(
            ids=choice.ids,
            since=choice.since,
            after_id=after_id,
            limit=size,
            lease_seconds=None if self.dry_run else LEASE_SECONDS,
        )

    def batch(self, targets: Sequence[AuditTarget]) -> bool:
        """Check, judge and act on one batch; False: the run stops (host down, no time)."""
        audits, period = self.a.audits, self.a.period_seconds
        passed = [t.record_id for t in targets if not (t.archived and t.hosted_url)]
        self.summary.passed += len(passed)
        if not self.dry_run:
            audits.pass_over(passed, period_seconds=period)
        checks: list[Checked] = []
        to_check = [t for t in targets if t.archived and t.hosted_url]
        try:
            for target in to_check:
                if not self.time_left():
                    break
                self.pace.wait()
                checks.append(check_hosted(self.a.downloader, target, self.deadline()))
            unchecked = [t.record_id for t in to_check[len(checks) :]]
            unreachable = sum(1 for c in checks if c.judged.verdict is None)
            self.summary.unreachable += unreachable
            _count("AuditUnreachable", unreachable)
            if host_down(unreachable, len(checks)):
                self._host_down(checks, unreachable)
                if not self.dry_run:
                    audits.release([c.target.record_id for c in checks] + unchecked)
                return False
            results = [self._act(check) for check in checks]
        finally:
            for check in checks:
                check.close()
        if not self.dry_run:
            audits.release(unchecked)
            for record_id in audits.record(
                results, period_seconds=period, retry_seconds=RETRY_SECONDS
            ):
                logger.error(
                    "hosted image lost: nothing to restore it from", record_id=str(record_id)
                )
            self._restore()
        return not unchecked

    # -- after a verdict ---------------------------------------------------------------------

    def _act(self, check: Checked) -> AuditResult:
        target, judged = check.target, check.judged
        verdict = judged.verdict
        if verdict is None:
            why = {"why": judged.why}
            return AuditResult(target.record_id, None, target.hosted_url, detail=why)
        self.summary.checked += 1
        setattr(self.summary, str(verdict), getattr(self.summary, str(verdict)) + 1)
        _count(verdict_metric(verdict), 1)
        originals = self.a.originals
        repair = repair_for(
            judged,
            has_original=target.original is not None,
            originals_on=originals.enabled,
            can_refetch=bool(target.image_url),
        )
        detail: dict[str, object] = {"why": judged.why}
        lost = repair is Repair.LOST
        restore: bool | None = None  # a restore, and whether it needs the original
        if repair is Repair.KEEP_ORIGINAL and check.held is not None:
            self._keep(target, check.held, OriginalSource.HOSTED)
        elif repair is Repair.RESTORE:
            restore = True
        elif repair is Repair.REFETCH:
            restore = self._refetch(target, detail)
            lost = restore is None
        if judged.wrong:
            detail["repair"] = "lost" if lost else str(repair)
            if target.hosted_key:
                detail["hosted_key"] = target.hosted_key  # for an operator to delete
            self.summary.found.append(
                {"record_id": target.record_id, "verdict": str(verdict), **detail}
            )
            logger.warning(
                "hosted image is not what was archived",
                record_id=str(target.record_id),
                verdict=str(verdict),
                why=judged.why,
                repair=detail["repair"],
            )
        if lost:
            self.summary.lost += 1
            _count("LostOnHost", 1)
        if restore is not None:
            self.restores.append((target.record_id, target.hosted_url, str(verdict), restore))
            if self.dry_run:
                self.summary.restores += 1
        return AuditResult(target.record_id, str(verdict), target.hosted_url, lost, detail)

    def _keep(self, target: AuditTarget, held: HeldImage, source: OriginalSource) -> bool:
        if self.dry_run:
            return True
        kept = self.a.originals.keep(target.record_id, held, source, self.deadline())
        if kept is None:
            return False
        self.a.kept.keep(target.record_id, kept, by=self.by)
        self.summary.originals_kept += 1
        _count("OriginalsKept", 1)
        return True

    def _refetch(self, target: AuditTarget, detail: dict[str, object]) -> bool | None:
        """The provider's URL again. None: it does not give the bytes first sent (the record
        is lost); else whether they were kept as its original (with originals on), before
        the record is archived again (from the original, or from that URL once more)."""
        got = refetch(self.a.downloader, target, self.deadline())
        detail["provider"] = got.why
        if got.held is None:
            return None
        try:
            return self.a.originals.enabled and self._keep(
                target, got.held, OriginalSource.PROVIDER
            )
        finally:
            got.held.close()

    def _restore(self) -> None:
        pending, self.restores = self.restores, []
        restorer = self.a.restorer
        if restorer is None:
            return
        groups: dict[tuple[str, bool], list[tuple[int, str | None]]] = {}
        for record_id, url, reason, need_original in pending:
            groups.setdefault((reason, need_original), []).append((record_id, url))
        for (reason, need_original), asked in groups.items():
            report = restorer.restore(asked, reason=reason, by=self.by, need_original=need_original)
            self.summary.restores += report.requested

    def _host_down(self, checks: Sequence[Checked], unreachable: int) -> None:
        whys = sorted({c.judged.why for c in checks if c.judged.verdict is None})
        self.summary.host_down = True
        logger.error(
            "hosted images unreachable: the host seems down; nothing judged",
            unreachable=unreachable,
            checked=len(checks),
            why=whys[:5],
        )
        _count("AuditHostDown", 1)


def verdict_metric(verdict: AuditVerdict) -> str:
    """The metric a verdict counts (the alarms are on missing and altered)."""
    if verdict is AuditVerdict.INTACT:
        return "AuditIntact"
    if verdict is AuditVerdict.MISSING:
        return "AuditMissing"
    return "AuditAltered"


def _count(name: str, value: int) -> None:
    if value:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
