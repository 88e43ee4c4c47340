"""`archive-ctl list`: records by state, wait reason, error class or text, failure time and
id, newest first, a page at a time (lib.state.selection; queries.sql list_failed and
list_records). `requeue --dry-run` prints its records the same way."""

from __future__ import annotations

import shutil
import sys
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from lib.cli.args import selection_of
from lib.cli.context import EXIT_OK, Context, UsageError
from lib.cli.progress import duration
from lib.cli.words import plural, verb
from lib.platform.redact import ELLIPSIS, outside_text
from lib.state.error_classes import error_class
from lib.state.records import ERROR_LIMIT
from lib.state.selection import NEVER_QUEUED, Cursor, ListedRecord, Selection
from lib.state.status import ArchiveStatus

# On a terminal, a line's error takes the rest of its width, and at least this much of it
# however narrow the terminal (--json, a pipe or a file have all of it).
MIN_ERROR_SHOWN = 40


def terminal_width() -> int | None:
    """The width a text line is fitted to: the terminal's (COLUMNS when set, as shutil
    reads it); None when stdout is no terminal and COLUMNS is unset, or is not the
    process's own (a caller's capture): nothing is cut."""
    if sys.stdout is not sys.__stdout__:
        return None
    return shutil.get_terminal_size(fallback=(0, 0)).columns or None


def run(ctx: Context) -> int:
    args = ctx.args
    selection = selection_of(args)
    try:
        after = Cursor.decode(args.after) if args.after else None
    except ValueError as error:
        raise UsageError(str(error)) from None
    records = ctx.records()
    page = records.list_records(selection, after=after, limit=args.limit)
    matched = records.count_failed(selection, requeuable=False) if selection.failures else None
    last = page[-1].cursor(by_failure=selection.failures) if len(page) == args.limit else None
    order = "failure time" if selection.failures else "id"
    ctx.answer(
        {
            "order": order,
            "matched": matched,
            "records": [as_json(record) for record in page],
            "next": None if last is None else last.encode(),
        }
    )
    if matched is not None:
        ctx.say(
            f"{plural(matched, 'record')} {verb(matched, 'matches', 'match')}; newest failure first"
        )
    for line in lines(page, width=terminal_width()):
        ctx.say(line)
    if not page:
        ctx.say("no records match")
    if last is not None:
        ctx.say(f"next page: the same command with --after {last.encode()}")
    return EXIT_OK


def as_json(record: ListedRecord) -> dict[str, Any]:
    return {
        "id": record.record_id,
        "state": record.archive_status or NEVER_QUEUED,
        "generation_status": record.status,
        "attempts": record.attempts,
        "failed_at": record.failed_at,
        "failed_at_estimated": record.failed_at_estimated,
        "wait_reason": record.wait_reason,
        "parked": record.parked if record.archive_status == ArchiveStatus.PENDING else None,
        "next_run_at": record.next_run_at,
        "locked_at": record.locked_at,
        "archived_at": record.archived_at,
        "started_at": record.started_at,
        "hosted_url": record.hosted_url,
        "hosted_key": record.hosted_key,
        "audit": record.audit,
        "error_class": error_class(record.error),
        # Stored redacted; redacted again for rows an older release wrote.
        "error": None if record.error is None else outside_text(record.error, ERROR_LIMIT),
    }


def lines(
    records: Sequence[ListedRecord], *, now: datetime | None = None, width: int | None = None
) -> list[str]:
    """One line a record: id, state, attempts, its time, its error; the error cut to fit
    `width` (at least MIN_ERROR_SHOWN of it), or whole (as stored) when `width` is None."""
    moment = now or datetime.now(UTC)
    result = []
    for r in records:
        head = (
            f"  {r.record_id:>12}  {(r.archive_status or NEVER_QUEUED):<9}  "
            f"attempts {r.attempts}  {_when(r, moment)}  "
        )
        if r.audit is not None:
            # The damaged copy's key: for an operator to delete on the host.
            head += f"audit: {r.audit}, key {outside_text(r.hosted_key or '?', 64)}  "
        error = "" if r.error is None else outside_text(r.error, ERROR_LIMIT)
        if width is not None:
            error = _fit(error, max(width - len(head), MIN_ERROR_SHOWN))
        result.append(f"{head}{error}".rstrip())
    return result


def _cells(char: str) -> int:
    """The columns a character takes on a terminal: two for the wide ones (Lsky's Chinese)."""
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _fit(text: str, cells: int) -> str:
    """`text` in at most `cells` terminal columns, cut with "..." when it needs more."""
    if sum(map(_cells, text)) <= cells:
        return text
    kept, used = [], len(ELLIPSIS)
    for char in text:
        used += _cells(char)
        if used > cells:
            break
        kept.append(char)
    return "".join(kept) + ELLIPSIS


def _when(record: ListedRecord, now: datetime) -> str:
    """The time that matters in its state, with how long ago (or ahead) it is."""
    state = record.archive_status
    if state == ArchiveStatus.FAILED:
        estimated = "~" if record.failed_at_estimated else ""
        return f"failed {estimated}{_ago(record.failed_at, now)}"
    if state == ArchiveStatus.PENDING:
        if record.next_run_at is not None and record.next_run_at > now:
            how = "parked" if record.parked else "held"
            reason = record.wait_reason or "unknown"
            return f"waits {reason} ({how}), due in {duration(_seconds(record.next_run_at, now))}"
        return f"due {_ago(record.next_run_at, now)}"
    if state == ArchiveStatus.RUNNING:
        return f"locked {_ago(record.locked_at, now)}"
    if state == ArchiveStatus.SUCCEEDED:
        return f"archived {_ago(record.archived_at, now)}"
    return f"generated {_ago(record.started_at, now)}"


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    return f"{moment.isoformat(timespec='seconds')} ({duration(-_seconds(moment, now))} ago)"


def _seconds(moment: datetime, now: datetime) -> float:
    return (moment - now).total_seconds()


def describe(selection: Selection) -> str:
    """The time bounds of a selection of failures, for a report's first line: ` (failed
    since T)`, or nothing without bounds."""
    words = []
    if selection.failed_since is not None:
        words.append(f"since {selection.failed_since.isoformat(timespec='seconds')}")
    if selection.failed_until is not None:
        words.append(f"before {selection.failed_until.isoformat(timespec='seconds')}")
    return f" (failed {' and '.join(words)})" if words else ""
