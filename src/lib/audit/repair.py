"""Repair: a record whose hosted copy is missing or altered is archived again, through the
archive's own path (the lane, pacing, the look-up, fidelity, the time budget), from its
original; the row keeps its hosted URL until the success write replaces it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lib.archive.enqueue import BatchSender, EnqueueReport, send_marked
from lib.state.audits import AuditRecords
from lib.state.events import Actor
from lib.state.operations import OperatorRecords


@dataclass
class RestoreReport:
    """What became of the records asked for."""

    sent: list[int] = field(default_factory=list)  # PENDING, message sent
    unsent: dict[int, str] = field(default_factory=dict)  # PENDING, the sweeper sends it
    left: list[int] = field(default_factory=list)  # not archived now, URL changed, no original

    @property
    def requested(self) -> int:
        return len(self.sent) + len(self.unsent)


class Restorer:
    def __init__(
        self,
        *,
        audits: AuditRecords,
        operator: OperatorRecords,
        sender: BatchSender,
        queue_url: str,
    ) -> None:
        self.audits = audits
        self.operator = operator
        self.sender = sender
        self.queue_url = queue_url

    def restore(
        self,
        requests: Sequence[tuple[int, str | None]],
        *,
        reason: str,
        by: Actor,
        need_original: bool = True,
    ) -> RestoreReport:
        """Mark each (record id, hosted URL judged) PENDING again, then send its message;
        the order is the producer's (a failed send leaves a row the sweeper sends)."""
        report = RestoreReport()
        marked = self.audits.request_restores(
            requests, reason=reason, by=by, need_original=need_original
        )
        ids = [record_id for record_id, _ in marked]
        report.left = [record_id for record_id, _ in requests if record_id not in set(ids)]
        if ids:
            sent = EnqueueReport()
            send_marked(
                self.operator,
                self.sender,
                self.queue_url,
                ids,
                stamp=marked[0][1],
                report=sent,
                by=by,
            )
            report.sent, report.unsent = sent.sent, sent.unsent
        return report
