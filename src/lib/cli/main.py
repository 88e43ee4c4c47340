"""archive-ctl: operate the image archive from a terminal, in production or locally.

    archive-ctl status [--all] [--json]
    archive-ctl enqueue RECORD_ID... | -
    archive-ctl requeue --failed [--since 24h|2026-12-01] [--limit N] [--dry-run]
    archive-ctl redrive-dlq [--manual] [--max-messages N] [--wait] [--dry-run]
    archive-ctl migrate [--with-base-schema] [--dry-run]

Run it as `scripts/archive-ctl ...` or `python -m lib.cli.main ...` with src/ on the path.
Configuration comes from the same environment as the functions (DATABASE_URL or
DB_SECRET_ARN, ARCHIVE_QUEUE_URL, ARCHIVE_DLQ_URL, AWS_* for boto3); the queue URLs
can also be given as options. Reports go to stdout, errors and warnings to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pg8000.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from lib.archive import enqueue as enqueueing
from lib.archive.message import MAX_RECORD_ID
from lib.cli import dlq as redrive
from lib.cli import status
from lib.platform import schema as migration
from lib.platform.config import DEFAULT_LOCK_TTL_SECONDS, load_database_config, positive_int
from lib.platform.db import Database, describe
from lib.platform.errors import ConfigError, DatabaseUnavailable, ServiceError
from lib.platform.observability import logger
from lib.state.records import ArchiveRecords

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from lib.platform.sqs import Queue

PROG = "archive-ctl"
EXIT_OK = 0
EXIT_ERROR = 1  # nothing or not everything could be done: configuration, database, SQS
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_PARTIAL = 3  # done, but some records were not found or not sent
EXIT_INTERRUPTED = 130

EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done
  {EXIT_ERROR}    error (configuration, database or SQS); the message says which
  {EXIT_USAGE}    bad command line
  {EXIT_PARTIAL}    partly done: some records were not found or their message was not sent
"""

EXAMPLES = f"""examples:
  {PROG} status                                   how things stand
  {PROG} enqueue 123 124                          queue records (row first, then message)
  {PROG} requeue --failed --since 24h --dry-run   what failed today, and why
  {PROG} redrive-dlq --dry-run                    look into the DLQ before moving it
  {PROG} migrate                                  add the archive columns and indexes
"""

_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class CommandError(ServiceError):
    """A clear, expected failure: printed as one line, exit code EXIT_ERROR."""


# -- argument types ------------------------------------------------------------------------


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
            "(2026-12-01, 2026-12-01T08:00, 2026-12-01T08:00+08:00)"
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


# -- shared plumbing -----------------------------------------------------------------------


@dataclass
class Context:
    """What the commands share: lazily built clients, configured from env and options."""

    args: argparse.Namespace
    _db: Database | None = None
    _queue: Queue | None = None

    def database(self, *, migration_session: bool = False) -> Database:
        if self._db is None:
            config = load_database_config()
            if migration_session:
                self._db = Database(
                    config,
                    application_name=f"{PROG}-migrate",
                    connect=migration.open_migration_connection,
                )
            else:
                self._db = Database(config, application_name=PROG)
        return self._db

    @property
    def queue(self) -> Queue:
        if self._queue is None:
            # Deferred: boto3 is the slowest import, and `migrate` does not need it.
            from lib.platform.sqs import Queue  # noqa: PLC0415

            self._queue = Queue()
        return self._queue

    @property
    def sqs(self) -> SQSClient:
        return self.queue.client

    def sqs_no_retry(self) -> SQSClient:
        from lib.platform.sqs import Queue  # noqa: PLC0415

        return Queue(max_attempts=1).client

    def queue_url(self) -> str | None:
        return self.args.queue_url or os.environ.get("ARCHIVE_QUEUE_URL", "").strip() or None

    def required_queue_url(self) -> str:
        url = self.queue_url()
        if url is None:
            raise CommandError("no queue URL: set ARCHIVE_QUEUE_URL or pass --queue-url")
        return url

    def dlq_url(self) -> str:
        url = self.args.dlq_url or os.environ.get("ARCHIVE_DLQ_URL", "").strip() or None
        if url:
            return url
        queue_url = self.queue_url()
        if queue_url is None:
            raise CommandError(
                "no DLQ URL: set ARCHIVE_DLQ_URL or pass --dlq-url "
                "(or give the queue URL, whose redrive policy names the DLQ)"
            )
        derived = redrive.dead_letter_queue_url(self.sqs, queue_url)
        if derived is None:
            raise CommandError(f"{queue_url} has no redrive policy; pass --dlq-url")
        return derived

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


def out(line: str = "") -> None:
    print(line, flush=True)


# -- status --------------------------------------------------------------------------------


