"""The completion events' entries (lib.publish.entries), pure: what each detail type
carries, bounds on whatever a row holds, PutEvents' batches and what its answer means."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from lib.platform.config import load_settings
from lib.platform.errors import ConfigError
from lib.publish import entries
from lib.publish.entries import DetailType, Fate
from lib.state.error_classes import ERROR_CLASSES
from lib.state.outbox import OutboxEvent
from tests.docs.markdown import json_schema

AT = datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)


def event(detail_type: str, detail: dict[str, Any], **fields: Any) -> OutboxEvent:
    return OutboxEvent(
        "1b0e6f55-4a3e-4c57-9d5f-6a55b1a3e5c0", 42, detail_type, detail, AT, **fields
    )


def test_each_detail_type_carries_the_fields_its_schema_names() -> None:
    schema = json_schema("completion-event-detail")
    stored = {
        "attempts": 2,
        "hostedUrl": "https://img.example.com/i/a.png",
        "mimeType": "image/png",
        "size": 1234,
        "key": "abc123",
        "previousHostedUrl": "https://img.example.com/i/old.png",
        "previousKey": "old",
        "error": "download failed (HTTP 404): gone [attempt 1/3]",
    }
    for which in schema["oneOf"]:
        found = entries.detail(event(which["title"], stored))
        assert set(found) == set(which["required"]) == set(which["properties"]), which["title"]
        assert found["eventId"] == "1b0e6f55-4a3e-4c57-9d5f-6a55b1a3e5c0"
        assert (found["recordId"], found["time"]) == ("42", "2030-01-02T03:04:05.678Z")
    assert {s["title"] for s in schema["oneOf"]} == {str(t) for t in DetailType}
    [failed] = [s for s in schema["oneOf"] if s["title"] == DetailType.FAILED]
    classes = failed["properties"]["errorClass"]["enum"]
    assert classes == [*ERROR_CLASSES, None]
    assert entries.detail(event(DetailType.FAILED, stored))["errorClass"] == "download"


@pytest.mark.parametrize(
    "absurd",
    [
        {"hostedUrl": "https://h/" + "a" * 1_000_000, "error": "e" * 1_000_000},
        {"attempts": -1, "size": 2**80, "mimeType": ["not", "text"], "key": {"k": 1}},
        {"attempts": float("nan"), "size": 1.5, "hostedUrl": None, "error": None},
        {"attempts": True, "size": "12", "extra": "x" * 10_000},
    ],
)
def test_whatever_a_row_holds_the_entry_is_bounded_and_well_formed(absurd: dict[str, Any]) -> None:
    for detail_type in DetailType:
        item = entries.entry(event(detail_type, absurd))
        assert entries.entry_bytes(item) < 8_000
        detail = json.loads(item["Detail"])
        assert "extra" not in detail
        assert isinstance(detail["attempts"], int)
        assert detail["attempts"] >= 0
        if "size" in detail:
            assert detail["size"] is None or isinstance(detail["size"], int)
        for key in ("hostedUrl", "previousHostedUrl", "error"):
            if key in detail:
                assert isinstance(detail[key], str)
                assert len(detail[key]) <= 2_048


def test_texts_from_outside_are_redacted() -> None:
    stored = {
        "hostedUrl": "https://user:secret@img.example.com/a.png?X-Amz-Signature=abc",
        "previousHostedUrl": "https://img.example.com/old.png?token=t0ps3cret",
        "error": "upload failed: Bearer 1|abcdefgh refused\nsecond line",
    }
    text = json.dumps([entries.detail(event(t, stored)) for t in DetailType])
    for secret in ("secret@", "X-Amz-Signature=abc", "t0ps3cret", "1|abcdefgh", "\\n"):
        assert secret not in text, secret


def test_batches_keep_to_put_events_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    many = [event(DetailType.ARCHIVED, {"hostedUrl": f"https://h/{n}"}) for n in range(23)]
    assert [len(b) for b in entries.batches(many)] == [10, 10, 3]
    big = {"error": "x" * 400}
    heavy = [event(DetailType.FAILED, big) for _ in range(10)]
    three = 3 * entries.entry_bytes(entries.entry(heavy[0]))
    monkeypatch.setattr(entries, "MAX_REQUEST_BYTES", three)
    assert [len(b) for b in entries.batches(heavy)] == [3, 3, 3, 1]
    assert entries.batches([]) == []


def test_the_entry_is_what_put_events_takes() -> None:
    item = entries.entry(event(DetailType.RESTORED, {}))
    assert item["Source"] == "image-archive"
    assert item["DetailType"] == "Image Restored"
    assert item["Time"] == AT
    # Time counts 14 bytes; the texts their UTF-8 bytes.
    assert entries.entry_bytes(item) == 14 + len(b"image-archive") + len(b"Image Restored") + len(
        item["Detail"].encode()
    )


def test_put_events_answers_are_read_entry_by_entry() -> None:
    sent = [event(DetailType.ARCHIVED, {}, rejections=n) for n in (0, 0, 0, 2, 0, 0)]
    results = [
        {"EventId": "a"},
        {"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"},
        {"ErrorCode": "MalformedDetail", "ErrorMessage": "Detail is malformed."},
        {"ErrorCode": "InvalidArgument"},
        {"ErrorCode": "AccessDeniedException", "ErrorMessage": "no"},
        # one entry the answer does not account for
    ]
    found = entries.answers(sent, results)
    assert [a.fate for a in found] == [
        Fate.PUBLISHED,
        Fate.RETRY,
        Fate.REFUSED,
        Fate.REFUSED,
        Fate.RETRY,  # our configuration: kept until fixed, never dropped
        Fate.RETRY,
    ]
    assert [a.dropped for a in found] == [False, False, False, True, False, False]
    assert found[1].error == "ThrottlingException: Rate exceeded"
    assert found[5].error == "NotAcknowledged"
    assert entries.codes(found) == sorted(
        {
            "ThrottlingException",
            "MalformedDetail",
            "InvalidArgument",
            "AccessDeniedException",
            "NotAcknowledged",
        }
    )


def test_an_answer_s_error_text_is_bounded() -> None:
    [answer] = entries.answers(
        [event(DetailType.FAILED, {})],
        [{"ErrorCode": "X" * 500, "ErrorMessage": "Bearer 9|secretsecret " + "m" * 5_000}],
    )
    assert len(answer.error) < 300
    assert "secretsecret" not in answer.error


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        ("  ", None),
        ("default", "default"),
        ("orders/archive.v2-bus_1", "orders/archive.v2-bus_1"),
    ],
)
def test_the_event_bus_setting(value: str, expected: str | None) -> None:
    env = {"DATABASE_URL": "postgresql://u@h/d", "LSKY_BASE_URL": "https://i", "LSKY_TOKEN": "1|a"}
    assert load_settings({**env, "ARCHIVE_EVENT_BUS": value}).event_bus == expected


@pytest.mark.parametrize(
    "value",
    ["my bus name", "arn:aws:events:us-east-1:123456789012:event-bus/x", "a" * 257, "b;us", "巴士"],
)
def test_an_event_bus_that_cannot_be_one_stops_the_start_naming_the_setting(value: str) -> None:
    env = {"DATABASE_URL": "postgresql://u@h/d", "LSKY_BASE_URL": "https://i", "LSKY_TOKEN": "1|a"}
    with pytest.raises(ConfigError, match=re.escape("ARCHIVE_EVENT_BUS")) as raised:
        load_settings({**env, "ARCHIVE_EVENT_BUS": value})
    assert value.strip() not in str(raised.value)


def test_time_is_iso_8601_utc_with_milliseconds() -> None:
    local = AT.astimezone(ZoneInfo("Asia/Shanghai"))
    assert entries.iso_time(local) == "2030-01-02T03:04:05.678Z"
    assert entries.iso_time(AT + timedelta(microseconds=999)) == "2030-01-02T03:04:05.678Z"
