"""Calling the archive handler as Lambda would: an SQS event and a context object."""

from __future__ import annotations

import json
from typing import Any

from devkit.context import LambdaContext
from devkit.sqs import lambda_event

QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:archive-queue"


def event_for(*record_ids: int) -> dict[str, Any]:
    """A synthetic SQS event (fake receipt handles: the happy path never calls SQS)."""
    return lambda_event([json.dumps({"recordId": str(i)}) for i in record_ids], QUEUE_ARN)


def archive(*record_ids: int) -> dict[str, Any]:
    """Invoke handlers.archive.lambda_handler once; raise unless every record succeeded."""
    from handlers.archive import lambda_handler  # noqa: PLC0415 - imported where measured

    response: dict[str, Any] = dict(lambda_handler(event_for(*record_ids), LambdaContext()))
    if response.get("batchItemFailures"):
        raise RuntimeError(f"archive reported failures: {response}")
    return response
