"""The archive function wired to the real test services (see tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devkit.lsky import DEFAULT_TOKEN
from devkit.sqs import QueuePair, receive_as_lambda_event
from lib import runtime
from tests.logcapture import capture_logs, parse
from tests.support import FakeLambdaContext

TOKEN = DEFAULT_TOKEN


@dataclass
class ArchiveHarness:
    sqs: Any
    queues: QueuePair
    env: dict[str, str]
    raw_logs: list[str]

    def send(self, body: str) -> str:
        return str(self.sqs.send_message(QueueUrl=self.queues.url, MessageBody=body)["MessageId"])

    def receive(self, max_messages: int = 1, wait_seconds: int = 1) -> dict[str, Any]:
        return receive_as_lambda_event(
            self.sqs, self.queues, max_messages=max_messages, wait_seconds=wait_seconds
        )

    def invoke(self, event: dict[str, Any], context: FakeLambdaContext | None = None) -> Any:
        from handlers.archive import lambda_handler

        return lambda_handler(event, context or FakeLambdaContext())

    def settle(self, event: dict[str, Any], response: Any) -> None:
        """Do what Lambda's event source mapping does with a partial batch response:
        delete what succeeded, leave the batch item failures to their visibility."""
        failed = {item["itemIdentifier"] for item in response["batchItemFailures"]}
        for record in event["Records"]:
            if record["messageId"] not in failed and record["receiptHandle"]:
                self.sqs.delete_message(
                    QueueUrl=self.queues.url, ReceiptHandle=record["receiptHandle"]
                )

    def deliver(self, body: str, context: FakeLambdaContext | None = None) -> Any:
        """Send one message, receive it as Lambda would, invoke the handler, settle it."""
        self.send(body)
        event = self.receive()
        assert len(event["Records"]) == 1, "the message did not arrive"
        response = self.invoke(event, context)
        self.settle(event, response)
        return response

    def logs(self) -> list[dict[str, Any]]:
        return parse(self.raw_logs)

    def log_for(self, message: str) -> dict[str, Any]:
        matches = [line for line in self.logs() if line.get("message") == message]
        assert matches, f"no log line {message!r} in {[x.get('message') for x in self.logs()]}"
        return matches[-1]

    def visible(self, url: str | None = None) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url or self.queues.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"])

    def in_flight(self, url: str | None = None) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url or self.queues.url,
            AttributeNames=["ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessagesNotVisible"])


@pytest.fixture
def archive_env(
    monkeypatch: pytest.MonkeyPatch, pg_dsn: str, lsky: Any, queues: QueuePair
) -> Callable[..., dict[str, str]]:
    """Set the archive function's environment (overrides as keyword args) and reset its state."""

    def apply(**overrides: str | None) -> dict[str, str]:
        env: dict[str, str | None] = {
            "DATABASE_URL": pg_dsn,
            "LSKY_BASE_URL": lsky.base_url,
            "LSKY_TOKEN": TOKEN,
            "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8",
            "ARCHIVE_DLQ_URL": queues.dlq_url,
            "ARCHIVE_QUEUE_URL": queues.url,
            "ARCHIVE_RETRY_DELAYS": "30,120,600",
            "ARCHIVE_MAX_ATTEMPTS": "3",
            "LSKY_STRATEGY_ID": None,
            "LSKY_ALBUM_ID": None,
            "DB_SECRET_ARN": None,
            "LSKY_TOKEN_SECRET_ARN": None,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "ImageArchive",
            **overrides,
        }
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        runtime.reset()
        return {k: v for k, v in env.items() if v is not None}

    yield apply  # type: ignore[misc]
    runtime.reset()


@pytest.fixture
def archive(
    archive_env: Callable[..., dict[str, str]], sqs: Any, queues: QueuePair
) -> Iterator[ArchiveHarness]:
    env = archive_env()
    with capture_logs() as raw:
        yield ArchiveHarness(sqs=sqs, queues=queues, env=env, raw_logs=raw)
