"""Point 3: per-message cost of the handler with a tiny image, against the local services.

One fresh process is one warm container. Messages go through moto's SQS like the event
source mapping's: SendMessage, ReceiveMessage (as a Lambda event), the handler, then
DeleteMessage. Only the handler call is timed. Message 0 is the container's first
(it opens the database connection); messages 1..100 are the warm ones reported. The same
container archives 101 more from a provider that writes each answer's header and body
apart with Nagle on (Services.apart), in blocks of BLOCK alternating with the usual
provider's: the first opens its connection, the other 100 reuse it, and their median is
held to the usual provider's (a kept connection must add no delayed-ACK wait:
lib.transfer.quickack).

Database round trips are counted, not estimated, two ways:
- statements: `Database.statements_run` (what the code asks for);
- round trips: every time pg8000 waits for the server's ReadyForQuery (devkit.roundtrips,
  which a test uses too: the archive path's count never grows unnoticed).
Connections: `Database.connections_opened`, and the server's own pg_stat_activity.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.child import child_main, run_child
from bench.common import Row, command_for, median, ms, write_results
from bench.services import ORIGINALS_ENV, TINY, Services

MESSAGES = 100
TARGET_ROUND_TRIPS = 3
TARGET_APART = 1.2  # x the usual provider's warm message
# Messages from one provider in a row: within a block each request follows the last answer
# from its host closely, as in a busy queue (Linux then delays its ACKs); blocks alternate
# so that drift in the container's speed falls on both providers alike.
BLOCK = 10


def measure(args: dict[str, Any]) -> dict[str, Any]:
    # The child imports what it measures.
    from devkit import roundtrips  # noqa: PLC0415
    from devkit.postgres import connect  # noqa: PLC0415
    from lib.archive import runtime  # noqa: PLC0415

    with roundtrips.counted() as trips:
        per_message = _archive_each(args["record_ids"], trips, args.get("alternate_on"))
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


def _archive_each(
    record_ids: list[int], trips: Any, alternate_on: str | None = None
) -> list[dict[str, Any]]:
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
    # With a bus to alternate on (bench.events), every second warm message publishes its
    # completion event (the container's records and publisher switched on and off): the two
    # kinds interleaved in one container, so that a machine's drift weighs on both alike.
    bus = EventBus(alternate_on) if alternate_on else None
    for index, record_id in enumerate(record_ids):
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
                "record_id": record_id,
                "events": events,
                "seconds": seconds,
                "statements": db.statements_run - statements0,
                "round_trips": trips.waits - waits0,
            }
        )
        sqs.delete_message(QueueUrl=queues.url, ReceiptHandle=event["Records"][0]["receiptHandle"])
    return per_message


def run(services: Services, messages: int = MESSAGES) -> list[Row]:
    services.start_moto()
    record_ids = services.seed(TINY, messages + 1)
    apart_ids = services.seed(TINY, messages + 1, upstream=services.apart())
    args = {"record_ids": _in_blocks(record_ids, apart_ids), "dsn": services.dsn}
    # As deployed: every archive keeps its original (its PUT is the only S3 request).
    env = services.handler_env(**ORIGINALS_ENV)
    s3_before = len(services.originals_requests())
    result = run_child("bench.overhead", args, env, log_name="overhead")
    s3_calls = services.originals_requests()[s3_before:]
    statuses = services.statuses(record_ids + apart_ids)
    if statuses != {"SUCCEEDED": 2 * (messages + 1)}:
        raise RuntimeError(f"overhead: not every archive succeeded: {statuses}")
    from_apart = set(apart_ids)
    usual = [m for m in result["messages"] if m["record_id"] not in from_apart]
    first, warm = usual[0], usual[1:]
    times = [m["seconds"] for m in warm]
    p90 = statistics.quantiles(times, n=10)[-1]
    apart_first, *apart = [m for m in result["messages"] if m["record_id"] in from_apart]
    apart_times = [m["seconds"] for m in apart]
    apart_p90 = statistics.quantiles(apart_times, n=10)[-1]
    apart_ratio = median(apart_times) / median(times)
    statements = sorted({m["statements"] for m in warm})
    trips = sorted({m["round_trips"] for m in warm})
    write_results("overhead", {"messages": messages, "originals_requests": s3_calls, **result})
    command = command_for("overhead")
    connections = result["connections_opened"]
    methods = sorted({method for method, _ in s3_calls})
    return [
        Row(
            "3",
            f"handler time per message, tiny image kept as an original, {messages} warm messages",
            f"median {ms(median(times))}, p90 {ms(p90)} (first message {ms(first['seconds'])})",
            "reported",
            None,
            command,
        ),
        Row(
            "3",
            f"the same, {messages} warm messages from a provider writing header and body "
            "apart (Nagle on), vs the usual provider's in the same container",
            f"median {ms(median(apart_times))} vs {ms(median(times))} = {apart_ratio:.2f} x "
            f"(p90 {ms(apart_p90)}; first message from it {ms(apart_first['seconds'])})",
            f"<= {TARGET_APART} x",
            apart_ratio <= TARGET_APART,
            command,
        ),
        Row(
            "3",
            "S3 requests per archive, its original kept (counted at moto)",
            f"{len(s3_calls) / len(result['messages']):g} ({', '.join(methods)}: {len(s3_calls)} "
            f"over {len(result['messages'])} archives)",
            "1 (one PUT)",
            len(s3_calls) == len(result["messages"]) and methods == ["PUT"],
            command,
        ),
        Row(
            "3",
            "DB round trips per archive, its original kept (counted)",
            f"{'/'.join(map(str, trips))} round trips, {'/'.join(map(str, statements))} statements "
            f"(first message: {first['round_trips']} / {first['statements']}, incl. connect)",
            f"<= {TARGET_ROUND_TRIPS}",
            max(trips) <= TARGET_ROUND_TRIPS,
            command,
        ),
        Row(
            "3",
            f"DB connections over {len(result['messages'])} messages in one container",
            f"{connections} opened (server sees {result['server_backends']})",
            "1",
            connections == 1 and result["server_backends"] == 1,
            command,
        ),
    ]


def _in_blocks(usual: list[int], apart: list[int]) -> list[int]:
    """The order of the messages: usual[0] (the container's first), then BLOCK of the rest
    from each provider in turn."""
    order = usual[:1]
    for start in range(0, max(len(usual) - 1, len(apart)), BLOCK):
        order += usual[1 + start : 1 + start + BLOCK] + apart[start : start + BLOCK]
    return order


if __name__ == "__main__":
    child_main(measure)
