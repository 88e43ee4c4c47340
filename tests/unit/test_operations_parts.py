"""The pure parts of archive-ctl: argument types, the schema splitter and runner, error classes."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from botocore.exceptions import ClientError
from pg8000.exceptions import DatabaseError

from lib.archive.message import MAX_RECORD_ID
from lib.cli import dlq as redrive
from lib.cli.args import parse_since, record_id
from lib.cli.main import build_parser
from lib.platform import schema as migrate
from lib.platform.db import MIGRATION_SESSION, is_connection_lost
from tests.support import ARCHIVE_INDEXES

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("24h", timedelta(hours=24)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        ("1d12h", timedelta(days=1, hours=12)),
        (" 3H ", timedelta(hours=3)),
    ],
)
def test_since_durations_count_back_from_now(text: str, ago: timedelta) -> None:
    assert parse_since(text, now=NOW) == NOW - ago


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T08:30", datetime(2026, 12, 1, 8, 30, tzinfo=UTC)),
        ("2026-12-01T08:30:00Z", datetime(2026, 12, 1, 8, 30, tzinfo=UTC)),
        (
            "2026-12-01T08:30+08:00",
            datetime(2026, 12, 1, 8, 30, tzinfo=timezone(timedelta(hours=8))),
        ),
    ],
)
def test_since_accepts_iso_dates_and_times_utc_unless_an_offset_is_given(
    text: str, expected: datetime
) -> None:
    assert parse_since(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "24", "h24", "1d x", "", "-3h"])
def test_since_rejects_anything_else_with_examples(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="24h"):
        parse_since(text)


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "abc", "١٢", str(MAX_RECORD_ID + 1)])
def test_record_ids_follow_the_message_contract(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        record_id(text)


def test_record_id_accepts_the_largest_bigint() -> None:
    assert record_id(str(MAX_RECORD_ID)) == MAX_RECORD_ID


def test_every_command_is_registered_with_a_handler() -> None:
    parser = build_parser()
    for argv in (
        ["status"],
        ["enqueue", "1"],
        ["requeue", "--failed"],
        ["backfill"],
        ["lane", "clear"],
        ["redrive-dlq"],
        ["migrate"],
        ["grants", "--role", "r"],
    ):
        assert callable(parser.parse_args(argv).handler)


def test_split_statements_on_line_end_semicolons_only() -> None:
    sql = "-- c\nSET a = 1;\n\nCREATE INDEX x\n  ON t (c) -- tail; not an end\n  WHERE s = 'a;b';\n"
    assert migrate.split_statements(sql) == [
        "SET a = 1",
        "CREATE INDEX x\n  ON t (c) -- tail; not an end\n  WHERE s = 'a;b'",
    ]


def test_split_statements_keeps_a_do_block_whole() -> None:
    sql = "DO $$\nBEGIN\n    PERFORM 1;\n    PERFORM 2;\nEND\n$$;\nSELECT 3;\n"
    assert migrate.split_statements(sql) == [
        "DO $$\nBEGIN\n    PERFORM 1;\n    PERFORM 2;\nEND\n$$",
        "SELECT 3",
    ]


def test_the_migration_file_splits_into_its_statements() -> None:
    statements = migrate.load(migrate.schema_files(with_base_schema=False))
    assert statements[0].sql == "SET lock_timeout = '5s'"  # the psql path's own
    assert statements[1].sql == "SELECT pg_advisory_lock(1634888552)"
    # 11 archive columns, may_be_hosted and altered (exactly-once), staged key, time, sha256
    # and bytes, the lane's wait reason, what was sent, the first claim, backfilled, the
    # failure time, the upload hours' backfill count, and whether an original is confirmed.
    assert sum("ADD COLUMN" in s.sql for s in statements) == 24
    assert any(s.sql.startswith("DO $$") and s.sql.endswith("$$") for s in statements)
    assert migrate.concurrent_index_names(statements) == list(ARCHIVE_INDEXES)
    with_base = migrate.load(migrate.schema_files(with_base_schema=True))
    assert with_base[0].source.name == "base_schema.sql"
    assert with_base[-len(statements) :] == statements


def test_the_settings_and_the_lock_run_before_the_invalid_index_drop() -> None:
    statements = migrate.load(migrate.schema_files(with_base_schema=True))
    ran: list[str] = []

    def run(sql: str, **params: Any) -> list[list[Any]]:
        ran.append(sql)
        if sql == migrate.INVALID_INDEXES_SQL:
            return [["image_generation_records_archive_failed_idx"]]
        return []

    assert migrate.apply(run, statements) == ["image_generation_records_archive_failed_idx"]
    assert ran[:4] == [
        "SET lock_timeout = '5s'",  # before the base schema, and before the drop
        "SELECT pg_advisory_lock(1634888552)",  # an INVALID index is nobody else's build
        migrate.INVALID_INDEXES_SQL,
        "DROP INDEX CONCURRENTLY IF EXISTS image_generation_records_archive_failed_idx",
    ]
    prelude = ("SET", "SELECT pg_advisory_lock")
    assert sorted(ran[4:]) == sorted(s.sql for s in statements if not s.sql.startswith(prelude))


def test_the_migration_session_waits_briefly_for_locks_and_never_times_out_a_statement() -> None:
    assert MIGRATION_SESSION.lock_timeout_ms == 300
    assert MIGRATION_SESSION.statement_timeout_ms == 0
    assert MIGRATION_SESSION.socket_timeout is None


def test_a_cancelled_statement_is_not_a_lost_connection() -> None:
    assert not is_connection_lost(DatabaseError({"C": "57014", "M": "statement timeout"}))
    assert is_connection_lost(DatabaseError({"C": "57P01", "M": "terminating connection"}))
    assert is_connection_lost(DatabaseError({"C": "08006", "M": "connection failure"}))
    assert is_connection_lost(TimeoutError("timed out"))  # the socket's own limit


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "StartMessageMoveTask",
    )


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("500", 500, True),  # moto: a bare 500 with no SQS error code
        ("NotImplemented", 501, True),
        ("InvalidAction", 400, True),
        ("UnknownOperationException", 400, True),
        ("InternalError", 500, False),  # AWS having a bad moment: do not hide it
        ("UnsupportedOperation", 400, False),  # e.g. the source is not a DLQ: say so
        ("AccessDenied", 403, False),
        ("ResourceNotFoundException", 404, False),
    ],
)
def test_only_a_missing_operation_triggers_the_manual_redrive(
    code: str, status: int, expected: bool
) -> None:
    assert redrive.not_implemented(_client_error(code, status)) is expected


def test_status_json_gives_each_queue_its_total() -> None:
    from lib.cli.status import ArchiveCounts, QueueDepth, Status

    depth = QueueDepth(name="queue", url="https://sqs/q", visible=3, in_flight=2, delayed=1)
    counts = ArchiveCounts(
        pending=0,
        pending_due=0,
        oldest_pending_age_seconds=None,
        running=0,
        running_expired=0,
        failed=0,
        failed_last_24h=0,
    )
    [queue] = Status(archive=counts, queues=[depth]).as_dict()["queues"]
    assert queue["total"] == depth.total == 6
