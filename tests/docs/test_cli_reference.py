"""The archive-ctl reference is the parser's: every command has its page and its generated
block, and each block is what tests/docs/cli_reference.py writes from lib.cli.parser today.
After changing the parser, `UPDATE_DOC_SAMPLES=1 .venv/bin/pytest tests/docs/test_cli_reference.py`
writes the blocks again (then read the diff)."""

from __future__ import annotations

import os
import re

import pytest

from tests.docs import cli_reference
from tests.docs.markdown import ARCHIVE_CTL, ROOT, read

UPDATE = os.environ.get("UPDATE_DOC_SAMPLES") == "1"


@pytest.fixture(scope="module", autouse=True)
def _rewritten() -> None:
    if UPDATE:
        cli_reference.rewrite()


def test_every_command_has_its_page_and_one_block_there() -> None:
    names = [name for name, _, _ in cli_reference.commands()]
    assert len(names) >= 12, names
    found = [(doc, name) for doc, name, _ in cli_reference.blocks()]
    expected = [(ARCHIVE_CTL, cli_reference.PROG)]
    expected += [(f"docs/reference/{cli_reference.page(name)}", name) for name in names]
    assert sorted(found) == sorted(expected)
    for name in names:
        heading = read(f"docs/reference/{cli_reference.page(name)}").splitlines()[0]
        assert heading == f"# `archive-ctl {name}`", heading


@pytest.mark.parametrize(
    ("doc", "name"), [(doc, name) for doc, name, _ in cli_reference.blocks()], ids=str
)
def test_the_block_is_what_the_parser_says(doc: str, name: str) -> None:
    [body] = [b for d, n, b in cli_reference.blocks() if (d, n) == (doc, name)]
    assert body == cli_reference.render(name), f"{doc}: run with UPDATE_DOC_SAMPLES=1"


def test_the_blocks_name_every_flag_default_and_exit_code() -> None:
    """The rendering itself misses nothing the parser holds (guards the renderer)."""
    from lib.cli.help import exit_codes

    for name, parser, _ in cli_reference.commands():
        text = cli_reference.render(name)
        for action in cli_reference._own(parser):
            row = f"| `{cli_reference._name(action)}` | {cli_reference._default(action)} |"
            assert row in text, (name, action.dest)
            assert all(flag in row for flag in action.option_strings), (name, row)
            if isinstance(action.default, int | float) and not isinstance(action.default, bool):
                assert f"`{action.default:g}`" in row, (name, row)
        codes = {int(code) for code in re.findall(r"^\| (\d+) \|", text, re.M)}
        assert codes == {code for code, _ in cli_reference.exit_codes(str(parser.epilog))}
        assert {0, 1, 2, 130} <= codes, name
    assert cli_reference.exit_codes(exit_codes((3, "x"))) == [
        (0, "done"),
        (1, "failed: configuration, database or SQS; the message says which"),
        (2, "bad command line"),
        (3, "x"),
        (130, "interrupted (Ctrl-C)"),
    ]


def test_hidden_options_stay_out_of_the_reference() -> None:
    """`--show` (how many rows a dry run lists) is a knob for the tests: --help hides it,
    and so does the reference."""
    assert "--show" not in read("docs/reference/archive-ctl/requeue.md")
    assert "--poll-seconds" not in read("docs/reference/archive-ctl/redrive-dlq.md")


def test_a_changed_parser_would_show() -> None:
    """A default or a help text the parser no longer has makes the block differ."""
    [(doc, body)] = [(d, b) for d, n, b in cli_reference.blocks() if n == "list"]
    assert "| `--limit N` | `50` |" in body
    assert body.replace("`50`", "`60`") != cli_reference.render("list")
    assert (ROOT / doc).exists()
