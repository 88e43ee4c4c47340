"""Every record's story, kept and shown: each life a record can have, end to end against
PostgreSQL, moto's SQS (and S3) and the Lsky stand-in, asserting the events in order and
what `archive-ctl show` prints of them, as text and as JSON."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from devkit.lsky import AccountState, Behaviour
from lib.archive import runtime
from lib.archive.message import encode
from lib.cli.context import EXIT_NOT_FOUND, EXIT_OK
from lib.state.events import EventKind
from tests.integration.conftest import start_child
from tests.integration.test_cli import Ctl
from tests.integration.world import World
from tests.support import HANG_SECONDS, FakeLambdaContext, make_due, seed_record

# A line of `show`'s event list: "  12 s ago  #1  claimed   attempt 1 by ...".
EVENT_LINE = re.compile(r"^\s+\S.* ago  #(\d+)\s+(\w+)\s", re.M)


@pytest.fixture
def ctl(cli_env: None, capsys: pytest.CaptureFixture[str], sqs: Any, queues: Any) -> Ctl:
    return Ctl(capsys, sqs=sqs, queues=queues)


def story(db: Any, record_id: int) -> list[tuple[str, int]]:
    """The record's events as (kind, attempt), in order."""
    rows = db.run(
        "SELECT kind, attempt FROM image_archive_events WHERE record_id = :id ORDER BY at, seq",
        id=record_id,
    )
    return [(str(kind), int(attempt)) for kind, attempt in rows]


def detail(db: Any, record_id: int, kind: str, nth: int = -1) -> dict[str, Any]:
    rows = db.run(
        "SELECT detail FROM image_archive_events WHERE record_id = :id AND kind = :kind"
        " ORDER BY at, seq",
        id=record_id,
        kind=kind,
    )
    value: dict[str, Any] = rows[nth][0]
    return value


def shown(ctl: Ctl, record_id: int, *extra: str) -> tuple[str, dict[str, Any]]:
    """`show ID` as text and as JSON, each checked against the other and the table."""
    assert ctl("show", str(record_id), *extra) == EXIT_OK, ctl.err
    text = ctl.out
    assert ctl("show", str(record_id), "--json", *extra) == EXIT_OK, ctl.err
    data: dict[str, Any] = json.loads(ctl.out)
    listed = [(kind, int(attempt)) for attempt, kind in EVENT_LINE.findall(text)]
    assert listed == [(e["kind"], e["attempt"]) for e in data["events"]]
    ages = [e["ago_seconds"] for e in data["events"]]
    assert ages == sorted(ages, reverse=True)  # newest last
    return text, data


def received_owner(world: World, record_id: int) -> str:
    """The lock owner of the record's last claim: its invocation and message ids."""
    line = world.archive.log_for("archive succeeded")
    message = detail(world.db, record_id, "received")["message_id"]
    return f"{line['function_request_id']}/{message}"


def kinds(*names: str) -> list[str]:
    assert set(names) <= {str(kind) for kind in EventKind}, names
    return list(names)


def deliver_again(world: World, event: dict[str, Any]) -> dict[str, Any]:
    """The held message comes back (its visibility over: the test moves the clock on) and
    is handled; returns the new receive's event."""
    world.archive.fast_forward(event)
    again = world.archive.receive(wait_seconds=2)
    assert len(again["Records"]) == 1, "the held message did not come back"
    world.archive.settle(again, world.archive.invoke(again))
    return again


def first_delivery(world: World, record_id: int) -> tuple[dict[str, Any], Any]:
    world.archive.send(encode(record_id))
    event = world.archive.receive()
    response = world.archive.invoke(event)
    world.archive.settle(event, response)
    return event, response


# -- 1. archived the first time ---------------------------------------------------------


