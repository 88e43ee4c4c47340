"""Connect timeout, statement timeout and socket timeout are three separate limits, and the
session's settings come back with a reconnect (a real server, no fakes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pg8000.exceptions
import pytest

from devkit.postgres import connect
from lib.platform.config import DatabaseConfig
from lib.platform.db import (
    CONNECT_TIMEOUT_SECONDS,
    HANDLER_SESSION,
    MIGRATION_SESSION,
    STATEMENT_TIMEOUT_MS,
    Database,
    Session,
)
from lib.platform.errors import DatabaseUnavailable
from lib.state.records import ArchiveRecords
from tests.support import HANG_SECONDS, fetch_record, seed_record, wait_until


@pytest.fixture
def database(pg_dsn: str) -> Iterator[Database]:
    """A Database built the way the functions build theirs (lib.archive.runtime)."""
    built = Database(DatabaseConfig(url=pg_dsn), application_name="timeout-test")
    yield built
    built.close()


def socket_timeout(database: Database) -> float | None:
    conn: Any = database._conn
    assert conn is not None
    timeout: float | None = conn._usock.gettimeout()
    return timeout


@pytest.mark.slow
def test_a_statement_longer_than_the_connect_timeout_completes(database: Database) -> None:
    assert CONNECT_TIMEOUT_SECONDS < 7 < STATEMENT_TIMEOUT_MS / 1000

    started = time.monotonic()
    database.run("SELECT pg_sleep(7)")

    assert time.monotonic() - started >= 7  # it really ran that long (no bound above it)
    assert database.connections_opened == 1
    assert database.statements_run == 1
    assert socket_timeout(database) == HANDLER_SESSION.socket_timeout


def test_a_statement_past_the_statement_timeout_is_cancelled_and_not_retried(
    pg_dsn: str,
) -> None:
    database = Database(DatabaseConfig(url=pg_dsn), session=Session(statement_timeout_ms=300))
    try:
        with pytest.raises(pg8000.exceptions.DatabaseError) as cancelled:
            database.run("SELECT pg_sleep(30)")

        assert cancelled.value.args[0]["C"] == "57014"  # query_canceled, by the server
        assert database.statements_run == 1  # not run again as if the connection were lost
        # The session survives a cancelled statement: the next one uses the same connection.
        assert database.run("SELECT 1") == [[1]]
        assert database.connections_opened == 1
    finally:
        database.close()


@pytest.mark.slow
def test_a_claim_waiting_six_seconds_on_a_row_lock_completes_once(
    database: Database, db: Any, pg_dsn: str
) -> None:
    seed_record(db, 7, image_url="https://upstream.invalid/7.png")
    holder = connect(pg_dsn)
    holder.run("BEGIN")
    holder.run("SELECT id FROM image_generation_records WHERE id = 7 FOR UPDATE")
    claims: list[Any] = []
    claimer = threading.Thread(
        target=lambda: claims.append(
            ArchiveRecords(database).claim(
                7, owner="invocation-1", lock_ttl_seconds=180, max_attempts=3
            )
        )
    )
    try:
        claimer.start()
        wait_until(lambda: waiting_on_a_lock(db), "the claim queued behind the row lock")
        time.sleep(6.0)  # longer than the connect timeout; far inside the statement timeout
        assert claimer.is_alive()
        assert waiting_on_a_lock(db), "the claim did not wait for the row lock"
        holder.run("COMMIT")
        claimer.join(timeout=HANG_SECONDS)
    finally:
        holder.close()

    [claim] = claims
    assert claim.task is not None
    assert claim.task.attempt == 1
    assert database.statements_run == 1
    assert database.connections_opened == 1
    row = fetch_record(db, 7)
    assert (row["archive_status"], row["archive_attempts"]) == ("RUNNING", 1)


def waiting_on_a_lock(db: Any) -> bool:
    """Whether the test's Database (application_name timeout-test) waits on a lock now."""
    [[waiting]] = db.run(
        "SELECT count(*) > 0 FROM pg_stat_activity"
        " WHERE application_name = 'timeout-test' AND wait_event_type = 'Lock'"
    )
    return bool(waiting)


def terminate(pg_dsn: str, database: Database) -> None:
    [[pid]] = database.run("SELECT pg_backend_pid()")
    admin = connect(pg_dsn)
    try:
        admin.run("SELECT pg_terminate_backend(CAST(:pid AS int))", pid=pid)
    finally:
        admin.close()


def settings(database: Database) -> tuple[str, str]:
    [[statement]] = database.run("SHOW statement_timeout")
    [[lock]] = database.run("SHOW lock_timeout")
    return str(statement), str(lock)


def test_session_settings_survive_a_reconnect(pg_dsn: str) -> None:
    session = Session(statement_timeout_ms=1234, lock_timeout_ms=2345)
    database = Database(DatabaseConfig(url=pg_dsn), session=session)
    try:
        assert settings(database) == ("1234ms", "2345ms")
        terminate(pg_dsn, database)

        assert settings(database) == ("1234ms", "2345ms")
        assert database.connections_opened == 2
        assert socket_timeout(database) == pytest.approx(1.234 + 5)
    finally:
        database.close()


def test_the_migration_session_has_no_statement_or_socket_timeout_and_keeps_its_lock_timeout(
    pg_dsn: str,
) -> None:
    database = Database(DatabaseConfig(url=pg_dsn), session=MIGRATION_SESSION)
    try:
        assert settings(database) == ("0", "300ms")
        assert socket_timeout(database) is None
        terminate(pg_dsn, database)

        assert settings(database) == ("0", "300ms")  # a SET run once would be gone now
        assert socket_timeout(database) is None
        assert database.connections_opened == 2
    finally:
        database.close()


def test_without_reconnect_a_lost_session_is_reported_not_replaced(pg_dsn: str) -> None:
    """archive-ctl migrate's session: its advisory lock dies with the connection, so a
    statement must not quietly run again on a new session that does not hold it."""
    database = Database(DatabaseConfig(url=pg_dsn), session=MIGRATION_SESSION, reconnect=False)
    try:
        terminate(pg_dsn, database)
        with pytest.raises(DatabaseUnavailable):
            database.run("SELECT 1")
        assert database.connections_opened == 1
    finally:
        database.close()
