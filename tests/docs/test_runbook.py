"""Every runbook entry has the same shape, so an operator at 3 a.m. finds each thing where
the last entry had it: what fired (and what it means for users), how to look (starting
from `archive-ctl status` or `archive-ctl show`), what to do, and how to tell it is over.
tests/docs/test_as_written.py checks that every alarm has its entry."""

from __future__ import annotations

import re

import pytest

from tests.docs.markdown import RUNBOOK, read

PARTS = ("**What fired.**", "**Look.**", "**Act", "**It is over when**")


def entries() -> dict[str, str]:
    """The heading of each alarm's entry -> its body."""
    text = read(RUNBOOK)
    entry = re.compile(r"^## ([^\n]*\(`\w+Alarm`[^\n]*\))\n(.*?)(?=^## |\Z)", re.S | re.M)
    return {m.group(1): m.group(2) for m in entry.finditer(text)}


def test_there_are_entries() -> None:
    assert len(entries()) >= 15


@pytest.mark.parametrize("heading", list(entries()))
def test_the_entry_has_the_four_parts_in_order(heading: str) -> None:
    body = entries()[heading]
    where = [body.find(part) for part in PARTS]
    assert -1 not in where, (heading, dict(zip(PARTS, where, strict=True)))
    assert where == sorted(where), heading
    fired = body[where[0] : where[1]]
    assert re.search(r"\b(users?|site)\b", fired), f"{heading}: what it means for users"
    look = body[where[1] : where[2]]
    assert re.search(r"`archive-ctl (status|show|list)", look), f"{heading}: look with archive-ctl"
    assert body[where[3] :].strip(), heading


def test_the_shape_check_catches_a_missing_part() -> None:
    body = "**What fired.** users wait.\n**Act.** do it.\n**It is over when** done."
    assert -1 in [body.find(part) for part in PARTS]
