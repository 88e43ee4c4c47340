"""When a record failed, and finding records: archive_failed_at set by every statement that
fails a row and cleared by a requeue; `archive-ctl list` and `requeue` by state, wait
reason, error, failure time and id, newest first, paged by a keyset cursor; each common
filter served by an index (EXPLAIN on a table of 60,000 rows)."""

from __future__ import annotations

import json
import unicodedata
from datetime import timedelta
from typing import Any

import pytest

from lib.cli.context import EXIT_OK, EXIT_PARTIAL
from lib.state.error_classes import ERROR_CLASSES
from lib.state.queries import QUERIES
from lib.state.records import ArchiveRecords
from lib.state.selection import MAX_ID, Selection
from lib.state.sweeps import SweepRecords
from tests.integration.conftest import ArchiveCtl
from tests.integration.test_cli import drain, record_ids
from tests.integration.test_sweeper import explain
from tests.support import db_now, fetch_record, seed_record, seed_running

URL = "https://upstream.invalid/gen.png"


def failed_at(db: Any, record_id: int) -> Any:
    return fetch_record(db, record_id)["archive_failed_at"]


def seconds_since(db: Any, moment: Any) -> float:
    return float((db_now(db) - moment).total_seconds())


# -- the failure time ---------------------------------------------------------------------


def test_every_statement_that_fails_a_row_records_when(database: Any, db: Any) -> None:
    records, sweeps = ArchiveRecords(database), SweepRecords(database)
    # fail: the worker's conclusion.
    seed_record(db, 1, image_url=URL)
    task = records.claim(1, owner="w", lock_ttl_seconds=180, max_attempts=3).task
    assert task is not None
    assert records.fail(task, owner="w", error="download failed (HTTP 404): gone")
    # The claim's `exhausted`: an expired lock on the last attempt, met by a redelivery.
    seed_running(db, 2, attempts=3, locked_at=3600)
    assert records.claim(2, owner="w2", lock_ttl_seconds=180, max_attempts=3).snapshot.exhausted
    # The sweeper: an expired lock with no attempt left, and a generation not SUCCEEDED.
    seed_running(db, 3, attempts=3, locked_at=3600)
    seed_record(db, 4, image_url=URL, status="DELETED", next_run_at=7200, enqueued_at=7200)
    taken = sweeps.take_expired_locks(limit=10, lock_ttl_seconds=180, max_attempts=3)
    assert [(r.record_id, r.archive_status) for r in taken] == [(3, "FAILED")]
    lost = sweeps.take_lost(
        limit=10, grace_seconds=300, lost_before=db_now(db) - timedelta(seconds=900), after=None
    )
    assert [(r.record_id, r.archive_status) for r in lost] == [(4, "FAILED")]

    for record_id in (1, 2, 3, 4):
        row = fetch_record(db, record_id)
        assert row["archive_status"] == "FAILED"
        assert 0 <= seconds_since(db, row["archive_failed_at"]) < 60, record_id

    # Cleared by a requeue (the row is PENDING again), and by a success.
    seed_running(db, 5, attempts=1, locked_by="w5", locked_at=1)
    db.run("UPDATE image_generation_records SET archive_failed_at = now() WHERE id = 5")
    assert [i for i, _ in database_requeue(database, Selection(ids=(1,)))] == [1]
    assert failed_at(db, 1) is None
    task5 = records.claim(5, owner="w5", lock_ttl_seconds=180, max_attempts=3).task
    assert task5 is not None
    records.succeed(task5, owner="w5", hosted_url="https://img/5.png", mime_type="image/png",
                    response={"key": "k"})  # fmt: skip
    assert failed_at(db, 5) is None


def database_requeue(database: Any, selection: Selection) -> list[tuple[int, Any]]:
    from lib.state.operations import OperatorRecords

    return OperatorRecords(database).requeue_failed(selection, limit=10)


@pytest.fixture
def database(pg_dsn: str) -> Any:
    from lib.platform.config import DatabaseConfig
    from lib.platform.db import Database

    db = Database(DatabaseConfig(url=pg_dsn), application_name="list-test")
    yield db
    db.close()


