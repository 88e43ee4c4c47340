"""The reference's tables that mirror a list in the code are the code's: the kinds of
event of a record's story, and the classes that run the statements."""

from __future__ import annotations

import re

from tests.docs.markdown import DATABASE, read, section


def test_the_event_kinds_are_lib_state_events_kinds() -> None:
    from lib.state.events import EventKind

    body = section(read(DATABASE), "## The events table")
    table = body.split("| kind | written by | detail |", 1)[1].split("\n\n", 1)[0]
    documented = [
        kind
        for line in table.splitlines()[2:]
        for kind in re.findall(r"`(\w+)`", line.split(" | ")[0])
    ]
    assert sorted(documented) == sorted(kind.value for kind in EventKind)


def test_the_statement_classes_are_those_that_derive_from_statements() -> None:
    import importlib
    import pkgutil

    import lib.state
    from lib.state.queries import Statements

    classes = set()
    for module in pkgutil.iter_modules(lib.state.__path__):
        loaded = importlib.import_module(f"lib.state.{module.name}")
        classes |= {
            name
            for name, value in vars(loaded).items()
            if isinstance(value, type) and issubclass(value, Statements) and value is not Statements
        }
    body = section(read(DATABASE), "## The statements")
    documented = set(re.findall(r"^\| `(\w+)` \| `\w+\.py` \|", body, re.M))
    assert documented == classes
    count = {10: "Ten", 11: "Eleven", 12: "Twelve", 9: "Nine", 8: "Eight"}[len(classes)]
    assert f"{count} classes" in " ".join(body.split())
