"""The database grants docs/reference/database.md documents are enough, and nothing more is needed:
every statement, the archive handler and the sweeper run as a role that has exactly them."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from devkit import images
from devkit.postgres import connect
from lib.archive.message import encode
from lib.cli.context import EXIT_ERROR
from lib.platform import schema
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.state.audits import AuditFindings, AuditRecords, AuditResult
from lib.state.claim import Confirmed, KeptOriginal, OriginalSource, SentImage, StagedCopy
from lib.state.events import Actor
from lib.state.lane_store import LaneStore
from lib.state.operations import OperatorRecords
from lib.state.originals import OriginalStore
from lib.state.outbox import OutboxStore, Publication
from lib.state.privileges import RolePrivileges
from lib.state.queries import QUERIES
from lib.state.records import ArchiveRecords
from lib.state.selection import Selection
from lib.state.status import WaitReason
from lib.state.stories import StoryRecords
from lib.state.sweeps import SweepRecords
from tests.integration.conftest import ArchiveCtl, ArchiveHarness
from tests.integration.world import World
from tests.logcapture import capture_logs, parse
from tests.support import FakeLambdaContext, emf_metrics, fetch_record, seed_record, seed_running

ROOT = Path(__file__).resolve().parents[2]
GRANTS_DOC = ROOT / "docs" / "reference" / "database.md"
STATE = ROOT / "src" / "lib" / "state"
DOC_ROLE = "image_archive"
URL = "https://upstream.invalid/gen.png"


def documented_grants() -> str:
    """The ```sql block of the Permissions section of docs/reference/database.md."""
    text = GRANTS_DOC.read_text(encoding="utf-8")
    section = text.split("### Permissions", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sql\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1, "the Permissions section should hold one SQL block of grants"
    assert "GRANT" in blocks[0]
    return str(blocks[0])


@pytest.fixture
def role_dsn(pg_dsn: str, db: Any) -> Iterator[str]:
    """A login role with the documented grants and nothing else, and its DSN."""
    role = f"archive_{uuid.uuid4().hex[:10]}"
    db.run(f"CREATE ROLE {role} LOGIN PASSWORD 'grants-test'")
    grants = re.sub(rf"\b{DOC_ROLE}\b", role, documented_grants())
    for statement in schema.split_statements(grants):
        db.run(statement)
    parts = urlsplit(pg_dsn)
    netloc = f"{role}:grants-test@{parts.hostname}:{parts.port}"
    try:
        yield urlunsplit(parts._replace(netloc=netloc))
    finally:
        admin = connect(pg_dsn)
        try:
            admin.run(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r",
                r=role,
            )
            admin.run(f"DROP OWNED BY {role}")
            admin.run(f"DROP ROLE {role}")
        finally:
            admin.close()


class RecordingDatabase(Database):
    """Remembers which named statements of queries.sql it ran."""

    names = {sql: name for name, sql in QUERIES.items()}

    def __init__(self, dsn: str) -> None:
        super().__init__(DatabaseConfig(url=dsn), application_name="grants-test")
        self.ran: set[str] = set()

    def run(self, sql: str, **params: Any) -> list[list[Any]]:
        rows = super().run(sql, **params)
        self.ran.add(self.names.get(sql, sql))
        return rows


def statements_records_runs() -> set[str]:
    """Every named statement the state package's classes run."""
    return {
        name
        for module in STATE.glob("*.py")
        for name in re.findall(r'_run\(\s*"(\w+)"', module.read_text(encoding="utf-8"))
    }


def test_the_documented_grants_cover_every_statement(role_dsn: str, db: Any) -> None:
    for record_id in (1, 2, 3, 4):
        seed_record(db, record_id, image_url=URL)
    seed_running(db, 5, locked_at=1000)
    seed_running(db, 6, locked_by=None, locked_at=None)
    seed_record(db, 7, image_url=URL, next_run_at=None)
    seed_record(db, 8, image_url=URL, next_run_at=5000, enqueued_at=None)
    seed_record(db, 9, image_url=URL, archive_status=None)
    seed_record(db, 10, image_url=URL, archive_status="FAILED", attempts=3)
    database = RecordingDatabase(role_dsn)
    # Completion events on: the statements write them, the outbox's are run too.
    records = ArchiveRecords(database, publish=True)
    sweeps, lanes, ops = (
        SweepRecords(database, publish=True),
        LaneStore(database),
        OperatorRecords(database),
    )
    outbox = OutboxStore(database)
    try:
        tasks = {}
        for record_id in (1, 2, 3, 4):
            claim = records.claim(record_id, owner="o", lock_ttl_seconds=180, max_attempts=3)
            assert claim.task is not None
            tasks[record_id] = claim.task
        original = KeptOriginal(
            "originals-bucket",
            "originals/1/" + "a" * 32 + ".png",
            "v1",
            "0" * 64,
            3,
            "image/png",
            OriginalSource.ARCHIVE,
        )
        assert records.succeed(
            tasks[1],
            owner="o",
            hosted_url="https://img/x.png",
            mime_type="image/png",
            response={"key": "k"},
            original=original,
        )
        # The audit's original replaces it (INSERT ... ON CONFLICT DO UPDATE), and is read.
        originals = OriginalStore(database)
        assert originals.of(1) == original
        hosted = KeptOriginal(**{**vars(original), "source": OriginalSource.HOSTED})
        assert originals.keep(1, hosted)
        assert originals.of(1) == hosted
        assert records.retry(
            tasks[2],
            owner="o",
            error="HTTP 500",
            delay_seconds=30,
            staged=StagedCopy("staged/2/a.png", "0" * 64, 3),
            sent=SentImage("s", (1, 1)),
        )
        assert records.fail(tasks[3], owner="o", error="HTTP 404")
        assert records.release(tasks[4], owner="o", delay_seconds=5, wait_reason=WaitReason.NO_TIME)
        archived, failed = records.written.take()  # records 1 and 3
        # A claim records the publication of what its container published.
        published = [Publication(archived.event_id, archived.created_at)]
        assert (
            records.claim(
                10, owner="o2", lock_ttl_seconds=180, max_attempts=3, published=published
            ).task
            is None
        )

        assert [
            r.record_id
            for r in sweeps.take_expired_locks(limit=10, lock_ttl_seconds=180, max_attempts=3)
        ] == [5]
        assert [r.record_id for r in sweeps.take_lockless(limit=10, max_attempts=3)] == [6]
        assert sorted(sweeps.date_undated(limit=10)) == [5, 6, 7]  # 5, 6 recovered undated
        _, now = sweeps.queue_mark()  # the receive mark the claims above kept
        cutoff = now - timedelta(seconds=900)
        lost = sweeps.take_lost(limit=10, grace_seconds=300, lost_before=cutoff, after=None)
        assert [r.record_id for r in lost] == [8]
        assert (
            sweeps.take_lost(
                limit=10, grace_seconds=300, lost_before=cutoff, after=None, backfilled=True
            )
            == []
        )
        assert sweeps.restore(lost) == 1
        sweeps.oldest_pending_age_seconds()

        [marked] = ops.mark_for_enqueue([9], by=Actor.ENQUEUE)
        assert marked.marked_at is not None
        ops.unstamp([9], stamp=marked.marked_at, by=Actor.ENQUEUE, error="SQS down")
        everything = Selection()
        assert ops.count_failed(everything, requeuable=True) == 2  # 3, and 10
        assert len(ops.list_records(everything, after=None, limit=10, requeuable=True)) == 2
        assert len(ops.list_records(everything, after=None, limit=10)) == 10
        assert len(ops.requeue_failed(Selection(ids=(3, 10, 11)), limit=10)) == 2
        assert [row.record_id for row in ops.record_states([11])] == [11]
        # What a 42501 would be explained with: the documented grants lack nothing.
        check = RolePrivileges(database).check(None)
        assert check is not None
        assert check.verdict.complete
        ops.live_counts(lock_ttl_seconds=180)
        ops.all_counts()
        ops.waiting_counts()
        assert sweeps.staged_summary().waiting == 1  # 2
        # The upload lane.
        lanes.state()

        def take(record_id: int) -> str:
            slot = lanes.take_slot(
                record_id, limits=[(60, 4)], margin=0.1, tolerance=0.05, stale=120, book_within=900
            )
            return slot.answer

        # Records 1 (archived), 5 and 6 (vanished, unpaced: they may have uploaded) are in
        # the ledger: the fourth of four a minute.
        assert take(12) == "go"
        assert take(13) == "booked"
        assert lanes.uploads_within(60) == 4  # the uploads done and the one under way
        assert lanes.window_frees_at(60, 1, margin=0.1) is not None
        lanes.roll_up()
        assert lanes.unpark(spread_seconds=1, by=Actor.LANE_CLEAR) == []
        lanes.pause(until="infinity", reason="account", window=None, detail="401")
        assert records.park(9, delay_seconds=0, wait_reason=WaitReason.PAUSED)
        assert lanes.clear() == "account"
        ops.altered_counts()
        # Backfill: generations never queued.
        seed_record(db, 11, image_url=URL, archive_status=None)
        assert ops.count_backfill(since=None, until=None, user_id=None) == 1
        assert [
            row[0] for row in ops.preview_backfill(since=None, until=None, user_id=None, limit=5)
        ] == [11]
        page = ops.mark_backfill_page(since=None, until=None, user_id=None, after=None, limit=5)
        assert [row[0] for row in page] == [11]
        assert ops.unmark_backfill([11], stamp=page[0][-1]) == [11]
        assert ops.count_never_queued(limit=5) == 1
        assert ops.lane_demand().live_due >= 1
        assert lanes.ledger(3600)
        # The story: a DLQ redrive, `show`, and the retention (nothing old enough here).
        assert ops.mark_redriven([(3, "message-3")]) == {3: "PENDING"}  # requeued above
        story = StoryRecords(database).story(1, lock_ttl_seconds=180, limit=10)
        assert [e.kind for e in story.events][-3:] == ["archived", "published", "original_kept"]
        story = StoryRecords(database).story(3, lock_ttl_seconds=180, limit=30)
        assert "publishing" in [e.kind for e in story.events]  # its event still waits
        assert sweeps.expire_events(retention_seconds=86_400, limit=10) == {}
        # The sweeper's part of the completion events.
        page = outbox.take(grace_seconds=1, lease_seconds=60, limit=10, own=[failed.event_id])
        assert [e.event_id for e in page.events] == [failed.event_id]
        done = [Publication(failed.event_id, failed.created_at)]
        assert outbox.settle(published=done, missed=[], dropped=[]).published == 1
        assert outbox.summary().waiting == 0
        # The audit: the walk, the rotation, a batch's verdicts, an original, a restore.
        audits = AuditRecords(database)
        assert audits.walk(batch=100, period_seconds=86_400).walking
        assert [t.record_id for t in audits.peek_due(limit=10)] == [1]  # archived above
        [due] = audits.take_due(limit=10, lease_seconds=60)
        chosen = audits.take_chosen(ids=[1], since=None, after_id=0, limit=5, lease_seconds=60)
        assert [t.record_id for t in chosen] == [1]
        kept = KeptOriginal(
            "bucket-b", "originals/1/x.png", "v1", "0" * 64, 3, "image/png", OriginalSource.HOSTED
        )
        assert originals.keep(1, kept, by=Actor.AUDITOR)
        # The audit's look at unconfirmed originals: none here (it keeps confirmed ones).
        assert originals.unconfirmed(grace_seconds=0, limit=5) == []
        assert originals.confirm([Confirmed(1, kept.key, "v2")]) == 0
        assert not originals.absent(1, kept.key)  # a confirmed row is never removed
        result = AuditResult(1, "missing", due.hosted_url, detail={"why": "HTTP 404"})
        assert audits.record([result], period_seconds=86_400, retry_seconds=900) == []
        audits.release([1])
        assert audits.expire_events(retention_seconds=86_400, limit=10) == 0  # none old
        audits.pass_over([999], period_seconds=86_400)
        findings = AuditFindings(database)
        assert [f.record_id for f in findings.found("missing", after_id=0, limit=5)] == [1]
        assert findings.keeping(1).verdict == "missing"
        assert findings.coverage().missing == 1
        assert [r for r, _ in audits.request_restores([(1, due.hosted_url)], reason="missing",
                                                      by=Actor.AUDITOR)] == [1]  # fmt: skip
        [restoring] = findings.restorable([1])
        assert not isinstance(restoring, int)
        assert restoring.restoring
    finally:
        database.close()

    assert database.ran == statements_records_runs()
    assert fetch_record(db, 1)["archive_status"] == "PENDING"  # restored


def test_the_handlers_run_as_a_role_with_the_documented_grants(role_dsn: str, world: World) -> None:
    db = world.db
    world.settings(DATABASE_URL=role_dsn)
    world.record(21)
    world.record(22, b"", route={"status": 404})
    world.crashed(23, locked_at=1000)

    for record_id in (21, 22):
        assert world.deliver(record_id)["batchItemFailures"] == []
    assert world.row(21)["archive_status"] == "SUCCEEDED"
    assert world.row(22)["archive_status"] == "FAILED"

    from handlers.sweeper import lambda_handler

    context = FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60)
    summary = lambda_handler({}, context)
    assert summary["requeued"] == 1
    assert fetch_record(db, 23)["archive_status"] == "PENDING"


def test_a_grant_missing_after_an_upgrade_is_our_fault_and_spends_no_attempt(
    role_dsn: str,
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # An upgrade that missed the ledger's grant: the claim (which enters an upload an
    # attempt that vanished may have made) is refused with 42501, before anything is
    # fetched or sent.
    role = urlsplit(role_dsn).username
    db.run(f"REVOKE INSERT ON image_archive_uploads FROM {role}")
    archive_env(DATABASE_URL=role_dsn)
    seed_record(db, 31, image_url=upstream.add("/p.png", images.png(8, 8)))
    capsys.readouterr()

    response = archive.deliver(encode(31))

    assert len(response["batchItemFailures"]) == 1  # redelivered, not failed
    row = fetch_record(db, 31)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert lsky.image_records() == []  # nothing sent
    line = archive.log_for("permission denied; message will be redelivered")
    assert "permission denied on table image_archive_uploads" in line["error"]
    assert "archive-ctl grants" in line["error"]
    assert emf_metrics(capsys)["PermissionDenied"] == 1

    # The grant fixed, the record is archived: one copy, no attempt lost.
    db.run(f"GRANT INSERT ON image_archive_uploads TO {role}")
    db.run("UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = 31")
    assert archive.deliver(encode(31)) == {"batchItemFailures": []}
    row = fetch_record(db, 31)
    assert (row["archive_status"], row["archive_attempts"]) == ("SUCCEEDED", 1)
    assert len(lsky.image_records()) == 1


def test_the_sweeper_names_a_missing_grant(
    role_dsn: str,
    archive_env: Callable[..., dict[str, str]],
    db: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    role = urlsplit(role_dsn).username
    db.run(f"REVOKE INSERT ON image_archive_upload_hours FROM {role}")
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        " VALUES ('lsky', now() - interval '3 hours', 'done')"
    )
    archive_env(DATABASE_URL=role_dsn)
    from handlers.sweeper import lambda_handler

    capsys.readouterr()
    with capture_logs() as lines, pytest.raises(Exception, match="42501"):
        lambda_handler({}, FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60))

    [stopped] = [e for e in parse(lines) if e["message"].startswith("sweep stopped")]
    assert stopped["message"] == "sweep stopped: the database role lacks a grant"
    assert "permission denied on table image_archive_upload_hours" in stopped["error"]
    assert emf_metrics(capsys)["PermissionDenied"] == 1


# -- a 42501 names the grant, wherever it is met ---------------------------------------------


def test_a_grant_missing_even_for_the_last_resort_is_named_with_its_fix(
    role_dsn: str,
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> None:
    """Without UPDATE on archive_staged_at, the upload is stored, its success cannot be
    written, nor can the attempt be given back (that statement writes the column too): the
    last resort's line still says what to grant, to whom, and how to get the GRANT."""
    role = urlsplit(role_dsn).username
    db.run(f"REVOKE UPDATE (archive_staged_at) ON image_generation_records FROM {role}")
    archive_env(DATABASE_URL=role_dsn)
    seed_record(db, 41, image_url=upstream.add("/41.png", images.png(8, 8)))

    response = archive.deliver(encode(41))

    assert len(response["batchItemFailures"]) == 1  # SQS redelivers it
    line = archive.log_for("could not conclude the attempt; SQS will redeliver it")
    for said in (line["error"], line["conclusion_error"]):
        assert said.startswith("42501: permission denied on table image_generation_records")
        assert f"role {role} lacks UPDATE (archive_staged_at) on image_generation_records" in said
        assert f"`archive-ctl grants --role {role}`" in said
    row = fetch_record(db, 41)
    assert (row["archive_status"], row["archive_attempts"]) == ("RUNNING", 1)  # lock expires


def test_the_sweeper_names_the_column_and_the_privilege(
    role_dsn: str, archive_env: Callable[..., dict[str, str]], db: Any
) -> None:
    role = urlsplit(role_dsn).username
    db.run(f"REVOKE UPDATE (archive_failed_at) ON image_generation_records FROM {role}")
    seed_running(db, 51, attempts=3, locked_at=3600)  # to be failed: no attempt left
    archive_env(DATABASE_URL=role_dsn)
    from handlers.sweeper import lambda_handler

    with capture_logs() as lines, pytest.raises(Exception, match="42501"):
        lambda_handler({}, FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60))

    [stopped] = [e for e in parse(lines) if e["message"].startswith("sweep stopped")]
    assert (
        f"role {role} lacks UPDATE (archive_failed_at) on image_generation_records"
        in (stopped["error"])
    )
    assert f"`archive-ctl grants --role {role}`" in stopped["error"]


def test_archive_ctl_names_the_column_and_the_privilege(
    role_dsn: str, archive_ctl: ArchiveCtl, db: Any
) -> None:
    role = urlsplit(role_dsn).username
    db.run(f"REVOKE UPDATE (archive_failed_at) ON image_generation_records FROM {role}")
    seed_record(db, 61, image_url=URL, archive_status="FAILED", attempts=3)

    result = archive_ctl("requeue", "--failed", env={"DATABASE_URL": role_dsn})

    assert result.returncode == EXIT_ERROR
    assert result.stderr.splitlines()[-1] == (
        "archive-ctl: error: database error: 42501: permission denied on table"
        f" image_generation_records; role {role} lacks UPDATE (archive_failed_at) on"
        f" image_generation_records; `archive-ctl grants --role {role}` prints the GRANT"
        " statements this release needs"
    )
    assert fetch_record(db, 61)["archive_status"] == "FAILED"
