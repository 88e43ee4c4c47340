"""ArchiveStatus is mirrored by a CHECK constraint that the migration adds live-safely."""

from __future__ import annotations

import re
import threading
from typing import Any

import pg8000.exceptions
import pytest

from devkit.postgres import apply_schema, connect
from lib.platform import schema
from lib.state.status import ArchiveStatus

CONSTRAINT = "image_generation_records_archive_status_check"


def constraint(conn: Any) -> tuple[str, bool] | None:
    rows = conn.run(
        "SELECT pg_get_constraintdef(oid), convalidated FROM pg_constraint WHERE conname = :n",
        n=CONSTRAINT,
    )
    return (str(rows[0][0]), bool(rows[0][1])) if rows else None


def test_the_constraint_allows_exactly_the_enum(db: Any) -> None:
    found = constraint(db)
    assert found is not None
    definition, validated = found
    assert validated
    assert set(re.findall(r"'(\w+)'", definition)) == {str(s) for s in ArchiveStatus}


def test_a_status_outside_the_enum_is_refused(db: Any) -> None:
    db.run("INSERT INTO users (id, username) VALUES (1, 'u')")
    with pytest.raises(pg8000.exceptions.DatabaseError) as refused:
        db.run(
            "INSERT INTO image_generation_records (id, user_id, status, image_url, archive_status)"
            " VALUES (1, 1, 'SUCCEEDED', 'http://x', 'DONE')"
        )
    assert refused.value.args[0]["C"] == "23514"  # check_violation


def test_added_on_a_table_with_rows_validated_and_idempotent(blank_database: str) -> None:
    conn = connect(blank_database)
    try:
        base = schema.load([schema.BASE_SCHEMA])
        schema.apply(conn.run, base)
        conn.run("INSERT INTO users (id, username) VALUES (1, 'u')")
        conn.run(
            "INSERT INTO image_generation_records (id, user_id, status, image_url)"
            " SELECT g, 1, 'SUCCEEDED', 'http://x' FROM generate_series(1, 500) AS g"
        )
        migration = schema.load([schema.ARCHIVE_MIGRATION])
        schema.apply(conn.run, migration)
        conn.run("UPDATE image_generation_records SET archive_status = 'PENDING' WHERE id < 10")
        schema.apply(conn.run, migration)  # a second run changes nothing and does not fail
        found = constraint(conn)
        assert found is not None
        assert found[1], "the constraint is validated"
        [[count]] = conn.run("SELECT count(*) FROM pg_constraint WHERE conname = :n", n=CONSTRAINT)
        assert count == 1
    finally:
        conn.close()


def test_adding_it_waits_no_longer_than_the_lock_timeout(blank_database: str) -> None:
    apply_schema(blank_database)
    conn = connect(blank_database)
    blocker = connect(blank_database)
    try:
        conn.run(f"ALTER TABLE image_generation_records DROP CONSTRAINT {CONSTRAINT}")
        # A long read transaction holds ACCESS SHARE; ADD CONSTRAINT needs a brief
        # ACCESS EXCLUSIVE lock and must give up after lock_timeout instead of queueing
        # every writer behind it.
        blocker.run("BEGIN")
        blocker.run("SELECT count(*) FROM image_generation_records")
        outcome: list[BaseException | None] = []

        def migrate() -> None:
            try:
                schema.apply(conn.run, schema.load([schema.ARCHIVE_MIGRATION]))
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        worker = threading.Thread(target=migrate)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive()
        error = outcome[0]
        assert isinstance(error, pg8000.exceptions.DatabaseError)
        assert error.args[0]["C"] == "55P03"  # lock_not_available
        blocker.run("ROLLBACK")
        schema.apply(conn.run, schema.load([schema.ARCHIVE_MIGRATION]))
        assert constraint(conn) is not None
    finally:
        blocker.close()
        conn.close()
