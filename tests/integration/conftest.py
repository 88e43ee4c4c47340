"""The archive function wired to the real test services (see tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from devkit.lsky import DEFAULT_TOKEN
from devkit.postgres import connect
from devkit.sqs import MotoServer, QueuePair, receive_as_lambda_event
from lib.archive import runtime
from lib.archive.message import encode
from tests.logcapture import LogAssertions, capture_logs
from tests.support import HANG_SECONDS, FakeLambdaContext, queue_attrs, reset_lane, sqs_event

if TYPE_CHECKING:
    from tests.integration.world import World

TOKEN = DEFAULT_TOKEN
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ArchiveHarness(LogAssertions):
    sqs: Any
    queues: QueuePair
    env: dict[str, str]
    raw_logs: list[str]
    moto: MotoServer

    def send(self, body: str) -> str:
        return str(self.sqs.send_message(QueueUrl=self.queues.url, MessageBody=body)["MessageId"])

    def receive(self, max_messages: int = 1, wait_seconds: int = 1) -> dict[str, Any]:
        return receive_as_lambda_event(
            self.sqs, self.queues, max_messages=max_messages, wait_seconds=wait_seconds
        )

    def receive_all(self, count: int) -> list[dict[str, Any]]:
        """Receive until `count` messages are in hand (moto hands out at most ten a call)."""
        records: list[dict[str, Any]] = []
        for _ in range(10):
            records += self.receive(max_messages=10)["Records"]
            if len(records) >= count:
                break
        assert len(records) == count, f"{len(records)} of {count} messages arrived"
        return records

    def invoke(self, event: dict[str, Any], context: FakeLambdaContext | None = None) -> Any:
        from handlers.archive import lambda_handler

        return lambda_handler(event, context or FakeLambdaContext())

    def settle(self, event: dict[str, Any], response: Any) -> None:
        """Do what Lambda's event source mapping does with a partial batch response:
        delete what succeeded, leave the batch item failures to their visibility."""
        failed = {item["itemIdentifier"] for item in response["batchItemFailures"]}
        for record in event["Records"]:
            if record["messageId"] not in failed and record["receiptHandle"]:
                self.sqs.delete_message(
                    QueueUrl=self.queues.url, ReceiptHandle=record["receiptHandle"]
                )

    def deliver(self, body: str, context: FakeLambdaContext | None = None) -> Any:
        """Send one message, receive it as Lambda would, invoke the handler, settle it."""
        self.send(body)
        event = self.receive()
        assert len(event["Records"]) == 1, "the message did not arrive"
        response = self.invoke(event, context)
        self.settle(event, response)
        return response

    def fast_forward(self, event: dict[str, Any]) -> None:
        """The hold on the event's messages runs out now, as it would once the visibility
        the handler set had passed: the test moves the clock on instead of waiting."""
        for record in event["Records"]:
            self.sqs.change_message_visibility(
                QueueUrl=self.queues.url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
            )

    def holds(self) -> list[int]:
        """Every visibility (seconds) set on this queue's messages, in order (what the
        handler asked SQS to hold them for, read from the requests moto served)."""
        calls = self.moto.sqs_calls("ChangeMessageVisibility", QueueUrl=self.queues.url)
        return [int(call["VisibilityTimeout"]) for call in calls]

    def visible(self, url: str | None = None) -> int:
        return queue_attrs(self.sqs, url or self.queues.url).visible

    def in_flight(self, url: str | None = None) -> int:
        return queue_attrs(self.sqs, url or self.queues.url).not_visible


@pytest.fixture
def archive_env(
    monkeypatch: pytest.MonkeyPatch, pg_dsn: str, lsky: Any, queues: QueuePair
) -> Iterator[Callable[..., dict[str, str]]]:
    """Set the archive function's environment (overrides as keyword args) and reset its state."""

    def apply(**overrides: str | None) -> dict[str, str]:
        env: dict[str, str | None] = {
            "DATABASE_URL": pg_dsn,
            "LSKY_BASE_URL": lsky.base_url,
            "LSKY_TOKEN": TOKEN,
            "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8",
            "ARCHIVE_DLQ_URL": queues.dlq_url,
            "ARCHIVE_QUEUE_URL": queues.url,
            "ARCHIVE_RETRY_DELAYS": "30,120,600",
            "ARCHIVE_MAX_ATTEMPTS": "3",
            "LSKY_STRATEGY_ID": None,
            "LSKY_ALBUM_ID": None,
            "DB_SECRET_ARN": None,
            "LSKY_TOKEN_SECRET_ARN": None,
            "ARCHIVE_STAGING_BUCKET": None,  # staging off unless a test turns it on
            "ARCHIVE_ORIGINALS_BUCKET": None,  # no originals kept unless a test says so
            "ARCHIVE_ORIGINALS_STORAGE_CLASS": None,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "ImageArchive",
            **overrides,
        }
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        runtime.reset()
        return {k: v for k, v in env.items() if v is not None}

    yield apply
    runtime.reset()


