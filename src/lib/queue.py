"""The few SQS calls the archive function makes itself (the event source mapping does the rest).

boto3 is imported on first use: it is the largest import of the package and the
happy path of an archive never needs it.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


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


class Queue:
    @cached_property
    def client(self) -> SQSClient:
        import boto3  # noqa: PLC0415 - deferred, see the docstring
        from botocore.config import Config  # noqa: PLC0415

        config = Config(
            connect_timeout=3, read_timeout=10, retries={"max_attempts": 3, "mode": "standard"}
        )
        return boto3.client("sqs", config=config)

    def queue_url(self, arn: str) -> str:
        return queue_url_from_arn(arn, os.environ.get("AWS_ENDPOINT_URL_SQS"))

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