def cmd_status(ctx: Context) -> int:
    args = ctx.args
    lock_ttl = positive_int(os.environ, "ARCHIVE_LOCK_TTL_SECONDS", DEFAULT_LOCK_TTL_SECONDS)
    report = status.Status(
        archive=status.archive_counts(
            ArchiveRecords(ctx.database()), lock_ttl_seconds=lock_ttl, include_all=args.all
        )
    )
    code = EXIT_OK
    queue_url = ctx.queue_url()
    if queue_url is None:
        report.notes.append("queue depths not shown: set ARCHIVE_QUEUE_URL or pass --queue-url")
    else:
        try:
            report.queues.append(status.queue_depth(ctx.sqs, "queue", queue_url))
            report.queues.append(status.queue_depth(ctx.sqs, "DLQ", ctx.dlq_url()))
        except (CommandError, BotoCoreError, ClientError) as error:
            report.notes.append(f"queue depths incomplete: {_describe_error(error)}")
            code = EXIT_ERROR
    out(report.to_json() if args.json else status.render(report))
    return code


# -- enqueue / requeue ---------------------------------------------------------------------


def _read_ids(values: Sequence[str]) -> list[int]:
    words = sys.stdin.read().split() if list(values) == ["-"] else list(values)
    try:
        return [record_id(word) for word in words]
    except argparse.ArgumentTypeError as error:
        raise CommandError(str(error)) from None


def _print_report(report: enqueueing.EnqueueReport, verb: str) -> int:
    for record in report.sent:
        out(f"{verb:<9} {record}")
    for record, reason in report.skipped.items():
        out(f"{'skipped':<9} {record}: {reason}")
    for record in report.missing:
        out(f"{'missing':<9} {record}: no such record")
    for record, reason in report.unsent.items():
        out(f"{'NOT SENT':<9} {record}: {reason}")
    out(
        f"{len(report.sent)} sent, {len(report.skipped)} skipped, "
        f"{len(report.missing)} not found, {len(report.unsent)} not sent"
    )
    if report.unsent:
        out(
            "the records not sent are PENDING: the sweeper sends them once they are past its "
            "grace period, or run this command again"
        )
    return EXIT_OK if report.ok else EXIT_PARTIAL


def cmd_enqueue(ctx: Context) -> int:
    ids = _read_ids(ctx.args.record_ids)
    if not ids:
        raise CommandError("no record ids given")
    queue_url = ctx.required_queue_url()  # checked before any row is written
    report = enqueueing.enqueue(ArchiveRecords(ctx.database()), ctx.queue, queue_url, ids)
    return _print_report(report, "sent")


def cmd_requeue(ctx: Context) -> int:
    args = ctx.args
    if not args.failed:
        raise CommandError("say what to requeue: --failed (rows whose archive is FAILED)")
    since = f" since {args.since.isoformat(timespec='seconds')}" if args.since else ""
    if args.dry_run:
        total, rows = enqueueing.preview_failed(
            ArchiveRecords(ctx.database()), since=args.since, limit=min(args.limit, args.show)
        )
        out(f"{total} FAILED records{since} (generation SUCCEEDED); --limit {args.limit}")
        for row in rows:
            started = row.started_at.isoformat(timespec="seconds") if row.started_at else "-"
            out(f"  {row.record_id:>12}  {started}  attempts {row.attempts}  {row.error or ''}")
        if total > len(rows):
            out(f"  ... and {total - len(rows)} more")
        out("dry run: nothing changed")
        return EXIT_OK
    queue_url = ctx.required_queue_url()
    report = enqueueing.requeue_failed(
        ArchiveRecords(ctx.database()), ctx.queue, queue_url, since=args.since, limit=args.limit
    )
    if not report.sent and not report.unsent:
        out(f"no FAILED records{since}")
        return EXIT_OK
    out(f"reset to PENDING with 0 attempts{since}:")
    return _print_report(report, "requeued")


# -- redrive -------------------------------------------------------------------------------


def _manual_redrive(ctx: Context, dlq_url: str) -> int:
    queue_url = ctx.required_queue_url()

    def progress(move: redrive.ManualMove) -> None:
        out(f"  moved {move.moved} so far")

    result = redrive.move_manually(
        ctx.sqs,
        dlq_url=dlq_url,
        queue_url=queue_url,
        max_messages=ctx.args.max_messages,
        on_batch=progress,
    )
    out(
        f"moved {result.moved} messages to {queue_url} ({result.stopped}); "
        f"{result.send_failed} not sent, {result.not_deleted} sent but left in the DLQ"
    )
    return EXIT_OK if not result.send_failed and not result.not_deleted else EXIT_PARTIAL


def _wait_for_task(ctx: Context, dlq_arn: str, handle: str) -> int:
    while True:
        task = redrive.move_task(ctx.sqs, dlq_arn, handle)
        if task is None:
            raise CommandError(f"move task {handle} is not listed any more")
        state = task.get("Status", "?")
        moved = task.get("ApproximateNumberOfMessagesMoved", 0)
        total = task.get("ApproximateNumberOfMessagesToMove", "?")
        out(f"  {state}: {moved} of {total} moved")
        if state in redrive.TASK_DONE_STATES:
            if state != "COMPLETED":
                raise CommandError(f"move task {state}: {task.get('FailureReason', 'no reason')}")
            return EXIT_OK
        time.sleep(ctx.args.poll_seconds)


