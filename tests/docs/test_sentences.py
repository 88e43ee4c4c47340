"""Short sentences: in the prose of docs/ and the README (outside code blocks, tables,
headings and comments), a page's median sentence has at most 22 words, and no sentence has
more than 50 (tests/docs/sentences.py says what a sentence and a word are)."""

from __future__ import annotations

import pytest

from tests.docs.markdown import DOCS, read
from tests.docs.sentences import median_words, sentences

PAGES = list(DOCS)  # docs/ and the front page
MEDIAN = 22
LONGEST = 50


@pytest.mark.parametrize("doc", PAGES)
def test_the_page_s_sentences_are_short(doc: str) -> None:
    found = sentences(doc, read(doc))
    assert found, f"{doc} has no prose"
    assert median_words(found) <= MEDIAN, (doc, median_words(found))
    too_long = [(s.words, s.text[:120]) for s in found if s.words > LONGEST]
    assert too_long == []


def test_the_docs_as_a_whole_keep_the_budget() -> None:
    every = [s for doc in PAGES for s in sentences(doc, read(doc))]
    assert len(every) > 1000
    assert median_words(every) <= MEDIAN


@pytest.mark.parametrize(
    ("text", "lengths"),
    [
        ("One two three. Four five!\nSix seven? Eight.", [3, 2, 2, 1]),
        ("Use `archive-ctl requeue --failed --since 2h` now.", [3]),
        ("See [the lane and pacing](x.md#y) first.", [6]),
        ("It waits, e.g. for a slot, vs. a pause. Then it goes.", [9, 3]),
        ("A ratio of 0.95 × and 1.5 s. Next.", [7, 1]),
        ("- one item\n- two items here\n\nA paragraph\nover two lines.", [2, 3, 5]),
        ("| a table | cell. Not prose. |\n\n```\ncode. Not prose.\n```\n\n## A heading. No.", []),
        ("<!-- a comment. Not prose. -->\nThe text.", [2]),
    ],
)
def test_the_splitter_counts_sentences_and_words(text: str, lengths: list[int]) -> None:
    assert [s.words for s in sentences("x", text)] == lengths
