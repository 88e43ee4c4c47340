"""ArchiveFunction: SQS (BatchSize 1) -> archive one generated image to Lsky Pro.

Thin by design: Powertools turns each record into a call to the worker and reports
the records to redeliver as batchItemFailures (ReportBatchItemFailures). In Lambda with
events on, the completion events go out after the response (lib.platform.after_response).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from lib.archive.message import sent_time
from lib.archive.outcome import Message, Redelivered
from lib.archive.runtime import after_response, archive_worker, publishing_after_response
from lib.platform.observability import log_unexpected, logger, metrics, traced

# A record's failure is a batch item failure, not a function error: with BatchSize 1 an
# "entire batch failed" error would make Lambda back off the whole event source. The one
# deliberate function error is a missing setting at start-up (below), before any record.
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)


def record_handler(record: SQSRecord, lambda_context: LambdaContext) -> None:
    message = Message(
        message_id=record.message_id,
        body=record.body,
        receipt_handle=record.receipt_handle,
        queue_arn=record.event_source_arn,
        receive_count=int(record.attributes.approximate_receive_count or 1),
        sent_at=sent_time(record.attributes.get("SentTimestamp")),
    )
    owner = f"{lambda_context.aws_request_id}/{record.message_id}"
    try:
        result = archive_worker().process(
            message,
            owner=owner,
            remaining_ms=lambda_context.get_remaining_time_in_millis,
            publish_now=after_response() is None,
        )
    except Exception as error:
        # The safety net: Powertools marks the record failed, but never silently.
        log_unexpected("unhandled error for a message; SQS will redeliver it", error)
        raise
    if result.outcome.redelivers:
        raise Redelivered(result)


# Registers the extension now, during Lambda's init: it cannot register later.
@publishing_after_response
@traced
@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    archive_worker()  # a missing setting fails the invocation loudly, before any record
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
