"""Completion events end to end: the archive function and the sweeper against moto's
EventBridge, a rule on a bus whose target is an SQS queue (what the generation service
would subscribe), and devkit's EventBridge gate in front of it where PutEvents must fail,
be throttled or refuse entries. Each event that arrives is checked against the JSON Schema
of docs/reference/events-and-metrics.md."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from devkit.eventbridge import Behaviour, EventBridgeGate
from devkit.sqs import MotoServer
from lib.archive.message import encode
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.publish.entries import MAX_REJECTIONS
from lib.state.claim import Task
from lib.state.records import ArchiveRecords
from tests.docs.markdown import json_schema
from tests.integration.conftest import start_child
from tests.integration.world import PNG, World
from tests.logcapture import capture_logs, parse
from tests.support import HANG_SECONDS, FakeLambdaContext, seed_record, wait_until

SOURCE = "image-archive"


def detail_schema() -> dict[str, Any]:
    return json_schema("completion-event-detail")


@dataclass
class Bus:
    """A bus with a rule sending image-archive's events to an SQS queue (the consumer)."""

    name: str
    queue_url: str
    sqs: Any

    def received(self, count: int) -> list[dict[str, Any]]:
        """Exactly `count` events (waits for them), then checks that no more arrive."""
        events: list[dict[str, Any]] = []

        def arrived() -> bool:
            response = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            for message in response.get("Messages", []):
                events.append(json.loads(message["Body"]))
                self.sqs.delete_message(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
            return len(events) >= count

        if count:
            wait_until(arrived, f"{count} events on the consumer's queue")
        extra = self.sqs.receive_message(QueueUrl=self.queue_url, WaitTimeSeconds=1)
        assert not extra.get("Messages"), [m["Body"] for m in extra["Messages"]]
        assert len(events) == count, events
        schema = detail_schema()
        for event in events:
            assert event["source"] == SOURCE
            jsonschema.validate(event["detail"], schema)
            [which] = [s for s in schema["oneOf"] if s["title"] == event["detail-type"]]
            jsonschema.validate(event["detail"], {**which, "$defs": schema["$defs"]})
        return events


@pytest.fixture
def bus(moto: MotoServer, sqs: Any) -> Iterator[Bus]:
    import boto3

    events = boto3.client("events", endpoint_url=moto.endpoint_url)
    name = f"archive-{uuid.uuid4().hex[:10]}"
    events.create_event_bus(Name=name)
    queue_url = sqs.create_queue(QueueName=f"generation-{name}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    pattern = {"source": [SOURCE]}
    events.put_rule(Name="generation", EventBusName=name, EventPattern=json.dumps(pattern))
    events.put_targets(
        Rule="generation",
        EventBusName=name,
        Targets=[{"Id": "queue", "Arn": arn["Attributes"]["QueueArn"]}],
    )
    yield Bus(name, queue_url, sqs)
    sqs.delete_queue(QueueUrl=queue_url)


@pytest.fixture(scope="session")
def _gate_server(moto: MotoServer) -> Iterator[EventBridgeGate]:
    gate = EventBridgeGate(moto.endpoint_url).start()
    yield gate
    gate.stop()


@pytest.fixture
def gate(_gate_server: EventBridgeGate, monkeypatch: pytest.MonkeyPatch) -> EventBridgeGate:
    """EventBridge for the functions is the gate (scripted per test), moto behind it."""
    _gate_server.script()
    monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", _gate_server.endpoint_url)
    return _gate_server


@pytest.fixture
def events_on(world: World, bus: Bus) -> World:
    world.settings(ARCHIVE_EVENT_BUS=bus.name)
    return world


def outbox(db: Any) -> list[dict[str, Any]]:
    rows = db.run(
        "SELECT event_id, record_id, detail_type, tries, rejections, last_error"
        " FROM image_archive_outbox ORDER BY created_at"
    )
    keys = ("event_id", "record_id", "detail_type", "tries", "rejections", "last_error")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def conclusion(db: Any, record_id: int) -> dict[str, Any]:
    """The detail of the record's latest conclusion event (archived or failed)."""
    [[detail]] = db.run(
        "SELECT detail FROM image_archive_events WHERE record_id = :id"
        " AND kind IN ('archived', 'failed') ORDER BY at DESC LIMIT 1",
        id=record_id,
    )
    return detail if isinstance(detail, dict) else json.loads(detail)


def sweep() -> dict[str, Any]:
    from handlers.sweeper import lambda_handler

    return dict(
        lambda_handler({}, FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60))
    )


def grace_over(db: Any) -> None:
    """Move the outbox's clock on: every event is older than the sweeper's grace period."""
    db.run("UPDATE image_archive_outbox SET created_at = created_at - interval '1 hour'")


# -- what each conclusion publishes -----------------------------------------------------


def test_an_archived_record_publishes_one_image_archived_event(events_on: World, bus: Bus) -> None:
    world = events_on
    world.record(1)
    world.deliver(1)
    row = world.row(1)
    [event] = bus.received(1)
    assert event["detail-type"] == "Image Archived"
    detail = event["detail"]
    assert detail == {
        "eventId": detail["eventId"],
        "recordId": "1",
        "time": detail["time"],
        "attempts": 1,
        "hostedUrl": row["hosted_image_url"],
        "mimeType": "image/png",
        "size": len(PNG),
        "key": row["hosted_response"]["key"],
    }
    # The story's conclusion carries the event's id; the outbox still holds it until the
    # container's next claim records the publication.
    assert conclusion(world.db, 1)["event_id"] == detail["eventId"]
    assert [r["event_id"] for r in outbox(world.db)] == [uuid.UUID(detail["eventId"])]
    world.record(2)
    world.deliver(2)
    assert [r["record_id"] for r in outbox(world.db)] == [2]
    published = conclusion(world.db, 1)
    assert published["published_by"] == "archive function"
    assert published["published_at"] >= event["time"].replace("Z", "")
    bus.received(1)


def test_a_failed_record_publishes_image_archive_failed_with_its_error_class(
    events_on: World, bus: Bus
) -> None:
    world = events_on
    world.record(3, route={"status": 404})
    world.deliver(3)
    assert world.state(3) == ("FAILED", 1)
    [event] = bus.received(1)
    assert event["detail-type"] == "Image Archive Failed"
    detail = event["detail"]
    assert detail["recordId"] == "3"
    assert detail["attempts"] == 1
    assert detail["error"] == world.row(3)["archive_error"]
    assert detail["errorClass"] == "download"
    assert set(detail) == {"eventId", "recordId", "time", "attempts", "error", "errorClass"}


def test_a_retried_attempt_publishes_nothing_and_its_success_one_event(
    events_on: World, bus: Bus
) -> None:
    world = events_on
    world.record(4, route={"fail_first": 1})
    world.deliver(4)
    assert world.state(4) == ("PENDING", 1)
    bus.received(0)
    assert outbox(world.db) == []
    world.db.run("UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = 4")
    world.deliver(4)
    [event] = bus.received(1)
    assert (event["detail-type"], event["detail"]["attempts"]) == ("Image Archived", 2)


def test_a_success_replacing_another_hosted_url_is_image_restored(
    events_on: World, bus: Bus
) -> None:
    """A repair re-publishes an archived record through the normal path: the row is
    PENDING again with its old URL (and Lsky's answer for it), which succeed replaces."""
    world = events_on
    old = "https://img.example.com/i/old/abc.png"
    world.record(5, hosted_image_url=old, hosted_response=json.dumps({"key": "oldKey"}))
    world.deliver(5)
    row = world.row(5)
    assert row["hosted_image_url"] != old
    [event] = bus.received(1)
    assert event["detail-type"] == "Image Restored"
    detail = event["detail"]
    assert (detail["previousHostedUrl"], detail["previousKey"]) == (old, "oldKey")
    assert detail["hostedUrl"] == row["hosted_image_url"]
    # The same URL again (a re-run of a success) is no restoration; neither is a first one.
    world.record(6, hosted_image_url=None)
    world.deliver(6)
    [plain] = bus.received(1)
    assert plain["detail-type"] == "Image Archived"


def test_events_off_writes_no_event_and_calls_nothing(world: World, moto: MotoServer) -> None:
    world.settings(ARCHIVE_EVENT_BUS=None)
    before = moto.requests("events")
    world.record(7)
    world.record(8, route={"status": 404})
    world.deliver(7)
    world.deliver(8)
    assert world.state(7)[0] == "SUCCEEDED"
    assert world.state(8)[0] == "FAILED"
    assert outbox(world.db) == []
    assert "event_id" not in conclusion(world.db, 7)
    sweep()
    assert moto.requests("events") == before


# -- written once, never invented -------------------------------------------------------


def test_a_success_written_twice_has_one_event_and_a_lost_lock_none(pg_dsn: str, db: Any) -> None:
    records = ArchiveRecords(Database(DatabaseConfig(url=pg_dsn)), publish=True)
    try:
        seed_record(db, 9, image_url="http://x/9.png", archive_status="RUNNING", locked_by="me")
        task = Task(9, 1, "alice", "http://x/9.png", None, 1)
        write = {"owner": "me", "mime_type": "image/png", "response": {"key": "k9"}}
        for _ in range(2):  # the second: a re-run after a reply that was lost
            records.succeed(task, hosted_url="https://img.example.com/9.png", **write)
        assert [r["record_id"] for r in outbox(db)] == [9]
        assert len(records.written.take()) == 1
        seed_record(
            db, 10, image_url="http://x/10.png", archive_status="RUNNING", locked_by="another"
        )
        assert not records.fail(
            Task(10, 1, "alice", "http://x/10.png", None, 1), owner="me", error="x"
        )
        assert [r["record_id"] for r in outbox(db)] == [9]
        assert records.written.take() == []
    finally:
        records.db.close()


# -- PutEvents failing: the record is concluded all the same, the event goes out later ---


@pytest.mark.parametrize(
    ("behaviour", "code"),
    [(Behaviour.failed(), "InternalException"), (Behaviour.throttled(), "ThrottlingException")],
    ids=["failing", "throttled"],
)
def test_a_failing_or_throttled_put_events_leaves_the_record_archived_and_the_sweeper_publishes(
    events_on: World, bus: Bus, gate: EventBridgeGate, behaviour: Behaviour, code: str
) -> None:
    world = events_on
    world.settings(ARCHIVE_EVENT_BUS=bus.name)  # rebuilt on the gate's endpoint
    gate.script(behaviour)
    world.record(11)
    response = world.deliver(11)
    # Acknowledged (no batch item failure), archived at its first attempt, nothing retried.
    assert response == {"batchItemFailures": []}
    assert world.state(11) == ("SUCCEEDED", 1)
    assert len(gate.calls) == 1
    said = world.archive.log_for("completion events not published; the sweeper publishes them")
    assert said["code"] == code
    bus.received(0)
    [kept] = outbox(world.db)
    # Within the grace period the sweeper leaves it to its container...
    sweep()
    assert outbox(world.db) == [kept]
    bus.received(0)
    # ...after it, the sweeper publishes it, and its story says so.
    grace_over(world.db)
    summary = sweep()
    assert summary["events_published"] == 1
    [event] = bus.received(1)
    assert event["detail"]["eventId"] == str(kept["event_id"])
    assert outbox(world.db) == []
    assert conclusion(world.db, 11)["published_by"] == "sweeper"


def test_entries_put_events_refuses_are_kept_and_published_with_the_next_call(
    events_on: World, bus: Bus, gate: EventBridgeGate
) -> None:
    """One entry of a call refused as retryable: the container keeps it and sends it with
    its next conclusion's event, in one call."""
    world = events_on
    world.settings(ARCHIVE_EVENT_BUS=bus.name)
    gate.script(Behaviour.refusing(e0="ThrottlingException"))
    world.record(12)
    world.deliver(12)
    bus.received(0)
    world.record(13)
    world.deliver(13)
    assert [len(call) for call in gate.calls] == [1, 2]
    events = bus.received(2)
    assert sorted(e["detail"]["recordId"] for e in events) == ["12", "13"]


def test_the_sweeper_publishes_in_batches_and_keeps_what_put_events_refuses(
    events_on: World, bus: Bus, gate: EventBridgeGate
) -> None:
    """Three events left to the sweeper; PutEvents refuses one of the three (FailedEntryCount
    1): two arrive, the third is kept with its error, and the next sweep publishes it."""
    world = events_on
    world.settings(ARCHIVE_EVENT_BUS=bus.name)
    gate.script(Behaviour.failed())  # the first container call fails: a minute's quiet
    for record_id in (21, 22, 23):
        world.record(record_id)
        world.deliver(record_id)
    assert len(gate.calls) == 1
    assert len(outbox(world.db)) == 3
    grace_over(world.db)
    gate.script(Behaviour.refusing(e1="InternalFailure"))
    summary = sweep()
    assert [len(call) for call in gate.calls] == [3]
    assert (summary["events_published"], summary["events_missed"]) == (2, 1)
    assert len(bus.received(2)) == 2
    [kept] = outbox(world.db)
    assert (kept["tries"], kept["rejections"]) == (1, 0)
    assert kept["last_error"].startswith("InternalFailure")
    sweep()
    [event] = bus.received(1)
    assert event["detail"]["eventId"] == str(kept["event_id"])
    assert outbox(world.db) == []


def test_an_entry_refused_for_good_is_dropped_after_a_few_tries_logged_and_counted(
    events_on: World, bus: Bus, gate: EventBridgeGate, capsys: pytest.CaptureFixture[str]
) -> None:
    world = events_on
    world.settings(ARCHIVE_EVENT_BUS=bus.name)
    gate.script(Behaviour.refusing(e0="MalformedDetail"))
    world.record(24)
    world.deliver(24)
    [refused] = outbox(world.db)  # the container leaves it to the sweeper
    grace_over(world.db)
    with capture_logs() as raw:
        for tries in range(1, MAX_REJECTIONS + 1):
            gate.script(Behaviour.refusing(e0="MalformedDetail"))
            summary = sweep()
            left = outbox(world.db)
            if tries < MAX_REJECTIONS:
                assert [(r["tries"], r["rejections"]) for r in left] == [(tries, tries)]
    assert summary["events_dropped"] == 1
    assert left == []
    bus.received(0)
    [line] = [r for r in parse(raw) if r["message"].startswith("completion event dropped")]
    assert line["event_id"] == str(refused["event_id"])
    assert line["reason"] == "MalformedDetail: Detail is malformed."
    assert '"EventsDropped":[1.0]' in capsys.readouterr().out
    noted = conclusion(world.db, 24)
    assert noted["dropped_because"] == "MalformedDetail: Detail is malformed."
    assert noted["tries"] == MAX_REJECTIONS


def test_a_container_killed_between_its_commit_and_put_events_leaves_the_event_to_the_sweeper(
    events_on: World, bus: Bus, gate: EventBridgeGate, tmp_path: Path
) -> None:
    world = events_on
    world.settings(ARCHIVE_EVENT_BUS=bus.name)
    held = threading.Event()
    gate.script(Behaviour.held(held, deliver=False))
    world.record(25)
    world.archive.send(encode(25))
    child = start_child(world.archive.receive(), tmp_path, "killed")
    try:
        assert gate.holding.wait(HANG_SECONDS), "the child never called PutEvents"
        child.process.kill()
        child.process.wait(HANG_SECONDS)
    finally:
        held.set()
    # Committed before the call: archived, its event in the outbox, nothing published.
    assert world.state(25) == ("SUCCEEDED", 1)
    [kept] = outbox(world.db)
    bus.received(0)
    grace_over(world.db)
    sweep()
    [event] = bus.received(1)
    assert event["detail"]["eventId"] == str(kept["event_id"])
    assert event["detail"]["recordId"] == "25"


def test_the_sweeper_publishes_the_failures_it_concludes_in_the_same_run(
    events_on: World, bus: Bus
) -> None:
    """A crashed last attempt (its lock expired): the sweeper fails the record and
    publishes its event in the same run, no grace period."""
    world = events_on
    world.crashed(26, attempts=3)
    summary = sweep()
    assert summary["failed"] == 1
    [event] = bus.received(1)
    assert event["detail-type"] == "Image Archive Failed"
    assert event["detail"]["errorClass"] == "lock-expired"
    assert event["detail"]["attempts"] == 3
    assert outbox(world.db) == []
    assert conclusion(world.db, 26)["published_by"] == "sweeper"


def test_a_claim_that_fails_an_expired_last_attempt_publishes_its_event(
    events_on: World, bus: Bus
) -> None:
    world = events_on
    world.crashed(27, attempts=3)
    world.deliver(27)
    assert world.state(27) == ("FAILED", 3)
    [event] = bus.received(1)
    assert event["detail-type"] == "Image Archive Failed"
    assert event["detail"]["error"] == "lock expired after the last attempt"


def test_the_record_s_story_tells_where_its_event_is(
    events_on: World, bus: Bus, gate: EventBridgeGate, pg_dsn: str
) -> None:
    """`archive-ctl show`'s story: the event waiting (its tries, its last error), then
    published by the sweeper, each in its place after the conclusion."""
    from lib.cli.show_events import describe
    from lib.state.stories import StoryRecords

    world = events_on
    world.settings(ARCHIVE_EVENT_BUS=bus.name)
    gate.script(Behaviour.throttled())
    world.record(28)
    world.deliver(28)
    grace_over(world.db)
    gate.script(Behaviour.throttled())
    sweep()  # a second refusal, now the sweeper's: a try counted with its error
    stories = StoryRecords(Database(DatabaseConfig(url=pg_dsn)))
    try:
        story = stories.story(28, lock_ttl_seconds=180, limit=30)
        *_, archived, waiting = story.events
        assert (archived.kind, waiting.kind) == ("archived", "publishing")
        words = describe(waiting, story.row.now if story.row else waiting.at)
        assert words.startswith(f"Image Archived {archived.detail['event_id']} not published")
        assert "1 failed tries; last: ThrottlingException" in words
        sweep()
        bus.received(1)
        *_, archived, published = stories.story(28, lock_ttl_seconds=180, limit=30).events
        assert published.kind == "published"
        assert published.at >= archived.at
        assert describe(published, published.at).endswith("on EventBridge, by the sweeper")
    finally:
        stories.db.close()
