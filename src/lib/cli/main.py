"""archive-ctl: parses the command line, hands it to the command's module (status,
enqueue, backfill, lane, redrive, migrate, grants) and maps what fails to an exit code and
one line on stderr.

Run it as `scripts/archive-ctl ...` or `python -m lib.cli ...` with src/ on the path.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pg8000.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from lib.cli import backfill, enqueue, grants, lane, migrate, redrive, show, status
from lib.cli.args import parse_since, positive, positive_at_most, positive_number, record_id
from lib.cli.context import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    PROG,
    CommandError,
    Context,
    describe_error,
)
from lib.platform.errors import ConfigError, DatabaseUnavailable
from lib.platform.observability import logger

EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done
  {EXIT_ERROR}    error (configuration, database or SQS); the message says which
  {EXIT_USAGE}    bad command line
  {EXIT_PARTIAL}    partly done: some records were not found or their message was not sent
  {EXIT_NOT_FOUND}    show: no such record
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); what was done is consistent, run it again to go on
"""

EXAMPLES = f"""examples:
  {PROG} status                                   how things stand
  {PROG} show 123                                 why is record 123 not archived (yet)?
  {PROG} enqueue 123 124                          queue records (row first, then message)
  {PROG} requeue --failed --since 24h --dry-run   what failed today, and why
  {PROG} backfill --since 30d --dry-run           never-queued generations of the last 30 days
  {PROG} backfill --since 30d                     queue them, live records first
  {PROG} lane clear --reason account              reopen the lane after fixing the token
  {PROG} redrive-dlq --dry-run                    look into the DLQ before moving it
  {PROG} migrate --dry-run                        what migrate would change, and legacy values
  {PROG} migrate                                  add what is missing of the schema, live-safely
  {PROG} grants --role image_archive              the GRANTs a role lacks for this release
"""


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's wrapping for prose, but indented blocks (the exit codes) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in text.split("\n\n"):
            lines = block.strip("\n").splitlines()
            if any(line.startswith("  ") for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(super()._fill_text(block, width, indent))
        return "\n\n".join(blocks)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--queue-url", help="the archive queue (default: $ARCHIVE_QUEUE_URL)", metavar="URL"
    )
    common.add_argument(
        "--dlq-url",
        help="the dead-letter queue (default: $ARCHIVE_DLQ_URL, else the queue's redrive policy)",
        metavar="URL",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="debug logs on stderr")

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate the image archive: inspect it, queue records, replay failures, "
        "redrive the DLQ, apply the schema. The database comes from DATABASE_URL or "
        "DB_SECRET_ARN; SQS from the usual AWS_* settings (AWS_ENDPOINT_URL_SQS for a local one).",
        epilog=EXAMPLES + "\n" + EXIT_CODES,
        formatter_class=_HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[Context], int], summary: str, description: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            parents=[common],
            help=summary,
            description=description,
            epilog=EXIT_CODES,
            formatter_class=_HelpFormatter,
        )
        sub.set_defaults(handler=handler)
        return sub

    p = command(
        "status",
        status.run,
        "archive states, oldest pending age, queue and DLQ depth",
        "Counts PENDING (and how many are due, and for how long the oldest has been), "
        "RUNNING (and expired locks), FAILED (and how many of the last 24 h), using the "
        "partial indexes only; then the queue's and the DLQ's approximate depths.",
    )
    p.add_argument(
        "--all", action="store_true", help="also count SUCCEEDED and never-queued rows (full scan)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")

    _show_command(command)

    p = command(
        "enqueue",
        enqueue.run_enqueue,
        "mark records PENDING and send their messages",
        "For each record: set archive_status PENDING, due now, stamp archive_enqueued_at, "
        'then send {"recordId": "..."}. Records whose generation is not SUCCEEDED, or '
        "whose archive is RUNNING, SUCCEEDED or FAILED, are reported and left alone "
        "(use `requeue --failed` for FAILED ones).",
    )
    p.add_argument(
        "record_ids", nargs="+", metavar="RECORD_ID", help="ids, or - to read from stdin"
    )

    p = command(
        "requeue",
        enqueue.run_requeue,
        "give FAILED records new attempts and send them",
        "Resets FAILED records of SUCCEEDED generations to archive_attempts 0, PENDING, "
        "due now, stamps archive_enqueued_at, then sends their messages; oldest generation "
        "first, a page of 100 at a time.",
    )
    p.add_argument("--failed", action="store_true", help="select records whose archive FAILED")
    p.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="only generations started since WHEN: a duration (24h, 90m, 7d) or an ISO "
        "date/time (2026-12-01, 2026-12-01T08:00+08:00; UTC without an offset)",
    )
    p.add_argument(
        "--limit", type=positive, default=1000, metavar="N", help="at most N records (default 1000)"
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be requeued")
    p.add_argument("--show", type=positive, default=50, help=argparse.SUPPRESS)

    p = command(
        "backfill",
        backfill.run,
        "queue SUCCEEDED generations that were never queued, paced",
        "Marks never-queued (archive_status NULL) rows of SUCCEEDED generations PENDING "
        "(and archive_backfilled) and sends their messages, a page at a time, oldest "
        "generation first (row first, then message, as `enqueue`). Live records first: it "
        "sends nothing while the lane is paused, a live record waits for it or slots are "
        "booked ahead; with pacing (LSKY_RATE_LIMITS, as the archive function has it) only "
        "into the room live demand leaves in every window; and it keeps no more history in "
        "the lane than it uploads in --ahead-seconds. It does not start while the lane is "
        "paused for an account problem unless --force. Progress with rate, ETA and what it "
        "waits for on stderr, every second. At the range's end it counts again and takes "
        "rows another transaction held. Ctrl-C stops after the page being sent (exit 130); "
        "run it again to go on: a queued row is never selected again.",
    )
    p.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="only generations started since WHEN: a duration (24h, 90m, 7d) or an ISO "
        "date/time (UTC without an offset)",
    )
    p.add_argument(
        "--until",
        type=parse_since,
        metavar="WHEN",
        help="only generations started before WHEN, same forms (default: when the run starts)",
    )
    p.add_argument("--user", type=positive, metavar="USER_ID", help="only this user's generations")
    p.add_argument("--limit", type=positive, metavar="N", help="at most N records (default: all)")
    p.add_argument(
        "--page-size",
        type=positive_at_most(1000),
        default=100,
        metavar="N",
        help="rows marked and sent together at most (default 100)",
    )
    p.add_argument(
        "--ahead-seconds",
        type=positive_number,
        default=10.0,
        metavar="SECONDS",
        help="keep no more history in the lane than it uploads in SECONDS (at least 2 "
        "records): what a live record may find ahead of it (default 10)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="start although the lane is paused for an account problem (waits until it opens)",
    )
    p.add_argument("--dry-run", action="store_true", help="count and list, change nothing")
    p.add_argument("--show", type=positive, default=10, help=argparse.SUPPRESS)

    lane_parser = commands.add_parser(
        "lane",
        help="the upload lane: clear a pause",
        description="The upload lane to Lsky Pro (image_archive_lane): one row that every "
        "container reads before an upload. `archive-ctl status` shows it.",
        epilog=EXIT_CODES,
        formatter_class=_HelpFormatter,
    )
    lane_actions = lane_parser.add_subparsers(dest="lane_action", required=True, metavar="ACTION")
    p = lane_actions.add_parser(
        "clear",
        parents=[common],
        help="reopen a paused lane",
        description="Clears the lane's pause (after fixing the Lsky token or quota, or to end "
        "a rate-limit pause early) and prints what it was. Exit 0 also when the lane was not "
        "paused. The sweeper's probe clears an account pause by itself once the account "
        "works again.",
        epilog=EXIT_CODES,
        formatter_class=_HelpFormatter,
    )
    p.set_defaults(handler=lane.run_clear)
    p.add_argument(
        "--reason",
        choices=lane.REASONS,
        help="clear it only if it is a pause of this reason",
    )

    p = command(
        "redrive-dlq",
        redrive.run,
        "move DLQ messages back to the archive queue",
        "By default starts an SQS message move task (StartMessageMoveTask) from the DLQ to "
        "the queue; SQS does the moving. When the endpoint does not implement that API "
        "(moto, other local emulators) it falls back to the manual move, as --manual does: "
        "receive from the DLQ, SendMessageBatch to the queue, delete what was sent; bounded "
        "by --max-messages, at-least-once (a message may arrive twice; the archive "
        "function acknowledges the duplicate).",
    )
    p.add_argument("--manual", action="store_true", help="move the messages here, not by a task")
    p.add_argument(
        "--max-messages",
        type=positive,
        default=1000,
        metavar="N",
        help="manual move: at most N messages (default 1000)",
    )
    p.add_argument(
        "--rate", type=positive, metavar="N", help="move task: at most N messages a second"
    )
    p.add_argument("--wait", action="store_true", help="move task: wait until it has finished")
    p.add_argument(
        "--wait-for", metavar="HANDLE", help="wait for a move task started earlier, by its handle"
    )
    p.add_argument("--dry-run", action="store_true", help="show some DLQ messages, move nothing")
    p.add_argument("--show", type=positive, default=20, help=argparse.SUPPRESS)
    p.add_argument("--poll-seconds", type=float, default=5.0, help=argparse.SUPPRESS)

    _schema_commands(command)
    return parser


