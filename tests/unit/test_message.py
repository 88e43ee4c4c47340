from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from lib.archive.message import MalformedMessage, encode, parse_record_id, sent_time
from lib.archive.outcome import Message


@pytest.mark.parametrize(
    ("body", "record_id"),
    [
        ('{"recordId": "123"}', 123),
        ('{"recordId": 123}', 123),
        ('{"recordId": "9223372036854775807"}', 2**63 - 1),
        ('{"recordId": "42", "source": "nuxt", "extra": {"x": 1}}', 42),
        (encode(77), 77),
    ],
)
def test_valid_bodies(body: str, record_id: int) -> None:
    assert parse_record_id(body) == record_id


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("", "empty body"),
        ("   ", "empty body"),
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"123"', "not a JSON object"),
        ("{}", "no recordId"),
        ('{"record_id": 1}', "no recordId"),
        ('{"recordId": 0}', "positive 64-bit"),
        ('{"recordId": -5}', "positive 64-bit"),
        ('{"recordId": "-5"}', "positive 64-bit"),
        ('{"recordId": "9223372036854775808"}', "positive 64-bit"),
        ('{"recordId": 9223372036854775808}', "positive 64-bit"),
        ('{"recordId": 1.5}', "positive 64-bit"),
        ('{"recordId": "1e3"}', "positive 64-bit"),
        ('{"recordId": " 12"}', "positive 64-bit"),
        ('{"recordId": "١٢٣"}', "positive 64-bit"),  # Arabic-Indic digits: isdigit() but not ASCII
        ('{"recordId": true}', "positive 64-bit"),
        ('{"recordId": null}', "positive 64-bit"),
        ('{"recordId": ["1"]}', "positive 64-bit"),
        (json.dumps({"recordId": "1" * 5000}), "characters"),
    ],
)
def test_malformed_bodies_say_why(body: str, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason):
        parse_record_id(body)


@pytest.mark.parametrize("levels", [1500, 100_000])
def test_a_deeply_nested_body_is_malformed_not_a_crash(levels: int) -> None:
    body = '{"recordId": ' + "[" * levels + "]" * levels + "}"
    with pytest.raises(MalformedMessage) as malformed:
        parse_record_id(body)
    if levels == 1500:
        assert len(body) < 4096  # small enough to reach the parser
        assert "nested too deeply" in str(malformed.value)
    else:
        assert "characters" in str(malformed.value)  # refused by size before parsing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1796358179825", datetime(2026, 12, 4, 4, 22, 59, 825000, tzinfo=UTC)),
        ("946684800000", datetime(2000, 1, 1, tzinfo=UTC)),
        (None, None),
        ("", None),
        ("0", None),  # 1970: not a time SQS writes
        ("-1796358179825", None),
        ("1796358179.825", None),
        ("1e12", None),
        ("４２", None),  # digits, but not ASCII ones
        ("4102444800000", None),  # 2100
        ("9" * 40, None),
    ],
)
def test_a_sent_timestamp_is_read_only_when_it_is_one(value: str | None, expected: object) -> None:
    assert sent_time(value) == expected


def test_only_a_first_receive_says_how_far_the_queue_was_read() -> None:
    sent = datetime(2026, 12, 4, tzinfo=UTC)
    first = Message("m", "{}", "r", "arn", receive_count=1, sent_at=sent)
    assert first.queue_mark == sent
    assert replace(first, receive_count=2).queue_mark is None
    assert replace(first, sent_at=None).queue_mark is None
