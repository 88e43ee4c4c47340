"""The archive handler end to end: moto SQS, PostgreSQL, a loopback upstream and Lsky stand-in."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour
from devkit.sqs import lambda_record
from lib.archive import runtime
from lib.archive.message import encode
from lib.platform.errors import ConfigError
from tests.integration.conftest import TOKEN, ArchiveHarness
from tests.integration.world import World
from tests.support import (
    db_now,
    emf_metrics,
    fetch_record,
    make_due,
    queue_mark,
    seed_record,
    wait_until,
)

PNG = images.png(8, 8)
QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:archive-queue"


def test_archives_a_record(world: World) -> None:
    archive, lsky = world.archive, world.lsky
    world.record(1, username="alice", started_at=datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC))

    response = world.deliver(1)

    assert response == {"batchItemFailures": []}
    row = world.row(1)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["status"] == "SUCCEEDED"
    assert row["archive_attempts"] == 1
    assert row["hosted_image_url"].startswith(lsky.base_url)
    assert row["image_mime_type"] == "image/png"
    assert row["hosted_response"]["links"]["url"] == row["hosted_image_url"]
    assert row["archived_at"] is not None
    assert row["archive_locked_by"] is None
    assert row["archive_locked_at"] is None
    assert row["archive_error"] is None

    [upload] = lsky.uploads
    assert upload.filename == "alice_1_20261202T120005Z.png"
    assert upload.content_type == "image/png"
    assert upload.size == len(PNG)
    assert upload.headers.get("authorization") == f"Bearer {TOKEN}"
    assert upload.headers.get("accept") == "application/json"
    assert "origin" not in upload.headers
    assert "referer" not in upload.headers
    assert "strategy_id" not in upload.fields  # never sent empty
    assert "album_id" not in upload.fields

    done = archive.log_for("archive succeeded")
    assert done["record_id"] == "1"
    assert done["attempt"] == 1
    assert done["outcome"] == "archived"


def test_strategy_and_album_are_sent_when_configured(world: World) -> None:
    world.settings(LSKY_STRATEGY_ID="3", LSKY_ALBUM_ID="9")
    world.record(2)

    assert world.deliver(2) == {"batchItemFailures": []}
    [upload] = world.lsky.uploads
    assert upload.fields["strategy_id"] == "3"
    assert upload.fields["album_id"] == "9"


def test_any_batch_size_reports_only_the_failed_items(world: World) -> None:
    archive = world.archive
    world.record(10)
    world.record(11, route={"status": 503})
    for body in (encode(10), encode(11), '{"nope": 1}'):
        archive.send(body)
    event = {"Records": archive.receive_all(3)}

    response = archive.invoke(event)

    by_body = {r["body"]: r["messageId"] for r in event["Records"]}
    assert response == {"batchItemFailures": [{"itemIdentifier": by_body[encode(11)]}]}
    assert world.row(10)["archive_status"] == "SUCCEEDED"
    assert world.row(11)["archive_status"] == "PENDING"


def test_retryable_failure_sets_backoff_on_row_and_message(world: World) -> None:
    archive, db = world.archive, world.db
    world.settings(ARCHIVE_RETRY_DELAYS="120,300")
    world.record(3)
    world.lsky.script(lsky_behaviour("http_500"))

    archive.send(encode(3))
    event = archive.receive()
    before = db_now(db)
    response = archive.invoke(event)
    after = db_now(db)
    archive.settle(event, response)

    [failure] = response["batchItemFailures"]
    row = world.row(3)
    assert row["archive_status"] == "PENDING"
    assert row["archive_attempts"] == 1
    assert "HTTP 500" in row["archive_error"]
    assert row["archive_locked_by"] is None
    backoff = timedelta(seconds=120)
    assert before + backoff <= row["archive_next_run_at"] <= after + backoff
    assert row["status"] == "SUCCEEDED"
    assert archive.log_for("archive attempt failed, will retry")["retry_in_seconds"] == 120

    # The message is hidden for the first delay, then comes back for attempt 2: the clock
    # is moved on (the hold runs out, the row is due) instead of waiting two minutes.
    assert archive.holds() == [120]
    assert archive.receive(wait_seconds=0)["Records"] == []
    archive.fast_forward(event)
    make_due(db, 3)
    event = archive.receive(wait_seconds=2)
    [again] = event["Records"]
    assert again["messageId"] == failure["itemIdentifier"]
    assert again["attributes"]["ApproximateReceiveCount"] == "2"

    assert archive.invoke(event) == {"batchItemFailures": []}
    assert world.state(3) == ("SUCCEEDED", 2)


def test_last_attempt_fails_the_row_and_acknowledges(world: World) -> None:
    archive = world.archive
    url = world.record(4, route={"status": 503}, attempts=2)

    assert world.deliver(4) == {"batchItemFailures": []}

    row = world.row(4)
    assert (row["archive_status"], row["archive_attempts"]) == ("FAILED", 3)
    assert row["archive_error"] == (
        f"download failed (HTTP 503): upstream answered HTTP 503 for {url} [attempt 3/3]"
    )
    assert row["status"] == "SUCCEEDED"  # the generation itself is never touched
    assert archive.in_flight() == 0
    assert archive.visible() == 0
    assert archive.log_for("archive failed")["outcome"] == "failed"


@pytest.mark.parametrize(
    ("behaviour", "fragment"),
    [
        ("status_false_type", "不支持的文件类型"),
        ("http_413", "HTTP 413"),
    ],
)
def test_permanent_errors_fail_at_once(world: World, behaviour: str, fragment: str) -> None:
    world.record(5)
    world.lsky.script(lsky_behaviour(behaviour))

    assert world.deliver(5) == {"batchItemFailures": []}
    assert world.state(5) == ("FAILED", 1)
    assert fragment in world.row(5)["archive_error"]


def test_429_retry_after_longer_than_the_schedule_is_honoured(world: World) -> None:
    archive = world.archive
    world.settings(ARCHIVE_RETRY_DELAYS="1")
    world.record(6)
    world.lsky.script(lsky_behaviour("http_429", retry_after=90))

    before = db_now(world.db)
    assert len(world.deliver(6)["batchItemFailures"]) == 1
    row = world.row(6)
    # Not the scheduled 1 s: the host's 90 s, for the row and for its message.
    assert row["archive_next_run_at"] >= before + timedelta(seconds=90)
    held = archive.log_for("upload lane paused; message held")["retry_in_seconds"]
    assert archive.holds() == [held]
    assert held >= 90
    assert archive.receive(wait_seconds=0)["Records"] == []


@pytest.mark.parametrize(
    ("seed", "reason"),
    [
        (None, "record not found"),
        ({"status": "RUNNING"}, "generation status is RUNNING"),
        ({"status": "FAILED"}, "generation status is FAILED"),
        ({"archive_status": "SUCCEEDED"}, "archive already SUCCEEDED"),
        ({"archive_status": "FAILED"}, "archive already FAILED"),
        (
            {"archive_status": "RUNNING", "locked_by": "other", "locked_at": 10},
            "archive is RUNNING under a live lock",
        ),
        ({"archive_status": None}, "archive was never queued"),
    ],
)
def test_duplicates_and_strays_are_acknowledged_without_work(
    world: World, seed: dict[str, Any] | None, reason: str
) -> None:
    if seed is None:
        world.image(7)
    else:
        world.record(7, attempts=1, **seed)
    before = world.row(7) if seed is not None else None

    assert world.deliver(7) == {"batchItemFailures": []}

    assert world.downloads(7) == 0
    assert world.lsky.upload_count == 0
    if before is not None:
        assert world.row(7) == before
    skipped = world.archive.log_for("message skipped")
    assert skipped["reason"] == reason
    assert skipped["outcome"] == "duplicate"


def test_expired_lock_is_taken_over(world: World) -> None:
    world.crashed(8, attempts=1)
    assert world.deliver(8) == {"batchItemFailures": []}
    assert world.state(8) == ("SUCCEEDED", 2)


MALFORMED = [
    "not json",
    "",
    "[]",
    '{"record": 1}',
    '{"recordId": "abc"}',
    '{"recordId": -1}',
    '{"recordId": "99999999999999999999"}',
]


@pytest.mark.parametrize("body", MALFORMED)
def test_malformed_messages_go_to_the_dlq_without_touching_the_database(
    archive: ArchiveHarness, db: Any, lsky: Any, body: str
) -> None:
    seed_record(db, 1, image_url="http://127.0.0.1:9/x.png")
    before = fetch_record(db, 1)
    if body == "":  # SQS refuses empty bodies; the handler still must cope
        response = archive.invoke(synthetic_event(archive, body))
    else:
        response = archive.deliver(body)

    assert response == {"batchItemFailures": []}
    assert fetch_record(db, 1) == before
    assert lsky.upload_count == 0
    if body:
        parked = archive.sqs.receive_message(
            QueueUrl=archive.queues.dlq_url, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        )["Messages"]
        assert [m["Body"] for m in parked] == [body]
        assert parked[0]["MessageAttributes"]["archive-error"]["StringValue"]
    line = archive.log_for("malformed message")
    assert line["outcome"] == "malformed"
    assert line["reason"]


def test_malformed_without_a_dlq_url_is_left_to_the_redrive_policy(
    archive_env: Any, archive: ArchiveHarness, db: Any
) -> None:
    archive_env(ARCHIVE_DLQ_URL="")
    archive.send("garbage")
    for _ in range(8):  # the test queue's maxReceiveCount is 5
        event = archive.receive(wait_seconds=1)
        if not event["Records"]:
            break
        response = archive.invoke(event)
        assert len(response["batchItemFailures"]) == 1  # failed, visibility 0
    parked = archive.sqs.receive_message(QueueUrl=archive.queues.dlq_url, WaitTimeSeconds=2)
    assert [m["Body"] for m in parked.get("Messages", [])] == ["garbage"]


def test_one_connection_per_container_and_reconnect_after_a_drop(world: World) -> None:
    for record_id in (21, 22, 23):
        world.record(record_id)
    world.deliver(21)
    world.deliver(22)
    database = runtime.archive_worker().records.db
    assert database.connections_opened == 1

    world.db.run(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'image-archive'"
    )
    assert world.deliver(23) == {"batchItemFailures": []}
    assert world.row(23)["archive_status"] == "SUCCEEDED"
    assert database.connections_opened == 2


def test_a_container_s_archives_from_one_provider_share_one_connection(world: World) -> None:
    for record_id in (24, 25, 26):
        world.record(record_id)
        assert world.deliver(record_id) == {"batchItemFailures": []}
    connections = [request.client for request in world.upstream.requests]
    assert len(connections) == 3
    assert len(set(connections)) == 1  # no TCP (or TLS) handshake after the first


def test_database_down_redelivers_without_spending_an_attempt(world: World) -> None:
    archive = world.archive
    world.record(30)
    world.settings(
        DATABASE_URL="postgresql://postgres@127.0.0.1:9/none",
        ARCHIVE_LOCK_TTL_SECONDS="60",
        ARCHIVE_FUNCTION_TIMEOUT_SECONDS="45",
    )

    response = world.deliver(30)
    assert len(response["batchItemFailures"]) == 1
    assert world.row(30)["archive_attempts"] == 0
    assert archive.log_for("database unavailable; message will be redelivered")
    assert "postgres@" not in json.dumps(archive.logs())
    assert archive.holds() == [65]  # held for the lock TTL + margin
    assert archive.receive(wait_seconds=0)["Records"] == []


# The invocation fails before any metric is added; Powertools warns that it has none.
@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_missing_setting_fails_the_invocation_with_its_name(
    archive_env: Any, archive: ArchiveHarness
) -> None:
    archive_env(LSKY_BASE_URL=None)
    with pytest.raises(ConfigError, match="LSKY_BASE_URL"):
        archive.invoke(synthetic_event(archive, encode(1)))


def test_metrics_are_emitted_as_emf(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.record(40)
    world.deliver(40)
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert emf, "no EMF document printed"
    names = {
        m["Name"] for doc in emf for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]
    }
    assert {"Archived", "ImageBytes", "ArchiveDuration"} <= names
    assert emf[-1]["Archived"] == [1.0] or emf[-1]["Archived"] == 1.0
    assert emf[-1]["ImageBytes"] in (float(len(PNG)), [float(len(PNG))])


def synthetic_event(archive: ArchiveHarness, body: str) -> dict[str, Any]:
    from tests.support import sqs_event

    return sqs_event([body], archive.queues.arn)


def lsky_behaviour(name: str, **kwargs: Any) -> Behaviour:
    """Short names for the stand-in's scripted answers, as the tests' parameters use them."""
    return {
        "http_500": Behaviour.server_error,
        "http_401": Behaviour.unauthorized,
        "http_413": Behaviour.too_large,
        "http_429": Behaviour.rate_limited,
        "status_false_type": lambda: Behaviour.status_false("不支持的文件类型"),
    }[name](**kwargs)


def test_credentials_from_secrets_manager_are_cached(
    world: World, moto: Any, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from aws_lambda_powertools.utilities import parameters

    from lib.platform.secrets import parse_database_url

    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto.endpoint_url)
    parameters.clear_caches()
    secrets = boto3.client("secretsmanager")
    url = parse_database_url(pg_dsn)
    db_secret = secrets.create_secret(
        Name=f"db-{time.time_ns()}",
        SecretString=json.dumps(
            {
                "username": url.user,
                "password": url.password or "",
                "host": url.host,
                "port": url.port,
                "dbname": url.database,
            }
        ),
    )["ARN"]
    token_secret = secrets.create_secret(
        Name=f"lsky-{time.time_ns()}", SecretString=json.dumps({"token": TOKEN})
    )["ARN"]
    world.settings(
        DATABASE_URL=None,
        DB_SECRET_ARN=db_secret,
        LSKY_TOKEN=None,
        LSKY_TOKEN_SECRET_ARN=token_secret,
    )
    world.record(50)
    world.record(51)

    assert world.deliver(50) == {"batchItemFailures": []}
    # Gone from Secrets Manager: the warm container still has both values cached.
    secrets.delete_secret(SecretId=db_secret, ForceDeleteWithoutRecovery=True)
    secrets.delete_secret(SecretId=token_secret, ForceDeleteWithoutRecovery=True)
    runtime.archive_worker().records.db.close()  # force a reconnect, which reads the secret
    assert world.deliver(51) == {"batchItemFailures": []}
    assert world.row(51)["archive_status"] == "SUCCEEDED"
    assert world.lsky.uploads[-1].authorization == f"Bearer {TOKEN}"
    parameters.clear_caches()


def test_a_copy_arriving_during_the_backoff_is_held_until_due(world: World) -> None:
    archive = world.archive
    world.record(60, attempts=1, next_run_at=-60)
    before = world.row(60)
    due = before["archive_next_run_at"]

    asked = db_now(world.db)
    response = world.deliver(60)
    answered = db_now(world.db)

    assert len(response["batchItemFailures"]) == 1  # kept, not dropped
    assert world.row(60) == before  # no attempt spent, nothing changed
    assert world.downloads(60) == 0
    assert world.lsky.upload_count == 0
    held = archive.log_for("message arrived before the row is due; held back")
    # Held until the row is due: what was left of its 60 s when the handler looked.
    left = [math.ceil((due - at).total_seconds()) for at in (answered, asked)]
    assert left[0] <= held["retry_in_seconds"] <= left[1]
    assert archive.holds() == [held["retry_in_seconds"]]
    assert archive.receive(wait_seconds=0)["Records"] == []


def test_a_message_a_moment_before_the_due_time_is_on_time(world: World) -> None:
    world.record(61, attempts=1, next_run_at=-2)
    assert world.deliver(61) == {"batchItemFailures": []}
    assert world.row(61)["archive_status"] == "SUCCEEDED"


def test_an_expired_lock_on_the_last_attempt_fails_instead_of_running_a_fourth(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = world.archive
    world.crashed(70, attempts=3)
    assert world.deliver(70) == {"batchItemFailures": []}
    row = world.row(70)
    assert (row["archive_status"], row["archive_attempts"]) == ("FAILED", 3)
    assert row["archive_error"] == "lock expired after the last attempt"
    assert row["archive_locked_by"] is None
    assert world.downloads(70) == 0
    assert world.lsky.upload_count == 0
    # Concluded by the claim itself: a failure (Failed), never a duplicate.
    line = archive.log_for("archive failed")
    assert (line["level"], line["outcome"]) == ("ERROR", "failed")
    assert line["error"] == "lock expired after the last attempt: failed"
    assert "message skipped" not in [x.get("message") for x in archive.logs()]
    emitted = emf_metrics(capsys)
    assert emitted.get("Failed") == 1
    assert "Duplicate" not in emitted


def test_sslmode_require_against_a_server_without_tls_is_refused(world: World) -> None:
    world.record(71)
    world.settings(DB_SSLMODE="require")  # the test cluster has no TLS
    response = world.deliver(71)
    assert len(response["batchItemFailures"]) == 1
    line = world.archive.log_for("database unavailable; message will be redelivered")
    assert "Server refuses SSL" in line["error"]
    assert world.row(71)["archive_attempts"] == 0

    world.settings(DB_SSLMODE="prefer")  # falls back to plain, as libpq does
    world.record(72)
    assert world.deliver(72) == {"batchItemFailures": []}


def test_a_token_that_cannot_be_a_header_fails_clearly_without_quoting_it(
    world: World, capfd: pytest.CaptureFixture[str]
) -> None:
    archive = world.archive
    world.settings(LSKY_TOKEN="1|abc\ndef-secret-half")
    world.record(73, attempts=2)

    # Our misconfiguration, not the record's fault: the attempt is given back (even the
    # last one) and the message redelivered; the setting is named, never its value.
    assert len(world.deliver(73)["batchItemFailures"]) == 1
    row = world.row(73)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 2)
    assert "LSKY_TOKEN holds characters a token cannot have" in row["archive_error"]
    assert not row["archive_error"].startswith(("upload", "download"))
    # Our fault may strike mid-upload: the next attempt looks the image up first.
    assert row["archive_may_be_hosted"] is True
    assert (
        archive.log_for(
            "archive stopped by our own fault; attempt given back, message will be redelivered"
        )["level"]
        == "ERROR"
    )
    out, err = capfd.readouterr()
    for text in (out, err, json.dumps(archive.logs()), row["archive_error"]):
        assert "def-secret-half" not in text
    assert world.lsky.upload_count == 0


def test_a_database_without_the_schema_is_logged_and_redelivered(
    archive_env: Any, archive: ArchiveHarness, db: Any, pg_dsn: str
) -> None:
    from urllib.parse import urlsplit, urlunsplit

    name = f"no_schema_{time.time_ns()}"
    db.run(f'CREATE DATABASE "{name}"')
    try:
        archive_env(DATABASE_URL=urlunsplit(urlsplit(pg_dsn)._replace(path=f"/{name}")))
        response = archive.deliver(encode(80))
        assert len(response["batchItemFailures"]) == 1
        line = archive.log_for("database error; message will be redelivered")
        assert line["error"].startswith("42P01")  # undefined_table: the migration is missing
        assert line["outcome"] == "unconcluded"
    finally:
        runtime.reset()
        db.run(f'DROP DATABASE "{name}" WITH (FORCE)')


# -- the queue's receive mark (the sweeper's lost-message rule reads it) -------------------


def test_a_first_receive_moves_the_queue_s_receive_mark_on_and_nothing_moves_it_back(
    world: World,
) -> None:
    """The claim keeps how far the queue has been read: the newest SentTimestamp among first
    receives, in the statement it runs anyway. A later receive of a message, an older
    message, one within a second of the mark, or a SentTimestamp that is not one never
    moves it; one from the future moves it only to the database's now."""
    archive, db = world.archive, world.db
    world.record(1, archive_status="SUCCEEDED")

    def receive(sent_ms: int | str, receive_count: int = 1) -> None:
        # Row 1 is archived: each message is a duplicate, whose claim runs all the same.
        record = lambda_record(encode(1), QUEUE_ARN, receive_count=receive_count)
        record["attributes"]["SentTimestamp"] = str(sent_ms)
        assert archive.invoke({"Records": [record]}) == {"batchItemFailures": []}

    # A message through moto, as Lambda hands it over: its SentTimestamp is the mark.
    assert queue_mark(db) is None
    archive.send(encode(1))
    event = archive.receive()
    [sent] = [int(r["attributes"]["SentTimestamp"]) for r in event["Records"]]
    assert archive.invoke(event) == {"batchItemFailures": []}
    mark = datetime.fromtimestamp(sent / 1000, UTC)
    assert queue_mark(db) == mark

    receive(sent + 60_000, receive_count=2)  # received before: says nothing new
    receive(sent - 60_000)  # an older message, received late
    receive(sent + 500)  # within a second: a burst sent together writes it once
    for nonsense in ("soon", "-5", "1e12", "99999999999999", "", "0"):
        receive(nonsense)
    assert queue_mark(db) == mark

    wait_until(lambda: db_now(db) > mark + timedelta(seconds=1.5), "a second went by")
    before = db_now(db)
    receive(sent + 86_400_000)  # SQS's clock a day ahead (or a lie): the database's now
    moved = queue_mark(db)
    assert moved is not None
    assert before <= moved <= db_now(db)