def _show_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`show`: one record's story (its options are lib.cli.show's)."""
    show.add_arguments(command("show", show.run, show.SUMMARY, show.DESCRIPTION), record_id)


def _schema_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`migrate` and `grants`: the database's side of a deploy."""
    p = command(
        "migrate",
        migrate.run,
        "add what is missing of the archive schema, live-safely (idempotent)",
        "Brings the database to src/lib/sql/archive_migration.sql: under an advisory lock "
        "(one migration at a time), reads the catalog and runs only what is missing. First it "
        "looks for archive_status values the CHECK constraint would refuse: it maps the obvious "
        "ones (pending, DONE, ERROR, ...) and stops, changing nothing, on any other. A statement "
        "that needs the table's exclusive lock waits at most 300 ms at a time, so the "
        "generation service is never queued behind it for longer, and is retried with backoff "
        "for --retry-for seconds. Index builds and VALIDATE let reads and writes through while "
        "they wait, up to --wait seconds. On an up-to-date schema it takes no lock on the table. "
        "Safe on the live table, safe to repeat after any failure.",
    )
    p.add_argument(
        "--with-base-schema",
        action="store_true",
        help="first create the generation service's tables (local and test databases only)",
    )
    p.add_argument(
        "--retry-for",
        type=positive_number,
        default=60.0,
        metavar="SECONDS",
        help="keep retrying a statement that needs the table's exclusive lock this long "
        "(default 60)",
    )
    p.add_argument(
        "--wait",
        type=positive_number,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for another migration, and for the locks of index builds and "
        "VALIDATE, which do not block the table (default 600)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show the checks and the plan (statements, legacy values and their mapping), "
        "apply nothing",
    )

    p = command(
        "grants",
        grants.run,
        "check a database role's privileges against what this release needs",
        "Checks, in the live database, that ROLE has every privilege the functions and these "
        "commands need (lib.platform.grants.NEEDS; docs/database.md lists them): SELECT and "
        "UPDATE on the archive columns, SELECT on the generation's columns the claim reads and "
        "on users, and what the project's own tables need. Prints the GRANT statements that "
        "add what is missing and exits 1 when anything is; run them as the tables' owner.",
    )
    p.add_argument(
        "--role",
        metavar="NAME",
        help="the role to check (default: the one archive-ctl connects as)",
    )


