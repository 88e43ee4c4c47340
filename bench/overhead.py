"""Point 3: per-message cost of the handler with a tiny image, against the local services.

One fresh process is one warm container. Messages go through moto's SQS like the event
source mapping's: SendMessage, ReceiveMessage (as a Lambda event), the handler, then
DeleteMessage. Only the handler call is timed. Message 0 is the container's first
(it opens the database connection); messages 1..100 are the warm ones reported.

Database round trips are counted, not estimated, two ways:
- statements: `Database.statements_run` (what the code asks for);
- round trips: every time pg8000 waits for the server's ReadyForQuery (devkit.roundtrips,
  which a test uses too: the archive path's count never grows unnoticed).
Connections: `Database.connections_opened`, and the server's own pg_stat_activity.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.child import child_main, run_child
from bench.common import Row, command_for, median, ms, ratio, write_results
from bench.services import REGION, TINY, Services

MESSAGES = 100
TARGET_ROUND_TRIPS = 3


def measure(args: dict[str, Any]) -> dict[str, Any]:
    # The child imports what it measures.
    from devkit import roundtrips  # noqa: PLC0415
    from devkit.postgres import connect  # noqa: PLC0415
    from lib.archive import runtime  # noqa: PLC0415

    with roundtrips.counted() as trips:
        per_message = _archive_each(args, trips)
    db = runtime.archive_worker().records.db
    check = connect(args["dsn"])
    try:
        [[backends]] = check.run(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'image-archive'"
        )
    finally:
        check.close()
    return {
        "messages": per_message,
        "connections_opened": db.connections_opened,
        "statements_run": db.statements_run,
        "server_backends": int(backends),
    }


def _archive_each(args: dict[str, Any], trips: Any) -> list[dict[str, Any]]:
    """Each record's message sent, received and handled; its time, statements, round trips."""
    import boto3  # noqa: PLC0415

    from devkit.context import LambdaContext  # noqa: PLC0415
    from devkit.sqs import create_queue_pair, receive_as_lambda_event  # noqa: PLC0415
    from handlers.archive import lambda_handler  # noqa: PLC0415
    from lib.archive import runtime  # noqa: PLC0415
    from lib.platform.eventbridge import EventBus  # noqa: PLC0415

    sqs = boto3.client("sqs")
    queues = create_queue_pair(sqs, f"bench-{int(time.time() * 1000)}")
    per_message: list[dict[str, Any]] = []
    # With a bus to alternate on, every second warm message publishes its completion event
    # (the container's records and publisher switched on and off): the two kinds of message
    # interleaved in one container, so that a machine's drift weighs on both alike.
    bus = EventBus(args["alternate_on"]) if args.get("alternate_on") else None
    for index, record_id in enumerate(args["record_ids"]):
        events = bus is not None and index % 2 == 1
        if bus is not None and index:
            worker = runtime.archive_worker()
            worker.records.written.publish = events
            worker.publisher.bus = bus if events else None
        sqs.send_message(QueueUrl=queues.url, MessageBody=f'{{"recordId": "{record_id}"}}')
        event = receive_as_lambda_event(sqs, queues, wait_seconds=2)
        if len(event["Records"]) != 1:
            raise RuntimeError("message did not arrive")
        # Before the first message the container has no worker (and no Database) yet.
        warm = runtime.archive_worker.cache_info().currsize
        statements0 = runtime.archive_worker().records.db.statements_run if warm else 0
        waits0 = trips.waits
        started = time.perf_counter()
        response = lambda_handler(event, LambdaContext())
        seconds = time.perf_counter() - started
        if response["batchItemFailures"]:
            raise RuntimeError(f"record {record_id} failed: {response}")
        db = runtime.archive_worker().records.db
        per_message.append(
            {
                "seconds": seconds,
                "statements": db.statements_run - statements0,
                "round_trips": trips.waits - waits0,
                "events": events,
            }
        )
        sqs.delete_message(QueueUrl=queues.url, ReceiptHandle=event["Records"][0]["receiptHandle"])
    return per_message


# With completion events on, a warm message costs one PutEvents more (on loopback, to an
# EventBridge that answers at once): at most this ratio of the time it takes with them off.
TARGET_EVENTS_RATIO = 1.10
BUS = "bench-archive-events"


def _container(
    services: Services, messages: int, *, alternate_on: str | None = None, **extra: str
) -> dict[str, Any]:
    """One container (a child process) archiving `messages` + 1 records; `alternate_on`:
    every second warm message publishes its completion event on that bus."""
    record_ids = services.seed(TINY, messages + 1)
    args = {"record_ids": record_ids, "dsn": services.dsn, "alternate_on": alternate_on}
    name = "overhead-events" if extra or alternate_on else "overhead"
    result: dict[str, Any] = run_child(
        "bench.overhead", args, services.handler_env(**extra), log_name=name
    )
    statuses = services.statuses(record_ids)
    if statuses != {"SUCCEEDED": messages + 1}:
        raise RuntimeError(f"overhead: not every archive succeeded: {statuses}")
    return result


