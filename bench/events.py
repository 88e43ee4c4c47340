"""Point 3 with completion events on (docs/reference/events-and-metrics.md, "Completion
events"). Two containers run by AWS's runtime interface client (awslambdaric) against
devkit's Runtime and Extensions API, one with events off and one publishing each warm
message's event after its response to an EventBridge on loopback that answers at once,
invoked in turn so that drift weighs on both alike: the time to the response is held to
the one without; the busy time (the publication after it included) is reported. Round
trips come from bench.overhead's container; for reference, the same against moto."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.child import run_child
from bench.common import RESULTS, ROOT, Row, command_for, median, ms, ratio, write_results
from bench.lambda_call import event_for
from bench.services import REGION, TINY, Services

MESSAGES = 100
# With completion events on, a warm message's response (what its record's message waits
# for) takes at most this ratio of the time it takes with them off.
TARGET_EVENTS_RATIO = 1.10
BUS = "bench-archive-events"
# An invocation that has not ended by then has hung (a tiny archive takes milliseconds).
INVOKE_TIMEOUT_SECONDS = 60.0


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


@contextmanager
def _lambda(services: Services, name: str, **extra: str) -> Iterator[Any]:
    """One container: awslambdaric running the archive handler against devkit's Runtime
    and Extensions API (the stand-in is yielded)."""
    from devkit.lambda_runtime import LambdaRuntimeStandIn  # noqa: PLC0415

    api = LambdaRuntimeStandIn().start()
    env = services.handler_env(AWS_LAMBDA_RUNTIME_API=api.address, **extra)
    (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
    with (RESULTS / "logs" / f"events-{name}.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "awslambdaric", "handlers.archive.lambda_handler"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield api
        finally:
            process.kill()
            process.wait()
            api.stop()


def _in_turn(services: Services, apis: dict[str, Any], messages: int) -> dict[str, Any]:
    """`messages` + 1 tiny archives in each container, one invocation each in turn; per
    warm message, the seconds to its response and to its release (all extensions done)."""
    record_ids = {name: services.seed(TINY, messages + 1) for name in apis}
    timings: dict[str, dict[str, list[float]]] = {
        name: {"response": [], "busy": []} for name in apis
    }
    for index in range(messages + 1):
        for name, api in apis.items():
            invocation = api.invoke(
                event_for(record_ids[name][index]), timeout_seconds=INVOKE_TIMEOUT_SECONDS
            )
            if not invocation.done.wait(INVOKE_TIMEOUT_SECONDS):
                raise RuntimeError(f"events: {name}'s invocation did not end")
            if invocation.error is not None or invocation.response["batchItemFailures"]:
                raise RuntimeError(f"events: {name}: {invocation.error or invocation.response}")
            if index:  # the first is the container's cold start
                timings[name]["response"].append(invocation.responded - invocation.delivered)
                timings[name]["busy"].append(invocation.released - invocation.delivered)
    for name, ids in record_ids.items():
        statuses = services.statuses(ids)
        if statuses != {"SUCCEEDED": messages + 1}:
            raise RuntimeError(f"events: not every archive of {name} succeeded: {statuses}")
    return timings


def _warm(result: dict[str, Any], key: str, *, events: bool) -> list[Any]:
    return [m[key] for m in result["messages"][1:] if m["events"] is events]


def run(services: Services, messages: int = MESSAGES) -> list[Row]:
    from devkit.eventbridge import EventBridgeGate  # noqa: PLC0415

    arrived = _consumer(services.start_moto())
    gate = EventBridgeGate(None).start()
    try:
        loopback = {"AWS_ENDPOINT_URL_EVENTBRIDGE": gate.endpoint_url}
        inline = _container(services, 2 * messages, alternate_on=BUS, **loopback)
        taken_inline = gate.taken
        with (
            _lambda(services, "off") as off,
            _lambda(services, "on", ARCHIVE_EVENT_BUS=BUS, **loopback) as on,
            _lambda(services, "moto", ARCHIVE_EVENT_BUS=BUS) as moto,
        ):
            timings = _in_turn(services, {"off": off, "on": on, "moto": moto}, messages)
    finally:
        gate.stop()
    taken = gate.taken - taken_inline
    published = arrived()
    if taken_inline != messages or taken != messages + 1 or published != messages + 1:
        raise RuntimeError(
            f"events: {taken_inline} inline and {taken} after the response taken, "
            f"{published} delivered by moto"
        )
    response, response_on = median(timings["off"]["response"]), median(timings["on"]["response"])
    busy, busy_on = median(timings["off"]["busy"]), median(timings["on"]["busy"])
    times, times_on = _warm(inline, "seconds", events=False), _warm(inline, "seconds", events=True)
    trips, trips_on = (sorted(set(_warm(inline, "round_trips", events=e))) for e in (False, True))
    statements, statements_on = (
        sorted(set(_warm(inline, "statements", events=e))) for e in (False, True)
    )
    response_ratio = ratio(response_on, response)
    write_results("events", {"messages": messages, "inline": inline, "lambda": timings})
    command = command_for("events")
    warm = len(timings["on"]["response"])
    return [
        Row(
            "3",
            "DB round trips per archive, completion events on (counted)",
            f"{'/'.join(map(str, trips_on))} round trips, "
            f"{'/'.join(map(str, statements_on))} statements ({taken_inline} events published)",
            f"= events off ({'/'.join(map(str, trips))})",
            trips_on == trips and statements_on == statements,
            command,
        ),
        Row(
            "3",
            f"time to the response per warm message, completion events on / off ({warm} each, "
            "two awslambdaric containers in turn; PutEvents on loopback after the response)",
            f"{response_ratio:.2f}x (median {ms(response_on)} / {ms(response)})",
            f"<= {TARGET_EVENTS_RATIO:.2f}x",
            response_ratio <= TARGET_EVENTS_RATIO,
            command,
        ),
        Row(
            "3",
            "busy time per warm message (to the extension's release: held and billed), "
            "events on / off",
            f"{ratio(busy_on, busy):.2f}x (median {ms(busy_on)} / {ms(busy)})",
            "reported",
            None,
            command,
        ),
        Row(
            "3",
            "the same against moto's EventBridge (each event delivered to a rule's SQS "
            "queue): response / busy",
            f"median {ms(median(timings['moto']['response']))} / "
            f"{ms(median(timings['moto']['busy']))} ({published} events arrived)",
            "reported",
            None,
            command,
        ),
        Row(
            "3",
            f"handler time per warm message when published before returning (outside "
            f"Lambda; {len(times_on)} each, alternating in one container), on / off",
            f"{ratio(median(times_on), median(times)):.2f}x "
            f"(median {ms(median(times_on))} / {ms(median(times))})",
            "reported",
            None,
            command,
        ),
    ]
