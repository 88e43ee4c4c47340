"""Each outcome says what really happened: lost locks, repeated writes, our own faults."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from devkit import images
from lib.archive import naming
from lib.archive.message import encode
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.state.claim import Task
from lib.state.records import ArchiveRecords, Recorded
from tests.integration.conftest import ArchiveHarness
from tests.integration.world import World
from tests.support import emf_metrics, fetch_record, seed_record

PNG = images.png(size=3_000)


def test_a_retry_whose_lock_passed_on_is_reported_as_lost_not_as_a_retry(
    gate: threading.Event, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # The upstream holds its 503; meanwhile the lock passes to another attempt.
    world.record(80, PNG, route={"gate": gate, "fail_first": 1})

    def take_over() -> None:
        world.db.run(
            "UPDATE image_generation_records SET archive_locked_by = 'another-attempt' "
            "WHERE id = 80"
        )

    with world.meanwhile(lambda: world.downloads(80) >= 1, take_over, gate):
        response = world.deliver(80)
    archive, db = world.archive, world.db

    assert response == {"batchItemFailures": []}  # the new holder concludes the row
    row = fetch_record(db, 80)
    assert (row["archive_status"], row["archive_locked_by"]) == ("RUNNING", "another-attempt")
    assert row["archive_error"] is None  # our retry was not written
    line = archive.log_for("the lock had passed on; the retry was not recorded")
    assert line["outcome"] == "lost_lock"
    messages = [x.get("message") for x in archive.logs()]
    assert "archive attempt failed, will retry" not in messages
    emitted = emf_metrics(capsys)
    assert emitted.get("LostLock") == 1
    assert "Retried" not in emitted


def test_the_success_write_tells_a_rerun_from_another_attempts_success(
    db: Any, pg_dsn: str
) -> None:
    seed_record(db, 81, image_url="http://x/a.png", archive_status="RUNNING", locked_by="me")
    records = ArchiveRecords(Database(DatabaseConfig(url=pg_dsn)))
    task = Task(81, 1, "alice", "http://x/a.png", None, 1)
    try:
        write = {"owner": "me", "mime_type": "image/png", "response": {"key": "k"}}
        assert records.succeed(task, hosted_url="http://h/1.png", **write) is Recorded.UNDER_LOCK
        # The same write again, as after a reply lost on the way back: ours already.
        assert records.succeed(task, hosted_url="http://h/1.png", **write) is Recorded.ALREADY_THIS
        # A different image for a row archived elsewhere: not ours.
        other = records.succeed(task, hosted_url="http://h/2.png", **write)
        assert other is Recorded.ALREADY_OTHER
        assert fetch_record(db, 81)["hosted_image_url"] == "http://h/1.png"
        db.run("DELETE FROM image_generation_records WHERE id = 81")
        assert records.succeed(task, hosted_url="http://h/1.png", **write) is Recorded.ROW_GONE
    finally:
        records.db.close()


def test_a_bug_gives_the_attempt_back_and_claims_no_stage(
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(**_: Any) -> str:
        text = "a bug in our own code"  # the stack shows source lines, never this value
        raise TypeError(text)

    # Fault injection: a bug inside the copy, after the download began.
    monkeypatch.setattr(naming, "hosted_file_name", broken)
    monkeypatch.setattr("lib.archive.copier.hosted_file_name", broken)
    upstream.add("/bug.png", PNG)
    seed_record(db, 82, image_url=upstream.url("/bug.png"), attempts=2)

    response = archive.deliver(encode(82))

    assert len(response["batchItemFailures"]) == 1  # redelivered, not concluded
    row = fetch_record(db, 82)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 2)  # not spent
    assert row["archive_error"] == "internal error (TypeError)"
    assert lsky.upload_count == 0
    bug = archive.log_for("unexpected error while handling a message")
    assert bug["error_type"] == "TypeError"
    assert "copier.py" in bug["stack"]
    assert "a bug in our own code" not in json.dumps(archive.logs())
    assert emf_metrics(capsys).get("InternalError") == 1


def test_a_bad_secret_value_spends_no_attempt_across_the_backlog(world: World) -> None:
    archive, db, lsky = world.archive, world.db, world.lsky
    world.settings(LSKY_TOKEN="1|has a space")
    for record_id in (83, 84, 85):
        world.record(record_id, PNG, attempts=2)
        assert len(world.deliver(record_id)["batchItemFailures"]) == 1
    rows = [fetch_record(db, record_id) for record_id in (83, 84, 85)]
    assert {(r["archive_status"], r["archive_attempts"]) for r in rows} == {("PENDING", 2)}
    assert lsky.upload_count == 0
    assert "has a space" not in json.dumps(archive.logs())
    assert (
        "LSKY_TOKEN"
        in archive.log_for(
            "archive stopped by our own fault; attempt given back, message will be redelivered"
        )["error"]
    )


def test_an_escaping_exception_is_logged_before_powertools_fails_the_record(
    archive: ArchiveHarness, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: Any, **kwargs: Any) -> Any:
        text = "body text must not be logged"
        raise RuntimeError(text)

    # Fault injection around the worker's own guard: only the handler's net is left.
    monkeypatch.setattr("lib.archive.worker.ArchiveWorker.process", explode)

    response = archive.deliver(encode(86))

    assert len(response["batchItemFailures"]) == 1
    line = archive.log_for("unhandled error for a message; SQS will redeliver it")
    assert line["level"] == "ERROR"
    assert line["error_type"] == "RuntimeError"
    assert "test_worker_outcomes.py" in line["stack"]
    assert "body text must not be logged" not in json.dumps(archive.logs())


def test_an_upload_whose_success_cannot_be_recorded_leaves_its_url_in_the_log(
    world: World,
) -> None:
    archive, lsky = world.archive, world.lsky
    world.record(87, PNG)

    with world.records_table_gone_during_the_upload():
        response = world.deliver(87)

    assert len(response["batchItemFailures"]) == 1
    line = archive.log_for(
        "archived on Lsky, but the success could not be recorded; message will be redelivered"
    )
    [stored] = lsky.image_records()
    assert line["hosted_key"] == stored.key
    assert line["hosted_url"].endswith(stored.pathname)
