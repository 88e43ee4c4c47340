"""The few SQS calls the functions make themselves (the event source mapping does the rest).

boto3 is imported on first use: it is the largest import of the package and the
happy path of an archive never needs it.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from lib.platform import aws

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


MAX_VISIBILITY_SECONDS = 43_200  # SQS's ceiling for ChangeMessageVisibility (12 h)
# SendMessageBatch's limit on entries per call.
MAX_BATCH_ENTRIES = 10


def queue_url_from_arn(arn: str, endpoint_url: str | None = None) -> str:
    """arn:aws:sqs:REGION:ACCOUNT:NAME -> the queue URL (no GetQueueUrl round trip)."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[2] != "sqs":
        raise ValueError(f"not an SQS queue ARN: {arn!r}")
    _, partition, _, region, account, name = parts
    if endpoint_url:
        return f"{endpoint_url.rstrip('/')}/{account}/{name}"
    suffix = "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"
    return f"https://sqs.{region}.{suffix}/{account}/{name}"


def failed_entries(entry_ids: Sequence[str], response: Mapping[str, Any]) -> dict[str, str]:
    """The entries of a SendMessageBatch call that were not sent, id -> error code.

    An entry that SQS lists neither as Successful nor as Failed counts as failed: a
    caller that records "sent" must never assume a send that did not happen.
    """
    succeeded = {str(entry["Id"]) for entry in response.get("Successful", [])}
    reported = {
        str(entry["Id"]): str(entry.get("Code") or "Failed") for entry in response.get("Failed", [])
    }
    return {
        entry_id: reported.get(entry_id, "NotAcknowledged")
        for entry_id in entry_ids
        if entry_id in reported or entry_id not in succeeded
    }


@dataclass(frozen=True)
class QueueCounts:
    """GetQueueAttributes' approximate counts (they settle about a minute after a change)."""

    visible: int  # waiting to be received
    in_flight: int  # received and not deleted: being handled, or held (a visibility set)
    delayed: int  # sent with a delay that has not run out
    retention_seconds: int | None = None  # how long SQS keeps a message from its first send
    date: datetime | None = None  # the answer's Date header: SQS's clock, whole seconds

    @property
    def waiting(self) -> int:
        """Messages still to be received: visible or delayed."""
        return self.visible + self.delayed


def _count(value: object) -> int:
    text = str(value)
    if not text.isdigit() or len(text) > 12:
        raise ValueError(f"not a count: {text[:20]!r}")
    return int(text)


def http_date(value: object) -> datetime | None:
    """An HTTP Date header as an aware datetime; None when absent or not a date."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo is not None else None


class Queue:
    def __init__(
        self, *, connect_timeout: float = 2, read_timeout: float = 5, max_attempts: int = 2
    ) -> None:
        # Short by default: both functions call SQS inside a time budget (the archive
        # function after its transfer, the sweeper between pages), and one call can take
        # about max_attempts x (connect or read timeout) when SQS is unreachable.
        # Interactive tools may pass longer values.
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_attempts = max_attempts

    @cached_property
    def client(self) -> SQSClient:
        sqs: SQSClient = aws.client(
            "sqs",
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            max_attempts=self._max_attempts,
        )
        return sqs

    def connect(self) -> None:
        """Make the client now rather than on first use (it costs boto3's import and
        about a tenth of a second)."""
        _ = self.client

    def queue_url(self, arn: str) -> str:
        # The client's endpoint: AWS's regional one, or AWS_ENDPOINT_URL_SQS (boto3 reads it).
        return queue_url_from_arn(arn, self.client.meta.endpoint_url)

    def counts(self, queue_url: str) -> QueueCounts:
        """The queue's messages by state, its retention, and SQS's clock (one call).
        Raises ValueError for counts SQS should never send (not a number, negative)."""
        response = self.client.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
                "MessageRetentionPeriod",
            ],
        )
        attributes = response["Attributes"]
        headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        retention = attributes.get("MessageRetentionPeriod")
        return QueueCounts(
            visible=_count(attributes.get("ApproximateNumberOfMessages")),
            in_flight=_count(attributes.get("ApproximateNumberOfMessagesNotVisible")),
            delayed=_count(attributes.get("ApproximateNumberOfMessagesDelayed")),
            retention_seconds=None if retention is None else _count(retention),
            date=http_date(headers.get("date")),
        )

    def change_visibility(self, queue_arn: str, receipt_handle: str, seconds: int) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.queue_url(queue_arn),
            ReceiptHandle=receipt_handle,
            VisibilityTimeout=seconds,
        )

    def send(self, queue_url: str, body: str, attributes: dict[str, str] | None = None) -> str:
        response = self.client.send_message(
            QueueUrl=queue_url,
            MessageBody=body,
            MessageAttributes={
                name: {"DataType": "String", "StringValue": value}
                for name, value in (attributes or {}).items()
            },
        )
        return response["MessageId"]

    def send_batch(self, queue_url: str, entries: Sequence[tuple[str, str]]) -> dict[str, str]:
        """Send up to ten (entry id, body) pairs in one call; returns the failed ones (id -> code).

        A failure of the whole call (SQS unreachable, access denied) raises, as boto3 does.
        """
        if not entries:
            return {}
        if len(entries) > MAX_BATCH_ENTRIES:
            raise ValueError(f"at most {MAX_BATCH_ENTRIES} entries per batch, got {len(entries)}")
        response = self.client.send_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": entry_id, "MessageBody": body} for entry_id, body in entries],
        )
        return failed_entries([entry_id for entry_id, _ in entries], response)
