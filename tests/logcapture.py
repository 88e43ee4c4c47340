"""Capture the service's Powertools JSON log lines, exactly as CloudWatch would get them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from lib.observability import logger


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


def parse(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines]
