"""The record does not wait for S3's answer to its original's PUT: once the body has gone
out whole the success write records the original unconfirmed; S3's answer, kept by the
container, is recorded by its next claim; what no container confirmed the audit looks at
(a HEAD): confirmed, or found absent and kept again from its own GET. Real PostgreSQL,
moto's S3 (its answers held back or refused at the server), the Lsky stand-in
(lib.archive.confirmations, lib.audit.confirm, docs/explanation/staging-and-originals.md)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from devkit import images
from lib.archive import runtime
from lib.archive.confirmations import Confirmations
from tests.integration.test_audit import Audit
from tests.integration.test_cli import Ctl
from tests.integration.test_migrate_live import admin, ctl, database, generation_service_tables
from tests.integration.test_repair import _restore_delivered, audit, keeping
from tests.integration.world import World
from tests.support import HANG_SECONDS, emf_metrics

__all__ = ["admin", "audit", "ctl", "database", "keeping"]  # other tests' fixtures, used here

IMAGE = images.png(16, 16, size=2_000_000, seed=38)
SHA256 = hashlib.sha256(IMAGE).hexdigest()
ABSENT = "an original recorded unconfirmed is not in the bucket; a new one is kept"
NAMES = ("bucket", "key", "version_id", "sha256", "bytes", "source", "confirmed")


def kept(db: Any, record_id: int) -> dict[str, Any] | None:
    rows = db.run(
        "SELECT bucket, key, version_id, sha256, bytes, source, confirmed"
        " FROM image_archive_originals WHERE record_id = :id",
        id=record_id,
    )
    return dict(zip(NAMES, rows[0], strict=True)) if rows else None


def confirmations() -> Confirmations:
    return runtime.archive_worker().transfer.original.originals.confirmations


def kept_again(world: World, row: dict[str, Any]) -> dict[str, Any]:
    """Record 2's original, kept again (from the audit's GET) under a new key."""
    again = kept(world.db, 2)
    assert again is not None
    assert again["key"] != row["key"]
    return again


def die() -> None:
    """The container dies with the answers it kept: a new one starts with none."""
    runtime.archive_worker().transfer.original.originals.confirmations = Confirmations()


def age_original(db: Any, record_id: int) -> None:
    """Move the clock in the row: recorded long before the audit's grace."""
    db.run(
        "UPDATE image_archive_originals SET kept_at = now() - interval '1 day'"
        " WHERE record_id = :id",
        id=record_id,
    )


def warm(world: World) -> int:
    """The container's first message (it connects, builds the worker), S3's answer to its
    original in; the statements run so far."""
    world.record(1, IMAGE)
    world.deliver(1)
    row = kept(world.db, 1)
    assert row is not None
    if not row["confirmed"]:
        assert confirmations().wait(1, HANG_SECONDS)
    return int(runtime.archive_worker().records.db.statements_run)


def held_archive(world: World, moto: Any, bucket: str, record_id: int, body: bytes = IMAGE) -> Any:
    """`record_id` archived while S3 holds back its answer to the original's PUT (moto has
    stored it); the event that lets the answer go."""
    release = moto.hold_s3("PUT", f"/{bucket}/originals/{record_id}/")
    world.record(record_id, body)
    assert world.deliver(record_id) == {"batchItemFailures": []}
    return release


# -- the record does not wait; the next claim confirms --------------------------------------


