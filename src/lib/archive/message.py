"""The queue message contract: {"recordId": "123"} (a decimal string or a JSON number)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from lib.platform.errors import ServiceError

MAX_RECORD_ID = 2**63 - 1  # BIGINT
MAX_BODY_CHARS = 4096  # a valid body is tiny; don't parse megabytes of junk
# SentTimestamp is milliseconds since the epoch: anything outside these years is not one.
_SENT_RANGE_MS = (946_684_800_000, 4_102_444_800_000)  # 2000-01-01 .. 2100-01-01


class MalformedMessage(ServiceError):
    """The body does not follow the message contract; retrying cannot help."""


def parse_record_id(body: str | None) -> int:
    """The record id of a message body, or MalformedMessage saying what is wrong."""
    if body is None or not body.strip():
        raise MalformedMessage("empty body")
    if len(body) > MAX_BODY_CHARS:
        raise MalformedMessage(f"body is {len(body)} characters, expected a small JSON object")
    try:
        payload: Any = json.loads(body)
    except ValueError:
        raise MalformedMessage("body is not JSON") from None
    except RecursionError:
        # A few KB of brackets nest deeper than the parser's recursion limit (1000).
        raise MalformedMessage("body is JSON nested too deeply to parse") from None
    if not isinstance(payload, dict):
        raise MalformedMessage("body is not a JSON object")
    if "recordId" not in payload:
        raise MalformedMessage("body has no recordId")
    return _record_id(payload["recordId"])


def _record_id(value: Any) -> int:
    # bool is an int in Python; true is not a record id.
    if isinstance(value, bool):
        raise MalformedMessage("recordId must be a positive 64-bit integer")
    if isinstance(value, int):
        record_id = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        record_id = int(value)
    else:
        raise MalformedMessage("recordId must be a positive 64-bit integer")
    if not 0 < record_id <= MAX_RECORD_ID:
        raise MalformedMessage("recordId must be a positive 64-bit integer")
    return record_id


def encode(record_id: int) -> str:
    """The body a producer sends for a record (a string: JavaScript-safe)."""
    return json.dumps({"recordId": str(record_id)})


def sent_time(value: str | None) -> datetime | None:
    """A message's SentTimestamp attribute (epoch milliseconds, a string) as a UTC time;
    None when it is missing or not a time SQS could have written."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 13:
        return None
    milliseconds = int(value)
    if not _SENT_RANGE_MS[0] <= milliseconds < _SENT_RANGE_MS[1]:
        return None
    return datetime.fromtimestamp(milliseconds / 1000, UTC)
