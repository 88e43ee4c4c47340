"""The pure parts of finding records: the selection's rules, the keyset cursor (and what it
refuses), the error classes against every writer's text, and what a 42501 says."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.archive.faults import fault_verdict
from lib.archive.retry import error_summary
from lib.platform import config
from lib.platform.errors import ConfigError
from lib.platform.grants import Privilege, describe_missing
from lib.platform.s3 import StagingError
from lib.state.error_classes import ERROR_CLASSES, error_class
from lib.state.selection import MAX_ID, Cursor, Selection, like_pattern
from lib.transfer.failures import Failure, Kind, Stage
from tests.support import model_examples

QUERIES_SQL = Path(__file__).resolve().parents[2] / "src" / "lib" / "sql" / "queries.sql"
NOW = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


# -- the selection ---------------------------------------------------------------------------


def test_a_failure_bound_or_the_failed_state_lists_by_failure_time() -> None:
    assert Selection(state="FAILED").failures
    assert Selection(failed_since=NOW).failures
    assert Selection(failed_until=NOW).failures
    assert not Selection(state="PENDING").failures
    assert not Selection(error_text="x").failures


@pytest.mark.parametrize(
    ("selection", "says"),
    [
        (Selection(state="RUNNING", failed_since=NOW), "select FAILED records, not RUNNING"),
        (Selection(state="FAILED", waiting="backoff"), "--waiting selects PENDING records"),
        (Selection(waiting="paused", failed_until=NOW), "select nothing together"),
        (Selection(id_from=5, id_to=4), "--from-id 5 is above --to-id 4"),
        (Selection(failed_since=NOW, failed_until=NOW), "is not before --failed-until"),
    ],
)
def test_filters_that_contradict_each_other_are_refused(selection: Selection, says: str) -> None:
    conflict = selection.conflict()
    assert conflict is not None
    assert says in conflict


def test_no_filter_is_every_record() -> None:
    params = Selection().params()
    assert params == {
        "ids": None,
        "id_from": 0,
        "id_to": MAX_ID,
        "error": None,
        "error_patterns": None,
        "waiting": None,
        "audit": None,
    }
    assert Selection().failure_range() == {"since": "-infinity", "until": "infinity"}
    assert Selection().conflict() is None


def test_error_text_is_matched_literally() -> None:
    assert like_pattern("HTTP 5") == "%HTTP 5%"
    assert like_pattern("100%_done\\") == "%100\\%\\_done\\\\%"


# -- the cursor ------------------------------------------------------------------------------


def test_a_cursor_round_trips_to_the_microsecond() -> None:
    for cursor in (Cursor(42), Cursor(MAX_ID, NOW), Cursor(1, datetime(1960, 1, 1, tzinfo=UTC))):
        assert Cursor.decode(cursor.encode()) == cursor
    assert Cursor(7, NOW).encode() == f"t{int(NOW.timestamp())}678901_7"


@pytest.mark.model
@settings(max_examples=model_examples(200))
@given(
    st.integers(min_value=1, max_value=MAX_ID),
    st.datetimes(
        min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
)
def test_any_cursor_round_trips(record_id: int, moment: datetime) -> None:
    assert Cursor.decode(Cursor(record_id, moment).encode()) == Cursor(record_id, moment)


@pytest.mark.parametrize(
    "text",
    ["", "abc", "t_5", "t5", "-5", "5_6", f"{MAX_ID + 1}", "t9999999999999999999_1", "1 2", "x1"],
)
def test_anything_else_is_not_a_cursor(text: str) -> None:
    with pytest.raises(ValueError, match="not a cursor this command printed"):
        Cursor.decode(text)


# -- error classes ---------------------------------------------------------------------------


@pytest.mark.parametrize("stage", list(Stage))
def test_every_attempt_failure_falls_in_its_stage_class(stage: Stage) -> None:
    text = error_summary(
        Failure(stage, Kind.HTTP_STATUS, "upstream answered", status=503),
        attempt=3,
        max_attempts=3,
    )
    assert error_class(text) == str(stage)


def test_the_texts_queries_sql_writes_fall_in_a_class() -> None:
    sql = QUERIES_SQL.read_text(encoding="utf-8")
    written = re.findall(r"archive_error = '([^']+)'", sql)
    written += re.findall(r"format\('([^']+)'", sql)
    assert len(written) >= 3, written
    assert {error_class(text.replace("%s", "X")) for text in written} == {
        "lock-expired",
        "generation",
    }


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConfigError("LSKY_TOKEN is empty"), "configuration"),
        (StagingError("no such key"), "staging"),
        (RuntimeError("boom"), "internal"),
    ],
)
def test_our_own_faults_fall_in_their_class(error: Exception, expected: str) -> None:
    verdict = fault_verdict(error, claimed=True, lock_ttl_seconds=180)
    assert error_class(verdict.detail) == expected


def test_a_permission_error_and_an_unknown_text() -> None:
    assert error_class("42501: permission denied on table t; ...") == "permission"
    assert error_class("something else entirely") is None
    assert error_class(None) is None
    assert set(ERROR_CLASSES) >= {"download", "upload", "lookup", "lock-expired"}


# -- a 42501 in words ----------------------------------------------------------------------------


def test_what_a_role_lacks_is_named_by_table_privilege_and_column() -> None:
    missing = [
        Privilege("image_generation_records", "archive_staged_at", "UPDATE"),
        Privilege("image_generation_records", "archived_at", "UPDATE"),
        Privilege("image_archive_uploads", "", "INSERT"),
    ]
    assert describe_missing(missing) == (
        "UPDATE (archive_staged_at, archived_at) on image_generation_records,"
        " INSERT on image_archive_uploads"
    )
    many = [Privilege("t", f"c{i}", "SELECT") for i in range(9)]
    assert describe_missing(many).endswith("and 3 more")


# -- the region --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"AWS_REGION": "eu-central-1"}, "eu-central-1"),
        ({"AWS_REGION": "eu-central-1", "AWS_DEFAULT_REGION": "us-east-1"}, "eu-central-1"),
        ({"AWS_DEFAULT_REGION": "us-east-1"}, "us-east-1"),
        ({"AWS_REGION": " ", "AWS_DEFAULT_REGION": "us-east-1"}, "us-east-1"),
        ({}, None),
    ],
)
def test_aws_region_is_what_boto3_reads(env: dict[str, str], expected: str | None) -> None:
    config.use_aws_region(env)
    assert env.get("AWS_DEFAULT_REGION") == expected
