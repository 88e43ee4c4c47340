"""archive-ctl's argument types: each returns the value or raises ArgumentTypeError,
which argparse reports as a bad command line (exit code 2)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from lib.archive.message import MAX_RECORD_ID

_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """`24h`, `90m`, `7d`, `1d12h` (that long ago) or an ISO date/time (UTC unless it
    carries an offset)."""
    value = text.strip().lower()
    parts = _DURATION_PART.findall(value)
    if parts and "".join(number + unit for number, unit in parts) == value:
        seconds = sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts)
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (24h, 90m, 7d, 1d12h) nor an ISO date/time "
            "(2026-12-01, 2026-12-01T08:00, 2026-12-01T08:00+08:00)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def record_id(text: str) -> int:
    if text.isascii() and text.isdigit() and 0 < int(text) <= MAX_RECORD_ID:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a record id (a positive 64-bit integer)")


def positive(text: str) -> int:
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")


def positive_at_most(highest: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = positive(text)
        if value > highest:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {highest}")
        return value

    return parse


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value
