"""Moving messages from the DLQ back to the archive queue (`archive-ctl redrive-dlq`).

StartMessageMoveTask on AWS; a manual receive/send/delete path (at-least-once) where the
API is missing (moto). docs/explanation/sweeper.md has the details.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from lib.archive.message import MalformedMessage, parse_record_id
from lib.platform.redact import outside_text

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import (
        ListMessageMoveTasksResultEntryTypeDef,
        MessageAttributeValueTypeDef,
        MessageTypeDef,
    )

# What an endpoint says when it does not have an operation at all. moto answers
# with a bare HTTP 500 whose "code" is just the status number.
NOT_IMPLEMENTED_CODES = frozenset(
    {"NotImplemented", "InvalidAction", "UnknownOperationException", "UnknownOperation"}
)
TASK_DONE_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED"})
BATCH = 10  # ReceiveMessage / SendMessageBatch / DeleteMessageBatch limit
# Long polling even on a full DLQ: a short poll samples only some SQS servers and
# can come back empty while messages remain, which would end the move early.
RECEIVE_WAIT_SECONDS = 2
# How long received messages stay hidden while they are sent and deleted.
MOVE_VISIBILITY_SECONDS = 60
PREVIEW_CHARS = 120
REASON_CHARS = 200  # the archive function's own reasons are one short line


def not_implemented(error: ClientError) -> bool:
    """True when the endpoint lacks the operation (as opposed to refusing this request)."""
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in NOT_IMPLEMENTED_CODES or status == 501 or (status == 500 and code.isdigit())


def queue_arn(client: SQSClient, url: str) -> str:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return attributes["Attributes"]["QueueArn"]


def dead_letter_queue_url(client: SQSClient, queue_url: str) -> str | None:
    """The DLQ named by the queue's RedrivePolicy, or None when it has none."""
    attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])
    policy = attributes.get("Attributes", {}).get("RedrivePolicy")
    if not policy:
        return None
    arn = str(json.loads(policy)["deadLetterTargetArn"])
    _, _, _, _, account, name = arn.split(":")
    return client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]


def start_move_task(
    client: SQSClient, *, dlq_arn: str, destination_arn: str | None, max_per_second: int | None
) -> str:
    """Start StartMessageMoveTask; returns its TaskHandle. Without a destination, SQS
    moves each message back to the queue it came from."""
    kwargs: dict[str, Any] = {"SourceArn": dlq_arn}
    if destination_arn:
        kwargs["DestinationArn"] = destination_arn
    if max_per_second:
        kwargs["MaxNumberOfMessagesPerSecond"] = max_per_second
    return client.start_message_move_task(**kwargs)["TaskHandle"]


def move_task(
    client: SQSClient, dlq_arn: str, handle: str
) -> ListMessageMoveTasksResultEntryTypeDef | None:
    tasks = client.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)
    return next((t for t in tasks.get("Results", []) if t.get("TaskHandle") == handle), None)


def _attributes(message: MessageTypeDef) -> dict[str, MessageAttributeValueTypeDef]:
    # Only the value fields: the list fields that ReceiveMessage returns are
    # "reserved for future use" and refused when sent.
    out: dict[str, MessageAttributeValueTypeDef] = {}
    for name, value in message.get("MessageAttributes", {}).items():
        kept: MessageAttributeValueTypeDef = {"DataType": value["DataType"]}
        if "StringValue" in value:
            kept["StringValue"] = value["StringValue"]
        if "BinaryValue" in value:
            kept["BinaryValue"] = value["BinaryValue"]
        out[name] = kept
    return out


def _receive(client: SQSClient, url: str, count: int, visibility: int) -> list[MessageTypeDef]:
    response = client.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=count,
        WaitTimeSeconds=RECEIVE_WAIT_SECONDS,
        VisibilityTimeout=visibility,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )
    return list(response.get("Messages", []))


def _release(client: SQSClient, url: str, messages: Sequence[MessageTypeDef]) -> None:
    """Make received messages visible again at once."""
    if messages:
        client.change_message_visibility_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                for i, m in enumerate(messages)
            ],
        )


class Action(enum.Enum):
    """What a manual redrive does with one DLQ message."""

    MOVE = "move"  # send it to the queue, then delete it from the DLQ
    DELETE = "delete"  # delete it from the DLQ
    LEAVE = "leave"  # keep it in the DLQ (hidden while the run lasts, visible again after)


def malformed(message: MessageTypeDef) -> bool:
    """A body the archive function refuses (lib.archive.message, the contract's parser):
    redriven, it would only come back to the DLQ."""
    try:
        parse_record_id(message.get("Body", ""))
    except MalformedMessage:
        return True
    return False


def move_all(message: MessageTypeDef) -> Action:
    return Action.MOVE


def leave_malformed(message: MessageTypeDef) -> Action:
    return Action.LEAVE if malformed(message) else Action.MOVE


def delete_malformed(message: MessageTypeDef) -> Action:
    return Action.DELETE if malformed(message) else Action.LEAVE


@dataclass
class ManualMove:
    moved: int = 0  # sent to the queue and deleted from the DLQ
    moved_malformed: int = 0  # of those, bodies the archive function refuses
    not_deleted: int = 0  # sent, but the delete failed: a copy will reappear in the DLQ
    send_failed: int = 0  # not sent; made visible again in the DLQ
    deleted: int = 0  # deleted without being sent (malformed, on request)
    delete_failed: int = 0  # to be deleted, but the delete failed: still in the DLQ
    left: int = 0  # left in the DLQ on request
    left_malformed: int = 0  # of those, bodies the archive function refuses
    stopped: str = "DLQ empty"

    @property
    def complete(self) -> bool:
        """Everything asked for was done (what was left, was left on request)."""
        return not (self.send_failed or self.not_deleted or self.delete_failed)


