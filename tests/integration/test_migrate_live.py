"""`archive-ctl migrate` adopting and upgrading a live table (issue 21): it never queues the
generation service behind a lock request for longer than the short lock_timeout, finds
legacy status values before it changes anything, marks what an older release may have
uploaded, and serializes with another migration instead of taking its index build.

The long reader, the writers and the second migration are real sessions; no wall clock is
asserted: a writer whose statement_timeout (2 s) is far above the 300 ms lock_timeout fails
only if a lock request queued it for longer, and waits are observed in pg_locks or in what
migrate prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pg8000.exceptions
import pytest

from devkit.postgres import apply_schema, connect
from lib.platform import migration_file as mf
from lib.platform import migration_plan as mp
from lib.platform import schema
from tests.integration.test_cli import INDEXES, Ctl, valid_indexes

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINT = "image_generation_records_archive_status_check"
# The archive columns the first release added; archive_may_be_hosted came later.
FIRST_RELEASE_COLUMNS = 11
WRITER_STATEMENT_TIMEOUT_MS = 2_000
SETTLE_SECONDS = 30  # a bound on waiting for migrate to reach a point; never asserted


@pytest.fixture
def ctl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Ctl:
    monkeypatch.delenv("DB_SECRET_ARN", raising=False)
    monkeypatch.delenv("DB_SSLMODE", raising=False)
    return Ctl(capsys)


@pytest.fixture
def database(blank_database: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A blank database that archive-ctl (in-process or a child) is pointed at."""
    monkeypatch.setenv("DATABASE_URL", blank_database)
    return blank_database


@pytest.fixture
def admin(database: str) -> Iterator[Any]:
    conn = connect(database)
    yield conn
    conn.close()


def generation_service_tables(conn: Any, *, archive_columns: int = 0) -> None:
    """The generation service's tables, with the first `archive_columns` archive columns an
    older release added (0: never adopted)."""
    schema.apply(conn.run, schema.load([schema.BASE_SCHEMA]))
    columns = mf.load_declaration().columns_of(mf.RECORDS)[:archive_columns]
    if columns:
        conn.run(mp.add_columns_sql(mf.RECORDS, columns))
    conn.run("INSERT INTO users (id, username) VALUES (1, 'u')")


def add_row(
    conn: Any,
    record_id: int,
    archive_status: str | None = None,
    *,
    attempts: int = 0,
    hosted_url: str | None = None,
) -> None:
    conn.run(
        "INSERT INTO image_generation_records"
        " (id, user_id, status, image_url, archive_status, archive_attempts, hosted_image_url)"
        " VALUES (:id, 1, 'SUCCEEDED', 'https://upstream.invalid/x.png', :s, :a, :u)",
        id=record_id,
        s=archive_status,
        a=attempts,
        u=hosted_url,
    )


def add_plain_rows(conn: Any, count: int, first: int = 1_000_000) -> None:
    conn.run(
        "INSERT INTO image_generation_records (id, user_id, status, image_url)"
        " SELECT g, 1, 'SUCCEEDED', 'https://upstream.invalid/' || g"
        " FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g",
        first=first,
        last=first + count - 1,
    )