def test_archived_the_first_time(world: World, ctl: Ctl) -> None:
    world.record(1, enqueued_at=5)

    assert world.deliver(1) == {"batchItemFailures": []}

    assert [k for k, _ in story(world.db, 1)] == kinds(
        "enqueued", "received", "claimed", "fetched", "upload_answered", "archived"
    )
    assert [a for _, a in story(world.db, 1)] == [0, 0, 1, 1, 1, 1]
    assert detail(world.db, 1, "enqueued") == {"by": "producer", "inferred": True}
    received = detail(world.db, 1, "received")
    assert received == {"message_id": received["message_id"], "receive_count": 1}
    assert detail(world.db, 1, "claimed") == {"owner": received_owner(world, 1)}
    assert detail(world.db, 1, "fetched")["source"] == "provider"
    assert detail(world.db, 1, "upload_answered")["status"] == 200
    row = world.row(1)
    archived = detail(world.db, 1, "archived")
    assert archived == {"url": row["hosted_image_url"], "key": archived["key"], "altered": False}

    text, data = shown(ctl, 1)
    assert text.splitlines()[0] == "record 1: SUCCEEDED, attempt 1 of 3"
    assert "waiting for  nothing: archived" in text
    assert f"hosted       {row['hosted_image_url']}, archived " in text
    assert "by producer (inferred from the row: the producer writes no event)" in text
    assert (data["state"], data["waiting"]["for"], data["hosted_url"]) == (
        "SUCCEEDED",
        "nothing",
        row["hosted_image_url"],
    )
    assert data["events_total"] == 6


# -- 2. two failures, then archived -------------------------------------------------------


def test_two_failures_then_archived(world: World, ctl: Ctl) -> None:
    world.record(2, route={"fail_first": 2, "fail_status": 503}, enqueued_at=5)

    event, response = first_delivery(world, 2)
    assert len(response["batchItemFailures"]) == 1
    text, data = shown(ctl, 2)
    assert data["waiting"]["for"] == "backoff"
    assert "waiting for  its backoff until" in text
    assert "then attempt 2 of 3" in text
    assert "its message held" in text
    assert "last error   download failed (HTTP 503): upstream answered HTTP 503" in text
    for _ in range(2):
        make_due(world.db, 2)
        event = deliver_again(world, event)

    attempt = ["received", "claimed", "fetched"]
    assert [k for k, _ in story(world.db, 2)] == kinds(
        "enqueued",
        *attempt, "retried",
        *attempt, "retried",
        *attempt, "upload_answered", "archived",
    )  # fmt: skip
    assert [
        d["receive_count"] for d in (detail(world.db, 2, "received", n) for n in (0, 1, 2))
    ] == [
        1,
        2,
        3,
    ]
    assert detail(world.db, 2, "fetched", 0)["status"] == 503
    retried = detail(world.db, 2, "retried", 1)
    assert retried["error_class"] == "transient"
    assert retried["delay_seconds"] == 120
    assert retried["next_run_at"]
    assert world.state(2) == ("SUCCEEDED", 3)

    text, data = shown(ctl, 2)
    assert text.splitlines()[0] == "record 2: SUCCEEDED, attempt 3 of 3"
    assert re.search(r"#2\s+retried\s+transient: download failed \(HTTP 503\)", text), text
    assert [e["attempt"] for e in data["events"] if e["kind"] == "claimed"] == [1, 2, 3]


# -- 3. paced and held once ---------------------------------------------------------------


def test_paced_and_held_once(world: World, ctl: Ctl) -> None:
    world.settings(LSKY_RATE_LIMITS="1/minute")
    world.record(30, enqueued_at=5)
    world.record(3, enqueued_at=5)
    assert world.deliver(30) == {"batchItemFailures": []}  # the minute's one upload

    event, response = first_delivery(world, 3)
    assert len(response["batchItemFailures"]) == 1  # held until its slot

    text, data = shown(ctl, 3)
    assert (data["state"], data["attempts"], data["waiting"]["for"]) == ("PENDING", 0, "slot")
    assert "waiting for  its booked upload slot at" in text
    assert "its message held" in text
    # A minute passes for the ledger: the first upload and the booking move back (62 s:
    # Lsky's whole seconds at both ends of its window and the margin, whatever the date).
    world.db.run("UPDATE image_archive_uploads SET at = at - interval '62 seconds'")
    make_due(world.db, 3)
    deliver_again(world, event)

    assert [k for k, _ in story(world.db, 3)] == kinds(
        "enqueued",
        "received", "claimed", "fetched", "slot", "held",
        "received", "claimed", "fetched", "slot", "upload_answered", "archived",
    )  # fmt: skip
    booked, go = detail(world.db, 3, "slot", 0), detail(world.db, 3, "slot", 1)
    assert (booked["answer"], go["answer"]) == ("booked", "go")
    held = detail(world.db, 3, "held")
    assert (held["why"], held["given_back"]) == ("paced", True)
    assert world.state(3) == ("SUCCEEDED", 1)  # the wait spent no attempt

    text, _ = shown(ctl, 3)
    assert re.search(r"#1\s+held\s+paced until .*, attempt given back", text), text
    assert re.search(r"#1\s+slot\s+booked for ", text), text


