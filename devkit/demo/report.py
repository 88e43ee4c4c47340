"""What a `make local` run prints: a line per event, and the summary at the end."""

from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from devkit.demo.scenario import MAX_ATTEMPTS
from lib.cli.words import plural

STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED")


class Printer:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def line(self, tag: str, text: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f}s  {tag:<10} {text}", flush=True)

    @staticmethod
    def plain(text: str = "") -> None:
        print(text, flush=True)


def _kb(size: Any) -> str:
    if not isinstance(size, int | float):
        return "?"
    return f"{int(size)} B" if size < 1024 else f"{size / 1024:.1f} KB"


def _ljust(text: str, width: int) -> str:
    """Left-justify by display width: CJK characters take two terminal columns."""
    shown = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(0, width - shown)


_OUTCOME_LINES = {
    "archived": "archived     attempt {attempt}/{max}, {size} {mime_type}",
    "retry": "retry in {retry_in_seconds} s  {error}",
    "failed": "FAILED       {error}",
    "duplicate": "duplicate    acknowledged: {reason}",
    "malformed": "malformed    {reason}: parked in the DLQ",
}


def describe_log(entry: dict[str, Any]) -> str | None:
    """One progress line for an archive log line, or None for the ones not shown."""
    record = f"#{entry['record_id']}" if entry.get("record_id") else "-"
    outcome = entry.get("outcome")
    if outcome is None:
        level = str(entry.get("level", "")).lower()
        if level in ("warning", "error", "critical"):
            return f"{record:<5} {level:<12} {entry.get('message', '')}"
        return None
    template = _OUTCOME_LINES.get(str(outcome), f"{outcome:<12} {{message}}")
    fields = {"attempt": "?", "retry_in_seconds": "?", "error": "", "reason": "", "message": ""}
    fields |= {k: v for k, v in entry.items() if isinstance(k, str)}
    return f"{record:<5} " + template.format_map(
        {
            **fields,
            "max": MAX_ATTEMPTS,
            "size": _kb(entry.get("bytes")),
            "mime_type": entry.get("mime_type", ""),
        }
    )


@dataclass
class Summary:
    records: int
    archived: int
    retried: int
    failed: int
    dlq: int
    swept: int
    duplicates: int
    seconds: float
    completed: bool
    function_errors: int = 0
    interrupted: bool = False
    files: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


def print_summary(summary: Summary, printer: Printer) -> None:
    columns = ("records", "archived", "retried", "failed", "DLQ", "re-sent by sweeper", "time")
    values = (
        summary.records,
        summary.archived,
        summary.retried,
        summary.failed,
        summary.dlq,
        summary.swept,
        f"{summary.seconds:.1f} s",
    )
    widths = [max(len(c), len(str(v))) for c, v in zip(columns, values, strict=True)]
    state = "done" if summary.completed else ("interrupted" if summary.interrupted else "TIMED OUT")
    printer.plain()
    printer.plain(f"summary ({state})")
    printer.plain("  " + "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    printer.plain("  " + "  ".join(str(v).rjust(w) for v, w in zip(values, widths, strict=True)))
    if summary.duplicates or summary.function_errors:
        printer.plain(
            f"  also: {plural(summary.duplicates, 'duplicate delivery', 'duplicate deliveries')}"
            f" acknowledged, {plural(summary.function_errors, 'function error')}"
        )
    if summary.files:
        printer.plain()
        printer.plain("archived files (served by the Lsky stand-in while it ran; kept on disk):")
        for item in summary.files:
            printer.plain(
                f"  #{item['record_id']:<4} {_ljust(item['name'] or '?', 36)} {item['path']}"
            )
    if summary.failures:
        printer.plain()
        printer.plain(
            "failed (archive_status FAILED; `archive-ctl requeue --failed` replays them):"
        )
        for item in summary.failures:
            printer.plain(f"  #{item['record_id']:<4} {item['error']}")
