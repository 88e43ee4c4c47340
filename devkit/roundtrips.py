"""Database round trips, counted rather than estimated: every time pg8000 waits for the
server's ReadyForQuery (`CoreConnection.handle_messages`) in this process. A prepared
statement's execution is one such wait; a one-off statement with parameters is three
(Parse, Describe, Bind/Execute). Bench point 3 counts the archive path with it, and a test
holds the path to its count (tests/integration/test_story_costs.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pg8000.core


@dataclass
class RoundTrips:
    waits: int = 0


@contextlib.contextmanager
def counted() -> Iterator[RoundTrips]:
    """Count the round trips of every pg8000 connection in this process while inside."""
    counter = RoundTrips()
    original = pg8000.core.CoreConnection.handle_messages

    def counting(self: Any, context: Any) -> Any:
        counter.waits += 1
        return original(self, context)

    pg8000.core.CoreConnection.handle_messages = counting  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        pg8000.core.CoreConnection.handle_messages = original  # type: ignore[method-assign]