def seed_failure(
    db: Any, record_id: int, *, failed: float | None, started: float, **kw: Any
) -> None:
    """A FAILED row generated `started` seconds ago that failed `failed` seconds ago (None:
    an older release failed it, and wrote no failure time)."""
    seed_record(db, record_id, image_url=URL, archive_status="FAILED", attempts=3,
                started_at=started, **kw)  # fmt: skip
    if failed is not None:
        db.run(
            "UPDATE image_generation_records SET archive_failed_at ="
            " now() - CAST(:s AS double precision) * interval '1 second' WHERE id = :id",
            s=failed,
            id=record_id,
        )


def test_requeue_since_takes_what_failed_since_not_what_was_generated_since(
    archive_ctl: ArchiveCtl, db: Any, sqs: Any, queues: Any
) -> None:
    """After a token rotation: the images generated days ago that failed an hour ago are the
    ones to replay; one generated an hour ago that failed before the rotation is not."""
    seed_failure(db, 1, failed=3600, started=3 * 86400)  # old image, failed an hour ago
    seed_failure(db, 2, failed=5 * 3600, started=5 * 3600 + 60)  # failed five hours ago
    seed_failure(db, 3, failed=1800, started=2 * 86400)

    result = archive_ctl("requeue", "--failed", "--since", "2h")

    assert result.returncode == EXIT_OK, result.stderr
    assert record_ids(drain(sqs, queues.url)) == [1, 3]
    assert fetch_record(db, 2)["archive_status"] == "FAILED"
    for record_id in (1, 3):
        row = fetch_record(db, record_id)
        assert (row["archive_status"], row["archive_failed_at"]) == ("PENDING", None)


def test_list_failed_since_is_newest_failure_first(archive_ctl: ArchiveCtl, db: Any) -> None:
    seed_failure(db, 1, failed=3600, started=3 * 86400, archive_error="upload failed (HTTP 500)")
    seed_failure(db, 2, failed=5 * 3600, started=5 * 3600 + 60)
    seed_failure(db, 3, failed=600, started=86400, archive_error="download failed (HTTP 404)")
    seed_record(db, 4, image_url=URL, archive_status="PENDING")

    answer = archive_ctl.json("list", "--failed-since", "2h")

    assert answer["order"] == "failure time"
    assert answer["matched"] == 2
    assert [(r["id"], r["error_class"]) for r in answer["records"]] == [
        (3, "download"),
        (1, "upload"),
    ]
    text = archive_ctl("list", "--failed-since", "2h").stdout
    assert text.splitlines()[0] == "2 records match; newest failure first"
    assert "attempts 3  failed " in text.splitlines()[1]
    assert text.splitlines()[1].endswith("download failed (HTTP 404)")


def test_a_row_an_older_release_failed_gets_an_estimated_failure_time(
    archive_ctl: ArchiveCtl, db: Any
) -> None:
    # No failure time; last sent 90 minutes ago, generated two days ago.
    seed_failure(db, 1, failed=None, started=2 * 86400, enqueued_at=5400)
    seed_failure(db, 2, failed=None, started=3 * 86400, enqueued_at=3 * 86400)

    [record] = archive_ctl.json("list", "--failed-since", "2h")["records"]

    assert record["id"] == 1
    assert record["failed_at_estimated"] is True
    row = fetch_record(db, 1)
    assert record["failed_at"] == row["archive_enqueued_at"].isoformat()
    assert "failed ~" in archive_ctl("list", "--failed-since", "2h").stdout


