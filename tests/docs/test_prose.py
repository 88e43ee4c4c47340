"""README.md and docs/ say what is true now, not when it became true: no dates, no commit
hashes, no issue numbers (a bench run's date belongs in bench/results/, which the bench
writes; the code's history belongs in git)."""

from __future__ import annotations

import re

import pytest

from tests.docs.markdown import DOCS, prose, read

MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
YEAR = r"(?:19|20)\d{2}"
# Anywhere, code blocks and sample outputs included: a sample shows a timestamp as its
# format (YYYY-MM-DDTHH:MM:SS+00:00), an example input a duration (`--since 30d`).
DATES = {
    # A date alone or a timestamp's (2026-12-04T03:56:02): not followed by another digit.
    "an ISO date": re.compile(rf"(?<![\w-]){YEAR}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?!\d)"),
    "a compact timestamp": re.compile(rf"(?<!\d){YEAR}(?:0[1-9]|1[0-2])[0-3]\dT\d{{4,6}}Z?"),
    "a month and year": re.compile(rf"\b{MONTH}\.? (?:\d{{1,2}},? )?{YEAR}\b"),
    "a day and month": re.compile(rf"\b\d{{1,2}} {MONTH}\b"),
    "a year in a sentence": re.compile(
        rf"\b(?:in|since|until|before|after|from|of|by|on|early|late|mid)[ -]{YEAR}\b", re.I
    ),
    "a time of day": re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})? ?(?:UTC|GMT|[AP]M)\b"),
}
# A git hash as git prints it: 7 to 40 lowercase hex digits, at least one digit and one
# letter, not part of a longer word, an id (`i-0123456789abcdef0`) or a UUID.
HASH = re.compile(r"(?<![\w\-.:|])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w\-/])")
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# In prose only: a record's number in a sample output (`#1 archived`) is no issue.
ISSUES = re.compile(r"\b(?:issues?|PRs?|pull requests?|tickets?)\s+#?\d+\b|(?<![\w&/])#\d+\b", re.I)


def findings(text: str) -> list[tuple[str, str]]:
    found = [(what, m.group(0)) for what, rule in DATES.items() for m in rule.finditer(text)]
    found += [("a commit hash", m.group(0)) for m in HASH.finditer(UUID.sub("", text))]
    found += [("an issue number", m.group(0)) for m in ISSUES.finditer(prose(text))]
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_the_doc_has_no_dates_commit_hashes_or_issue_numbers(doc: str) -> None:
    assert findings(read(doc)) == []


@pytest.mark.parametrize(
    "text",
    [
        "Last run, 2026-12-03 18:09 UTC, on main at 5f0e0c4: 1.04 x",
        "seven months from now (December 2026)",
        "deprecated on 30 June",
        "before issue 13: 1",
        "the branch (#21) made it",
        "main's `src/` at be724fe",
        "files in lsky/6b101cca06f0d.png",
        "alice_1234_20261202T124735Z.png",
        "```\n  paused until 2026-12-02T14:00:00+00:00\n```",
        "```\n  9  FAILED  failed 2026-12-04T03:56:02+00:00 (25 min ago)\n```",
        "Runs of 2026-12-03: 1.05",
        "in 2027 it goes",
    ],
)
def test_the_rules_catch_what_a_lab_notebook_writes(text: str) -> None:
    assert findings(text), text


@pytest.mark.parametrize(
    "text",
    [
        "`2001::/23` (Teredo), `2002::/16`, anything outside `2000::/3`",
        "```\n  fc32fef4-4f1d-4c29-bf06-6cea3de21365  sent YYYY-MM-DDTHH:MM:SS+00:00\n```",
        "`aws ssm start-session --target i-0123456789abcdef0`",
        "```\n   5.1s  archive-1  #1    archived     attempt 1/3\n```",
        "a 10 MB image, 20 a minute, 2 CPUs, `--since 30d`, 1.02 x, 999999 uploads",
        "`arn:aws:secretsmanager:...:secret:image-archive/db-Gh1JkL`",
        "the token `1|AbCdEf...`",
    ],
)
def test_the_rules_leave_formats_addresses_and_ids_alone(text: str) -> None:
    assert findings(text) == []
