"""Point 3 with completion events on (docs/reference/events-and-metrics.md, "Completion
events"): the same container as bench.overhead archiving tiny images, every second warm
message publishing its event with one PutEvents to an EventBridge on loopback that
answers at once (devkit.eventbridge), the two kinds interleaved so that drift weighs on
both alike. Round trips and statements per archive must not change; the time is held to
the one without. For reference, the same against moto's EventBridge, which delivers to a
rule's SQS queue."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from bench.child import run_child
from bench.common import Row, command_for, median, ms, ratio, write_results
from bench.services import REGION, TINY, Services

MESSAGES = 100
# With completion events on, a warm message costs one PutEvents more: at most this ratio of
# the time it takes with them off.
TARGET_EVENTS_RATIO = 1.10
BUS = "bench-archive-events"


def _container(
    services: Services, messages: int, *, alternate_on: str | None = None, **extra: str
) -> dict[str, Any]:
    """One container (a child process of bench.overhead) archiving `messages` + 1 records;
    `alternate_on`: every second warm message publishes its completion event on that bus."""
    record_ids = services.seed(TINY, messages + 1)
    args = {"record_ids": record_ids, "dsn": services.dsn, "alternate_on": alternate_on}
    result: dict[str, Any] = run_child(
        "bench.overhead", args, services.handler_env(**extra), log_name="events"
    )
    statuses = services.statuses(record_ids)
    if statuses != {"SUCCEEDED": messages + 1}:
        raise RuntimeError(f"events: not every archive succeeded: {statuses}")
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


def _warm(result: dict[str, Any], key: str, *, events: bool) -> list[Any]:
    return [m[key] for m in result["messages"][1:] if m["events"] is events]


def run(services: Services, messages: int = MESSAGES) -> list[Row]:
    from devkit.eventbridge import EventBridgeGate  # noqa: PLC0415

    arrived = _consumer(services.start_moto())
    gate = EventBridgeGate(None).start()
    try:
        endpoint = {"AWS_ENDPOINT_URL_EVENTBRIDGE": gate.endpoint_url}
        result = _container(services, 2 * messages, alternate_on=BUS, **endpoint)
    finally:
        gate.stop()
    taken = gate.taken
    moto = _container(services, messages, ARCHIVE_EVENT_BUS=BUS)
    published = arrived()
    if taken != messages or published != messages + 1:
        raise RuntimeError(f"events: {taken} events taken, {published} delivered by moto")
    times, times_on = _warm(result, "seconds", events=False), _warm(result, "seconds", events=True)
    times_moto = _warm(moto, "seconds", events=False)
    trips, trips_on = (sorted(set(_warm(result, "round_trips", events=e))) for e in (False, True))
    statements, statements_on = (
        sorted(set(_warm(result, "statements", events=e))) for e in (False, True)
    )
    events_ratio = ratio(median(times_on), median(times))
    write_results("events", {"messages": messages, **result, "moto": moto})
    command = command_for("events")
    return [
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
    ]
