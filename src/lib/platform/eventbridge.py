"""EventBridge's PutEvents, the one call the functions make to it (boto3 imported on first
use). One try per call and short timeouts: a call follows a record's conclusion, and a slow
or failing EventBridge must not delay the record's message (the outbox keeps what was not
published: lib.publish)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from lib.platform import aws

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient


# One try of at most about the two timeouts: made after a record's conclusion, so short.
CONNECT_TIMEOUT_SECONDS = 1.0
READ_TIMEOUT_SECONDS = 2.0


class EventBus:
    def __init__(self, name: str) -> None:
        self.name = name

    @cached_property
    def client(self) -> EventBridgeClient:
        # AWS_ENDPOINT_URL_EVENTBRIDGE (boto3 reads it) points it at a local EventBridge.
        events: EventBridgeClient = aws.client(
            "events",
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=READ_TIMEOUT_SECONDS,
            max_attempts=1,
            # The entries are ours, built and bounded by lib.publish.entries: botocore's
            # check of them would only cost every call its time.
            parameter_validation=False,
        )
        return events

    def put(self, entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """PutEvents; the answer's Entries, one per entry in order (an EventId, or an
        ErrorCode and ErrorMessage). A failure of the whole call raises, as boto3 does."""
        response = self.client.put_events(
            Entries=[{**entry, "EventBusName": self.name} for entry in entries]  # type: ignore[typeddict-item]
        )
        return [dict(entry) for entry in response.get("Entries", [])]
