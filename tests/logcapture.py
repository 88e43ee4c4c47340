"""Capture the service's Powertools JSON log lines, exactly as CloudWatch would get them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lib.platform.observability import logger


class _ListHandler(logging.Handler):
    def __init__(self, formatter: logging.Formatter | None) -> None:
        super().__init__()
        self.lines: list[str] = []
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def capture_logs() -> Iterator[list[str]]:
    """Yields the raw JSON lines the service logger writes while the block runs."""
    base = logging.getLogger(logger.name)
    handler = _ListHandler(logger.registered_formatter)
    previous = base.level
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        base.removeHandler(handler)
        base.setLevel(previous)


def parse(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


class LogAssertions:
    """For test harnesses holding `raw_logs` from capture_logs()."""

    raw_logs: list[str]

    def logs(self) -> list[dict[str, Any]]:
        return parse(self.raw_logs)

    def log_for(self, message: str) -> dict[str, Any]:
        """The last line with exactly this message; fails listing the messages seen."""
        matches = [line for line in self.logs() if line.get("message") == message]
        assert matches, f"no log line {message!r} in {[x.get('message') for x in self.logs()]}"
        return matches[-1]