@contextmanager
def _terminal_logging(verbose: bool) -> Iterator[None]:
    """The service's Powertools logger writes JSON to stdout for CloudWatch; on a
    terminal stdout is the report, so its lines (warnings only, unless -v) go to stderr.
    Restored afterwards, so that `main` can be called from other code and tests."""
    handler = logger.registered_handler
    stream = getattr(handler, "stream", None)
    level = logger.log_level
    if isinstance(handler, logging.StreamHandler):
        handler.setStream(sys.stderr)
    logger.setLevel("DEBUG" if verbose else "WARNING")
    try:
        yield
    finally:
        if isinstance(handler, logging.StreamHandler) and stream is not None:
            handler.setStream(stream)
        logger.setLevel(level)


def error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def main(
    argv: Sequence[str] | None = None,
    *,
    make_context: Callable[[argparse.Namespace], Context] = Context,
) -> int:
    args = build_parser().parse_args(argv)
    ctx = make_context(args)
    handler: Callable[[Context], int] = args.handler
    with _terminal_logging(args.verbose):
        try:
            return handler(ctx)
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except (
            CommandError,
            ConfigError,
            DatabaseUnavailable,
            pg8000.exceptions.Error,
            BotoCoreError,
            ClientError,
        ) as failure:
            return error(describe_error(failure))
        finally:
            ctx.close()
