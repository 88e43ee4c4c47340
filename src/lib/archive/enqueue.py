"""The producer's side in Python: mark the rows, then send their messages.

The order is the contract (docs/how-to/connect-the-generation-service.md): a send that fails
leaves a PENDING row the sweeper sends later; the reverse order could leave a message for a
row that is not PENDING yet, which the worker would drop as a stray."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from lib.archive.message import encode
from lib.platform.redact import outside_text
from lib.platform.sqs import MAX_BATCH_ENTRIES
from lib.state.events import Actor
from lib.state.operations import OperatorRecords
from lib.state.selection import Selection
from lib.state.status import GENERATION_SUCCEEDED, ArchiveStatus

REQUEUE_PAGE = 100


class BatchSender(Protocol):
    """What send_records needs: Queue.send_batch (tests substitute their own)."""

    def send_batch(self, queue_url: str, entries: Sequence[tuple[str, str]]) -> dict[str, str]: ...


@dataclass
class SendReport:
    """What send_records did with each record id."""

    sent: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # refused entries: id -> error code
    not_tried: list[int] = field(default_factory=list)  # after the loop stopped
    error: BaseException | None = None  # the whole-call failure that stopped it
    out_of_time: bool = False  # stopped because `may_send` said so

    @property
    def unsent(self) -> list[int]:
        return [*self.failed, *self.not_tried]


def send_records(
    sender: BatchSender,
    queue_url: str,
    record_ids: Sequence[int],
    *,
    may_send: Callable[[], bool] | None = None,
) -> SendReport:
    """One archive message per record, ten per SendMessageBatch call.

    The loop stops at the first call that fails as a whole (SQS unreachable or refusing:
    the rest would fail the same way) or when `may_send()` turns false (a time budget);
    the report says which ids were sent, refused, or never tried.
    """
    report = SendReport()
    for start in range(0, len(record_ids), MAX_BATCH_ENTRIES):
        if may_send is not None and not may_send():
            report.not_tried = list(record_ids[start:])
            report.out_of_time = True
            break
        chunk = record_ids[start : start + MAX_BATCH_ENTRIES]
        try:
            failed = sender.send_batch(queue_url, [(str(i), encode(i)) for i in chunk])
        except Exception as error:  # noqa: BLE001 - reported to the caller, who undoes its stamps
            report.not_tried = list(record_ids[start:])
            report.error = error
            break
        report.failed.update({int(entry_id): code for entry_id, code in failed.items()})
        report.sent += [i for i in chunk if str(i) not in failed]
    return report


@dataclass
class EnqueueReport:
    sent: list[int] = field(default_factory=list)
    # No message sent, and none needed or possible: id -> why.
    skipped: dict[int, str] = field(default_factory=dict)
    # Written as PENDING, but the message did not go out: id -> error. The sweeper
    # sends these once they are past due; running the command again also works.
    unsent: dict[int, str] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unsent and not self.missing


def _left_alone(status: str | None, archive_status: str | None, *, requeue: bool) -> str:
    """Why a row asked for was not queued (`enqueue`) or given new attempts (`requeue`)."""
    if status != GENERATION_SUCCEEDED:
        return f"generation status is {status}: nothing to archive"
    if archive_status == ArchiveStatus.SUCCEEDED:
        return "already archived"
    if requeue:
        if archive_status is None:
            return "never queued: use `enqueue`"
        if archive_status == ArchiveStatus.FAILED:
            return "FAILED, but not taken: outside the other filters, past --limit, or locked"
        return f"archive is {archive_status}: not FAILED, its attempts go on"
    if archive_status == ArchiveStatus.FAILED:
        return "archive FAILED: use `requeue --failed` to give it new attempts"
    if archive_status == ArchiveStatus.RUNNING:
        return "archive is RUNNING (the sweeper takes it over if its lock expires)"
    return f"archive changed to {archive_status} meanwhile; run again"


def send_marked(
    records: OperatorRecords,
    sender: BatchSender,
    queue_url: str,
    record_ids: Sequence[int],
    *,
    stamp: datetime | None,
    report: EnqueueReport,
    by: Actor,
) -> None:
    """Send one message per id; rows whose message did not go out lose our stamp, so the
    sweeper sends them after its grace period (and say so in their story)."""
    sent = send_records(sender, queue_url, record_ids)
    report.sent += sent.sent
    unsent: dict[int, str] = dict(sent.failed)
    reason = "the queue refused the message"
    if sent.error is not None:
        reason = f"{type(sent.error).__name__}: {outside_text(sent.error, 200)}"
        unsent.update(dict.fromkeys(sent.not_tried, reason))
    if unsent and stamp is not None:
        records.unstamp(list(unsent), stamp=stamp, by=by, error=reason)
    report.unsent.update(unsent)


def enqueue(
    records: OperatorRecords,
    sender: BatchSender,
    queue_url: str,
    record_ids: Sequence[int],
    *,
    by: Actor = Actor.PRODUCER,
) -> EnqueueReport:
    """Mark the records PENDING (due now) and send their messages, in that order.

    Rows that cannot take a message (not found, generation not SUCCEEDED, archive
    RUNNING or concluded) are reported, not changed. `by`: who enqueues, in their story.
    """
    report = EnqueueReport()
    to_send: list[int] = []
    stamp: datetime | None = None
    for row in records.mark_for_enqueue(list(record_ids), by=by):
        if not row.exists:
            report.missing.append(row.record_id)
        elif row.marked_at is None:
            report.skipped[row.record_id] = _left_alone(
                row.status, row.archive_status, requeue=False
            )
        else:
            to_send.append(row.record_id)
            stamp = row.marked_at
    send_marked(records, sender, queue_url, to_send, stamp=stamp, report=report, by=by)
    return report


def requeue_failed(
    records: OperatorRecords,
    sender: BatchSender,
    queue_url: str,
    selection: Selection,
    *,
    limit: int,
    page_size: int = REQUEUE_PAGE,
) -> EnqueueReport:
    """Reset up to `limit` FAILED rows of the selection (attempts 0, PENDING, due now,
    stamped), newest failure first, and send them a page at a time: an interruption leaves
    at most one page unsent (PENDING, so the sweeper sends them). Ids the selection names
    that were not taken are reported: missing, or skipped with their state."""
    report = EnqueueReport()
    while (room := limit - len(report.sent) - len(report.unsent)) > 0:
        rows = records.requeue_failed(selection, limit=min(page_size, room))
        if not rows:
            break
        ids = sorted(record_id for record_id, _ in rows)
        send_marked(
            records, sender, queue_url, ids, stamp=rows[0][1], report=report, by=Actor.REQUEUE
        )
        if report.unsent:
            break  # SQS trouble: leave the rest FAILED rather than reset it unsent
    not_taken(records, selection, {*report.sent, *report.unsent}, report)
    return report


def not_taken(
    records: OperatorRecords, selection: Selection, taken: set[int], report: EnqueueReport
) -> None:
    """The ids the selection names that a requeue did not take (or, dry, would not), in
    `report`: missing, or skipped with their state."""
    left = [record_id for record_id in dict.fromkeys(selection.ids) if record_id not in taken]
    for row in records.record_states(left) if left else []:
        if not row.exists:
            report.missing.append(row.record_id)
        else:
            report.skipped[row.record_id] = _left_alone(
                row.status, row.archive_status, requeue=True
            )


@dataclass(frozen=True)
class BackfillScope:
    """Which never-queued SUCCEEDED generations a backfill takes (None: no bound)."""

    since: datetime | None = None
    until: datetime | None = None
    user_id: int | None = None


@dataclass
class BackfillPage:
    marked: list[int]
    report: EnqueueReport
    # The keyset (started_at, id) of the page's last row: the next page starts after it.
    last: tuple[datetime, int] | None


class PageInterrupted(KeyboardInterrupt):
    """Ctrl-C arrived while a backfill page was being sent; the page was settled first."""

    def __init__(
        self,
        sent: list[int],
        put_back: list[int],
        left_pending: list[int],
        uncertain: Sequence[int] = (),
    ) -> None:
        super().__init__("interrupted while sending a backfill page")
        self.sent = sent  # messages that went out: those rows stay PENDING
        self.put_back = put_back  # not sent, never-queued again: the next run takes them
        # Not sent and not put back (touched meanwhile, or the database failed): PENDING,
        # so the sweeper sends them.
        self.left_pending = left_pending
        # In the batch whose answer never came: SQS may have taken their messages, so they
        # stay PENDING (put back, a re-run would send them twice); the sweeper's
        # lost-message rule sends any whose message did not arrive.
        self.uncertain = list(uncertain)


class _SentRecorder:
    """A BatchSender that remembers which ids went out, and which were in the call that
    was cut off (its answer never came), for when the send loop is cut off."""

    def __init__(self, sender: BatchSender) -> None:
        self._sender = sender
        self.sent: set[int] = set()
        self.in_flight: set[int] = set()

    def send_batch(self, queue_url: str, entries: Sequence[tuple[str, str]]) -> dict[str, str]:
        self.in_flight = {int(entry_id) for entry_id, _ in entries}
        failed = self._sender.send_batch(queue_url, entries)
        # Sent first, then out of flight: an interrupt in between leaves them uncertain
        # (PENDING), never unsent.
        self.sent.update(int(entry_id) for entry_id, _ in entries if entry_id not in failed)
        self.in_flight = set()
        return failed


def backfill_page(
    records: OperatorRecords,
    sender: BatchSender,
    queue_url: str,
    scope: BackfillScope,
    *,
    after: tuple[datetime, int] | None,
    limit: int,
) -> BackfillPage:
    """Mark the next `limit` never-queued rows after `after` PENDING, then send their
    messages, as `enqueue` does (rows whose send fails lose the stamp: the sweeper sends
    them).

    A KeyboardInterrupt during the send becomes PageInterrupted once the rows that were
    not sent are never-queued again, so a re-run takes them and no row is queued twice.
    The rows of a call cut off before its answer came are left PENDING: SQS may have
    taken them (the sweeper sends any that it did not).
    """
    rows = records.mark_backfill_page(
        since=scope.since, until=scope.until, user_id=scope.user_id, after=after, limit=limit
    )
    report = EnqueueReport()
    if not rows:
        return BackfillPage([], report, None)
    ids = sorted(record_id for record_id, _, _ in rows)
    stamp = rows[0][2]  # one statement, one now()
    recorder = _SentRecorder(sender)
    try:
        send_marked(
            records, recorder, queue_url, ids, stamp=stamp, report=report, by=Actor.BACKFILL
        )
    except KeyboardInterrupt:
        uncertain = recorder.in_flight - recorder.sent
        unsent = [i for i in ids if i not in recorder.sent and i not in uncertain]
        try:
            put_back = records.unmark_backfill(unsent, stamp=stamp) if unsent else []
        except Exception:  # noqa: BLE001 - still PENDING then: the sweeper sends them
            put_back = []
        raise PageInterrupted(
            sent=sorted(recorder.sent),
            put_back=sorted(put_back),
            left_pending=sorted(set(unsent) - set(put_back)),
            uncertain=sorted(uncertain),
        ) from None
    last = max((started, record_id) for record_id, started, _ in rows)
    return BackfillPage(ids, report, last)
