"""Queueing records for archiving: the producer's side of the contract, in Python.

The order is the contract (docs/operations.md, "Producer contract"): first the row
is written (archive_status PENDING, archive_next_run_at, archive_enqueued_at), then
the message {"recordId": "..."} is sent. A send that fails, or a process that dies
between the two, leaves a PENDING row without a message, which the sweeper sends
once it is past due. The reverse order could leave a message for a row that is not
PENDING yet, which the archive function would acknowledge as a stray and drop.

`enqueue` is what `archive-ctl enqueue` runs (and what a Python producer would);
`requeue_failed` gives FAILED rows a fresh attempt budget and sends them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lib.platform.db import Database
from lib.platform.sqs import BatchSender, send_records

REQUEUE_PAGE = 100

# One statement marks the rows that can take a message and reports on every id asked
# for. The outer SELECT sees the rows as they were before the UPDATE (one snapshot),
# which is what explains a skip. A concurrent claim is waited for and re-checked.
MARK_SQL = """
WITH wanted AS (
    SELECT DISTINCT unnest(CAST(:ids AS bigint[])) AS id
),
marked AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'PENDING',
        archive_next_run_at = now(),
        archive_enqueued_at = now()
    FROM wanted
    WHERE r.id = wanted.id
      AND r.status = 'SUCCEEDED'
      AND (r.archive_status IS NULL OR r.archive_status = 'PENDING')
    RETURNING r.id, r.archive_enqueued_at
)
SELECT wanted.id, r.id IS NOT NULL, r.status, r.archive_status, marked.archive_enqueued_at
FROM wanted
LEFT JOIN image_generation_records AS r ON r.id = wanted.id
LEFT JOIN marked ON marked.id = wanted.id
ORDER BY wanted.id
"""

# FAILED rows of a SUCCEEDED generation, oldest generation first, over the partial
# index on started_at WHERE archive_status = 'FAILED'. The last error is kept: it is
# history until the next attempt overwrites or clears it.
_FAILED_WHERE = """
    archive_status = 'FAILED'
    AND status = 'SUCCEEDED'
    AND started_at >= CAST(:since AS timestamptz)
"""
REQUEUE_FAILED_SQL = f"""
WITH picked AS (
    SELECT id
    FROM image_generation_records
    WHERE {_FAILED_WHERE}
    ORDER BY started_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE image_generation_records AS r
SET archive_status = 'PENDING',
    archive_attempts = 0,
    archive_next_run_at = now(),
    archive_enqueued_at = now(),
    archive_locked_by = NULL,
    archive_locked_at = NULL
FROM picked
WHERE r.id = picked.id
RETURNING r.id, r.archive_enqueued_at
"""
PREVIEW_FAILED_SQL = f"""
SELECT id, started_at, archive_attempts, archive_error
FROM image_generation_records
WHERE {_FAILED_WHERE}
ORDER BY started_at
LIMIT :limit
"""
COUNT_FAILED_SQL = f"SELECT count(*) FROM image_generation_records WHERE {_FAILED_WHERE}"

# A row whose send failed: drop our stamp, so the sweeper sends it as soon as it is
# past its grace period instead of waiting a whole requeue interval for our message.
UNSTAMP_SQL = """
UPDATE image_generation_records
SET archive_enqueued_at = NULL
WHERE id = ANY(CAST(:ids AS bigint[]))
  AND archive_status = 'PENDING'
  AND archive_enqueued_at = CAST(:stamp AS timestamptz)
"""

BEGINNING = "-infinity"


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


def _skip_reason(status: Any, archive_status: Any) -> str:
    if status != "SUCCEEDED":
        return f"generation status is {status}: nothing to archive"
    if archive_status == "SUCCEEDED":
        return "already archived"
    if archive_status == "FAILED":
        return "archive FAILED: use `requeue --failed` to give it new attempts"
    if archive_status == "RUNNING":
        return "archive is RUNNING (the sweeper takes it over if its lock expires)"
    return f"archive changed to {archive_status} meanwhile; run again"


def _send(
    db: Database,
    sender: BatchSender,
    queue_url: str,
    record_ids: Sequence[int],
    *,
    stamp: datetime | None,
    report: EnqueueReport,
) -> None:
    """Send one message per id; rows whose message did not go out lose our stamp, so the
    sweeper sends them after its grace period."""
    sent = send_records(sender, queue_url, record_ids)
    report.sent += sent.sent
    unsent: dict[int, str] = dict(sent.failed)
    if sent.error is not None:
        reason = f"{type(sent.error).__name__}: {str(sent.error)[:200]}"
        unsent.update(dict.fromkeys(sent.not_tried, reason))
    if unsent and stamp is not None:
        db.run(UNSTAMP_SQL, ids=list(unsent), stamp=stamp)
    report.unsent.update(unsent)


def enqueue(
    db: Database, sender: BatchSender, queue_url: str, record_ids: Sequence[int]
) -> EnqueueReport:
    """Mark the records PENDING (due now) and send their messages, in that order.

    Rows that cannot take a message (not found, generation not SUCCEEDED, archive
    RUNNING or concluded) are reported, not changed.
    """
    report = EnqueueReport()
    rows = db.run(MARK_SQL, ids=list(record_ids))
    to_send: list[int] = []
    stamp: datetime | None = None
    for record_id, exists, status, archive_status, marked_at in rows:
        if not exists:
            report.missing.append(int(record_id))
        elif marked_at is None:
            report.skipped[int(record_id)] = _skip_reason(status, archive_status)
        else:
            to_send.append(int(record_id))
            stamp = marked_at
    _send(db, sender, queue_url, to_send, stamp=stamp, report=report)
    return report


@dataclass(frozen=True)
class FailedRecord:
    record_id: int
    started_at: datetime | None
    attempts: int
    error: str | None


def preview_failed(
    db: Database, *, since: datetime | None, limit: int
) -> tuple[int, list[FailedRecord]]:
    """How many FAILED rows `requeue_failed` would take, and the first `limit` of them."""
    bound = BEGINNING if since is None else since
    [[total]] = db.run(COUNT_FAILED_SQL, since=bound)
    rows = db.run(PREVIEW_FAILED_SQL, since=bound, limit=limit)
    return int(total), [
        FailedRecord(int(i), started, int(attempts), error) for i, started, attempts, error in rows
    ]


def requeue_failed(
    db: Database,
    sender: BatchSender,
    queue_url: str,
    *,
    since: datetime | None,
    limit: int,
    page_size: int = REQUEUE_PAGE,
) -> EnqueueReport:
    """Reset up to `limit` FAILED rows (attempts 0, PENDING, due now, stamped) and send
    them, a page at a time, so an interruption leaves at most one page unsent (and
    those are PENDING: the sweeper sends them)."""
    report = EnqueueReport()
    bound = BEGINNING if since is None else since
    while (room := limit - len(report.sent) - len(report.unsent)) > 0:
        rows = db.run(REQUEUE_FAILED_SQL, since=bound, limit=min(page_size, room))
        if not rows:
            break
        ids = sorted(int(record_id) for record_id, _ in rows)
        _send(db, sender, queue_url, ids, stamp=rows[0][1], report=report)
        if report.unsent:
            break  # SQS trouble: leave the rest FAILED rather than reset it unsent
    return report
