"""The project's own words are defined once (docs/glossary.md) and used only after a reader
can know them: on every page, the first use of a glossary word links its entry.

The index (docs/README.md) is exempt: it is the list of page titles, and it links the
glossary before any of them. Code, generated blocks and headings are not prose
(tests/docs/glossary.py)."""

from __future__ import annotations

import posixpath
import re

import pytest

from tests.docs.glossary import FORMS, GLOSSARY, PATTERNS, first_uses
from tests.docs.markdown import DOCS, INDEX, read

PAGES = [doc for doc in DOCS if doc not in (GLOSSARY, INDEX)]


def entries() -> dict[str, tuple[str, str]]:
    """anchor -> (the word, the entry's text), in the glossary's order."""
    text = read(GLOSSARY)
    found = {}
    for m in re.finditer(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.S | re.M):
        word = m.group(1).strip()
        found[word.lower().replace(" ", "-")] = (word, m.group(2))
    return found


def test_every_word_has_one_entry_and_every_entry_a_word() -> None:
    found = entries()
    assert list(found) == sorted(found), "the glossary is in alphabetical order"
    assert set(found) == set(FORMS)
    for anchor, (word, body) in found.items():
        assert len(body.split()) >= 8, f"{anchor}: an entry defines its word"
        assert PATTERNS[anchor].fullmatch(word), f"{anchor}: its forms include the word"


@pytest.mark.parametrize("doc", PAGES)
def test_a_page_links_each_word_where_it_first_uses_it(doc: str) -> None:
    target = posixpath.relpath(GLOSSARY, posixpath.dirname(doc) or ".") + "#"
    wrong = [
        (use.word, use.linked_to)
        for use in first_uses(read(doc))
        if use.linked_to != target + use.anchor
    ]
    assert wrong == [], f"{doc}: first uses not linked to their entry"


def test_the_glossary_links_a_word_it_uses_before_its_entry() -> None:
    """An entry may use another word; when that word's own entry comes later, the entry
    links it (`[word](#anchor)`), so no word is used before a reader can know it."""
    order = list(entries())
    forward = [
        (anchor, use.word, use.linked_to)
        for position, (anchor, (_, body)) in enumerate(entries().items())
        for use in first_uses(body)
        if order.index(use.anchor) > position and use.linked_to != f"#{use.anchor}"
    ]
    assert forward == []


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        ("A [lane](../glossary.md#lane) pauses.", []),
        ("The lane pauses.", [("lane", None)]),
        ("The [lane](../glossary.md#slot) pauses.", [("lane", "../glossary.md#slot")]),
        (
            "See [the lane and pacing](x.md), then the [lane](../glossary.md#lane).",
            [("lane", "x.md")],
        ),
        ("`lane` is code.\n\n```\nlane\n```\n\n## The lane\n", []),
        ("<!-- cli: x -->\nthe lane\n<!-- /cli -->\n", []),
    ],
)
def test_the_rule_finds_a_first_use_that_is_not_linked(
    text: str, problems: list[tuple[str, str | None]]
) -> None:
    found = [
        (use.word, use.linked_to)
        for use in first_uses(text)
        if use.anchor == "lane" and use.linked_to != "../glossary.md#lane"
    ]
    assert found == problems
