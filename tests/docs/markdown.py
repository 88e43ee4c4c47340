"""Reading README.md and docs/*.md the way the docs tests need: code blocks, inline code,
prose, tables, headings and the sample blocks the docs mark for tests/docs/test_samples.py."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")),
)
# Where the docs keep what the tests read (one page each).
CONFIGURATION = "docs/reference/configuration.md"
ARCHIVE_CTL = "docs/reference/archive-ctl.md"
EVENTS = "docs/reference/events-and-metrics.md"
DATABASE = "docs/reference/database.md"
STACK = "docs/reference/stack.md"
CODE_MAP = "docs/reference/code-map.md"
RUNBOOK = "docs/how-to/runbook.md"
PRODUCER = "docs/how-to/connect-the-generation-service.md"
FIRST_DEPLOY = "docs/getting-started/first-deploy.md"
LOCAL_RUN = "docs/getting-started/local-run.md"
ATTEMPT = "docs/explanation/attempt.md"
PERFORMANCE = "docs/performance.md"
INDEX = "docs/README.md"

# A fenced block, indented ones (in lists) too: (indent, language, body).
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)
# `<!-- sample: NAME -->` right above a fenced block: its body is what running its `$ `
# lines prints, checked by tests/docs/test_samples.py against the test services.
SAMPLE = re.compile(r"^<!-- sample: ([\w-]+) -->\n```\w*\n(.*?)^```", re.S | re.M)


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def every_doc() -> dict[str, str]:
    return {name: read(name) for name in DOCS}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block; a shell line continued with a
    backslash is joined to the next."""
    return [
        (m.group(2), re.sub(r"\\\n\s*", " ", textwrap.dedent(m.group(3))))
        for m in FENCE.finditer(text)
    ]


def outside_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def inline_spans(text: str) -> list[str]:
    """Inline code spans, a span broken over lines joined again."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", outside_code_blocks(text))]


def prose(text: str) -> str:
    """The text a reader reads as sentences: no code blocks, no inline code, no HTML
    comments, no link targets."""
    text = re.sub(r"<!--.*?-->", "", outside_code_blocks(text), flags=re.S)
    text = re.sub(r"`[^`]+`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", outside_code_blocks(text), re.M)}


def section(text: str, heading: str) -> str:
    """The body under `heading` (a whole heading line, e.g. "## Configuration") up to the
    next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{level}}} ", body, maxsplit=1)[0]


def table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The first table under `heading` (e.g. "## Alarms"), by the backquoted name in
    each row's first cell: the row's cells."""
    rows: dict[str, list[str]] = {}
    for line in section(text, heading).splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        name = re.match(r"`(\w+)`", cells[0])
        if name:
            rows[name.group(1)] = cells
    return rows


@dataclass(frozen=True)
class Sample:
    """A marked sample block: the doc, its name and its lines."""

    doc: str
    name: str
    body: str


def samples() -> list[Sample]:
    return [
        Sample(doc, m.group(1), m.group(2))
        for doc, text in every_doc().items()
        for m in SAMPLE.finditer(text)
    ]


# `<!-- schema: NAME -->` right above a ```json block: a JSON Schema the code is tested
# against (the completion events' detail: tests/integration/test_completion_events.py).
SCHEMA = re.compile(r"^<!-- schema: ([\w-]+) -->\n```json\n(.*?)^```", re.S | re.M)


def json_schema(name: str, doc: str = EVENTS) -> dict[str, Any]:
    """The JSON Schema a doc shows under `<!-- schema: NAME -->`."""
    [body] = [m.group(2) for m in SCHEMA.finditer(read(doc)) if m.group(1) == name]
    schema: dict[str, Any] = json.loads(body)
    return schema
