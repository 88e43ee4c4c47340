from __future__ import annotations

from typing import Any

import pytest

from lib.archive.enqueue import send_records
from lib.archive.message import encode
from lib.platform.sqs import Queue, failed_entries


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


class ScriptedSender:
    """send_batch answers from a script: a dict of failed ids, or an exception to raise."""

    def __init__(self, *answers: dict[str, str] | Exception) -> None:
        self.answers = list(answers)
        self.batches: list[list[str]] = []

    def send_batch(self, queue_url: str, entries: Any) -> dict[str, str]:
        self.batches.append([entry_id for entry_id, _ in entries])
        answer = self.answers.pop(0) if self.answers else {}
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_send_records_sends_ten_per_call_with_the_contract_body() -> None:
    sender = ScriptedSender({}, {"15": "ThrottlingException"}, {})
    bodies: list[str] = []
    original = sender.send_batch

    def capture(queue_url: str, entries: Any) -> dict[str, str]:
        bodies.extend(body for _, body in entries)
        return original(queue_url, entries)

    sender.send_batch = capture  # type: ignore[method-assign]
    report = send_records(sender, "https://q", list(range(1, 24)))
    assert [len(batch) for batch in sender.batches] == [10, 10, 3]
    assert report.failed == {15: "ThrottlingException"}
    assert report.sent == [i for i in range(1, 24) if i != 15]
    assert report.unsent == [15]
    assert bodies[0] == encode(1)


def test_send_records_stops_at_a_whole_call_failure() -> None:
    boom = ConnectionError("sqs unreachable")
    report = send_records(ScriptedSender({}, boom), "https://q", list(range(1, 26)))
    assert report.sent == list(range(1, 11))
    assert report.not_tried == list(range(11, 26))  # the third call was never made
    assert report.error is boom
    assert report.unsent == list(range(11, 26))


def test_send_records_stops_when_out_of_time() -> None:
    budget = iter([True, False])
    sender = ScriptedSender()
    report = send_records(sender, "https://q", list(range(1, 16)), may_send=lambda: next(budget))
    assert report.sent == list(range(1, 11))
    assert report.not_tried == list(range(11, 16))
    assert report.out_of_time
    assert len(sender.batches) == 1
