"""Repair from the originals (docs/explanation/audit-and-repair.md): the audit finds a
hosted copy missing or
altered, the archive function publishes the record's original again through the archive
path, read back and checked against its SHA-256 first; history gains an original from the
audit's own GET; an original S3 refused is filled later; off, nothing calls S3. Real
PostgreSQL, moto's S3 and SQS, the Lsky stand-in, the handlers called as Lambda would."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from devkit import images
from tests.integration.test_audit import Audit
from tests.integration.world import World
from tests.support import fetch_record

IMAGE = images.png(12, 12, size=300_000, seed=7)
SHA256 = hashlib.sha256(IMAGE).hexdigest()


def original_row(db: Any, record_id: int) -> dict[str, Any] | None:
    rows = db.run(
        "SELECT bucket, key, version_id, sha256, bytes, source FROM image_archive_originals"
        " WHERE record_id = :id",
        id=record_id,
    )
    names = ("bucket", "key", "version_id", "sha256", "bytes", "source")
    return dict(zip(names, rows[0], strict=True)) if rows else None


@pytest.fixture
def keeping(world: World, originals_bucket: str) -> World:
    world.settings(ARCHIVE_ORIGINALS_BUCKET=originals_bucket)
    return world


@pytest.fixture
def audit(keeping: World) -> Audit:
    return Audit(keeping)


def _restore_delivered(world: World) -> None:
    world.archive.settle(event := world.archive.receive(), world.archive.invoke(event))


@pytest.mark.parametrize("damage", ["lose", "replace"])
def test_a_damaged_copy_is_published_again_from_its_original(
    audit: Audit, keeping: World, damage: str
) -> None:
    world = keeping
    audit.archived(1, body=IMAGE)
    old = fetch_record(world.db, 1)
    original = original_row(world.db, 1)
    assert original is not None
    assert original["sha256"] == SHA256
    key = audit.key(1)
    if damage == "lose":
        world.lsky.lose_file(key)
    else:
        world.lsky.replace_file(key, images.png(30, 30))
    # Lsky's dedupe would point the same bytes at the damaged file while it lists the
    # image: an operator deletes that one (the audit names its key); here the host lost
    # its row too.
    world.lsky.drop_record(key)
    world.upstream.reset()  # the provider's URL is long gone: only the original is left
    uploads = world.lsky.upload_count

    summary = audit.run()

    verdict = "missing" if damage == "lose" else "altered"
    assert (summary[verdict], summary["restores"], summary["lost"]) == (1, 1, 0)
    row = fetch_record(world.db, 1)
    assert row["archive_status"] == "PENDING"
    assert row["hosted_image_url"] == old["hosted_image_url"]  # until the new one is stored

    _restore_delivered(world)

    row = fetch_record(world.db, 1)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["hosted_image_url"] != old["hosted_image_url"]
    assert world.lsky.upload_count == uploads + 1  # one stored copy
    stored = world.lsky.stored_path(row["hosted_image_url"]).read_bytes()
    assert hashlib.sha256(stored).hexdigest() == SHA256  # the original's bytes
    [restored] = audit.events(1, "restored")
    assert (restored["old_url"], restored["old_key"]) == (old["hosted_image_url"], key)
    fetched = [e for e in audit.events(1, "fetched") if e.get("source") == "original"]
    assert fetched
    again = original_row(world.db, 1)
    assert again is not None
    same = ("bucket", "key", "sha256", "bytes", "source")
    assert [again[k] for k in same] == [original[k] for k in same]  # not a second one
    assert original["version_id"] in (None, again["version_id"])  # confirmed meanwhile
    assert world.downloads(1) == 0  # the provider not asked again (its URL is gone)
    assert audit.run()["intact"] == 1  # the new copy, checked soon


@pytest.mark.parametrize("tamper", ["replaced", "truncated"])
def test_an_original_that_is_not_what_was_kept_is_never_published(
    audit: Audit, keeping: World, s3: Any, tamper: str
) -> None:
    world = keeping
    audit.archived(1, body=IMAGE)
    original = original_row(world.db, 1)
    assert original is not None
    body = images.png(12, 12, size=300_000, seed=8) if tamper == "replaced" else IMAGE[:1000]
    # The recorded version itself changed (written over by hand): same key, same version id
    # as far as the row knows, other bytes. moto keeps versions, so the row's version is
    # pointed at a new object with other bytes.
    answer = s3.put_object(Bucket=original["bucket"], Key=original["key"], Body=body)
    world.db.run(
        "UPDATE image_archive_originals SET version_id = :v WHERE record_id = 1",
        v=answer["VersionId"],
    )
    key = audit.key(1)
    world.lsky.lose_file(key)
    world.lsky.drop_record(key)
    uploads = world.lsky.upload_count
    audit.run()

    _restore_delivered(world)

    row = fetch_record(world.db, 1)
    assert row["archive_status"] == "FAILED"
    assert row["archive_error"].startswith("restore failed: original ")
    assert "not published" in row["archive_error"]
    assert world.lsky.upload_count == uploads  # nothing published


def test_history_without_an_original_gains_one_from_the_audit_s_own_get(
    audit: Audit, world: World, originals_bucket: str
) -> None:
    # Archived before originals were kept (or while off): no row in the originals table.
    world.settings(ARCHIVE_ORIGINALS_BUCKET=None)
    audit.archived(1, body=IMAGE)
    assert original_row(world.db, 1) is None
    gets = world.lsky.file_gets

    summary = audit.run(ARCHIVE_ORIGINALS_BUCKET=originals_bucket)

    assert (summary["intact"], summary["originals_kept"]) == (1, 1)
    assert world.lsky.file_gets == gets + 1  # no extra request: the audit's own GET
    original = original_row(world.db, 1)
    assert original is not None
    # Lsky stored the bytes unaltered here: the hosted copy is the original.
    assert (original["source"], original["sha256"], original["bytes"]) == (
        "hosted",
        SHA256,
        len(IMAGE),
    )
    [event] = audit.events(1, "original_kept")
    assert (event["source"], event["by"]) == ("hosted", "auditor")


def test_an_original_s3_refused_at_archive_time_is_filled_by_the_next_audit(
    audit: Audit, world: World, originals_bucket: str
) -> None:
    # The bucket is not there when the record is archived: archived all the same, its
    # original recorded unconfirmed (its body had gone out whole; S3 refused it after).
    world.settings(ARCHIVE_ORIGINALS_BUCKET="no-such-originals-bucket")
    audit.archived(1, body=IMAGE)
    refused = original_row(world.db, 1)
    assert refused is not None
    assert (refused["bucket"], refused["version_id"]) == ("no-such-originals-bucket", None)
    # Long after: no container confirmed it (the audit's grace has passed).
    world.db.run("UPDATE image_archive_originals SET kept_at = now() - interval '1 day'")

    summary = audit.run(ARCHIVE_ORIGINALS_BUCKET=originals_bucket)

    # Not in the bucket it names: found absent, its row gone, and kept again from the GET.
    assert (summary["originals_absent"], summary["originals_kept"]) == (1, 1)
    original = original_row(world.db, 1)
    assert original is not None
    assert original["bucket"] == originals_bucket


def test_with_originals_off_the_audit_calls_nothing_on_s3(
    audit: Audit, world: World, moto: Any
) -> None:
    world.settings(ARCHIVE_ORIGINALS_BUCKET=None)
    audit.archived(1, body=IMAGE)
    world.lsky.lose_file(audit.key(1))
    calls = len(moto.s3_calls())

    summary = audit.run(ARCHIVE_ORIGINALS_BUCKET=None)

    assert summary["missing"] == 1
    assert summary["originals_kept"] == 0
    assert moto.s3_calls()[calls:] == []
