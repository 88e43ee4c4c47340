"""archive-ctl's argument types: each returns the value or raises ArgumentTypeError,
which argparse reports as a bad command line (exit code 2)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from lib.archive.message import MAX_RECORD_ID
from lib.cli.context import UsageError
from lib.state.error_classes import ERROR_CLASSES
from lib.state.selection import AUDIT_FINDINGS, STATES, Selection
from lib.state.status import ArchiveStatus, WaitReason

_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """`24h`, `90m`, `7d`, `1d12h` (that long ago) or an ISO date/time (UTC unless it
    carries an offset)."""
    value = text.strip().lower()
    parts = _DURATION_PART.findall(value)
    if parts and "".join(number + unit for number, unit in parts) == value:
        seconds = sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts)
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (24h, 90m, 7d, 1d12h) nor an ISO date/time "
            "(YYYY-MM-DD, YYYY-MM-DDTHH:MM, YYYY-MM-DDTHH:MM+08:00)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def record_id(text: str) -> int:
    if text.isascii() and text.isdigit() and 0 < int(text) <= MAX_RECORD_ID:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a record id (a positive 64-bit integer)")


def positive(text: str) -> int:
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")


def positive_at_most(highest: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = positive(text)
        if value > highest:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {highest}")
        return value

    return parse


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def state_name(text: str) -> str:
    """An archive state (any case), or `none` for never queued."""
    for state in STATES:
        if text.strip().lower() == state.lower():
            return state
    raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(STATES)}")


WAIT_REASONS = (*(str(reason) for reason in WaitReason), "unknown")


def add_selection(parser: argparse.ArgumentParser, *, failures_only: bool) -> None:
    """The filters `list` and `requeue` share (lib.state.selection.Selection). A requeue
    takes FAILED records only, so it has no --state or --waiting."""
    if not failures_only:
        parser.add_argument(
            "--state",
            type=state_name,
            metavar="STATE",
            help=f"only records in this archive state: {', '.join(STATES)} (never queued)",
        )
        parser.add_argument(
            "--audit",
            choices=AUDIT_FINDINGS,
            metavar="FINDING",
            help="only archived records whose hosted copy the audit last found so: "
            f"{', '.join(AUDIT_FINDINGS)} (missing or altered with nothing to restore from)",
        )
        parser.add_argument(
            "--waiting",
            choices=WAIT_REASONS,
            metavar="REASON",
            help="only PENDING records not due yet that wait for this reason: "
            f"{', '.join(WAIT_REASONS)}",
        )
    parser.add_argument(
        "--failed-since",
        type=parse_since,
        metavar="WHEN",
        help="only records that failed since WHEN: a duration (2h, 90m, 7d: that long ago) or "
        "an ISO date/time (YYYY-MM-DDTHH:MM, +08:00 for an offset; UTC without one)",
    )
    parser.add_argument(
        "--failed-until",
        type=parse_since,
        metavar="WHEN",
        help="only records that failed before WHEN, same forms",
    )
    parser.add_argument(
        "--id",
        dest="ids",
        type=record_id,
        nargs="+",
        action="extend",
        default=[],
        metavar="ID",
        help="only these records (one or many; repeatable)",
    )
    parser.add_argument("--from-id", type=record_id, metavar="ID", help="only ids >= ID")
    parser.add_argument("--to-id", type=record_id, metavar="ID", help="only ids <= ID")
    parser.add_argument(
        "--error", metavar="TEXT", help="only records whose last error contains TEXT (any case)"
    )
    parser.add_argument(
        "--error-class",
        choices=tuple(ERROR_CLASSES),
        metavar="CLASS",
        help=f"only records whose last error is of this class: {', '.join(ERROR_CLASSES)}",
    )


def selection_of(args: argparse.Namespace) -> Selection:
    """The Selection the filters of `add_selection` ask for; UsageError when they contradict
    each other. --waiting implies PENDING (its index), a failure bound implies FAILED."""
    state: str | None = getattr(args, "state", None)
    waiting: str | None = getattr(args, "waiting", None)
    audit: str | None = getattr(args, "audit", None)
    if waiting is not None and state is None:
        state = ArchiveStatus.PENDING
    selection = Selection(
        audit=audit,
        state=state,
        ids=tuple(args.ids),
        id_from=args.from_id,
        id_to=args.to_id,
        error_text=args.error,
        error_patterns=ERROR_CLASSES[args.error_class] if args.error_class else (),
        waiting=waiting,
        failed_since=args.failed_since,
        failed_until=args.failed_until,
    )
    if (conflict := selection.conflict()) is not None:
        raise UsageError(conflict)
    return selection
