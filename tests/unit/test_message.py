from __future__ import annotations

import json

import pytest

from lib.archive.message import MalformedMessage, encode, parse_record_id


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
