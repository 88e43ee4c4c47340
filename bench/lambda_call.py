"""Calling the archive handler as Lambda would: an SQS event and a context object."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from devkit.sqs import lambda_event

QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:archive-queue"


class Context:
    """Enough of the Lambda context for the handler and Powertools (120 s, 512 MB)."""

    function_name = "ArchiveFunction"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:ArchiveFunction"
    memory_limit_in_mb = 512
    log_group_name = "/aws/lambda/ArchiveFunction"
    log_stream_name = "bench"
    identity = None
    client_context = None

    def __init__(self, timeout_seconds: float = 120.0) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def event_for(*record_ids: int) -> dict[str, Any]:
    """A synthetic SQS event (fake receipt handles: the happy path never calls SQS)."""
    return lambda_event([json.dumps({"recordId": str(i)}) for i in record_ids], QUEUE_ARN)


def archive(*record_ids: int) -> dict[str, Any]:
    """Invoke handlers.archive.lambda_handler once; raise unless every record succeeded."""
    from handlers.archive import lambda_handler  # noqa: PLC0415 - imported where measured

    response: dict[str, Any] = dict(lambda_handler(event_for(*record_ids), Context()))
    if response.get("batchItemFailures"):
        raise RuntimeError(f"archive reported failures: {response}")
    return response
