"""What archive-ctl's commands share: the Context (clients built on first use, queue
URLs from the options or lib.platform.config), CommandError, exit codes, out()."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pg8000.exceptions
from botocore.exceptions import ClientError

from lib.cli import dlq
from lib.platform import config
from lib.platform.db import MIGRATION_SESSION, Database, describe
from lib.platform.errors import DatabaseUnavailable, ServiceError
from lib.platform.grants import describe_permission_denied
from lib.platform.redact import outside_text
from lib.state.lane_store import LaneStore
from lib.state.operations import OperatorRecords
from lib.state.privileges import RolePrivileges, explain_denial
from lib.state.sweeps import SweepRecords

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from lib.platform.sqs import Queue

PROG = "archive-ctl"
# The conventions of git, kubectl and the AWS CLI: 0 done, 1 the thing asked failed, 2 a
# bad command line; codes above tell apart what a script must (lib.cli.main lists, per
# command, only those it can return).
EXIT_OK = 0
EXIT_ERROR = 1  # the thing asked failed: configuration, database, SQS; the message says which
EXIT_USAGE = 2  # a bad command line: argparse's own code, and UsageError's
EXIT_PARTIAL = 3  # done in part: some records not found or not sent; status: a part unread
EXIT_NO_ROLE = 4  # grants: there is no such role
EXIT_NOT_FOUND = 4  # show: there is no such record
EXIT_NOT_MIGRATED = 5  # grants: tables or columns this release needs do not exist yet
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (128 + SIGPIPE), as a shell reports it
# grants: the role lacks privileges (the GRANTs are printed); the same number as a partial
# answer elsewhere: the check ran, and what it found is not complete.
EXIT_MISSING_GRANTS = EXIT_PARTIAL


class CommandError(ServiceError):
    """A clear, expected failure: printed as one line, exit code EXIT_ERROR."""


class UsageError(CommandError):
    """The command line asks for something that cannot be done as asked (a filter that is
    missing or contradicts another): printed with the command's usage, exit code EXIT_USAGE."""


@dataclass
class Context:
    """Per run: the parsed options, and the clients built on first use from them and config."""

    args: argparse.Namespace
    _db: Database | None = None
    _queue: Queue | None = None
    # How long-running commands wait and tell time; tests replace them so that a paced
    # run takes no real time.
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def database(self, *, migration_session: bool = False) -> Database:
        if self._db is None:
            settings = config.load_database_config()
            if migration_session:
                # No silent reconnect: the migration's advisory lock lives in the session.
                self._db = Database(
                    settings,
                    application_name=f"{PROG}-migrate",
                    session=MIGRATION_SESSION,
                    reconnect=False,
                )
            else:
                self._db = Database(settings, application_name=PROG)
        return self._db

    def records(self) -> OperatorRecords:
        return OperatorRecords(self.database())

    def lanes(self) -> LaneStore:
        return LaneStore(self.database())

    def sweeps(self) -> SweepRecords:
        return SweepRecords(self.database())

    def privileges(self) -> RolePrivileges:
        return RolePrivileges(self.database())

    @property
    def connected(self) -> Database | None:
        """The database, if this run has opened it (to explain a failure in its terms)."""
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

    def logs_client(self) -> Any:
        """CloudWatch Logs, for `show --logs` (boto3 imported on first use)."""
        from lib.platform import aws  # noqa: PLC0415

        return aws.client("logs", connect_timeout=5, read_timeout=15, max_attempts=2)

    def sqs_no_retry(self) -> SQSClient:
        from lib.platform.sqs import Queue  # noqa: PLC0415

        return Queue(max_attempts=1).client

    def queue_url(self) -> str | None:
        return self.args.queue_url or config.queue_urls().queue

    def required_queue_url(self) -> str:
        url = self.queue_url()
        if url is None:
            raise CommandError("no queue URL: set ARCHIVE_QUEUE_URL or pass --queue-url")
        return url

    def dlq_url(self) -> str:
        url = self.args.dlq_url or config.queue_urls().dlq
        if url:
            return url
        queue_url = self.queue_url()
        if queue_url is None:
            raise CommandError(
                "no DLQ URL: set ARCHIVE_DLQ_URL or pass --dlq-url "
                "(or give the queue URL, whose redrive policy names the DLQ)"
            )
        derived = dlq.dead_letter_queue_url(self.sqs, queue_url)
        if derived is None:
            raise CommandError(f"{queue_url} has no redrive policy; pass --dlq-url")
        return derived

    @property
    def json(self) -> bool:
        """--json: stdout is one JSON document (`answer`); report lines are not printed."""
        return bool(getattr(self.args, "json", False))

    def say(self, line: str = "") -> None:
        """A line of the text report (nothing under --json, whose answer says it all)."""
        if not self.json:
            out(line)

    def progress(self, line: str = "") -> None:
        """A line about the work under way: stdout in text, stderr under --json."""
        if self.json:
            note(line)
        else:
            out(line)

    def answer(self, data: Any) -> None:
        """The command's answer under --json (nothing in text, which `say` printed)."""
        if self.json:
            out(json_text(data))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


def out(line: str = "") -> None:
    print(line, flush=True)


def note(line: str = "") -> None:
    """Progress and remarks that are not the command's answer: stderr, so that stdout stays
    one JSON document under --json (and pipes carry only the answer)."""
    print(line, file=sys.stderr, flush=True)


def json_text(data: Any) -> str:
    """The --json answer; times in ISO 8601, dataclasses as objects."""
    return json.dumps(data, indent=2, default=_json_value)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def describe_error(error: BaseException, *, database: Database | None = None) -> str:
    """One line for an expected failure, as `archive-ctl: error: ...` or a status note. A
    42501 names what the role lacks when `database` can still be asked."""
    if isinstance(error, ClientError):
        detail = error.response.get("Error", {})
        message = str(detail.get("Message", "")).strip()
        if message.startswith("<"):
            message = "(an HTML error page)"
        return (
            f"SQS {error.operation_name}: {detail.get('Code', '?')}: {outside_text(message, 300)}"
        )
    if isinstance(error, DatabaseUnavailable):
        return f"database unreachable: {error}"
    if isinstance(error, pg8000.exceptions.Error):
        # A 42501 names the table, what the role lacks and the command that prints the GRANTs.
        explained = (
            explain_denial(database, error)
            if database is not None
            else describe_permission_denied(error)
        )
        return f"database error: {explained}{_database_hint(error)}"
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
