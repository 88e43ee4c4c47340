"""Sample outputs in the docs against what the command prints.

A doc marks a sample with `<!-- sample: NAME -->` on the line above its fenced block. Two
steps make a real run comparable with it:

- `scrub` turns what no doc should carry, or what only says where the test ran, into the
  forms the docs show: timestamps into `YYYY-MM-DDTHH:MM:SS+00:00` (the docs hold no
  dates), moto's queue URLs and ARNs into AWS's, a run's data directory into
  `local-data/...`. `UPDATE_DOC_SAMPLES=1` writes scrubbed output into the docs.
- `loosen`, applied to both sides, forgets what differs from run to run without saying
  anything: decimals (timings, sizes), ports, pids, UUIDs, a list cursor's time, a number
  of seconds, a time of day, trailing spaces, the width of a column.

Then every line of the sample must be a line of the output, in order; a line `...` (or
`…`) stands for any number of lines left out."""

from __future__ import annotations

import re
from collections.abc import Iterable

from tests.docs.markdown import ROOT, SAMPLE

AWS_QUEUES = "https://sqs.eu-central-1.amazonaws.com/111122223333/"
AWS_ARN = "arn:aws:sqs:eu-central-1:111122223333:"
SCRUB = (
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:[+-]\d{2}:?\d{2}|Z)?"
        ),
        "YYYY-MM-DDTHH:MM:SS+00:00",
    ),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "YYYY-MM-DD"),
    (re.compile(r"(?<!\d)\d{8}T\d{6}Z"), "YYYYMMDDTHHMMSSZ"),
    (re.compile(r"/\d{4}/\d{2}/\d{2}/[0-9a-z]{13}\."), "/YYYY/MM/DD/KEY."),
    (re.compile(r"http://127\.0\.0\.1:\d+/\d{12}/"), AWS_QUEUES),
    (re.compile(r"arn:aws:sqs:[\w-]+:\d{12}:"), AWS_ARN),
)
LOOSE = (
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:PORT"),
    (re.compile(r"(?<![\d.])\d+\.\d+(?![\d.])"), "N.N"),
    (re.compile(r"\bpid \d+"), "pid N"),
    (re.compile(r"\bt\d+_(?=\d)"), "tN_"),  # a list cursor: its failure time
    (re.compile(r"(?<![\d.:])\d+ s\b"), "N s"),  # seconds: how long a run took to get there
    (re.compile(r"\b\d{2}:\d{2}:\d{2}\b"), "HH:MM:SS"),  # a time of day (`show`)
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "UUID"),
    (re.compile(r"[ \t]+$", re.M), ""),
    # Column widths follow the widest value (an elapsed time past 10 s, a bigger count).
    (re.compile(r" {2,}"), "  "),
)
ELIDED = {"...", "…"}


def scrub(output: str, *, data_dir: str | None = None) -> str:
    if data_dir:
        output = output.replace(data_dir, "local-data/YYYYMMDDTHHMMSSZ")
    for pattern, replacement in SCRUB:
        output = pattern.sub(replacement, output)
    return output


def loosen(text: str) -> str:
    for pattern, replacement in LOOSE:
        text = pattern.sub(replacement, text)
    return text


def mismatch(sample: str, output: str, *, ordered: bool = True) -> str | None:
    """None when `output` (scrubbed) shows `sample`, else what is missing or extra.

    Ordered: the sample's lines are the output's, one for one, except where an elision
    stands; unordered (lines that concurrent work prints in any order): each sample line
    is one of the output's."""
    have = loosen(output).splitlines()
    position, gap = 0, False
    for line in loosen(sample).splitlines():
        if line.strip() in ELIDED:
            gap = True
            continue
        if not ordered:
            if line not in have:
                return f"missing: {line!r}"
        elif gap and line in have[position:]:
            position = have.index(line, position) + 1
        elif not gap and position < len(have) and have[position] == line:
            position += 1
        else:
            found = have[position] if position < len(have) else "(end of output)"
            return f"expected {line!r}, the output has {found!r}"
        gap = False
    if ordered and not gap and position < len(have):
        return f"the output goes on: {have[position]!r}"
    return None


def commands(body: str) -> list[tuple[str, str]]:
    """(command, the sample lines it printed) for each `$ ` line of a sample body."""
    runs: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            runs.append((line[2:], []))
        elif runs:
            runs[-1][1].append(line)
    return [(command, "\n".join(lines)) for command, lines in runs]


def rewrite(doc: str, name: str, outputs: Iterable[tuple[str, str]]) -> None:
    """Write scrubbed outputs into the doc's sample `name` (UPDATE_DOC_SAMPLES=1)."""
    path = ROOT / doc
    text = path.read_text(encoding="utf-8")
    body = "".join(f"$ {command}\n{output.rstrip()}\n" for command, output in outputs)

    def replace(match: re.Match[str]) -> str:
        if match.group(1) != name:
            return match.group(0)
        fence = match.group(0).split("\n", 2)[1]
        return f"<!-- sample: {name} -->\n{fence}\n{body}```"

    path.write_text(SAMPLE.sub(replace, text), encoding="utf-8")
