"""archive_may_be_hosted in the state machine: every claim sets it, the claim returns what
the last attempt left, and only the writes that know the host's answer clear it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.state.claim import Task
from lib.state.records import ArchiveRecords
from lib.state.status import WaitReason
from lib.state.sweeps import SweepRecords
from tests.support import fetch_record, seed_record

URL = "http://example.test/i.png"
TTL = 180


@pytest.fixture
def records(pg_dsn: str, db: Any) -> Iterator[ArchiveRecords]:
    database = Database(DatabaseConfig(url=pg_dsn), application_name="may-be-hosted-test")
    yield ArchiveRecords(database)
    database.close()


def claim(records: ArchiveRecords, record_id: int, owner: str) -> Task:
    task = records.claim(record_id, owner=owner, lock_ttl_seconds=TTL, max_attempts=3).task
    assert task is not None
    return task


def flag(db: Any, record_id: int) -> bool:
    return bool(fetch_record(db, record_id)["archive_may_be_hosted"])


def test_a_first_claim_finds_nothing_hosted_and_marks_the_attempt_open(
    db: Any, records: ArchiveRecords
) -> None:
    seed_record(db, 1, image_url=URL)

    task = claim(records, 1, "a")

    assert task.may_be_hosted is False  # a first attempt never looks anything up
    assert flag(db, 1) is True  # until an answer says otherwise, it may upload and vanish


def test_a_success_clears_it(db: Any, records: ArchiveRecords) -> None:
    seed_record(db, 1, image_url=URL)
    task = claim(records, 1, "a")

    records.succeed(
        task, owner="a", hosted_url="http://h/i.png", mime_type="image/png", response={}
    )

    assert flag(db, 1) is False


@pytest.mark.parametrize("may_be_hosted", [True, False])
def test_retry_and_fail_record_what_the_attempt_knows(
    db: Any, records: ArchiveRecords, may_be_hosted: bool
) -> None:
    seed_record(db, 1, image_url=URL)
    seed_record(db, 2, image_url=URL)
    first, second = claim(records, 1, "a"), claim(records, 2, "a")

    assert records.retry(first, owner="a", error="e", delay_seconds=0, may_be_hosted=may_be_hosted)
    assert records.fail(second, owner="a", error="e", may_be_hosted=may_be_hosted)

    assert (flag(db, 1), flag(db, 2)) == (may_be_hosted, may_be_hosted)
    # The next claim of the retried row reports it.
    assert claim(records, 1, "b").may_be_hosted is may_be_hosted


def test_release_puts_back_what_the_claim_found(db: Any, records: ArchiveRecords) -> None:
    seed_record(db, 1, image_url=URL, archive_may_be_hosted=True)
    seed_record(db, 2, image_url=URL)
    hosted, clean = claim(records, 1, "a"), claim(records, 2, "a")

    assert records.release(hosted, owner="a", delay_seconds=0, wait_reason=WaitReason.NO_TIME)
    assert records.release(clean, owner="a", delay_seconds=0, wait_reason=WaitReason.NO_TIME)

    assert (flag(db, 1), flag(db, 2)) == (True, False)


def test_an_attempt_that_vanished_is_reported_to_whoever_comes_next(
    db: Any, records: ArchiveRecords
) -> None:
    # A crash (or a success write that failed) leaves the row RUNNING with the flag set.
    seed_record(db, 1, image_url=URL)
    claim(records, 1, "a")
    db.run("UPDATE image_generation_records SET archive_locked_at = now() - interval '1 hour'")

    # Taken over by a redelivered message...
    assert claim(records, 1, "b").may_be_hosted is True

    # ...or recovered by the sweeper first: PENDING again, and the flag survives that.
    db.run("UPDATE image_generation_records SET archive_locked_at = now() - interval '1 hour'")
    [row] = SweepRecords(records.db).take_expired_locks(
        limit=10, lock_ttl_seconds=TTL, max_attempts=3
    )
    assert row.archive_status == "PENDING"
    assert claim(records, 1, "c").may_be_hosted is True


def test_the_claim_s_own_rerun_keeps_the_flag(db: Any, records: ArchiveRecords) -> None:
    # A re-run after a lost reply must not lose what the previous attempt left.
    seed_record(db, 1, image_url=URL, archive_may_be_hosted=True)
    assert claim(records, 1, "a").may_be_hosted is True
    assert claim(records, 1, "a").may_be_hosted is True