def _consumer(endpoint: str) -> Callable[[], int]:
    """A rule on moto's bus sending every archive event to an SQS queue, as the generation
    service would subscribe; returns a counter of what arrived."""
    import boto3  # noqa: PLC0415

    kw: dict[str, Any] = {
        "endpoint_url": endpoint,
        "region_name": REGION,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    events, sqs = boto3.client("events", **kw), boto3.client("sqs", **kw)
    events.create_event_bus(Name=BUS)
    queue = sqs.create_queue(QueueName=f"{BUS}-{int(time.time() * 1000)}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]
    pattern = json.dumps({"source": ["image-archive"]})
    events.put_rule(Name="generation", EventBusName=BUS, EventPattern=pattern)
    events.put_targets(
        Rule="generation", EventBusName=BUS, Targets=[{"Id": "q", "Arn": arn["QueueArn"]}]
    )

    def arrived() -> int:
        attributes = sqs.get_queue_attributes(
            QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    return arrived


def _warm(results: list[dict[str, Any]], key: str, *, events: bool = False) -> list[Any]:
    return [m[key] for r in results for m in r["messages"][1:] if m["events"] is events]


def run(services: Services, messages: int = MESSAGES) -> list[Row]:
    from devkit.eventbridge import EventBridgeGate  # noqa: PLC0415

    arrived = _consumer(services.start_moto())
    # EventBridge on loopback that answers at once (an EventId per entry): the function's
    # own cost of a PutEvents, every second message of one container.
    gate = EventBridgeGate(None).start()
    try:
        endpoint = {"AWS_ENDPOINT_URL_EVENTBRIDGE": gate.endpoint_url}
        result = _container(services, 2 * messages, alternate_on=BUS, **endpoint)
    finally:
        gate.stop()
    taken = gate.taken
    # For reference: the same against moto's EventBridge, which delivers to a rule's queue.
    moto = _container(services, messages, ARCHIVE_EVENT_BUS=BUS)
    published = arrived()
    if taken != messages or published != messages + 1:
        raise RuntimeError(f"overhead: {taken} events taken, {published} delivered by moto")
    offs, ons = [result], [result]
    result = offs[0]
    first = result["messages"][0]
    times, times_on = _warm(offs, "seconds"), _warm(ons, "seconds", events=True)
    times_moto = _warm([moto], "seconds", events=False)
    p90 = statistics.quantiles(times, n=10)[-1]
    statements, statements_on = (
        sorted(set(_warm(offs, "statements"))),
        sorted(set(_warm(ons, "statements"))),
    )
    trips, trips_on = (
        sorted(set(_warm(offs, "round_trips"))),
        sorted(set(_warm(ons, "round_trips"))),
    )
    events_ratio = ratio(median(times_on), median(times))
    write_results(
        "overhead",
        {"messages": messages, **result, "moto": moto},
    )
    command = command_for("overhead")
    connections = result["connections_opened"]
    return [
        Row(
            "3",
            f"handler time per message, tiny image, {len(times)} warm messages",
            f"median {ms(median(times))}, p90 {ms(p90)} (first message {ms(first['seconds'])})",
            "reported",
            None,
            command,
        ),
        Row(
            "3",
            "DB round trips per archive (counted)",
            f"{'/'.join(map(str, trips))} round trips, {'/'.join(map(str, statements))} statements "
            f"(first message: {first['round_trips']} / {first['statements']}, incl. connect)",
            f"<= {TARGET_ROUND_TRIPS}",
            max(trips) <= TARGET_ROUND_TRIPS,
            command,
        ),
        Row(
            "3",
            "DB round trips per archive, completion events on (counted)",
            f"{'/'.join(map(str, trips_on))} round trips, "
            f"{'/'.join(map(str, statements_on))} statements ({taken} events published)",
            f"= events off ({'/'.join(map(str, trips))})",
            trips_on == trips and statements_on == statements,
            command,
        ),
        Row(
            "3",
            f"handler time per warm message, completion events on / off ({len(times_on)} "
            "each, alternating in one container; one PutEvents on loopback)",
            f"{events_ratio:.2f}x (median {ms(median(times_on))} / {ms(median(times))})",
            f"<= {TARGET_EVENTS_RATIO:.2f}x",
            events_ratio <= TARGET_EVENTS_RATIO,
            command,
        ),
        Row(
            "3",
            f"the same against moto's EventBridge ({len(times_moto)} warm messages, each "
            "event delivered to a rule's SQS queue)",
            f"median {ms(median(times_moto))} ({published} events arrived)",
            "reported",
            None,
            command,
        ),
        Row(
            "3",
            f"DB connections over {messages + 1} messages in one container",
            f"{connections} opened (server sees {result['server_backends']})",
            "1",
            connections == 1 and result["server_backends"] == 1,
            command,
        ),
    ]


if __name__ == "__main__":
    child_main(measure)
