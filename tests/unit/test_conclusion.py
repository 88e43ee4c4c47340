"""The conclusion table (lib.archive.conclusion.CONCLUSIONS): complete, consistent with the
ack-or-redeliver rule, and the copy in docs/explanation/attempt.md is the table itself."""

from __future__ import annotations

from pathlib import Path

from lib.archive.conclusion import CONCLUSIONS, Attempt, Send, Write
from lib.archive.outcome import Outcome

DOC = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "attempt.md"


def test_every_outcome_has_one_row() -> None:
    assert set(CONCLUSIONS) == set(Outcome)


def test_a_held_message_is_exactly_one_the_handler_reports_for_redelivery() -> None:
    for outcome, rule in CONCLUSIONS.items():
        comes_back = rule.send in (Send.HOLD, Send.NOW)
        assert comes_back is outcome.redelivers, outcome


def test_an_attempt_is_given_back_exactly_by_the_release_statements() -> None:
    for outcome, rule in CONCLUSIONS.items():
        gives_back = rule.write in (Write.RELEASE, Write.PARK)
        assert gives_back is (rule.attempt is Attempt.GIVEN_BACK), outcome
        writes_result = rule.write in (Write.SUCCEED, Write.RETRY, Write.FAIL)
        assert writes_result is (rule.attempt is Attempt.SPENT), outcome


def test_the_table_in_the_docs_is_the_code_s() -> None:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("| outcome | statement | message | metric | log line | attempt |")
    lines = text[start:].split("\n\n", 1)[0].splitlines()[2:]
    documented = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    expected = [
        [
            f"`{outcome}`",
            f"`{rule.write}`",
            str(rule.send),
            f"`{rule.metric}`" if rule.metric else "-",
            f"{rule.level}: {rule.log}",
            str(rule.attempt),
        ]
        for outcome, rule in CONCLUSIONS.items()
    ]
    assert documented == expected