def test_pages_stay_correct_while_rows_change(archive_ctl: ArchiveCtl, db: Any) -> None:
    for record_id in range(1, 8):  # failed 1, 2, ... 7 minutes ago: newest is 1
        seed_failure(db, record_id, failed=60 * record_id, started=86400)

    first = archive_ctl.json("list", "--state", "FAILED", "--limit", "3")
    assert [r["id"] for r in first["records"]] == [1, 2, 3]
    # Meanwhile: a newer failure, a listed row requeued, an unlisted one requeued.
    seed_failure(db, 8, failed=1, started=60)
    db.run("UPDATE image_generation_records SET archive_status = 'PENDING' WHERE id IN (2, 5)")

    second = archive_ctl.json("list", "--state", "FAILED", "--limit", "3", "--after",
                              first["next"])  # fmt: skip
    assert [r["id"] for r in second["records"]] == [4, 6, 7]
    last = archive_ctl.json("list", "--state", "FAILED", "--limit", "3", "--after",
                            second["next"])  # fmt: skip
    assert last["records"] == []
    assert last["next"] is None
    # By id, the same: the cursor is a key, not an offset.
    by_id = archive_ctl.json("list", "--limit", "4")
    assert [r["id"] for r in by_id["records"]] == [8, 7, 6, 5]
    db.run("DELETE FROM image_generation_records WHERE id IN (4, 7)")
    rest = archive_ctl.json("list", "--limit", "4", "--after", by_id["next"])
    assert [r["id"] for r in rest["records"]] == [3, 2, 1]


def test_list_filters(archive_ctl: ArchiveCtl, db: Any) -> None:
    seed_failure(db, 10, failed=60, started=600, archive_error="lookup failed: listing refused")
    seed_failure(db, 11, failed=120, started=600, archive_error="upload failed (HTTP 413): big")
    seed_record(db, 12, image_url=URL, next_run_at=-600, enqueued_at=None,
                archive_wait_reason="paused", archive_error="upload failed (HTTP 429)")  # fmt: skip
    seed_record(db, 13, image_url=URL, next_run_at=-600, enqueued_at=30,
                archive_wait_reason="backoff")  # fmt: skip
    seed_record(db, 14, image_url=URL, next_run_at=60)  # due: not waiting
    seed_running(db, 15, locked_at=10)
    seed_record(db, 16, image_url=URL, archive_status="SUCCEEDED")
    seed_record(db, 17, image_url=URL, archive_status=None)

    def ids(*argv: str) -> list[int]:
        return [r["id"] for r in archive_ctl.json("list", *argv)["records"]]

    assert ids() == [17, 16, 15, 14, 13, 12, 11, 10]
    assert ids("--state", "pending") == [14, 13, 12]
    assert ids("--state", "none") == [17]
    assert ids("--state", "RUNNING") == [15]
    assert ids("--waiting", "paused") == [12]
    assert ids("--waiting", "backoff") == [13]
    assert ids("--error", "http 4") == [12, 11]  # any case, any state
    assert ids("--error-class", "upload") == [12, 11]
    assert ids("--error-class", "upload", "--state", "FAILED") == [11]
    assert ids("--error-class", "lookup") == [10]
    assert ids("--from-id", "12", "--to-id", "15") == [15, 14, 13, 12]
    assert ids("--id", "16", "10", "--id", "99") == [16, 10]
    assert ids("--error", "100%") == []  # LIKE's own wildcards are taken literally
    text = archive_ctl("list", "--waiting", "paused").stdout
    assert "waits paused (parked), due in 10 min" in text


def test_requeue_by_id_reports_every_id(
    archive_ctl: ArchiveCtl, db: Any, sqs: Any, queues: Any
) -> None:
    seed_failure(db, 1, failed=60, started=600)
    seed_failure(db, 2, failed=120, started=600)
    seed_failure(db, 3, failed=180, started=600)
    seed_record(db, 4, image_url=URL, archive_status="PENDING")

    dry = archive_ctl.json("requeue", "--id", "1", "3", "--dry-run")
    assert [r["id"] for r in dry["records"]] == [1, 3]
    assert fetch_record(db, 1)["archive_status"] == "FAILED"

    result = archive_ctl("requeue", "--id", "1", "3", "4", "99")

    assert result.returncode == EXIT_PARTIAL  # 99 does not exist
    assert record_ids(drain(sqs, queues.url)) == [1, 3]
    assert "skipped   4: archive is PENDING: not FAILED" in result.stdout
    assert "missing   99: no such record" in result.stdout
    assert "2 sent, 1 skipped, 1 not found, 0 not sent" in result.stdout
    assert fetch_record(db, 2)["archive_status"] == "FAILED"