def snapshot(conn: Any) -> dict[str, Any]:
    """The schema (columns, constraints, indexes, project tables) and every archive_status."""
    table = "CAST('image_generation_records' AS regclass)"
    return {
        "columns": conn.run(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
            f" WHERE attrelid = {table} AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ),
        "constraints": conn.run(
            "SELECT conname, convalidated, pg_get_constraintdef(oid) FROM pg_constraint"
            f" WHERE conrelid = {table} ORDER BY conname"
        ),
        "indexes": conn.run(
            "SELECT CAST(indexrelid AS regclass)::text, indisvalid FROM pg_index"
            f" WHERE indrelid = {table} ORDER BY 1"
        ),
        "tables": conn.run(
            "SELECT relname FROM pg_class WHERE relname LIKE 'image\\_archive\\_%' ORDER BY 1"
        ),
        # through to_jsonb: a table not adopted yet has no archive_status column
        "statuses": conn.run(
            "SELECT id, to_jsonb(r) ->> 'archive_status'"
            " FROM image_generation_records AS r ORDER BY id"
        ),
    }


def status_of(conn: Any, record_id: int) -> tuple[str | None, bool]:
    [[status, may_be_hosted]] = conn.run(
        "SELECT archive_status, archive_may_be_hosted FROM image_generation_records WHERE id = :id",
        id=record_id,
    )
    return status, may_be_hosted


def constraint_state(conn: Any) -> bool | None:
    """None: no constraint; else whether it is validated."""
    rows = conn.run("SELECT convalidated FROM pg_constraint WHERE conname = :n", n=CONSTRAINT)
    return bool(rows[0][0]) if rows else None


def generation_service_update(conn: Any, record_id: int) -> None:
    """What the generation service does to its own rows: it must keep working."""
    conn.run(
        "UPDATE image_generation_records SET status = 'SUCCEEDED', image_url = 'https://x/y'"
        " WHERE id = :id",
        id=record_id,
    )


# -- sessions that share the table with migrate ---------------------------------------


def long_reader(dsn: str) -> Any:
    """A report query's transaction, left open: it holds ACCESS SHARE on the table."""
    conn = connect(dsn, application_name="report")
    conn.run("BEGIN")
    conn.run("SELECT count(*) FROM image_generation_records")
    return conn


@dataclass
class Writer:
    """The generation service: updates its rows and inserts new ones in a loop, each
    statement under a 2 s statement_timeout (a lock queue longer than that fails it)."""

    dsn: str
    next_id: int = 5_000_000
    done: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Writer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        conn = connect(self.dsn, application_name="generation-service")
        conn.run(f"SET statement_timeout = {WRITER_STATEMENT_TIMEOUT_MS}")
        try:
            while not self._stop.is_set():
                try:
                    self.next_id += 1
                    conn.run(
                        "INSERT INTO image_generation_records (id, user_id, status, image_url)"
                        " VALUES (:id, 1, 'RUNNING', 'https://upstream.invalid/new')",
                        id=self.next_id,
                    )
                    generation_service_update(conn, self.next_id)
                    self.done += 1
                except pg8000.exceptions.DatabaseError as error:
                    self.errors.append(str(error.args[0].get("M", error)))
                time.sleep(0.01)
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


@dataclass
class Child:
    """`archive-ctl migrate` in a process of its own, its output read as it comes."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, count: int = 1) -> list[str]:
        deadline = time.monotonic() + SETTLE_SECONDS
        exited_at: float | None = None
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if text in line]
            if len(found) >= count:
                return found
            if exited_at is None and self.process.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > 1:
                break  # exited, and its output is read
            time.sleep(0.05)
        raise AssertionError(f"migrate never printed {text!r} {count}x:\n{self.output}")

    def finish(self) -> int:
        try:
            code = self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        assert self._reader is not None
        self._reader.join(timeout=10)  # the rest of its output
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def start_migrate(dsn: str, *args: str) -> Child:
    env = {**os.environ, "DATABASE_URL": dsn, "PYTHON": sys.executable}
    env.pop("DB_SECRET_ARN", None)
    process = subprocess.Popen(
        [str(ROOT / "scripts" / "archive-ctl"), "migrate", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    return Child(process)


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


# -- 1: no exclusive lock request on an up-to-date schema; short tries on a busy table ----


def test_a_rerun_on_an_up_to_date_schema_takes_no_lock_on_the_table(
    ctl: Ctl, database: str, admin: Any
) -> None:
    apply_schema(database)
    admin.run("INSERT INTO users (id, username) VALUES (1, 'u')")
    add_plain_rows(admin, 100)
    reader = long_reader(database)
    # A maintenance session holding SHARE UPDATE EXCLUSIVE: any lock migrate asked for on
    # the table other than ACCESS SHARE, ROW SHARE or ROW EXCLUSIVE would wait for it, and
    # migrate would give up (exit 1) after --retry-for / --wait.
    maintenance = connect(database)
    maintenance.run("BEGIN")
    maintenance.run("LOCK TABLE image_generation_records IN SHARE UPDATE EXCLUSIVE MODE")
    seen: set[str] = set()
    sampling = threading.Event()

    def sample() -> None:
        conn = connect(database)
        try:
            while not sampling.is_set():
                rows = conn.run(
                    "SELECT l.mode FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)"
                    " WHERE a.application_name = 'archive-ctl-migrate'"
                    " AND l.relation = CAST('image_generation_records' AS regclass)"
                )
                seen.update(str(mode) for (mode,) in rows)
                time.sleep(0.005)
        finally:
            conn.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    writer = Writer(database).start()
    try:
        wait_until(lambda: writer.done >= 3, "the writer got going")
        code = ctl("migrate", "--retry-for", "1", "--wait", "1")
        wait_until(lambda: writer.done >= 6, "the writer went on")
    finally:
        writer.stop()
        sampling.set()
        sampler.join(timeout=10)
        reader.run("ROLLBACK")
        maintenance.run("ROLLBACK")
        reader.close()
        maintenance.close()

    assert code == 0, ctl.err
    assert "the schema was up to date: nothing to change" in ctl.out
    assert "AccessExclusiveLock" not in seen
    assert seen == set()  # not even a catalog-free read of the table
    assert writer.errors == []


def test_a_fresh_adoption_behind_a_long_reader_tries_briefly_until_it_ends(
    database: str, admin: Any
) -> None:
    generation_service_tables(admin)
    add_plain_rows(admin, 500)
    reader = long_reader(database)
    [[reader_pid]] = reader.run("SELECT pg_backend_pid()")
    writer = Writer(database).start()
    migrate = start_migrate(database)
    try:
        wait_until(lambda: writer.done >= 3, "the writer got going")
        first = migrate.wait_for("image_generation_records is busy")[0]
        done_at_first_wait = writer.done
        migrate.wait_for("image_generation_records is busy", count=3)
        # The generation service kept writing between migrate's lock requests.
        wait_until(lambda: writer.done > done_at_first_wait + 3, "writes between the tries")
        reader.run("COMMIT")  # the report ends
        code = migrate.finish()
    finally:
        writer.stop()
        reader.close()

    assert writer.errors == []  # no statement waited WRITER_STATEMENT_TIMEOUT_MS
    assert code == 0, migrate.output
    assert f"held by pid {reader_pid} (report, idle in transaction" in first
    assert "gave up after 300 ms" in first
    assert valid_indexes(database) == INDEXES
    assert constraint_state(admin) is True
    assert "migrated in" in migrate.output


def test_a_table_that_stays_busy_is_left_as_it_was_and_a_rerun_is_said_to_be_safe(
    ctl: Ctl, database: str, admin: Any
) -> None:
    generation_service_tables(admin)
    add_plain_rows(admin, 50)
    before = snapshot(admin)
    reader = long_reader(database)
    try:
        code = ctl("migrate", "--retry-for", "1")
    finally:
        reader.run("ROLLBACK")
        reader.close()

    assert code == 1
    assert "add columns image_generation_records" in ctl.err
    assert "stayed busy for 1 s" in ctl.err
    assert "Nothing of this step was applied" in ctl.err
    assert "again is safe" in ctl.err
    assert snapshot(admin) == before


# -- 2: legacy archive_status values ----------------------------------------------------


def test_legacy_values_with_an_obvious_meaning_are_shown_by_dry_run_then_mapped(
    ctl: Ctl, database: str, admin: Any
) -> None:
    generation_service_tables(admin, archive_columns=FIRST_RELEASE_COLUMNS)
    add_row(admin, 1, "pending")
    add_row(admin, 2, "DONE", attempts=1, hosted_url="https://img/2.png")
    add_row(admin, 3, "ERROR", attempts=3)
    add_row(admin, 4, "processing", attempts=1)
    add_row(admin, 5, " Queued ")
    add_row(admin, 6, "PENDING")
    # More than one batch of one value, to cross the keyset pages.
    admin.run(
        "INSERT INTO image_generation_records"
        " (id, user_id, status, image_url, archive_status, archive_attempts, hosted_image_url)"
        " SELECT g, 1, 'SUCCEEDED', 'u', 'COMPLETED', 1, 'https://img/' || g"
        " FROM generate_series(100, 6099) AS g"
    )
    before = snapshot(admin)

    assert ctl("migrate", "--dry-run") == 0
    assert (
        "archive_status 'pending' (without a hosted_image_url): 1 row; maps to PENDING" in ctl.out
    )
    assert "'COMPLETED' (with a hosted_image_url): 6000 rows; maps to SUCCEEDED" in ctl.out
    assert "map legacy archive_status values of image_generation_records" in ctl.out
    assert snapshot(admin) == before

    assert ctl("migrate") == 0, ctl.err
    assert "6005 rows mapped" in ctl.out
    assert status_of(admin, 1) == ("PENDING", False)
    assert status_of(admin, 2) == ("SUCCEEDED", False)
    assert status_of(admin, 3) == ("FAILED", True)  # attempted: its last upload may be there
    assert status_of(admin, 4) == ("RUNNING", True)
    assert status_of(admin, 5) == ("PENDING", False)
    [[left]] = admin.run(
        "SELECT count(*) FROM image_generation_records WHERE archive_status = 'COMPLETED'"
    )
    assert left == 0
    assert constraint_state(admin) is True


def test_a_value_without_an_obvious_meaning_stops_migrate_before_anything_changes(
    ctl: Ctl, database: str, admin: Any
) -> None:
    generation_service_tables(admin, archive_columns=FIRST_RELEASE_COLUMNS)
    add_row(admin, 1, "CANCELLED", attempts=1)
    add_row(admin, 2, "CANCELLED")
    add_row(admin, 3, "done")  # a success without the URL it produced is not one
    add_row(admin, 4, "pending")
    add_row(admin, 5, "RUNNING", attempts=1)
    before = snapshot(admin)

    assert ctl("migrate") == 1
    assert "cannot map" in ctl.err
    assert "'CANCELLED' (without a hosted_image_url): 2 rows" in ctl.err
    assert "'done' (without a hosted_image_url): 1 row" in ctl.err
    assert "The schema was left as it was" in ctl.err
    assert "'pending' (without a hosted_image_url) -> PENDING (1 row)" in ctl.err
    assert snapshot(admin) == before  # nothing added, 'pending' not mapped either
    generation_service_update(admin, 1)  # the generation service's own writes still work

    admin.run("UPDATE image_generation_records SET archive_status = NULL WHERE id IN (1, 2, 3)")
    assert ctl("migrate") == 0, ctl.err  # what the message says to do, then again
    assert status_of(admin, 4) == ("PENDING", False)
    assert status_of(admin, 5) == ("RUNNING", True)


def test_a_not_valid_constraint_an_earlier_run_left_is_dropped_when_values_cannot_be_mapped(
    ctl: Ctl, database: str, admin: Any
) -> None:
    generation_service_tables(admin, archive_columns=FIRST_RELEASE_COLUMNS)
    add_row(admin, 1, "CANCELLED")
    # What the old migration left after its VALIDATE failed.
    constraint = mp.status_constraints(mf.load_declaration())[0]
    admin.run(mp.add_constraint_sql(constraint))
    with pytest.raises(pg8000.exceptions.DatabaseError) as refused:
        generation_service_update(admin, 1)
    assert refused.value.args[0]["C"] == "23514"  # the outage the issue reports

    assert ctl("migrate") == 1
    assert "'CANCELLED' (without a hosted_image_url): 1 row" in ctl.err
    assert f"Dropped the NOT VALID {CONSTRAINT} an earlier run left" in ctl.err
    assert constraint_state(admin) is None
    generation_service_update(admin, 1)


def test_a_value_written_between_the_check_and_validate_drops_the_constraint_again(
    database: str, admin: Any
) -> None:
    apply_schema(database)
    admin.run("INSERT INTO users (id, username) VALUES (1, 'u')")
    add_row(admin, 1, "PENDING")
    admin.run(f"ALTER TABLE image_generation_records DROP CONSTRAINT {CONSTRAINT}")
    # Holds migrate at ADD CONSTRAINT (after its check) while a release still running
    # writes a legacy value.
    reader = long_reader(database)
    migrate = start_migrate(database)
    try:
        migrate.wait_for("image_generation_records is busy")
        writer = connect(database)
        writer.run("SET statement_timeout = 2000")
        add_row(writer, 2, "DONE", attempts=1)
        writer.close()
        reader.run("COMMIT")
        code = migrate.finish()
    finally:
        reader.close()

    assert code == 1, migrate.output
    assert "validate constraint" in migrate.output
    assert "the NOT VALID constraint was dropped again" in migrate.output
    assert "'DONE' (without a hosted_image_url): 1 row" in migrate.output
    assert constraint_state(admin) is None
    generation_service_update(admin, 2)
    assert valid_indexes(database) == INDEXES  # everything else is in place


# -- 4: rows an older release left mid-upload -------------------------------------------


def test_an_upgrade_marks_what_the_older_release_may_have_uploaded_once(
    ctl: Ctl, database: str, admin: Any
) -> None:
    generation_service_tables(admin, archive_columns=FIRST_RELEASE_COLUMNS)
    add_row(admin, 1, "RUNNING", attempts=1)  # killed after Lsky stored the file
    add_row(admin, 2, "PENDING", attempts=1)  # its answer may have been lost
    add_row(admin, 3, "PENDING")  # never tried
    add_row(admin, 4, "FAILED", attempts=3)  # can be requeued
    add_row(admin, 5, "SUCCEEDED", attempts=1, hosted_url="https://img/5.png")
    add_row(admin, 6, None)
    # Enough RUNNING rows for several batches.
    admin.run(
        "INSERT INTO image_generation_records"
        " (id, user_id, status, image_url, archive_status, archive_attempts)"
        " SELECT g, 1, 'SUCCEEDED', 'u', CASE WHEN g % 2 = 0 THEN 'RUNNING' END, g % 2"
        " FROM generate_series(100, 12099) AS g"
    )

    assert ctl("migrate", "--dry-run") == 0
    assert "6003 rows would be marked" in ctl.out
    assert ctl("migrate") == 0, ctl.err
    assert "6003 rows marked" in ctl.out
    assert [status_of(admin, i)[1] for i in range(1, 7)] == [True, True, False, True, False, False]
    [[marked]] = admin.run(
        "SELECT count(*) FROM image_generation_records WHERE id >= 100 AND archive_may_be_hosted"
    )
    assert marked == 6000

    # From now on the column carries the truth: a later run leaves it alone.
    admin.run("UPDATE image_generation_records SET archive_may_be_hosted = false WHERE id = 1")
    assert ctl("migrate") == 0
    assert "nothing to change" in ctl.out
    assert status_of(admin, 1) == ("RUNNING", False)


# A batch of the marking that fails from a given id on, as one cut off would (a lost
# connection, Ctrl-C, a step that gave up): a real trigger, so migrate sees a real error.
STOP_MARKING = """
CREATE FUNCTION stop_marking() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id >= {from_id} AND NEW.archive_may_be_hosted AND NOT OLD.archive_may_be_hosted THEN
        RAISE EXCEPTION 'the connection went away';
    END IF;
    RETURN NEW;
END $$
"""


@pytest.mark.parametrize("stop_from", [1, 5098], ids=["right-after-the-column", "mid-marking"])
def test_an_upgrade_stopped_before_its_marking_is_done_is_finished_by_the_next_run(
    ctl: Ctl, database: str, admin: Any, stop_from: int
) -> None:
    """A run that adds archive_may_be_hosted and stops before its marking is done leaves
    the rest to the next run: it finds the note the first one made and marks after the
    last batch that got through. A row marked before the stop and set since by the new
    release (the truth) is left as it is."""
    generation_service_tables(admin, archive_columns=FIRST_RELEASE_COLUMNS)
    add_row(admin, 1, "RUNNING", attempts=1)  # killed after Lsky stored the file
    add_row(admin, 2, "PENDING")  # never tried: never marked
    admin.run(
        "INSERT INTO image_generation_records"
        " (id, user_id, status, image_url, archive_status, archive_attempts)"
        " SELECT g, 1, 'SUCCEEDED', 'u', CASE WHEN g % 2 = 0 THEN 'RUNNING' END, g % 2"
        " FROM generate_series(100, 12099) AS g"
    )
    # Batches of 5,000 ids: the first one ends at 5097.
    admin.run(STOP_MARKING.format(from_id=stop_from))
    admin.run(
        "CREATE TRIGGER stop_marking BEFORE UPDATE ON image_generation_records"
        " FOR EACH ROW EXECUTE FUNCTION stop_marking()"
    )

    assert ctl("migrate") == 1
    assert "the connection went away" in ctl.err
    assert "again is safe" in ctl.err
    marked_first = admin.run(
        "SELECT count(*) FROM image_generation_records WHERE archive_may_be_hosted"
    )[0][0]
    assert marked_first == (0 if stop_from == 1 else 1 + 2499)  # row 1, the even ids < 5098
    admin.run("DROP TRIGGER stop_marking ON image_generation_records")
    if stop_from > 1:
        # Since the stop the new release ran row 1's retry, which knows nothing was stored.
        admin.run("UPDATE image_generation_records SET archive_may_be_hosted = false WHERE id = 1")

    resumed = "" if stop_from == 1 else ", resumed after id 5097"
    left = 6001 if stop_from == 1 else 6000 - 2499
    assert ctl("migrate", "--dry-run") == 0
    assert f"{left} rows would be marked (the rest of an earlier run's marking)" in ctl.out
    assert ctl("migrate") == 0, ctl.err
    assert f"set archive_may_be_hosted on {mf.RECORDS}" in ctl.out
    assert f"{left} rows marked{resumed}" in ctl.out
    assert status_of(admin, 1) == ("RUNNING", stop_from == 1)
    assert status_of(admin, 2) == ("PENDING", False)
    [[unmarked]] = admin.run(
        "SELECT count(*) FROM image_generation_records"
        " WHERE id >= 100 AND archive_status = 'RUNNING' AND NOT archive_may_be_hosted"
    )
    assert unmarked == 0
    # Done: the note is gone, and a third run changes nothing and locks nothing.
    assert admin.run("SELECT step FROM image_archive_migration_steps") == []
    assert ctl("migrate") == 0
    assert "nothing to change" in ctl.out


# -- 5: two migrations at once ----------------------------------------------------------


def test_a_second_migrate_waits_for_the_first_instead_of_taking_its_index_build(
    database: str, admin: Any
) -> None:
    apply_schema(database)
    admin.run("INSERT INTO users (id, username) VALUES (1, 'u')")
    add_plain_rows(admin, 200)
    index = "image_generation_records_archive_failed_idx"
    admin.run(f"DROP INDEX {index}")
    # An open write transaction: CREATE INDEX CONCURRENTLY waits for it, its index INVALID
    # meanwhile, which is what the second run used to take for an interrupted build.
    write = connect(database)
    write.run("BEGIN")
    generation_service_update(write, 1_000_000)
    first = start_migrate(database)
    second: Child | None = None
    try:

        def building() -> bool:
            rows = admin.run(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)", n=index
            )
            return rows == [[False]]

        wait_until(building, "the first migrate's index build started")
        second = start_migrate(database)
        [waiting] = second.wait_for("for another migration to finish")
        [[holder]] = admin.run(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND objid = CAST(:key AS oid)",
            key=mf.load_declaration().lock_key,
        )
        assert f"pid {holder} since " in waiting
        assert "archive-ctl-migrate" in waiting
        assert building()  # still the first one's, not dropped
        write.run("COMMIT")
        first_code = first.finish()
        second_code = second.finish()
    finally:
        write.close()
        for child in (first, second):
            if child is not None and child.process.poll() is None:
                child.process.kill()

    assert (first_code, second_code) == (0, 0), first.output + "\n---\n" + second.output
    assert f"build index {index}" in first.output
    assert "nothing to change" in second.output
    assert "40P01" not in first.output + second.output
    assert valid_indexes(database) == INDEXES


def test_an_invalid_index_is_left_alone_while_another_migration_holds_the_lock(
    ctl: Ctl, database: str, admin: Any
) -> None:
    apply_schema(database)
    index = "image_generation_records_archive_pending_idx"
    admin.run(
        f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = CAST('{index}' AS regclass)"
    )
    # What `psql -f archive_migration.sql` holds while it runs (its second statement).
    other = connect(database, application_name="psql")
    other.run(f"SELECT pg_advisory_lock({mf.load_declaration().lock_key})")
    [[other_pid]] = other.run("SELECT pg_backend_pid()")
    try:
        code = ctl("migrate", "--wait", "1")
    finally:
        other.close()

    assert code == 1
    assert f"another migration is running (pid {other_pid} since " in ctl.err
    assert "psql" in ctl.err
    assert "it is safe to run `archive-ctl migrate` again once it finishes" in ctl.err
    assert index not in valid_indexes(database)
    assert admin.run("SELECT 1 FROM pg_class WHERE relname = :n", n=index) == [[1]]

    assert ctl("migrate") == 0  # the other one is gone
    assert f"drop the INVALID index {index}" in ctl.out
    assert valid_indexes(database) == INDEXES
