"""The archive-ctl reference, written from its parser (lib.cli.parser.build_parser).

Each command has its page in docs/reference/archive-ctl/, which holds a generated block between
`<!-- cli: NAME -->` and `<!-- /cli -->`: its synopsis, a table of its arguments (each
with its default and its help) and a table of the exit codes it can return. The
`archive-ctl` block of docs/reference/archive-ctl.md lists the commands (each linking its
page), the options every command shares and every exit code.
tests/docs/test_cli_reference.py renders them again and compares; with
UPDATE_DOC_SAMPLES=1 it writes them into the page. Options whose help is suppressed
(argparse.SUPPRESS: knobs for the tests) are left out, as `--help` leaves them out."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from tests.docs.markdown import ARCHIVE_CTL, ROOT

BLOCK = re.compile(r"^<!-- cli: ([\w -]+) -->\n(.*?)^<!-- /cli -->$", re.S | re.M)
SHARED = ("--queue-url", "--dlq-url", "--json", "-v")
PROG = "archive-ctl"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: str(choice.help) for choice in action._choices_actions}
    return {}


def commands() -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, summary) of every command, `lane clear` as one."""
    from lib.cli.main import build_parser

    top = build_parser()
    summaries = _summaries(top)
    for name, parser in _subparsers(top).items():
        nested = _subparsers(parser)
        if nested:
            inner = _summaries(parser)
            for action, sub in nested.items():
                yield f"{name} {action}", sub, inner[action]
        else:
            yield name, parser, summaries[name]


def _own(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The command's own options: not -h, not the shared flags, not hidden."""
    return [
        action
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        and not set(action.option_strings) & set(SHARED)
        and action.help is not argparse.SUPPRESS
    ]


def _name(action: argparse.Action) -> str:
    """`--limit N`, `--id ID...`, `RECORD_ID...`, `--dry-run`."""
    if not action.option_strings:
        metavar = str(action.metavar or action.dest)
        return f"{metavar}..." if action.nargs == "+" else metavar
    flag = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flag
    metavar = action.metavar or (None if action.choices else action.dest.upper())
    if metavar is None:
        metavar = "|".join(str(choice) for choice in action.choices or ())
    return f"{flag} {metavar}..." if action.nargs == "+" else f"{flag} {metavar}"


def _groups(parser: argparse.ArgumentParser) -> dict[int, argparse._MutuallyExclusiveGroup]:
    return {
        id(action): group
        for group in parser._mutually_exclusive_groups
        for action in group._group_actions
    }


def synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    parts, seen = [PROG, name], set()
    groups = _groups(parser)
    for action in _own(parser):
        group = groups.get(id(action))
        if group is not None:
            if id(group) in seen:
                continue
            seen.add(id(group))
            members = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
            inner = " | ".join(_name(a) for a in members)
            parts.append(f"({inner})" if group.required else f"[{inner}]")
        elif action.option_strings and not action.required:
            parts.append(f"[{_name(action)}]")
        else:
            parts.append(_name(action))
    return " ".join(parts)


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is False or value == [] or value is argparse.SUPPRESS:
        return "–"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _meaning(action: argparse.Action) -> str:
    text = str(action.help or "")
    choices = [str(choice) for choice in action.choices or ()]
    if choices and not all(choice in text for choice in choices):
        text += f" (one of {', '.join(choices)})"
    return _cell(text)


def exit_codes(epilog: str) -> list[tuple[int, str]]:
    """The codes an `exit codes:` block lists, each with its words (continued lines
    joined)."""
    codes: list[tuple[int, str]] = []
    for line in epilog.split("exit codes:", 1)[1].splitlines():
        code = re.match(r"^  (\d+)\s+(.*)$", line)
        if code:
            codes.append((int(code.group(1)), code.group(2).strip()))
        elif line.startswith("       ") and codes:
            number, words = codes[-1]
            codes[-1] = (number, f"{words} {line.strip()}")
    return codes


def _exit_table(epilog: str) -> list[str]:
    rows = ["| exit code | meaning |", "|---|---|"]
    rows += [f"| {code} | {_cell(words)} |" for code, words in exit_codes(epilog)]
    return rows


def render(name: str) -> str:
    """The generated block of one command, or of `archive-ctl` itself."""
    from lib.cli.main import build_parser

    if name == PROG:
        top = build_parser()
        lines = ["| command | does |", "|---|---|"]
        lines += [
            f"| [`{command}`]({page(command)}) | {_cell(summary)} |"
            for command, _, summary in commands()
        ]
        lines += ["", "Options every command takes, before or after its name:", ""]
        lines += ["| option | default | meaning |", "|---|---|---|"]
        for action in top._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                lines.append(f"| `{_name(action)}` | {_default(action)} | {_meaning(action)} |")
        lines += ["", *_exit_table(str(top.epilog))]
        return "\n".join(lines) + "\n"
    parser = {command: p for command, p, _ in commands()}[name]
    lines = ["```", synopsis(name, parser), "```", ""]
    own = _own(parser)
    if own:
        lines += ["| argument | default | meaning |", "|---|---|---|"]
        lines += [f"| `{_name(a)}` | {_default(a)} | {_meaning(a)} |" for a in own]
        lines.append("")
    lines += _exit_table(str(parser.epilog))
    return "\n".join(lines) + "\n"


def page(command: str) -> str:
    """A command's page, relative to the overview."""
    return f"archive-ctl/{command.replace(' ', '-')}.md"


def pages() -> list[str]:
    """The overview and every command's page that exists."""
    folder = ROOT / ARCHIVE_CTL.removesuffix(".md")
    return [ARCHIVE_CTL, *sorted(p.relative_to(ROOT).as_posix() for p in folder.glob("*.md"))]


def blocks() -> list[tuple[str, str, str]]:
    """(page, name, body) of every generated block."""
    return [
        (doc, m.group(1), m.group(2))
        for doc in pages()
        for m in BLOCK.finditer((ROOT / doc).read_text(encoding="utf-8"))
    ]


def rewrite() -> None:
    """Write every block from the parser (UPDATE_DOC_SAMPLES=1)."""
    for doc in pages():
        path = ROOT / doc
        text = path.read_text(encoding="utf-8")
        path.write_text(
            BLOCK.sub(
                lambda m: f"<!-- cli: {m.group(1)} -->\n{render(m.group(1))}<!-- /cli -->", text
            ),
            encoding="utf-8",
        )