def test_requeue_dry_run_reports_every_id_as_the_real_run_does(
    archive_ctl: ArchiveCtl, db: Any, sqs: Any, queues: Any
) -> None:
    seed_failure(db, 1, failed=60, started=600)
    seed_record(db, 2, image_url=URL, archive_status="SUCCEEDED")
    seed_record(db, 3, image_url=URL, archive_status="PENDING")
    argv = ("requeue", "--id", "1", "2", "3", "99")

    dry = archive_ctl(*argv, "--dry-run")
    answer = archive_ctl.json(*argv, "--dry-run", code=EXIT_PARTIAL)

    assert fetch_record(db, 1)["archive_status"] == "FAILED"  # nothing changed
    assert [r["id"] for r in answer["records"]] == [1]
    assert answer["skipped"] == {
        "2": "already archived",
        "3": "archive is PENDING: not FAILED, its attempts go on",
    }
    assert answer["missing"] == [99]
    assert "would requeue 1, skip 2; 1 not found" in dry.stdout
    real = archive_ctl(*argv)
    assert record_ids(drain(sqs, queues.url)) == [1]

    def left(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(("skipped", "missing"))]

    assert left(dry.stdout) == [
        "skipped   2: already archived",
        "skipped   3: archive is PENDING: not FAILED, its attempts go on",
        "missing   99: no such record",
    ]
    assert left(real.stdout) == left(dry.stdout)
    assert dry.returncode == real.returncode == EXIT_PARTIAL


def test_requeue_by_error_class_and_range(
    archive_ctl: ArchiveCtl, db: Any, sqs: Any, queues: Any
) -> None:
    seed_failure(db, 1, failed=60, started=600, archive_error="download failed (HTTP 404)")
    seed_failure(db, 2, failed=60, started=600, archive_error="upload failed (HTTP 500)")
    seed_failure(db, 3, failed=60, started=600, archive_error="upload failed (HTTP 500)")

    result = archive_ctl("requeue", "--error-class", "upload", "--to-id", "2")

    assert result.returncode == EXIT_OK, result.stderr
    assert record_ids(drain(sqs, queues.url)) == [2]


# -- each common filter reads an index ---------------------------------------------------------

ROWS = 60_000
FAILED_AT_INDEX = "image_generation_records_archive_failed_at_idx"
FILL = """
INSERT INTO image_generation_records
    (id, user_id, status, started_at, archive_status, archive_next_run_at, archive_locked_at,
     archive_wait_reason, archive_error, archive_failed_at)
SELECT g, 1, 'SUCCEEDED', now() - g * interval '1 minute',
       CASE WHEN g % 100 = 0 THEN 'FAILED' WHEN g % 100 = 1 THEN 'PENDING'
            WHEN g % 1000 = 2 THEN 'RUNNING' ELSE 'SUCCEEDED' END,
       CASE WHEN g % 100 = 1 THEN now() + interval '1 minute' END,
       CASE WHEN g % 1000 = 2 THEN now() END,
       CASE WHEN g % 100 = 1 THEN 'backoff' END,
       CASE WHEN g % 100 = 0 THEN 'download failed (HTTP 503)' END,
       CASE WHEN g % 100 = 0 THEN now() - g * interval '1 second' END
FROM generate_series(1, :rows) AS g
"""


@pytest.fixture
def big_table(db: Any) -> Any:
    db.run("INSERT INTO users (id, username) VALUES (1, 'alice')")
    db.run(FILL, rows=ROWS)
    db.run("ANALYZE image_generation_records")
    return db


def plan(db: Any, name: str, selection: Selection, **params: Any) -> list[Any]:
    return explain(
        db,
        QUERIES[name],
        analyze=True,
        **selection.params(),
        **params,
    )


