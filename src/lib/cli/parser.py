"""archive-ctl's command line: the shared flags (before or after the command's name), each
command with its options, help and exit codes, and the module that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from lib import __version__
from lib.cli import audit, backfill, enqueue, grants, lane, listing, migrate, redrive, show, status
from lib.cli.args import add_selection, parse_since, positive, positive_at_most, positive_number
from lib.cli.context import (
    EXIT_MISSING_GRANTS,
    EXIT_NO_ROLE,
    EXIT_NOT_FOUND,
    EXIT_NOT_MIGRATED,
    EXIT_OK,
    EXIT_PARTIAL,
    PROG,
    Context,
)
from lib.cli.help import EXAMPLES, EXIT_CODES, PARTIAL_RECORDS, HelpFormatter, exit_codes


def _shared_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The flags every command takes, before or after its name: the top-level parser keeps
    their defaults; a command's parser leaves an absent flag unset (SUPPRESS), so it never
    overwrites one given before the command's name."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--queue-url",
        default=default(None),
        help="the archive queue (default: $ARCHIVE_QUEUE_URL)",
        metavar="URL",
    )
    parser.add_argument(
        "--dlq-url",
        default=default(None),
        help="the dead-letter queue (default: $ARCHIVE_DLQ_URL, else the queue's redrive policy)",
        metavar="URL",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print the answer as one JSON object on stdout (progress, if any, on stderr)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="debug logs on stderr: each statement and AWS call with its time",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate the image archive: inspect it, find records, queue them, replay "
        "failures, redrive the DLQ, apply the schema. The database comes from DATABASE_URL "
        "or DB_SECRET_ARN; SQS from the usual AWS_* settings (AWS_REGION or "
        "AWS_DEFAULT_REGION; AWS_ENDPOINT_URL_SQS for a local one).",
        epilog=EXAMPLES + "\n" + EXIT_CODES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _shared_flags(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str,
        handler: Callable[[Context], int],
        summary: str,
        description: str,
        *,
        codes: Sequence[tuple[int, str]] = (),
        under: argparse._SubParsersAction[argparse.ArgumentParser] = commands,
    ) -> argparse.ArgumentParser:
        sub = under.add_parser(
            name,
            help=summary,
            description=description,
            epilog=exit_codes(*codes),
            formatter_class=HelpFormatter,
        )
        _shared_flags(sub, top=False)
        sub.set_defaults(handler=handler, command_parser=sub)
        return sub

    p = command(
        "status",
        status.run,
        "archive states, oldest pending age, queue and DLQ depth",
        "Counts PENDING (and how many are due, and for how long the oldest has been), "
        "RUNNING (and expired locks), FAILED (and how many failed in the last 24 h), using "
        "the partial indexes only; then the upload lane, and the queue's and the DLQ's "
        "approximate depths. A part that cannot be read is a note in the report and exit 3.",
        codes=[(EXIT_PARTIAL, "a partial answer: a part (lane, queue depths) could not be read")],
    )
    p.add_argument(
        "--all", action="store_true", help="also count SUCCEEDED and never-queued rows (full scan)"
    )

    p = command(
        "list",
        listing.run,
        "find records by state, wait reason, error, failure time or id",
        "Lists records, newest first, a page at a time: FAILED ones (--state FAILED or a "
        "failure-time bound) by when they failed, on the failed_at index; any others by id, "
        "newest record first, on the primary key or their state's partial index. A page "
        "ends with the cursor of the next (--after); a cursor stays correct while rows "
        "change. docs/reference/database.md says which index serves which filter.",
    )
    add_selection(p, failures_only=False)
    p.add_argument(
        "--limit",
        type=positive_at_most(1000),
        default=50,
        metavar="N",
        help="records per page (default 50, at most 1000)",
    )
    p.add_argument("--after", metavar="CURSOR", help="the next page: the cursor a page ended with")

    p = command(
        "show",
        show.run,
        show.SUMMARY,
        show.DESCRIPTION,
        codes=[(EXIT_NOT_FOUND, "no such record (its events, if any, are shown)")],
    )
    show.add_arguments(p)

    p = command(
        "enqueue",
        enqueue.run_enqueue,
        "mark records PENDING and send their messages",
        "For each record: set archive_status PENDING, due now, stamp archive_enqueued_at, "
        'then send {"recordId": "..."}. Records whose generation is not SUCCEEDED, or '
        "whose archive is RUNNING, SUCCEEDED or FAILED, are reported and left alone "
        "(use `requeue` for FAILED ones).",
        codes=[PARTIAL_RECORDS],
    )
    p.add_argument(
        "record_ids", nargs="+", metavar="RECORD_ID", help="ids, or - to read from stdin"
    )

    p = command(
        "requeue",
        enqueue.run_requeue,
        "give FAILED records new attempts and send them",
        "Resets FAILED records of SUCCEEDED generations to archive_attempts 0, PENDING, "
        "due now, stamps archive_enqueued_at, then sends their messages; newest failure "
        "first (the order `list --state FAILED` shows), a page of 100 at a time. Say which: "
        "--failed for all of them, or any filter (--id, --failed-since, --error, ...).",
        codes=[PARTIAL_RECORDS],
    )
    p.add_argument("--failed", action="store_true", help="every FAILED record (within the filters)")
    p.add_argument(
        "--since",
        dest="failed_since",
        type=parse_since,
        metavar="WHEN",
        help="the same as --failed-since",
    )
    add_selection(p, failures_only=True)
    p.add_argument(
        "--limit", type=positive, default=1000, metavar="N", help="at most N records (default 1000)"
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be requeued")
    p.add_argument("--show", type=positive, default=50, help=argparse.SUPPRESS)

    _queue_commands(command, commands)
    _audit_commands(command)
    _schema_commands(command)
    return parser


def _audit_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`audit` and `restore`: the hosted copies checked now, and repaired from originals."""
    p = command(
        "audit",
        audit.run_audit,
        audit.AUDIT_SUMMARY,
        audit.AUDIT_DESCRIPTION,
        codes=[audit.AUDIT_FOUND],
    )
    audit.add_audit_arguments(p)
    p = command(
        "restore",
        audit.run_restore,
        audit.RESTORE_SUMMARY,
        audit.RESTORE_DESCRIPTION,
        codes=[(EXIT_PARTIAL, "some records were left alone, not found or not sent")],
    )
    audit.add_restore_arguments(p)