@pytest.fixture
def archive(
    archive_env: Callable[..., dict[str, str]], sqs: Any, queues: QueuePair, moto: MotoServer
) -> Iterator[ArchiveHarness]:
    env = archive_env()
    with capture_logs() as raw:
        yield ArchiveHarness(sqs=sqs, queues=queues, env=env, raw_logs=raw, moto=moto)


# A short invocation (the `short_invocation` fixture): with the reserves shrunk, its
# attempt has about 2 s to transfer and 3 s left to conclude once that deadline passed.
SHORT_INVOCATION_SECONDS = 5.0
SHORT_FINISH_RESERVE_MS = 3_000


@pytest.fixture
def short_invocation(monkeypatch: pytest.MonkeyPatch) -> Callable[[], FakeLambdaContext]:
    """Shrink the time guard's reserves so an attempt can run out of time in seconds;
    returns a maker of such invocations' contexts. Their clock starts when the worker first
    looks at it, so neither the test's setup nor a slow moment before the handler ran eats
    the budget. What then holds the transfer past its deadline must be an event (a held
    Lsky answer, a gated upstream), never a number of seconds raced against the budget."""
    from lib.archive import budget, schedule, transfer

    monkeypatch.setattr(schedule, "MIN_ATTEMPT_MS", 500)
    monkeypatch.setattr(transfer, "FINISH_RESERVE_MS", SHORT_FINISH_RESERVE_MS)
    monkeypatch.setattr(budget, "DOWNLOAD_OVERHEAD_SECONDS", 0.1)
    monkeypatch.setattr(budget, "UPLOAD_OVERHEAD_SECONDS", 0.2)
    return lambda: FakeLambdaContext(timeout_seconds=SHORT_INVOCATION_SECONDS, from_first_look=True)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a test opens when it is ready (Behaviour.held, an upstream route's gate);
    opened at the end in any case, so nothing held outlives the test."""
    event = threading.Event()
    yield event
    event.set()


@dataclass
class Child:
    """The archive handler running in a subprocess (tests.integration.invoke_child)."""

    process: subprocess.Popen[str]
    out: str | None = None

    def response(self, timeout: float = HANG_SECONDS) -> dict[str, Any]:
        out = self.output(timeout)
        lines = [line for line in out.splitlines() if line.startswith("RESPONSE ")]
        assert lines, f"the child printed no response (exit {self.process.returncode}):\n{out}"
        result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESPONSE "))
        return result

    def output(self, timeout: float = HANG_SECONDS) -> str:
        """Everything the child printed, once it has exited (read once, however it ended)."""
        if self.out is None:
            self.out, _ = self.process.communicate(timeout=timeout)
        return self.out

    def logs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.output().splitlines() if '"level"' in line]


def start_child(event: dict[str, Any], tmp: Path, name: str, *, gate: Path | None = None) -> Child:
    """Start a handler process for `event` with the current (monkeypatched) environment.
    With `gate`, it waits after its imports until that file exists (tmp/<name>.ready says
    it is waiting)."""
    event_file = tmp / f"{name}.json"
    event_file.write_text(json.dumps(event))
    args = [sys.executable, "-m", "tests.integration.invoke_child", str(event_file)]
    if gate is not None:
        args += [str(tmp / f"{name}.ready"), str(gate)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    process = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Child(process)


# -- a cheaper harness for long parametrised tables ------------------------------------
# Creating queues and a connection per test costs ~0.1 s; tables of dozens of cases that
# only need the handler, the database and the HTTP stand-ins share them per module.

QUICK_ENV = {
    "LSKY_TOKEN": TOKEN,
    "POWERTOOLS_TRACE_DISABLED": "true",
    "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8",
}


@pytest.fixture(scope="module")
def quick_env(pg_dsn: str, _lsky_server: Any, moto: Any) -> Iterator[Callable[..., None]]:
    """`quick_env(**overrides)` sets the archive function's environment for a test;
    its cached state is rebuilt only when the environment actually changes."""
    current: list[dict[str, str]] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in ("DB_SECRET_ARN", "LSKY_TOKEN_SECRET_ARN", "LSKY_STRATEGY_ID", "LSKY_ALBUM_ID"):
            patch.delenv(name, raising=False)
        base = {"DATABASE_URL": pg_dsn, "LSKY_BASE_URL": _lsky_server.base_url, **QUICK_ENV}

        def apply(**overrides: str) -> None:
            wanted = {**base, **overrides}
            if current != [wanted]:
                for name, value in wanted.items():
                    patch.setenv(name, value)
                for name in set(current[0] if current else {}) - set(wanted):
                    patch.delenv(name, raising=False)
                runtime.reset()
                current[:] = [wanted]

        yield apply
    runtime.reset()


@pytest.fixture(scope="module")
def quick_conn(pg_dsn: str) -> Iterator[Any]:
    connection = connect(pg_dsn)
    reset_lane(connection)  # an earlier module may have left the shared lane paused
    yield connection
    connection.close()


def quick_invoke(record_id: int, context: FakeLambdaContext | None = None) -> Any:
    """Invoke the handler with a synthetic one-record event (fake receipt handle: setting
    its visibility fails with a logged warning, which these tests do not look at)."""
    from handlers.archive import lambda_handler

    return lambda_handler(sqs_event([encode(record_id)]), context or FakeLambdaContext())


@pytest.fixture
def blank_database(pg_dsn: str) -> Iterator[str]:
    """A new, empty database on the test server."""
    name = f"blank_{uuid.uuid4().hex[:10]}"
    admin = connect(pg_dsn)
    admin.run(f'CREATE DATABASE "{name}"')
    try:
        yield pg_dsn.rsplit("/", 1)[0] + "/" + name
    finally:
        admin.run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, pg_dsn: str, db: Any, queues: QueuePair) -> None:
    """archive-ctl's environment: the test database and queues, nothing inherited."""
    monkeypatch.setenv("DATABASE_URL", pg_dsn)
    monkeypatch.setenv("ARCHIVE_QUEUE_URL", queues.url)
    monkeypatch.setenv("ARCHIVE_DLQ_URL", queues.dlq_url)
    for name in ("DB_SECRET_ARN", "DB_SSLMODE", "ARCHIVE_LOCK_TTL_SECONDS", "LSKY_RATE_LIMITS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def world(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> World:
    """The archive function's world with its builders (tests.integration.world.World)."""
    from tests.integration.world import World

    return World(archive=archive, db=db, upstream=upstream, lsky=lsky, settings=archive_env)


@dataclass
class ArchiveCtl:
    """The real `archive-ctl` command (scripts/archive-ctl) in a process of its own, with
    the test services in a clean environment: what an operator's shell runs."""

    env: dict[str, str]

    def __call__(
        self, *argv: str, env: dict[str, str | None] | None = None, **run: Any
    ) -> subprocess.CompletedProcess[str]:
        environment = dict(self.env)
        for name, value in (env or {}).items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
        run.setdefault("stdout", subprocess.PIPE)
        run.setdefault("stderr", subprocess.PIPE)
        return subprocess.run(
            [str(ROOT / "scripts" / "archive-ctl"), *argv],
            text=True,
            env=environment,
            timeout=HANG_SECONDS,
            check=False,
            **run,
        )

    def json(self, *argv: str, code: int = 0) -> Any:
        """The --json answer of a run that must end with `code`."""
        result = self(*argv, "--json")
        assert result.returncode == code, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def archive_ctl(pg_dsn: str, db: Any, queues: QueuePair, moto: MotoServer) -> ArchiveCtl:
    inherited = ("PATH", "AWS_ENDPOINT_URL_SQS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    env = {name: os.environ[name] for name in inherited}
    env.update(
        PYTHON=sys.executable,
        DATABASE_URL=pg_dsn,
        ARCHIVE_QUEUE_URL=queues.url,
        ARCHIVE_DLQ_URL=queues.dlq_url,
        AWS_REGION=os.environ["AWS_REGION"],
        AWS_DEFAULT_REGION=os.environ["AWS_DEFAULT_REGION"],
    )
    return ArchiveCtl(env)