def test_the_record_does_not_wait_for_s3_and_the_next_claim_confirms_it(
    keeping: World,
    s3: Any,
    moto: Any,
    originals_bucket: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    world = keeping
    statements = warm(world)
    release = moto.hold_s3("PUT", f"/{originals_bucket}/originals/2/")
    world.record(2, IMAGE)
    answered = moto.watch_s3("PUT", f"/{originals_bucket}/originals/2/", answered=True)

    assert world.deliver(2) == {"batchItemFailures": []}

    # Concluded while S3's answer is still held back: the original recorded unconfirmed.
    assert not answered.is_set()
    assert world.state(2) == ("SUCCEEDED", 1)
    row = kept(world.db, 2)
    assert row is not None
    assert (row["sha256"], row["bytes"], row["version_id"], row["confirmed"]) == (
        SHA256,
        len(IMAGE),
        None,
        False,
    )
    db = runtime.archive_worker().records.db
    assert db.statements_run - statements == 2  # claim + success write, as before

    release.set()
    assert confirmations().wait(2, HANG_SECONDS)
    world.record(3, IMAGE)
    world.deliver(3)

    confirmed = kept(world.db, 2)
    head = s3.head_object(Bucket=originals_bucket, Key=row["key"])
    assert confirmed is not None
    assert confirmed["confirmed"] is True
    assert confirmed["version_id"] == head["VersionId"]  # the version S3 answered with
    assert db.statements_run - statements == 4  # recorded by the next claim, no round trip
    assert all(c.record_id == 3 for c in confirmations().unrecorded())
    assert emf_metrics(capsys).get("OriginalsConfirmedLater", 0) >= 1


def test_a_late_answer_for_a_replaced_original_confirms_nothing(
    keeping: World, moto: Any, originals_bucket: str
) -> None:
    world = keeping
    warm(world)
    release = held_archive(world, moto, originals_bucket, 2)
    row = kept(world.db, 2)
    assert row is not None
    other = "originals/2/" + "0" * 32 + ".png"
    world.db.run("UPDATE image_archive_originals SET key = :k WHERE record_id = 2", k=other)

    release.set()
    assert confirmations().wait(2, HANG_SECONDS)
    world.record(3, IMAGE)
    world.deliver(3)

    replaced = kept(world.db, 2)
    assert replaced is not None
    assert (replaced["key"], replaced["confirmed"], replaced["version_id"]) == (other, False, None)


# -- no container confirmed: the audit looks -------------------------------------------------


def test_a_container_that_dies_before_its_next_claim_leaves_it_to_the_audit(
    audit: Audit, keeping: World, s3: Any, moto: Any, originals_bucket: str
) -> None:
    world = keeping
    warm(world)
    release = held_archive(world, moto, originals_bucket, 2)
    release.set()
    assert confirmations().wait(2, HANG_SECONDS)
    die()  # the container dies with what it kept
    world.record(3, IMAGE)
    world.deliver(3)  # another container's claim: nothing to record of record 2
    row = kept(world.db, 2)
    assert row is not None
    assert row["confirmed"] is False

    summary = audit.run()  # recorded just now: within the grace, not looked at
    assert (summary["originals_confirmed"], summary["originals_absent"]) == (0, 0)
    assert kept(world.db, 2)["confirmed"] is False  # type: ignore[index]

    age_original(world.db, 2)
    summary = audit.run()

    assert (summary["originals_confirmed"], summary["originals_absent"]) == (1, 0)
    confirmed = kept(world.db, 2)
    assert confirmed is not None
    head = s3.head_object(Bucket=originals_bucket, Key=row["key"])
    assert (confirmed["confirmed"], confirmed["version_id"]) == (True, head["VersionId"])
    assert confirmed["key"] == row["key"]
    assert [m for m, _ in moto.s3_calls(f"/{originals_bucket}/")].count("DELETE") == 0


def test_an_original_s3_stored_nothing_of_is_found_absent_and_kept_again_from_the_audit_s_get(
    audit: Audit,
    keeping: World,
    moto: Any,
    originals_bucket: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    world = keeping
    warm(world)
    lift = moto.refuse_s3("PUT", f"/{originals_bucket}/originals/2/")  # after the whole body
    world.record(2, IMAGE)
    assert world.deliver(2) == {"batchItemFailures": []}
    assert world.state(2) == ("SUCCEEDED", 1)
    row = kept(world.db, 2)
    assert row is not None
    assert row["confirmed"] is False
    assert confirmations().wait(2, HANG_SECONDS)  # S3's refusal
    world.record(3, IMAGE)
    world.deliver(3)  # its claim tells the refusal, and leaves the original unconfirmed
    line = world.archive.log_for("no answer for an original recorded unconfirmed")
    assert "left unconfirmed" in line["error"]
    assert emf_metrics(capsys).get("OriginalsFailed") == 1
    assert kept(world.db, 2) == row
    lift()
    age_original(world.db, 2)

    summary = audit.run()

    # Absent: its row went and the record was due at once, so this run's own GET of the
    # hosted copy (intact) kept a new original, under a new key. Nothing was deleted.
    assert summary["originals_absent"] == 1
    assert summary["originals_kept"] == 1
    again = kept_again(world, row)
    assert (again["source"], again["sha256"], again["confirmed"]) == ("hosted", SHA256, True)
    assert [m for m, _ in moto.s3_calls(f"/{originals_bucket}/")].count("DELETE") == 0
    line = world.archive.log_for(ABSENT)
    assert (line["record_id"], line["found"]) == ("2", "absent")


@pytest.mark.parametrize("other", ["another length", "another record's", "no metadata"])
def test_an_object_that_is_not_the_one_sent_never_confirms_it(
    audit: Audit, keeping: World, s3: Any, moto: Any, originals_bucket: str, other: str
) -> None:
    world = keeping
    warm(world)
    lift = moto.refuse_s3("PUT", f"/{originals_bucket}/originals/2/")
    world.record(2, IMAGE)
    world.deliver(2)
    lift()
    row = kept(world.db, 2)
    assert row is not None
    body = IMAGE[:1000] if other == "another length" else IMAGE
    metadata = {
        "another length": {"record-id": "2", "source": "archive"},
        "another record's": {"record-id": "3", "source": "archive"},
        "no metadata": {},
    }[other]
    s3.put_object(Bucket=originals_bucket, Key=row["key"], Body=body, Metadata=metadata)
    die()
    age_original(world.db, 2)

    summary = audit.run()

    assert summary["originals_confirmed"] == 0
    assert summary["originals_absent"] == 1
    assert kept_again(world, row)["confirmed"] is True
    line = world.archive.log_for(ABSENT)
    assert line["found"] == "other"


# -- read back before it is confirmed ---------------------------------------------------------


@pytest.mark.parametrize("tamper", [None, "replaced", "truncated"])
def test_a_restore_reads_an_unconfirmed_original_by_its_key_and_checks_it(
    audit: Audit, keeping: World, s3: Any, moto: Any, originals_bucket: str, tamper: str | None
) -> None:
    world = keeping
    warm(world)
    own = images.png(16, 16, size=2_000_000, seed=40)  # a file on Lsky of its own
    release = held_archive(world, moto, originals_bucket, 2, own)
    release.set()
    assert confirmations().wait(2, HANG_SECONDS)
    die()
    row = kept(world.db, 2)
    assert row is not None
    assert (row["confirmed"], row["version_id"]) == (False, None)
    if tamper is not None:  # a newer object under its key (no version recorded to pin)
        body = images.png(16, 16, size=2_000_000, seed=39) if tamper == "replaced" else IMAGE[:999]
        s3.put_object(Bucket=originals_bucket, Key=row["key"], Body=body)
    key = audit.key(2)
    world.lsky.lose_file(key)
    world.lsky.drop_record(key)
    uploads = world.lsky.upload_count
    audit.make_due(2)
    audit.run()

    _restore_delivered(world)

    record = world.row(2)
    if tamper is None:
        assert record["archive_status"] == "SUCCEEDED"
        assert world.lsky.upload_count == uploads + 1
        assert world.lsky.uploads[-1].sha256 == hashlib.sha256(own).hexdigest()
        again = kept(world.db, 2)
        assert again is not None
        assert (again["key"], again["confirmed"]) == (row["key"], False)  # the same original
    else:
        assert record["archive_status"] == "FAILED"
        assert record["archive_error"].startswith("restore failed: original ")
        assert world.lsky.upload_count == uploads  # nothing published


# -- the schema ---------------------------------------------------------------------------


def test_the_migration_reads_an_older_release_s_originals_as_confirmed(
    ctl: Ctl, database: str, admin: Any
) -> None:
    generation_service_tables(admin)
    assert ctl("migrate") == 0, ctl.err
    # The previous release's table: no `confirmed` column (its index goes with it).
    admin.run("ALTER TABLE image_archive_originals DROP COLUMN confirmed")
    older_insert = (
        "INSERT INTO image_archive_originals AS kept"
        " (record_id, bucket, key, version_id, sha256, bytes, mime_type, source)"
        " VALUES (:id, 'originals-bucket', :key, 'v1', :sha, 10, 'image/png', 'archive')"
        " ON CONFLICT (record_id) DO UPDATE SET key = EXCLUDED.key,"
        " version_id = EXCLUDED.version_id, kept_at = now()"
    )
    admin.run(older_insert, id=1, key="originals/1/" + "a" * 32 + ".png", sha="0" * 64)

    assert ctl("migrate") == 0, ctl.err

    assert admin.run("SELECT confirmed FROM image_archive_originals") == [[True]]
    [[index]] = admin.run(
        "SELECT count(*) FROM pg_indexes WHERE indexname = :name",
        name="image_archive_originals_unconfirmed_idx",
    )
    assert index == 1
    # The older release, still running during the upgrade, writes as it did: confirmed.
    admin.run(older_insert, id=2, key="originals/2/" + "b" * 32 + ".png", sha="1" * 64)
    admin.run(older_insert, id=1, key="originals/1/" + "c" * 32 + ".png", sha="0" * 64)
    assert admin.run(
        "SELECT record_id, confirmed FROM image_archive_originals ORDER BY record_id"
    ) == [[1, True], [2, True]]


# -- the operator's view ------------------------------------------------------------------


@pytest.fixture
def cli(archive_ctl: Any, keeping: World) -> Any:
    return archive_ctl


def test_show_and_status_tell_an_original_s3_has_not_confirmed(
    keeping: World, moto: Any, originals_bucket: str, cli: Any
) -> None:
    world = keeping
    warm(world)
    release = held_archive(world, moto, originals_bucket, 2)

    assert (
        "2,000,000 bytes from the bytes archived; not confirmed by S3 yet"
        in cli("show", "2").stdout
    )
    assert cli.json("show", "2")["original"]["confirmed"] is False
    assert cli.json("status")["audit"]["unconfirmed"] >= 1  # record 1's may be too

    release.set()
    assert confirmations().wait(2, HANG_SECONDS)
    world.record(3, IMAGE)
    world.deliver(3)

    assert "not confirmed" not in cli("show", "2").stdout
    assert cli.json("show", "2")["original"]["confirmed"] is True