def _queue_commands(
    command: Callable[..., argparse.ArgumentParser],
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """`backfill`, `lane clear` and `redrive-dlq`: what moves records and messages along."""
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
        codes=[PARTIAL_RECORDS],
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
        epilog=exit_codes(),
        formatter_class=HelpFormatter,
    )
    _shared_flags(lane_parser, top=False)
    lane_actions = lane_parser.add_subparsers(dest="lane_action", required=True, metavar="ACTION")
    p = command(
        "clear",
        lane.run_clear,
        "reopen a paused lane",
        "Clears the lane's pause (after fixing the Lsky token or quota, or to end "
        "a rate-limit pause early) and prints what it was. Exit 0 also when the lane was not "
        "paused. The sweeper's probe clears an account pause by itself once the account "
        "works again.",
        under=lane_actions,
    )
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
        "function acknowledges the duplicate). A malformed body (one the archive function "
        "refuses) only comes back: --leave-malformed moves the others and leaves those, "
        "--delete-malformed deletes only those; both move by hand, since a move task "
        "cannot choose.",
        codes=[(EXIT_PARTIAL, "partly done: some messages were not sent or not deleted")],
    )
    p.add_argument("--manual", action="store_true", help="move the messages here, not by a task")
    malformed = p.add_mutually_exclusive_group()
    malformed.add_argument(
        "--leave-malformed",
        action="store_true",
        help="move by hand, but leave the malformed messages in the DLQ (and say how many)",
    )
    malformed.add_argument(
        "--delete-malformed",
        action="store_true",
        help="delete the malformed messages from the DLQ, move nothing, leave the others",
    )
    p.add_argument(
        "--max-messages",
        type=positive,
        default=1000,
        metavar="N",
        help="by hand: at most N messages moved or deleted (default 1000)",
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
        "commands need (lib.platform.grants.NEEDS; docs/reference/database.md lists them): "
        "SELECT and UPDATE on the archive columns, SELECT on the generation's columns the "
        "claim reads and on users, and what the project's own tables need. Prints the GRANT "
        "statements that add what is missing; run them as the tables' owner. The exit code "
        "tells a script which case it is.",
        codes=[
            (EXIT_OK, "the role has every privilege this release needs"),
            (EXIT_MISSING_GRANTS, "the role lacks privileges: the GRANT statements are printed"),
            (EXIT_NO_ROLE, "there is no such role"),
            (EXIT_NOT_MIGRATED, "tables or columns this release needs do not exist: migrate first"),
        ],
    )
    p.add_argument(
        "--role",
        metavar="NAME",
        help="the role to check (default: the one archive-ctl connects as)",
    )