# -- 4. parked by an account pause, sent by the sweeper after its probe ---------------------


def sweep() -> dict[str, Any]:
    from handlers.sweeper import lambda_handler

    runtime.reset()
    context = FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60)
    result: dict[str, Any] = lambda_handler({}, context)
    return result


def test_parked_by_an_account_pause_then_sent_by_the_sweeper_after_its_probe(
    world: World, ctl: Ctl
) -> None:
    world.lsky.account_state = AccountState.QUOTA_FULL
    world.record(4)
    assert world.deliver(4) == {"batchItemFailures": []}  # parked: its message acknowledged

    text, data = shown(ctl, 4)
    assert data["waiting"]["for"] == "lane"
    assert "waiting for  the lane's pause (account) until cleared; no message out" in text
    assert sweep()["lane_resumed"] is False  # the probe still sees the quota full
    world.lsky.account_state = AccountState.HEALTHY
    # Parked until cleared, the row was due all along: sent once the probe opens the lane.
    summary = sweep()
    assert (summary["lane_resumed"], summary["requeued"]) == (True, 1)
    event = world.archive.receive(wait_seconds=2)
    world.archive.settle(event, world.archive.invoke(event))

    assert [k for k, _ in story(world.db, 4)] == kinds(
        "enqueued",
        "received", "claimed", "fetched", "upload_answered", "lane_paused", "parked",
        "enqueued",
        "received", "claimed", "fetched", "upload_answered", "archived",
    )  # fmt: skip
    assert detail(world.db, 4, "lane_paused")["reason"] == "account"
    assert detail(world.db, 4, "parked")["why"] == "paused"
    assert detail(world.db, 4, "enqueued")["by"] == "sweeper"
    assert detail(world.db, 4, "enqueued")["why"] == "parked"
    assert world.state(4) == ("SUCCEEDED", 1)
    sweeper_lines = [
        line for line in world.archive.logs() if line.get("function_name") == "SweeperFunction"
    ]
    named = [line for line in sweeper_lines if "4" in (line.get("record_ids") or [])]
    assert {line["message"] for line in named} == {"sweep took records", "sweep sent records"}

    text, _ = shown(ctl, 4)
    assert re.search(r"#0\s+enqueued\s+by sweeper: parked", text), text
    assert re.search(r"#1\s+lane_paused\s+account until until cleared: ", text), text


# -- 5. staged, then published later ------------------------------------------------------


