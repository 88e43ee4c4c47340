from __future__ import annotations

from typing import Any

import pytest

from lib.queue import Queue, failed_entries


def test_failed_entries_lists_failed_and_unacknowledged() -> None:
    response = {
        "Successful": [{"Id": "1", "MessageId": "m1"}],
        "Failed": [{"Id": "2", "Code": "ThrottlingException", "SenderFault": False}],
    }
    # "3" is in neither list: it must not be taken as sent.
    assert failed_entries(["1", "2", "3"], response) == {
        "2": "ThrottlingException",
        "3": "NotAcknowledged",
    }
    assert failed_entries(["1"], {"Successful": [{"Id": "1"}]}) == {}


class FakeClient:
    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        self.calls: list[dict[str, Any]] = []

    def send_message_batch(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return self.response


def test_send_batch_sends_entries_by_id() -> None:
    queue = Queue()
    client = FakeClient({"Successful": [{"Id": "7"}], "Failed": [{"Id": "8", "Code": "X"}]})
    queue.__dict__["client"] = client  # the cached_property's slot: no boto3 needed
    assert queue.send_batch("https://q", [("7", "a"), ("8", "b")]) == {"8": "X"}
    assert client.calls == [
        {
            "QueueUrl": "https://q",
            "Entries": [{"Id": "7", "MessageBody": "a"}, {"Id": "8", "MessageBody": "b"}],
        }
    ]


def test_send_batch_limits() -> None:
    queue = Queue()
    queue.__dict__["client"] = FakeClient({})
    assert queue.send_batch("https://q", []) == {}
    with pytest.raises(ValueError, match="at most 10"):
        queue.send_batch("https://q", [(str(i), "x") for i in range(11)])
