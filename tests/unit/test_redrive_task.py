"""`redrive-dlq` on AWS: StartMessageMoveTask, and --wait following ListMessageMoveTasks.

moto does not implement the move-task API, so this path runs against botocore's Stubber,
which checks every request against the SQS service model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from lib.cli import dlq
from lib.cli import main as cli
from lib.cli.context import EXIT_ERROR, EXIT_OK, Context

QUEUE_URL = "https://sqs.eu-central-1.amazonaws.com/111122223333/image-archive-queue"
DLQ_URL = "https://sqs.eu-central-1.amazonaws.com/111122223333/image-archive-dlq"
QUEUE_ARN = "arn:aws:sqs:eu-central-1:111122223333:image-archive-queue"
DLQ_ARN = "arn:aws:sqs:eu-central-1:111122223333:image-archive-dlq"
HANDLE = "eyJ0YXNrSWQiOiJkNTEzIn0="


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    client = boto3.client(
        "sqs",
        region_name="eu-central-1",
        aws_access_key_id="stub",
        aws_secret_access_key="stub",
        endpoint_url="https://sqs.eu-central-1.amazonaws.com",
    )
    monkeypatch.setattr(Context, "sqs", property(lambda self: client))
    monkeypatch.setattr(Context, "sqs_no_retry", lambda self: client)
    monkeypatch.setenv("ARCHIVE_QUEUE_URL", QUEUE_URL)
    monkeypatch.setenv("ARCHIVE_DLQ_URL", DLQ_URL)
    with Stubber(client) as stubber:
        stubber.add_response(
            "get_queue_attributes",
            {"Attributes": {"QueueArn": DLQ_ARN}},
            {"QueueUrl": DLQ_URL, "AttributeNames": ["QueueArn"]},
        )
        stubber.add_response(
            "get_queue_attributes",
            {"Attributes": {"QueueArn": QUEUE_ARN}},
            {"QueueUrl": QUEUE_URL, "AttributeNames": ["QueueArn"]},
        )
        yield stubber
        stubber.assert_no_pending_responses()


def task(status: str, moved: int, **extra: Any) -> dict[str, Any]:
    return {
        "Results": [
            {
                "TaskHandle": HANDLE,
                "Status": status,
                "SourceArn": DLQ_ARN,
                "DestinationArn": QUEUE_ARN,
                "ApproximateNumberOfMessagesMoved": moved,
                "ApproximateNumberOfMessagesToMove": 7,
                **extra,
            }
        ]
    }


def test_redrive_starts_a_move_task_to_the_archive_queue(
    stub: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.add_response(
        "start_message_move_task",
        {"TaskHandle": HANDLE},
        {"SourceArn": DLQ_ARN, "DestinationArn": QUEUE_ARN, "MaxNumberOfMessagesPerSecond": 5},
    )

    assert cli.main(["redrive-dlq", "--rate", "5"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"started move task {HANDLE}: {DLQ_ARN} -> {QUEUE_ARN}" in out
    assert f"redrive-dlq --wait-for {HANDLE}" in out


def test_redrive_wait_follows_the_task_until_it_completes(
    stub: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.add_response("start_message_move_task", {"TaskHandle": HANDLE})
    listing = {"SourceArn": DLQ_ARN, "MaxResults": 10}
    stub.add_response("list_message_move_tasks", task("RUNNING", 3), listing)
    stub.add_response("list_message_move_tasks", task("COMPLETED", 7), listing)

    assert cli.main(["redrive-dlq", "--wait", "--poll-seconds", "0"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "RUNNING: 3 of 7 moved" in out
    assert "COMPLETED: 7 of 7 moved" in out


def test_a_failed_move_task_is_an_error_with_its_reason(
    stub: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.add_response("start_message_move_task", {"TaskHandle": HANDLE})
    stub.add_response(
        "list_message_move_tasks", task("FAILED", 2, FailureReason="AccessDenied on the queue")
    )

    assert cli.main(["redrive-dlq", "--wait", "--poll-seconds", "0"]) == EXIT_ERROR
    assert "move task FAILED: AccessDenied on the queue" in capsys.readouterr().err


def test_a_refused_move_task_is_reported_not_worked_around(
    stub: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    # e.g. the DLQ's RedriveAllowPolicy does not name the queue: moving by hand would
    # hide a misconfiguration, so this is an error.
    stub.add_client_error(
        "start_message_move_task",
        service_error_code="UnsupportedOperation",
        service_message="Source queue must be configured as a Dead Letter Queue.",
        http_status_code=400,
    )

    assert cli.main(["redrive-dlq"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "SQS StartMessageMoveTask: UnsupportedOperation: Source queue must be" in err


@pytest.mark.parametrize(
    ("body", "malformed"),
    [
        ('{"recordId": "123"}', False),
        ('{"recordId": 123, "extra": true}', False),
        ('{"recordId": "-4"}', True),
        ('{"recordId": "0"}', True),
        (f'{{"recordId": "{2**63}"}}', True),
        ("not json", True),
        ("", True),
        ("[]", True),
    ],
)
def test_malformed_is_what_the_archive_function_refuses(body: str, malformed: bool) -> None:
    message: Any = {"Body": body, "MessageId": "m", "ReceiptHandle": "r"}
    assert dlq.malformed(message) is malformed
    assert dlq.leave_malformed(message) is (dlq.Action.LEAVE if malformed else dlq.Action.MOVE)
    assert dlq.delete_malformed(message) is (dlq.Action.DELETE if malformed else dlq.Action.LEAVE)
    assert dlq.move_all(message) is dlq.Action.MOVE