@pytest.mark.parametrize(
    ("what", "name", "selection", "params", "index"),
    [
        (
            "--failed-since 2h",
            "list_failed",
            Selection(failed_since=None),
            {"since": "now() - 2h"},
            "image_generation_records_archive_failed_at_idx",
        ),
        (
            "--state FAILED --error-class download",
            "list_failed",
            Selection(state="FAILED", error_patterns=ERROR_CLASSES["download"]),
            {},
            "image_generation_records_archive_failed_at_idx",
        ),
        (
            "--waiting backoff",
            "list_records",
            Selection(state="PENDING", waiting="backoff"),
            {},
            "image_generation_records_archive_pending_idx",
        ),
        (
            "--state RUNNING",
            "list_records",
            Selection(state="RUNNING"),
            {},
            "image_generation_records_archive_running_idx",
        ),
        (
            "--error-class download",
            "list_records",
            Selection(error_patterns=ERROR_CLASSES["download"]),
            {"with_error": True},
            "image_generation_records_archive_failed_idx",
        ),
        ("no filter", "list_records", Selection(), {}, "image_generation_records_pkey"),
        (
            "--from-id 100 --to-id 2000",
            "list_records",
            Selection(id_from=100, id_to=2000),
            {},
            "image_generation_records_pkey",
        ),
    ],
)
def test_each_common_filter_reads_its_index_not_the_table(
    big_table: Any,
    what: str,
    name: str,
    selection: Selection,
    params: dict[str, Any],
    index: str,
) -> None:
    now = db_now(big_table)
    arguments: dict[str, Any] = {"limit": 50, "after_id": MAX_ID}
    if name == "list_failed":
        since = now - timedelta(hours=2) if params.get("since") else "-infinity"
        arguments.update(since=since, until="infinity", requeuable=False, after_time="infinity")
    else:
        arguments.update(state=selection.state, with_error=params.get("with_error", False))
    nodes = plan(big_table, name, selection, **arguments)
    assert not [n for n in nodes if n.node_type == "Seq Scan"], (what, nodes)
    assert index in {n.index for n in nodes}, (what, nodes)
    # Never more rows than a state holds (600 FAILED, 600 PENDING, 60 RUNNING), or a page.
    assert all((n.actual_rows or 0) <= 600 for n in nodes if n.index), (what, nodes)


def test_status_counts_the_last_day_of_failures_on_an_index(big_table: Any) -> None:
    nodes = explain(big_table, QUERIES["live_counts"], analyze=True, lock_ttl=180)
    assert not [n for n in nodes if n.node_type == "Seq Scan"], nodes
    # FAILED rows only, on one of their partial indexes (the planner picks either).
    failed = {"image_generation_records_archive_failed_idx", FAILED_AT_INDEX}
    assert all((n.actual_rows or 0) <= 600 for n in nodes if n.index in failed), nodes


def test_list_prints_json_that_round_trips(archive_ctl: ArchiveCtl, db: Any) -> None:
    seed_failure(db, 1, failed=60, started=600, archive_error="upload failed: token=abc123def")
    result = archive_ctl("list", "--json")
    assert result.returncode == EXIT_OK
    [record] = json.loads(result.stdout)["records"]
    assert record["state"] == "FAILED"
    assert "abc123def" not in json.dumps(record)  # redacted on its way out too


def test_list_fits_the_error_to_the_terminal_s_width_and_never_cuts_json(
    archive_ctl: ArchiveCtl, db: Any
) -> None:
    error = (
        "upload failed (HTTP 200): Lsky answered status false: 图片上传失败 "
        + "while the storage strategy wrote the file "
        + "[attempt 3/3]"
    )
    seed_failure(db, 1, failed=60, started=600, archive_error=error)

    def line(columns: str | None) -> str:
        result = archive_ctl("list", "--state", "FAILED", env={"COLUMNS": columns})
        [listed] = [text for text in result.stdout.splitlines() if text.startswith("   ")]
        return listed

    wide = line("250")
    said = archive_ctl("list", "--state", "FAILED").stdout
    assert said.startswith("1 record matches; newest failure first\n")
    assert wide.endswith(error)  # the whole of it: [attempt 3/3] included
    assert line(None).endswith(error)  # a pipe: nothing cut
    narrow = line("140")
    assert narrow.endswith("...")
    cells = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in narrow)
    assert 130 < cells <= 140  # the Chinese characters take two columns each
    assert "[attempt" not in line("60")  # however narrow, the error keeps 40 columns
    assert line("60").endswith("...")
    listed = archive_ctl("list", "--state", "FAILED", "--json", env={"COLUMNS": "60"})
    assert json.loads(listed.stdout)["records"][0]["error"] == error
