"""The sentences a reader reads in a doc: its prose outside code blocks, tables, headings
and HTML comments, cut at the end of each sentence, and their lengths in words.

A paragraph, a list item and a block quote are read on their own: a sentence never runs
from one into the next. An inline code span counts as one word (a name, however long), a
link as its text. A sentence ends at `.`, `!` or `?` followed by a space, except after the
abbreviations a sentence goes on past (`e.g.`, `i.e.`, `vs.`)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

FENCE = re.compile(r"^( *)```.*?^\1```", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
CODE = re.compile(r"`[^`]+`")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|vs|cf)\.", re.I)
END = re.compile(r"(?<=[.!?])[\"')*]*\s+")
WORD = re.compile(r"\w", re.U)


@dataclass(frozen=True)
class Sentence:
    doc: str
    text: str

    @property
    def words(self) -> int:
        return sum(1 for token in self.text.split() if WORD.search(token))


def blocks(text: str) -> list[str]:
    """The paragraphs and list items of a doc's prose, each as one line."""
    text = FENCE.sub("\n", COMMENT.sub("", text))
    found: list[list[str]] = []
    current: list[str] = []

    def flush() -> None:
        nonlocal current
        if current:
            found.append(current)
        current = []

    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#")):
            flush()
            continue
        item = LIST_ITEM.match(line)
        if item:
            flush()
            current = [line[item.end() :].strip()]
        else:
            current.append(stripped.removeprefix("> "))
    flush()
    return [" ".join(block) for block in found]


def sentences(doc: str, text: str) -> list[Sentence]:
    found = []
    for block in blocks(text):
        plain = LINK.sub(r"\1", CODE.sub("CODE", block)).replace("**", "")
        plain = ABBREVIATIONS.sub(lambda m: m.group(1).replace(".", ""), plain)
        found += [Sentence(doc, part.strip()) for part in END.split(plain) if WORD.search(part)]
    return found


def median_words(found: list[Sentence]) -> float:
    return statistics.median(sentence.words for sentence in found)
