"""What triggers the functions in a local run: an SQS event source mapping and a schedule.

`SqsEventSource` behaves like Lambda's SQS event source mapping with
ReportBatchItemFailures and ScalingConfig.MaximumConcurrency:

- one poller per container, so at most MaximumConcurrency batches are in flight and
  nothing is received that no container can take (no over-pulling);
- polling that sees a message as soon as it is visible, up to BatchSize messages per
  ReceiveMessage. moto's long poll wakes at once for a new message but only once a second
  for one whose visibility ended (a held message coming back); SQS returns either at once.
  So the pollers short-poll every POLL_INTERVAL_SECONDS instead;
- after the invocation, only the records that succeeded are deleted; batch item
  failures are left alone, to come back when their visibility timeout ends (the
  handler may have changed it); a function error leaves the whole batch.

`Schedule` invokes a container every `interval` seconds, like EventBridge Scheduler.
Both report each invocation to a callback, from their own threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from devkit.containers import Container, Invocation
from devkit.sqs import QueuePair, receive_as_lambda_event

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["Delivery", "Schedule", "SqsEventSource", "scheduled_event"]

# Between two empty short polls (see the module docstring): a message is seen this late.
POLL_INTERVAL_SECONDS = 0.05


@dataclass(frozen=True)
class Delivery:
    """One invocation by an event source, as its callback sees it."""

    source: str  # "sqs" or "schedule"
    container: str
    event: dict[str, Any]
    invocation: Invocation
    deleted: int = 0  # messages deleted after the invocation
    left: int = 0  # messages left for their visibility timeout


class SqsEventSource:
    def __init__(
        self,
        *,
        clients: list[SQSClient],
        queue: QueuePair,
        containers: list[Container],
        on_delivery: Callable[[Delivery], None],
        batch_size: int = 1,
        wait_seconds: int = 0,
    ) -> None:
        """One boto3 client per container (made by the caller, in one thread: creating
        clients concurrently from the default session is not thread-safe)."""
        if len(clients) != len(containers):
            raise ValueError("one SQS client per container")
        self.queue = queue
        self.batch_size = batch_size
        self.wait_seconds = wait_seconds
        self._pairs = list(zip(clients, containers, strict=True))
        self._on_delivery = on_delivery
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._busy = 0
        self._busy_lock = threading.Lock()
        self.errors: list[str] = []

    @property
    def in_flight(self) -> int:
        """Invocations running now (their messages are received but not settled)."""
        with self._busy_lock:
            return self._busy

    def start(self) -> SqsEventSource:
        for client, container in self._pairs:
            thread = threading.Thread(
                target=self._poll, args=(client, container), name=f"poller-{container.name}"
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop receiving; an invocation still running is abandoned (its messages come
        back after their visibility timeout, as after a crash)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.wait_seconds + 10)
        self._threads.clear()

    def _poll(self, client: SQSClient, container: Container) -> None:
        while not self._stop.is_set():
            try:
                self._poll_once(client, container)
            except Exception as error:  # keep polling, like the service does
                self.errors.append(f"{type(error).__name__}: {error}")
                self._stop.wait(1)

    def _poll_once(self, client: SQSClient, container: Container) -> None:
        event = receive_as_lambda_event(
            client, self.queue, max_messages=self.batch_size, wait_seconds=self.wait_seconds
        )
        if not event["Records"]:
            if not self.wait_seconds:
                self._stop.wait(POLL_INTERVAL_SECONDS)
            return
        with self._busy_lock:
            self._busy += 1
        try:
            invocation = container.invoke(event, stop=self._stop)
            if invocation is None:
                return  # stopping
            succeeded = _succeeded(event, invocation)
            if succeeded:
                client.delete_message_batch(
                    QueueUrl=self.queue.url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": r["receiptHandle"]}
                        for i, r in enumerate(succeeded)
                    ],
                )
        finally:
            with self._busy_lock:
                self._busy -= 1
        self._on_delivery(
            Delivery(
                source="sqs",
                container=container.name,
                event=event,
                invocation=invocation,
                deleted=len(succeeded),
                left=len(event["Records"]) - len(succeeded),
            )
        )


def _succeeded(event: dict[str, Any], invocation: Invocation) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = event["Records"]
    if invocation.error is not None:
        return []  # a function error fails the whole batch
    response = invocation.response if isinstance(invocation.response, dict) else {}
    failures = response.get("batchItemFailures")
    if not isinstance(failures, list):
        return []  # with ReportBatchItemFailures, an unreadable response fails the batch
    failed = {str(item.get("itemIdentifier")) for item in failures if isinstance(item, dict)}
    return [record for record in records if record["messageId"] not in failed]


def scheduled_event(now: datetime | None = None) -> dict[str, Any]:
    """An EventBridge Scheduler "Scheduled Event" (see events/sweeper_schedule.json)."""
    moment = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": "0",
        "id": f"local-{time.monotonic_ns()}",
        "detail-type": "Scheduled Event",
        "source": "aws.scheduler",
        "account": "123456789012",
        "time": moment,
        "region": "us-east-1",
        "resources": ["arn:aws:scheduler:us-east-1:123456789012:schedule/default/local-sweeper"],
        "detail": {"attempt": "1"},
    }


class Schedule:
    """Invoke `container` every `interval` seconds (the first run after one interval)."""

    def __init__(
        self, *, container: Container, interval: float, on_delivery: Callable[[Delivery], None]
    ) -> None:
        self.container = container
        self.interval = interval
        self._on_delivery = on_delivery
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Schedule:
        self._thread = threading.Thread(target=self._run, name=f"schedule-{self.container.name}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            event = scheduled_event()
            invocation = self.container.invoke(event, stop=self._stop)
            if invocation is None:
                return
            self._on_delivery(Delivery("schedule", self.container.name, event, invocation))
