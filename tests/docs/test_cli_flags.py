"""Every flag the docs give archive-ctl, or `make local`, is one its parser has.

tests/docs/test_as_written.py parses the archive-ctl commands a reader could copy; this
covers what it skips: synopses (`requeue --failed [--since WHEN]`), headings, table rows
and a flag named alone in the section of its command (`--ahead-seconds`)."""

from __future__ import annotations

import argparse
import ast
import re
import shlex

import pytest

from tests.docs.log_texts import modules
from tests.docs.markdown import ARCHIVE_CTL, every_doc, fenced_blocks, inline_spans, read, section

FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def archive_ctl_flags(words: list[str]) -> tuple[str, set[str]]:
    """The command `words` start with (`lane clear`) and the flags it accepts."""
    from lib.cli.main import build_parser

    parser = build_parser()
    accepted = _flags(parser)
    path = []
    for word in words:
        commands = _subparsers(parser)
        if word not in commands:
            break
        parser = commands[word]
        path.append(word)
        accepted |= _flags(parser)
    return " ".join(path), accepted


def mentions() -> list[tuple[str, str, list[str]]]:
    """(doc, text, words after `archive-ctl`) for every line, span, heading or table row
    that runs or shows archive-ctl."""
    found = []
    for doc, text in every_doc().items():
        lines = [line for _, body in fenced_blocks(text) for line in body.splitlines()]
        lines += inline_spans(text)
        lines += re.findall(r"^#+ (.*archive-ctl.*)$", text, re.M)
        for line in lines:
            for match in re.finditer(r"archive-ctl\s+(.*?)(?:\s#\s.*|\s[|]\s.*|$)", line):
                words = match.group(1).replace("`", " ").split()
                found.append((doc, line, words))
    return found


def command_table() -> list[list[str]]:
    """The command of each row of the archive-ctl reference's command table."""
    text = read(ARCHIVE_CTL)
    assert "\n| command | does |\n" in text, f"{ARCHIVE_CTL} has no command table"
    table = text.split("\n| command | does |\n", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| [`")]
    return [re.findall(r"`([^`]+)`", row)[0].split() for row in rows]


def test_every_archive_ctl_flag_named_exists() -> None:
    unknown = []
    checked = 0
    for doc, line, words in mentions():
        command, accepted = archive_ctl_flags(words)
        for flag in FLAG.findall(" ".join(words)):
            checked += 1
            if flag not in accepted:
                unknown.append((doc, command or "(no command)", flag, line))
    assert checked > 30
    assert unknown == []


def test_the_command_table_names_real_commands_and_flags() -> None:
    rows = command_table()
    assert len(rows) >= 8, rows
    bad = []
    for words in rows:
        command, accepted = archive_ctl_flags(words)
        if not command:
            bad.append((words, "no such command"))
        bad += [(words, flag) for flag in FLAG.findall(" ".join(words)) if flag not in accepted]
    assert bad == []


def sections_of_commands() -> list[tuple[str, str]]:
    """(command words, body) for each command's page of the reference."""
    from tests.docs.cli_reference import pages

    found = []
    for doc in pages()[1:]:
        text = read(doc)
        words = re.fullmatch(r"# `archive-ctl ([^`]+)`", text.splitlines()[0])
        assert words, doc
        command, _ = archive_ctl_flags(words.group(1).split())
        found.append((command, text))
    return found


def test_a_flag_named_alone_exists_for_its_section_s_command() -> None:
    found = sections_of_commands()
    assert len(found) >= 6
    bad = []
    for command, body in found:
        _, accepted = archive_ctl_flags(command.split())
        for span in inline_spans(body):
            if re.fullmatch(r"--[\w-]+(?: \S+)?", span) and span.split()[0] not in accepted:
                bad.append((command, span))
    assert bad == []


# ---------------------------------------------------------------- make local


def demo_flags() -> set[str]:
    from devkit.demo.run import build_parser

    return _flags(build_parser())


def test_make_local_options_exist() -> None:
    """The options table of `make local`, and every `ARGS=` a doc passes it."""
    named = []
    for doc, text in every_doc().items():
        for span in inline_spans(text) + [
            line for _, body in fenced_blocks(text) for line in body.splitlines()
        ]:
            for args in re.findall(r"make (?:local|services) ARGS=(\"[^\"]*\"|\S+)", span):
                named += [(doc, flag) for flag in FLAG.findall(" ".join(shlex.split(args)))]
        if "## `make local`" in text:
            body = section(
                text, next(h for h in text.splitlines() if h.startswith("## `make local`"))
            )
            named += [(doc, m.group(1)) for m in re.finditer(r"^\| `(--[\w-]+)", body, re.M)]
    assert len(named) >= 5, named
    assert [(doc, flag) for doc, flag in named if flag not in demo_flags()] == []


@pytest.mark.parametrize(
    ("words", "known"),
    [
        (["requeue", "--failed", "--since", "24h"], True),
        (["requeue", "--failed", "--older-than", "1h"], False),
        (["lane", "clear", "--reason", "account"], True),
        (["status", "--all"], True),
        (["grants", "--everything"], False),
    ],
)
def test_the_check_tells_real_flags_from_invented_ones(words: list[str], known: bool) -> None:
    _, accepted = archive_ctl_flags(words)
    flags = [w for w in words if w.startswith("--")]
    assert all(flag in accepted for flag in flags) is known


def test_the_exit_code_table_is_the_code_s() -> None:
    """The reference's exit codes are the EXIT_* codes archive-ctl's modules name."""
    codes = {
        node.value.value
        for name, module in modules().items()
        if name.startswith("lib.cli")
        for node in module.tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and any(isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in node.targets)
    }
    text = read(ARCHIVE_CTL)
    table = text.split("\n| exit code | meaning |\n", 1)[1].split("\n\n", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == codes