def cmd_redrive(ctx: Context) -> int:
    args = ctx.args
    dlq_url = ctx.dlq_url()
    if args.wait_for:
        return _wait_for_task(ctx, redrive.queue_arn(ctx.sqs, dlq_url), args.wait_for)
    if args.dry_run:
        letters = redrive.peek(ctx.sqs, dlq_url, min(args.max_messages, args.show))
        out(f"{len(letters)} messages looked at in {dlq_url} (none moved):")
        for letter in letters:
            sent = letter.sent_at.isoformat(timespec="seconds") if letter.sent_at else "-"
            reason = f"  [{letter.reason}]" if letter.reason else ""
            out(f"  {letter.message_id}  sent {sent}  received {letter.receive_count}x{reason}")
            out(f"      {letter.body_preview}")
        return EXIT_OK
    if args.manual:
        return _manual_redrive(ctx, dlq_url)

    dlq_arn = redrive.queue_arn(ctx.sqs, dlq_url)
    queue_url = ctx.queue_url()
    destination = redrive.queue_arn(ctx.sqs, queue_url) if queue_url else None
    try:
        # No retries for this call: an endpoint without the API answers 500, which
        # botocore would otherwise retry for seconds before the fallback.
        handle = redrive.start_move_task(
            ctx.sqs_no_retry(),
            dlq_arn=dlq_arn,
            destination_arn=destination,
            max_per_second=args.rate,
        )
    except ClientError as error:
        if not redrive.not_implemented(error):
            raise
        out("StartMessageMoveTask is not available at this endpoint; moving the messages here")
        return _manual_redrive(ctx, dlq_url)
    out(f"started move task {handle}: {dlq_arn} -> {destination or 'the original source queue'}")
    if not args.wait:
        out(f"follow it with: {PROG} redrive-dlq --wait-for {handle}")
        return EXIT_OK
    return _wait_for_task(ctx, dlq_arn, handle)


# -- migrate -------------------------------------------------------------------------------


def cmd_migrate(ctx: Context) -> int:
    args = ctx.args
    statements = migration.load(migration.schema_files(with_base_schema=args.with_base_schema))
    if args.dry_run:
        for statement in statements:
            out(f"-- {statement.source.name}\n{statement.sql};\n")
        out(f"dry run: {len(statements)} statements, nothing applied")
        return EXIT_OK
    db = ctx.database(migration_session=True)
    dropped = migration.apply(
        db.run, statements, on_statement=lambda s: out(f"  {s.source.name}: {s.summary}")
    )
    for name in dropped:
        out(f"dropped invalid index {name} (left by an interrupted build) and rebuilt it")
    out(f"applied {len(statements)} statements (all idempotent: safe to run again)")
    return EXIT_OK


# -- errors --------------------------------------------------------------------------------


def _describe_error(error: BaseException) -> str:
    if isinstance(error, ClientError):
        detail = error.response.get("Error", {})
        message = str(detail.get("Message", "")).strip()
        if message.startswith("<"):
            message = "(an HTML error page)"
        return f"SQS {error.operation_name}: {detail.get('Code', '?')}: {message[:300]}"
    if isinstance(error, DatabaseUnavailable):
        return f"database unreachable: {error}"
    if isinstance(error, pg8000.exceptions.Error):
        return f"database error: {describe(error)}{_database_hint(error)}"
    return str(error) or type(error).__name__


def _database_hint(error: BaseException) -> str:
    text = describe(error)
    if text.startswith("42P01"):
        return (
            " (the generation service's tables are not there: is this the right database? "
            "For an empty local database use `migrate --with-base-schema`)"
        )
    if text.startswith("55P03"):
        return " (the table is busy; every statement is idempotent, so run it again later)"
    return ""


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


# -- parser --------------------------------------------------------------------------------


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
        cmd_status,
        "archive states, oldest pending age, queue and DLQ depth",
        "Counts PENDING (and how many are due, and for how long the oldest has been), "
        "RUNNING (and expired locks), FAILED (and how many of the last 24 h), using the "
        "partial indexes only; then the queue's and the DLQ's approximate depths.",
    )
    p.add_argument(
        "--all", action="store_true", help="also count SUCCEEDED and never-queued rows (full scan)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command(
        "enqueue",
        cmd_enqueue,
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
        cmd_requeue,
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
        "redrive-dlq",
        cmd_redrive,
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

    p = command(
        "migrate",
        cmd_migrate,
        "apply the archive columns and indexes (idempotent)",
        "Applies src/lib/sql/archive_migration.sql one statement at a time in autocommit "
        "(CREATE INDEX CONCURRENTLY cannot run in a transaction), without the functions' "
        "statement timeout, with a 5 s lock timeout. Safe on the live table and safe to repeat.",
    )
    p.add_argument(
        "--with-base-schema",
        action="store_true",
        help="first create the generation service's tables (local and test databases only)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the statements, apply nothing")
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ctx = Context(args)
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
            return error(_describe_error(failure))
        finally:
            ctx.close()
