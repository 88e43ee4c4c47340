"""Counts in words for archive-ctl's output: `1 FAILED record`, `3 FAILED records`."""

from __future__ import annotations


def plural(count: int, one: str, many: str | None = None) -> str:
    """`count` and the noun that agrees with it: `one` for 1, `many` (by default `one`
    and an s) for any other number, 0 included."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def verb(count: int, one: str, many: str) -> str:
    """The verb that agrees with `count`: `was` or `were`, `is` or `are`."""
    return one if count == 1 else many
