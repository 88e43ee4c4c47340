"""The named statements of lib/sql/queries.sql, loaded once (procrastinate's model).

A block starts at `-- name: NAME`; whole-line comments are dropped and `{{NAME}}`
is replaced by that block's text, so a rule shared by statements is written once.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from lib.platform.db import Database
from lib.platform.observability import debug_enabled, logger

QUERIES_FILE = Path(__file__).resolve().parent.parent / "sql" / "queries.sql"
_HEADER = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)
_FRAGMENT = re.compile(r"\{\{(\w+)\}\}")


def parse(text: str) -> dict[str, str]:
    """name -> statement, fragments expanded; raises ValueError on an unknown fragment."""
    parts = _HEADER.split(text)
    raw: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in raw:
            raise ValueError(f"query {name!r} is defined twice")
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        raw[name] = "\n".join(lines).strip().rstrip(";").strip()

    def expand(name: str, seen: tuple[str, ...] = ()) -> str:
        if name not in raw:
            raise ValueError(f"unknown query fragment {name!r}")
        if name in seen:
            raise ValueError(f"query fragment {name!r} includes itself")
        return _FRAGMENT.sub(lambda m: expand(m.group(1), (*seen, name)), raw[name])

    return {name: expand(name) for name in raw}


QUERIES = parse(QUERIES_FILE.read_text(encoding="utf-8"))


class Statements:
    """Runs named statements on one Database: the base of the state package's classes,
    each the only code that runs its group of statements."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _run(self, name: str, **params: Any) -> list[list[Any]]:
        if not debug_enabled():
            return self.db.run(QUERIES[name], **params)
        # `-v` (or POWERTOOLS_LOG_LEVEL=DEBUG): each statement by name, with its time and
        # rows; never its parameters, which may carry an error text or a host's answer.
        started = time.perf_counter()
        rows = self.db.run(QUERIES[name], **params)
        elapsed_ms = round((time.perf_counter() - started) * 1000, 1)
        logger.debug("statement run", statement=name, ms=elapsed_ms, rows=len(rows))
        return rows
