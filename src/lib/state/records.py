"""The archive state machine's SQL: claim, succeed, retry, fail. One round trip each.

PENDING -> RUNNING (claim: attempts + 1, lock set) -> SUCCEEDED | PENDING (retry) | FAILED.
Only the archive_* columns (and hosted_*) are ever written; the generation's own
status is read, never changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.archive.retry import ClaimSnapshot
from lib.platform.db import Database

# One statement claims the row and explains a lost claim: `target` reads the row as
# it was, `claimed` is the conditional UPDATE. Under READ COMMITTED the UPDATE
# re-checks its WHERE on a row another claimer just changed, so exactly one wins.
# Re-running the claim with the same lock owner (after a lost connection) returns
# the row again without counting a second attempt.
CLAIM_SQL = """
WITH target AS (
    SELECT id, status, archive_status,
           archive_locked_at < now() - make_interval(secs => :lock_ttl) AS lock_expired,
           EXTRACT(EPOCH FROM archive_next_run_at - now()) AS due_in
    FROM image_generation_records
    WHERE id = :record_id
),
claimed AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'RUNNING',
        archive_attempts = CASE WHEN r.archive_locked_by = :owner
                                THEN r.archive_attempts ELSE r.archive_attempts + 1 END,
        archive_locked_by = :owner,
        archive_locked_at = now()
    WHERE r.id = :record_id
      AND r.status = 'SUCCEEDED'
      AND ((r.archive_status = 'PENDING'
            AND (r.archive_next_run_at IS NULL
                 OR r.archive_next_run_at <= now() + make_interval(secs => :early_slack)))
           OR (r.archive_status = 'RUNNING'
               AND (r.archive_locked_by = :owner
                    OR ((r.archive_locked_at IS NULL
                         OR r.archive_locked_at < now() - make_interval(secs => :lock_ttl))
                        AND r.archive_attempts < :max_attempts))))
    RETURNING r.id, r.user_id, r.image_url, r.started_at, r.archive_attempts
),
-- An expired lock on the last attempt is concluded here, as the sweeper would: taking
-- it over would run one attempt more than allowed. Its condition excludes `claimed`'s,
-- so the two never touch the same row.
exhausted AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'FAILED',
        archive_error = 'lock expired after the last attempt',
        archive_next_run_at = NULL,
        archive_locked_by = NULL,
        archive_locked_at = NULL
    WHERE r.id = :record_id
      AND r.status = 'SUCCEEDED'
      AND r.archive_status = 'RUNNING'
      AND r.archive_locked_by IS DISTINCT FROM :owner
      AND (r.archive_locked_at IS NULL
           OR r.archive_locked_at < now() - make_interval(secs => :lock_ttl))
      AND r.archive_attempts >= :max_attempts
    RETURNING r.id
)
SELECT target.status, target.archive_status, target.lock_expired, target.due_in,
       exhausted.id IS NOT NULL,
       claimed.id, claimed.user_id, u.username, claimed.image_url,
       claimed.started_at, claimed.archive_attempts
FROM (SELECT 1) AS one
LEFT JOIN target ON true
LEFT JOIN claimed ON true
LEFT JOIN exhausted ON true
LEFT JOIN users AS u ON u.id = claimed.user_id
"""

# Success wins whatever happened meanwhile (the lock expired and another attempt took
# over, or the sweeper failed the row): the picture is hosted, so record it rather
# than upload it again. `before` tells whether we still held the lock, for the log.
SUCCEED_SQL = """
UPDATE image_generation_records AS r
SET archive_status = 'SUCCEEDED',
    archived_at = now(),
    hosted_image_url = :hosted_url,
    image_mime_type = :mime_type,
    hosted_response = CAST(:hosted_response AS jsonb),
    archive_error = NULL,
    archive_next_run_at = NULL,
    archive_locked_by = NULL,
    archive_locked_at = NULL
FROM (
    SELECT id, archive_locked_by FROM image_generation_records
    WHERE id = :record_id FOR UPDATE
) AS before
WHERE r.id = before.id AND r.archive_status IN ('PENDING', 'RUNNING', 'FAILED')
RETURNING before.archive_locked_by IS NOT DISTINCT FROM :owner
"""

RETRY_SQL = """
UPDATE image_generation_records
SET archive_status = 'PENDING',
    archive_error = :error,
    archive_next_run_at = now() + make_interval(secs => :delay),
    archive_locked_by = NULL,
    archive_locked_at = NULL