def test_staged_and_published_later(
    world: World, ctl: Ctl, staging_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    world.settings(ARCHIVE_STAGING_BUCKET=staging_bucket)
    world.record(5, route={"fail_after": 1})  # the provider's URL expires after one fetch
    from tests.integration.test_lane import paused

    paused(os.environ["DATABASE_URL"], 3_600, reason="rate_limit", window="hour", detail="每小时内")
    assert world.deliver(5) == {"batchItemFailures": []}  # captured, then parked

    text, data = shown(ctl, 5)
    key = world.row(5)["archive_staged_key"]
    assert data["staged_key"] == key
    assert f"staged       {key}, 164 bytes, staged " in text
    assert "published from its staged copy" in data["waiting"]["words"]
    assert ctl("lane", "clear") == EXIT_OK
    assert "unparked: 5" in ctl.out
    make_due(world.db, 5)
    assert world.deliver(5) == {"batchItemFailures": []}

    assert [k for k, _ in story(world.db, 5)] == kinds(
        "enqueued",
        "received", "claimed", "staged", "parked",
        "unparked",
        "received", "claimed", "fetched", "upload_answered", "archived",
    )  # fmt: skip
    assert detail(world.db, 5, "staged")["key"] == key
    assert detail(world.db, 5, "unparked")["by"] == "archive-ctl lane clear"
    assert detail(world.db, 5, "claimed", 1)["staged"] is True
    assert detail(world.db, 5, "fetched")["source"] == "staged copy"
    assert world.downloads(5) == 1  # never fetched from the provider again

    text, _ = shown(ctl, 5)
    assert re.search(r"#1\s+staged\s+staged/5/\w+\.png \(\d+ bytes\): lane paused", text), text
    assert re.search(r"#1\s+claimed\s+attempt 1 by .*, from its staged copy", text), text


# -- 6. adopted after a lost answer -------------------------------------------------------


def test_adopted_after_a_lost_answer(world: World, ctl: Ctl) -> None:
    world.settings(ARCHIVE_RETRY_DELAYS="1")
    world.record(6)
    world.lsky.script(Behaviour.drop(store=True))

    event, response = first_delivery(world, 6)
    assert len(response["batchItemFailures"]) == 1
    deliver_again(world, event)

    assert [k for k, _ in story(world.db, 6)] == kinds(
        "enqueued",
        "received", "claimed", "fetched", "upload_answered", "retried",
        "received", "claimed", "looked_up", "archived",
    )  # fmt: skip
    assert detail(world.db, 6, "upload_answered")["may_be_hosted"] is True
    [image] = world.lsky.image_records()
    looked = detail(world.db, 6, "looked_up")
    assert looked["adopted"] == image.key
    assert "the sha1 of the bytes sent" in looked["why"]
    assert detail(world.db, 6, "archived")["adopted"] is True
    assert world.lsky.upload_count == 1

    text, _ = shown(ctl, 6)
    assert re.search(rf"#2\s+looked_up\s+adopted {image.key}: the record's name", text), text
    assert "adopted (an earlier attempt had stored it)" in text


# -- 7. a lock that expired, taken over -----------------------------------------------------


def crash_mid_upload(world: World, record_id: int, tmp: Path, gate: threading.Event) -> Any:
    """The record's message handled by a container that dies with Lsky holding its upload
    (which Lsky then stores, with no one to read the answer); the lock then expires (the
    clock moves on). Returns the message's event."""
    world.lsky.script(Behaviour.held(gate))
    world.archive.send(encode(record_id))
    event = world.archive.receive()
    child = start_child(event, tmp, f"crashed-{record_id}")
    assert world.lsky.wait_for_bodies(1, timeout=HANG_SECONDS)
    os.kill(child.process.pid, signal.SIGKILL)
    child.process.wait(timeout=HANG_SECONDS)
    gate.set()
    assert world.lsky.wait_for_uploads(1, timeout=HANG_SECONDS)
    world.db.run(
        "UPDATE image_generation_records SET archive_locked_at = now() - interval '1 hour'"
        " WHERE id = :id",
        id=record_id,
    )
    return event


def test_a_lock_that_expired_is_taken_over(
    world: World, ctl: Ctl, tmp_path: Path, gate: threading.Event
) -> None:
    world.record(7)
    event = crash_mid_upload(world, 7, tmp_path, gate)

    text, data = shown(ctl, 7)
    assert (data["state"], data["waiting"]["for"]) == ("RUNNING", "takeover")
    assert "waiting for  a takeover: the lock of attempt 1 expired" in text
    deliver_again(world, event)

    # The dead container's fetch and upload were in its memory: lost with it. The taker
    # looks for the image it may have stored, and adopts it.
    assert [k for k, _ in story(world.db, 7)] == kinds(
        "enqueued",
        "received", "claimed",
        "received", "lock_taken_over", "claimed", "fetched", "looked_up", "archived",
    )  # fmt: skip
    taken = detail(world.db, 7, "lock_taken_over")
    first_owner = detail(world.db, 7, "claimed", 0)["owner"]
    assert taken["owner"] == first_owner
    assert taken["by"] == detail(world.db, 7, "claimed", 1)["owner"] != first_owner
    assert world.state(7) == ("SUCCEEDED", 2)
    assert detail(world.db, 7, "archived")["adopted"] is True
    assert world.lsky.upload_count == 1

    text, _ = shown(ctl, 7)
    assert re.search(rf"#1\s+lock_taken_over\s+from {re.escape(first_owner)} \(locked ", text)


# -- 8. FAILED, redriven from the DLQ, archived -------------------------------------------


def test_failed_then_redriven_from_the_dlq_and_archived(
    world: World, ctl: Ctl, tmp_path: Path, gate: threading.Event
) -> None:
    world.settings(ARCHIVE_MAX_ATTEMPTS="1")
    world.record(8)
    event = crash_mid_upload(world, 8, tmp_path, gate)
    # Its only attempt died: the sweeper fails the row; the message, received again and
    # again by containers that die the same way, ends in the DLQ (maxReceiveCount 5).
    assert sweep()["failed"] == 1
    world.archive.fast_forward(event)
    sqs, queues = world.archive.sqs, world.archive.queues
    for _ in range(10):
        sqs.receive_message(QueueUrl=queues.url, VisibilityTimeout=0, WaitTimeSeconds=1)
        if world.archive.visible(queues.dlq_url):
            break
    assert ctl("redrive-dlq", "--dry-run") == EXIT_OK
    assert "1 message looked at" in ctl.out

    text, data = shown(ctl, 8)
    assert (data["state"], data["waiting"]["for"]) == ("FAILED", "nothing")
    assert "last error   lock expired after the last attempt" in text
    assert "waiting for  nothing: FAILED " in text
    assert "`archive-ctl requeue --id 8` gives it new attempts" in text
    assert data["failed_at"] is not None
    assert ctl("redrive-dlq", "--manual") == EXIT_OK
    assert "FAILED records given new attempts for their messages: 8" in ctl.out
    event = world.archive.receive(wait_seconds=2)
    world.archive.settle(event, world.archive.invoke(event))

    events = [k for k, _ in story(world.db, 8)]
    assert events[:6] == kinds(
        "enqueued", "received", "claimed", "lock_taken_over", "failed", "enqueued"
    )
    assert events[6:8] == kinds("received", "claimed")
    assert events[-1] == "archived"
    assert detail(world.db, 8, "lock_taken_over")["by"] == "sweeper"
    failed = detail(world.db, 8, "failed")
    assert (failed["by"], failed["error"]) == ("sweeper", "lock expired after the last attempt")
    redriven = detail(world.db, 8, "enqueued")
    assert (redriven["by"], redriven["was"]) == ("archive-ctl redrive-dlq", "FAILED")
    assert world.state(8) == ("SUCCEEDED", 1)

    text, _ = shown(ctl, 8)
    assert re.search(r"enqueued\s+by archive-ctl redrive-dlq, was FAILED after 1 attempt,", text)
    assert re.search(r"#1\s+failed\s+by sweeper: lock expired after the last attempt", text)


@pytest.mark.parametrize(
    ("route", "says"),
    [
        ({"status": 404}, "the provider's answer will not change"),
        ({"content_type": "text/html"}, "the provider's answer will not change"),  # not an image
    ],
)
def test_show_says_a_permanent_failure_would_fail_again_and_what_to_do(
    world: World, ctl: Ctl, route: dict[str, Any], says: str
) -> None:
    body = b"<html>gone</html>" if route.get("content_type") else b"not found"
    world.record(9, body, route=route)
    world.deliver(9)
    assert world.state(9) == ("FAILED", 1)

    text, data = shown(ctl, 9)

    assert "gives it new attempts" not in text
    assert f"it failed for good: {says}" in text
    assert "`archive-ctl requeue --id 9` would fail the same way unless the source has" in text
    assert "have it generated again" in data["waiting"]["words"]


# -- show's edges ---------------------------------------------------------------------------


def test_show_says_no_such_record_with_its_own_exit_code(ctl: Ctl, db: Any) -> None:
    assert ctl("show", "999999") == EXIT_NOT_FOUND
    assert ctl.out.startswith("record 999999: no such record")
    assert ctl("show", "999999", "--json") == EXIT_NOT_FOUND
    assert json.loads(ctl.out)["found"] is False
    with pytest.raises(SystemExit) as usage:
        ctl("show", "0")  # not a record id
    assert usage.value.code == 2


def test_show_infers_the_producer_s_enqueue_before_any_event(ctl: Ctl, db: Any) -> None:
    seed_record(
        db, 11, image_url="https://upstream.invalid/a.png", enqueued_at=120, next_run_at=120
    )

    text, data = shown(ctl, 11)

    assert data["events"] == []
    assert "(none yet: queued" in text
    assert "by the producer, inferred from the row" in text


def test_a_hosted_url_an_older_release_stored_is_shown_on_one_redacted_line(
    ctl: Ctl, db: Any
) -> None:
    """Before hosted URLs were checked, any text starting with http:// could be stored:
    shown as it is, a terminal escape or a password in it would reach the screen."""
    stored = "https://user:hunter22@img.example.com/i/a.png\x1b]0;owned\x07\nSet-Cookie: x"
    seed_record(
        db,
        13,
        image_url="https://upstream.invalid/a.png",
        archive_status="SUCCEEDED",
        hosted_image_url=stored,
    )

    text, data = shown(ctl, 13)

    [line] = [line for line in text.splitlines() if line.lstrip().startswith("hosted")]
    assert "img.example.com/i/a.png" in line
    assert "hunter22" not in text
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "Set-Cookie" in line  # the rest of the value, on the same line
    assert data["hosted_url"] == stored  # --json: the column as it is (JSON escapes it)


def test_a_message_that_looks_lost_is_said_to_wait_for_nothing(ctl: Ctl, db: Any) -> None:
    seed_record(
        db, 12, image_url="https://upstream.invalid/a.png", next_run_at=3_600, enqueued_at=3_600
    )

    text, data = shown(ctl, 12)

    assert data["waiting"]["for"] == "lost"
    assert "waiting for  nothing: its message (sent" in text
    assert "looks lost" in text


# -- show --logs ----------------------------------------------------------------------------


def test_show_logs_without_credentials_prints_the_query_and_says_why_it_did_not_run(
    ctl: Ctl, world: World, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world.record(21)
    world.deliver(21)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    text, data = shown(ctl, 21, "--logs")

    assert "logs: CloudWatch Logs Insights over /aws/lambda/image-archive-archive, " in text
    assert "/aws/lambda/image-archive-sweeper" in text
    assert '| filter record_id = "21" or @message like /"record_ids":' in text
    assert "not run: no AWS credentials" in text
    logs = data["logs"]
    assert (logs["ran"], logs["results"]) == (False, [])
    assert logs["log_groups"] == [
        "/aws/lambda/image-archive-archive",
        "/aws/lambda/image-archive-sweeper",
        "/aws/lambda/image-archive-auditor",
    ]
    assert logs["start"] < data["events"][0]["at"]  # from before the record's first event


def test_show_logs_runs_the_query_over_every_function_s_log_group(
    ctl: Ctl, world: World, moto: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", moto.endpoint_url)
    logs = boto3.client("logs")
    stack = f"stories-{time.time_ns()}"
    now_ms = int(time.time() * 1000)
    lines = {
        "archive": {"message": "archive succeeded", "record_id": "22", "outcome": "archived"},
        "sweeper": {"message": "sweep sent records", "record_ids": ["22"], "step": "lost"},
        "auditor": {"message": "hosted image is not what was archived", "record_id": "22"},
    }
    for function, line in lines.items():
        group = f"/aws/lambda/{stack}-{function}"
        logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName="s")
        logs.put_log_events(
            logGroupName=group,
            logStreamName="s",
            logEvents=[{"timestamp": now_ms, "message": json.dumps(line)}],
        )
    world.record(22)
    world.deliver(22)

    text, data = shown(ctl, 22, "--logs", "--stack", stack)

    assert data["logs"]["ran"] is True
    messages = sorted(json.loads(row["@message"])["message"] for row in data["logs"]["results"])
    assert messages == [
        "archive succeeded",
        "hosted image is not what was archived",
        "sweep sent records",
    ]
    assert "  3 lines" in text
    assert re.search(r"  \S.*  archive  .*archive succeeded", text), text
    assert re.search(r"  \S.*  sweeper  .*sweep sent records", text), text
    assert re.search(r"  \S.*  auditor  .*hosted image is not what was archived", text), text

    assert ctl("show", "22", "--logs", "--stack", "no-such-stack") == EXIT_OK
    assert "not run: a log group is not there: is --stack the stack's name?" in ctl.out