def _delete(client: SQSClient, url: str, messages: Sequence[MessageTypeDef]) -> int:
    """Delete from the DLQ; returns how many deletes failed."""
    if not messages:
        return 0
    deleted = client.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ],
    )
    return len(deleted.get("Failed", []))


def move_manually(
    client: SQSClient,
    *,
    dlq_url: str,
    queue_url: str,
    max_messages: int,
    decide: Callable[[MessageTypeDef], Action] = move_all,
    on_batch: Callable[[ManualMove], None] | None = None,
    before_send: Callable[[Sequence[MessageTypeDef]], None] | None = None,
) -> ManualMove:
    """Move, delete or leave up to `max_messages` DLQ messages, ten at a time, as `decide`
    says for each; `before_send` sees the messages to move before they are sent (their
    records' rows first, as a producer does). Messages left stay hidden while the run lasts
    (so they are not received again and again) and are made visible again at its end,
    however it ends.

    Bounded on purpose: while the archive function runs, a message that fails again
    can come back to the DLQ, and an unbounded loop would chase it forever.
    """
    result = ManualMove()
    moving = _Move(client, dlq_url, queue_url, before_send)
    kept: dict[str, MessageTypeDef] = {}  # message id -> its latest receipt
    try:
        while True:
            room = max_messages - result.moved - result.not_deleted - result.deleted
            if room <= 0:
                result.stopped = f"--max-messages {max_messages} reached"
                break
            messages = _receive(client, dlq_url, min(BATCH, room), MOVE_VISIBILITY_SECONDS)
            if not messages:
                break
            fresh = []
            for m in messages:
                if m["MessageId"] in kept:
                    kept[m["MessageId"]] = m  # left already; hidden again by this receive
                else:
                    fresh.append(m)
            actions = [(m, decide(m)) for m in fresh]
            for m, action in actions:
                if action is Action.LEAVE:
                    kept[m["MessageId"]] = m
                    result.left += 1
                    result.left_malformed += malformed(m)
            to_delete = [m for m, action in actions if action is Action.DELETE]
            failed = _delete(client, dlq_url, to_delete)
            result.deleted += len(to_delete) - failed
            result.delete_failed += failed
            to_move = [m for m, action in actions if action is Action.MOVE]
            if to_move and not moving.send(to_move, result):
                # Nothing of this batch could be sent: stop rather than spin on it.
                result.stopped = "the queue refused every message of a batch"
                break
            if on_batch is not None:
                on_batch(result)
    finally:
        left = list(kept.values())
        for start in range(0, len(left), BATCH):
            _release(client, dlq_url, left[start : start + BATCH])
    return result


@dataclass(frozen=True)
class _Move:
    """Where messages go, and who sees them first (their records' rows, before the send)."""

    client: SQSClient
    dlq_url: str
    queue_url: str
    before_send: Callable[[Sequence[MessageTypeDef]], None] | None = None

    def send(self, messages: Sequence[MessageTypeDef], result: ManualMove) -> bool:
        """Send to the queue, then delete what was sent; False when nothing could be sent."""
        if self.before_send is not None:
            self.before_send(messages)
        client, dlq_url = self.client, self.dlq_url
        sent = client.send_message_batch(
            QueueUrl=self.queue_url,
            Entries=[
                {"Id": str(i), "MessageBody": m["Body"], "MessageAttributes": _attributes(m)}
                for i, m in enumerate(messages)
            ],
        )
        ok = {int(entry["Id"]) for entry in sent.get("Successful", [])}
        unsent = [m for i, m in enumerate(messages) if i not in ok]
        _release(client, dlq_url, unsent)
        result.send_failed += len(unsent)
        done = [m for i, m in enumerate(messages) if i in ok]
        not_deleted = _delete(client, dlq_url, done)
        result.moved += len(done) - not_deleted
        result.moved_malformed += sum(malformed(m) for m in done)
        result.not_deleted += not_deleted
        return bool(done)


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ message as `redrive-dlq --dry-run` shows it."""

    message_id: str
    sent_at: datetime | None
    receive_count: int
    reason: str | None  # the archive function's `archive-error` attribute (malformed bodies)
    malformed: bool  # a body the archive function refuses: redriven, it comes back
    body_preview: str


def peek(client: SQSClient, dlq_url: str, limit: int) -> list[DeadLetter]:
    """Look at up to `limit` DLQ messages without moving them; they are visible again after."""
    received: list[MessageTypeDef] = []
    try:
        while len(received) < limit:
            batch = _receive(client, dlq_url, min(BATCH, limit - len(received)), 30)
            if not batch:
                break
            received += batch
    finally:
        for start in range(0, len(received), BATCH):
            _release(client, dlq_url, received[start : start + BATCH])
    letters = []
    for m in received:
        attributes = m.get("Attributes", {})
        sent_ms = attributes.get("SentTimestamp")
        # Anyone who may send to the DLQ may set it: shown redacted, on one bounded line.
        error_attribute = m.get("MessageAttributes", {}).get("archive-error")
        reason = error_attribute.get("StringValue") if error_attribute else None
        reason = outside_text(reason, REASON_CHARS) if isinstance(reason, str) else None
        letters.append(
            DeadLetter(
                message_id=m["MessageId"],
                sent_at=datetime.fromtimestamp(int(sent_ms) / 1000, UTC) if sent_ms else None,
                receive_count=int(attributes.get("ApproximateReceiveCount", 0)),
                reason=reason,
                malformed=malformed(m),
                body_preview=outside_text(m["Body"], PREVIEW_CHARS),
            )
        )
    return letters