WHERE id = :record_id AND archive_locked_by = :owner AND archive_status = 'RUNNING'
RETURNING id
"""

FAIL_SQL = """
UPDATE image_generation_records
SET archive_status = 'FAILED',
    archive_error = :error,
    archive_next_run_at = NULL,
    archive_locked_by = NULL,
    archive_locked_at = NULL
WHERE id = :record_id AND archive_locked_by = :owner AND archive_status = 'RUNNING'
RETURNING id
"""

# Give the row back without spending the attempt (the invocation ran out of time).
RELEASE_SQL = """
UPDATE image_generation_records
SET archive_status = 'PENDING',
    archive_attempts = GREATEST(archive_attempts - 1, 0),
    archive_next_run_at = now() + make_interval(secs => :delay),
    archive_locked_by = NULL,
    archive_locked_at = NULL
WHERE id = :record_id AND archive_locked_by = :owner AND archive_status = 'RUNNING'
RETURNING id
"""


# A message may come back a little before the row's due time (clock skew between SQS
# and PostgreSQL); within this slack it is on time. Earlier than that it is a second
# copy arriving during a backoff (or a Retry-After) and is held back until due.
EARLY_SLACK_SECONDS = 5


@dataclass(frozen=True)
class Task:
    """What an attempt needs, as returned by the claim."""

    record_id: int
    user_id: int
    username: str | None
    image_url: str
    started_at: datetime | None
    attempt: int


@dataclass(frozen=True)
class ClaimResult:
    task: Task | None
    snapshot: ClaimSnapshot


class Records:
    def __init__(self, db: Database) -> None:
        self.db = db

    def claim(
        self, record_id: int, *, owner: str, lock_ttl_seconds: int, max_attempts: int
    ) -> ClaimResult:
        rows = self.db.run(
            CLAIM_SQL,
            record_id=record_id,
            owner=owner,
            lock_ttl=lock_ttl_seconds,
            max_attempts=max_attempts,
            early_slack=EARLY_SLACK_SECONDS,
        )
        (
            status,
            archive_status,
            lock_expired,
            due_in,
            exhausted,
            claimed_id,
            user_id,
            username,
            url,
            started,
            n,
        ) = rows[0]
        snapshot = ClaimSnapshot(
            exists=status is not None,
            status=status,
            archive_status=archive_status,
            lock_expired=bool(lock_expired),
            due_in_seconds=float(due_in) if due_in is not None else 0.0,
            exhausted=bool(exhausted),
        )
        if claimed_id is None:
            return ClaimResult(None, snapshot)
        task = Task(
            record_id=int(claimed_id),
            user_id=int(user_id),
            username=username,
            image_url=url or "",
            started_at=started,
            attempt=int(n),
        )
        return ClaimResult(task, snapshot)

    def succeed(
        self, task: Task, *, owner: str, hosted_url: str, mime_type: str, response: dict[str, Any]
    ) -> bool | None:
        """Record the hosted image. True: under our lock; False: recorded although the lock
        had passed on; None: the row had already concluded as SUCCEEDED elsewhere."""
        rows = self.db.run(
            SUCCEED_SQL,
            record_id=task.record_id,
            owner=owner,
            hosted_url=hosted_url,
            mime_type=mime_type,
            hosted_response=json.dumps(response, ensure_ascii=False),
        )
        return bool(rows[0][0]) if rows else None

    def retry(self, task: Task, *, owner: str, error: str, delay_seconds: int) -> bool:
        rows = self.db.run(
            RETRY_SQL, record_id=task.record_id, owner=owner, error=error, delay=delay_seconds
        )
        return bool(rows)

    def fail(self, task: Task, *, owner: str, error: str) -> bool:
        return bool(self.db.run(FAIL_SQL, record_id=task.record_id, owner=owner, error=error))

    def release(self, task: Task, *, owner: str, delay_seconds: int) -> bool:
        rows = self.db.run(RELEASE_SQL, record_id=task.record_id, owner=owner, delay=delay_seconds)
        return bool(rows)
