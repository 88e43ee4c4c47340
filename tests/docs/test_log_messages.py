"""Every log line the docs tell an operator to search for is one the code writes.

The docs quote a log message as the filter term one searches for, `"sweep finished"` (an
inline code span that is one double-quoted string, an ellipsis for what varies), and
write searches as `aws logs tail ... --filter-pattern '...'`. Each quoted term must be
found among the texts the code can log (tests/docs/log_texts.py reads them from the
source); a JSON filter's `$.outcome` and `$.level` must be values the code uses."""

from __future__ import annotations

import ast
import re

import pytest

from tests.docs.log_texts import emitted, logged, metric_names, modules
from tests.docs.markdown import (
    EVENTS,
    RUNBOOK,
    every_doc,
    fenced_blocks,
    inline_spans,
    read,
    section,
)

# Lines Lambda itself writes to a function's log group.
LAMBDA_LINES = {"Task timed out": "the runtime's line for an invocation that timed out"}
LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def quoted_messages() -> list[tuple[str, str]]:
    """(doc, phrase) for every `"..."` span and every quoted term of a filter pattern."""
    found = []
    for doc, text in every_doc().items():
        found += [
            (doc, span[1:-1]) for span in inline_spans(text) if re.fullmatch(r'"[^"]+"', span)
        ]
        for pattern in filter_patterns(text):
            if not pattern.lstrip().startswith("{"):
                found += [(doc, term) for term in re.findall(r'"([^"]+)"', pattern)]
    return found


def filter_patterns(text: str) -> list[str]:
    lines = [
        line for lang, body in fenced_blocks(text) if lang == "sh" for line in body.splitlines()
    ]
    lines += inline_spans(text)
    return [m.group(1) for line in lines for m in re.finditer(r"--filter-pattern '([^']*)'", line)]


def test_the_docs_quote_log_messages_and_searches() -> None:
    phrases = {phrase for _, phrase in quoted_messages()}
    assert len(phrases) >= 10, phrases  # the runbook quotes what it searches for
    assert filter_patterns(every_doc()[RUNBOOK])


def test_every_quoted_log_message_is_one_the_code_writes() -> None:
    unknown = [
        (doc, phrase)
        for doc, phrase in quoted_messages()
        if phrase not in LAMBDA_LINES and not emitted(phrase)
    ]
    assert unknown == [], "not a log line the code writes (tests/docs/log_texts.py)"


def test_json_filters_name_outcomes_and_levels_the_code_logs() -> None:
    from lib.archive.outcome import Outcome

    outcomes = {outcome.value for outcome in Outcome}
    named = []
    for text in every_doc().values():
        for pattern in filter_patterns(text):
            named += re.findall(r'\$\.(outcome|level) = "([^"]+)"', pattern)
    assert named, "no JSON filter on the outcome or the level"
    wrong = [
        (key, value)
        for key, value in named
        if value not in (outcomes if key == "outcome" else LEVELS)
    ]
    assert wrong == []


def test_bare_filter_terms_name_errors_the_code_raises() -> None:
    """`?ConfigError`: a word of the log line, here the name of the exception that a
    failed start logs."""
    classes = {
        node.name
        for module in modules().values()
        for node in ast.walk(module.tree)
        if isinstance(node, ast.ClassDef)
    }
    terms = [
        term
        for text in every_doc().values()
        for pattern in filter_patterns(text)
        if not pattern.lstrip().startswith("{")
        for term in re.findall(r"(?:^|\s)\??([A-Za-z]\w*)(?=\s|$)", re.sub(r'"[^"]*"', "", pattern))
    ]
    assert terms
    assert [term for term in terms if term not in classes] == []


def test_every_outcome_list_in_the_docs_is_the_code_s() -> None:
    """A list of outcomes a log line's `outcome` can hold names exactly lib.archive.outcome's."""
    from lib.archive.outcome import Outcome

    lists = [
        re.findall(r"`(\w+)`", match)
        for text in every_doc().values()
        for match in re.findall(r"\(`archived`, `retry`[^)]*\)", " ".join(text.split()))
    ]
    assert lists, "no doc lists the outcomes"
    for names in lists:
        assert sorted(names) == sorted(outcome.value for outcome in Outcome)


@pytest.mark.parametrize(
    ("phrase", "written"),
    [
        ("unexpected error while handling a message", True),
        ("unexpected error during archive", False),  # what the runbook once said
        ("database unavailable; message will be redelivered", True),
        ("42501: permission denied on … of table …", True),
        ("does not hold the bytes captured (SHA-256 differs)", True),
        ("archive stopped by our own fault; …", True),
        ("sweep finished", True),
        ("sweep completed", False),
    ],
)
def test_the_scan_finds_what_the_code_logs_and_nothing_else(phrase: str, written: bool) -> None:
    assert emitted(phrase) is written, [t for t in logged() if any(t)][:5]


def test_the_metrics_table_names_every_metric_the_code_counts() -> None:
    """The metrics table against lib's add_metric calls and verdicts."""
    body = section(read(EVENTS), "## Metrics")
    table = body.split("| metric | counted when |", 1)[1].split("\n\n", 1)[0]
    listed = {
        name
        for line in table.splitlines()[2:]
        for name in re.findall(r"`(\w+)`", line.split(" | ")[0])
    }
    assert listed == set(metric_names())
