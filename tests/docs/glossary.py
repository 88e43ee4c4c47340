"""The project's own words (docs/glossary.md) and the forms a page may use them in.

Each entry of the glossary is a `## term` heading; its anchor is the key here, and the
pattern matches the term's forms as a reader meets them in prose (case aside). A page's
first use of a term must be a link to its entry (tests/docs/test_glossary.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

GLOSSARY = "docs/glossary.md"

FORMS = {
    "adopt": r"adopt(?:s|ed|ing|ion|ions)?",
    "altered": r"altered",
    "attempt": r"attempts?",
    "audit": r"audit(?:s|ed|ing)?",
    "backfill": r"backfill(?:s|ed|ing)?",
    "backoff": r"backoffs?",
    "booking": r"book(?:s|ed|ing|ings)?",
    "bytes-in-hand": r"bytes in hand",
    "claim": r"claim(?:s|ed|ing)?",
    "conclusion": r"conclu(?:de|des|ded|ding|sion|sions)",
    "drain": r"drain(?:s|ed|ing)?",
    "due": r"due",
    "give-back": r"g(?:ive|ives|iven|iving|ave) back",
    "grace-period": r"grace period",
    "hold": r"hold(?:s|ing)?|held",
    "hosted-copy": r"hosted cop(?:y|ies)",
    "lane": r"lanes?",
    "ledger": r"ledgers?",
    "live-record": r"live (?:records?|demand|uploads?)",
    "look-up": r"look-ups?",
    "lost-message": r"lost messages?",
    "lost-on-the-host": r"lost on the host",
    "original": r"originals?",
    "outbox": r"outbox(?:es)?",
    "own-fault": r"own fault",
    "pacing": r"pac(?:e|es|ed|ing)",
    "park": r"park(?:s|ed|ing)?",
    "pause": r"paus(?:e|es|ed|ing)",
    "probe": r"probes?",
    "provider": r"providers?",
    "receive-mark": r"receive mark",
    "record": r"records?",
    "redrive": r"redriv(?:e|es|en|ing)",
    "relay": r"relay(?:s|ed|ing)?",
    "requeue": r"requeu(?:e|es|ed|ing)",
    "restore": r"restor(?:e|es|ed|ing)",
    "slot": r"slots?",
    "stage": r"stag(?:e|es|ed|ing)|captur(?:e|es|ed|ing)",
    "stamp": r"stamp(?:s|ed)?",
    "story": r"stor(?:y|ies)",
    "stray": r"strays?",
    "sweeper": r"sweep(?:s|er|ers)?",
    "unconcluded": r"unconcluded",
    "verdict": r"verdicts?",
    "wait-reason": r"wait reasons?",
    "window": r"windows?",
}
PATTERNS = {
    anchor: re.compile(rf"(?<![\w-])(?:{forms})(?![\w-])", re.I) for anchor, forms in FORMS.items()
}
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
HEADING = re.compile(r"^#+ .*$", re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE = re.compile(r"`[^`]*`")
FENCE = re.compile(r"^( *)```.*?^\1```", re.S | re.M)
# The archive-ctl reference's blocks are written from the parser (tests/docs/cli_reference.py):
# its help texts, as code is, are no prose of the docs.
GENERATED = re.compile(r"^<!-- cli: .*?^<!-- /cli -->$", re.S | re.M)


def readable(text: str) -> str:
    """The text with what is no prose blanked out, character for character: code blocks,
    generated blocks, inline code, HTML comments, headings and link targets. Positions stay
    the text's."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    masked = FENCE.sub(blank, text)
    masked = GENERATED.sub(blank, masked)
    masked = COMMENT.sub(blank, masked)
    masked = HEADING.sub(blank, masked)
    masked = CODE.sub(blank, masked)
    return re.sub(r"\]\([^)]*\)", lambda m: "]" + " " * (len(m.group(0)) - 1), masked)


@dataclass(frozen=True)
class Use:
    """A term's first use on a page: where, and the glossary entry it links to, if any."""

    anchor: str
    start: int
    word: str
    linked_to: str | None


def first_uses(text: str) -> list[Use]:
    masked = readable(text)
    links = [(m.start(1), m.end(1), m.group(2)) for m in LINK.finditer(text)]
    found = []
    for anchor, pattern in PATTERNS.items():
        match = pattern.search(masked)
        if match is None:
            continue
        target = next((t for s, e, t in links if s <= match.start() < e), None)
        found.append(Use(anchor, match.start(), match.group(0), target))
    return sorted(found, key=lambda use: use.start)
