"""`make local`: the whole pipeline on this machine, on embedded defaults.

Starts a throwaway PostgreSQL, moto's SQS, a Lsky Pro stand-in that stores files on
disk and serves them, and an upstream that serves generated sample images (some
slow, some failing at first, one gone, one failing for good). Seeds records the way
the generation service would (lib.enqueue: row first, then message), plus a record
whose message was lost, one left RUNNING by a crashed attempt, and a malformed
message. Then runs the real handlers: the archive function in MaximumConcurrency
containers fed by an event-source-mapping poller, and the sweeper on a timer.
Prints a line per event, a summary table and the archived files' paths.

    python -m devkit.demo [--records N] [--short] [--concurrency N] [--batch-size N]

`--short` is the CI mode: few records, 1 s / 2 s backoff, done in about 10 s.
Ctrl-C stops everything it started (containers, servers, the cluster) and exits 130.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import os
import queue
import signal
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devkit import images

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from devkit.containers import Container
    from devkit.event_sources import Delivery
    from devkit.lsky import LskyStandIn
    from devkit.postgres import PostgresCluster
    from devkit.sqs import MotoServer, QueuePair
    from devkit.upstream import UpstreamServer
    from lib.db import Database

REPO_ROOT = Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
MAX_ATTEMPTS = 3
STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED")


@dataclass(frozen=True)
class Profile:
    """Timings of a run. Production's backoff (30 s / 2 min / 10 min) would make a
    demo take a quarter of an hour; the shape is the same, only shorter."""

    records: int
    retry_delays: tuple[int, ...]
    sweep_every: float  # seconds between sweeper runs (production: 5 minutes)
    sweep_grace: int  # ARCHIVE_SWEEP_GRACE_SECONDS (production: 300)
    requeue_interval: int  # ARCHIVE_REQUEUE_INTERVAL_SECONDS (production: 900)
    slow_seconds: float  # how long a slow upstream makes the download wait
    status_every: float  # seconds between compact status lines
    timeout: float  # give up (and fail) after this long


NORMAL = Profile(
    records=24,
    retry_delays=(2, 5),
    sweep_every=4,
    sweep_grace=6,
    requeue_interval=30,
    slow_seconds=2.5,
    status_every=5,
    timeout=300,
)
SHORT = Profile(
    records=8,
    retry_delays=(1, 2),
    sweep_every=1.5,
    sweep_grace=3,
    requeue_interval=20,
    slow_seconds=1.0,
    status_every=3,
    timeout=90,
)


# -- the scenario -------------------------------------------------------------------------


class Kind(enum.StrEnum):
    OK = "ok"
    SLOW = "slow"  # the upstream takes its time
    FLAKY = "flaky"  # 503 once, then fine: one retry
    FLAKY_TWICE = "flaky-twice"  # 503 twice: archived on the last attempt
    GONE = "gone"  # 404: the provider's URL expired, fails at once
    BROKEN = "broken"  # 503 forever: fails after the last attempt
    LOST = "lost"  # PENDING, but its message never made it: the sweeper sends it
    STALE = "stale"  # RUNNING under a lock that expired: the sweeper takes it over
    BIG = "big"  # 3 MB: spooled to disk by the downloader
    JPEG = "jpeg"
    GIF = "gif"
    WEBP = "webp"


# Which kinds a run of N records has: the first N of this list, then plain ones.
SCENARIO = (
    Kind.OK,
    Kind.SLOW,
    Kind.FLAKY,
    Kind.GONE,
    Kind.BROKEN,
    Kind.LOST,
    Kind.STALE,
    Kind.JPEG,
    Kind.FLAKY_TWICE,
    Kind.BIG,
    Kind.GIF,
    Kind.WEBP,
    Kind.SLOW,
)
FAILS = frozenset({Kind.GONE, Kind.BROKEN})
RETRIES = {Kind.FLAKY: 1, Kind.FLAKY_TWICE: 2, Kind.BROKEN: MAX_ATTEMPTS - 1}
SWEPT = frozenset({Kind.LOST, Kind.STALE})
USERS = {1: "alice", 2: "bob", 3: "李雷", 4: ""}  # "" shows the user<id> fallback name


@dataclass(frozen=True)
class Sample:
    record_id: int
    kind: Kind
    user_id: int

    @property
    def path(self) -> str:
        return f"/gen/{self.record_id}.{self.extension}"

    @property
    def extension(self) -> str:
        return {Kind.JPEG: "jpg", Kind.GIF: "gif", Kind.WEBP: "webp"}.get(self.kind, "png")

    def body(self) -> bytes:
        match self.kind:
            case Kind.JPEG:
                return images.jpeg()
            case Kind.GIF:
                return images.gif()
            case Kind.WEBP:
                return images.webp()
            case Kind.BIG:
                return images.png(64, 64, size=3 * 1024 * 1024, seed=self.record_id % 4)
            case _:
                # Distinct sizes: Lsky stores identical files once, and these should differ.
                size = 20_000 + self.record_id * 997
                return images.png(32, 32, size=size, seed=self.record_id % 4)


def plan(records: int) -> list[Sample]:
    kinds = [*SCENARIO[:records], *[Kind.OK] * max(0, records - len(SCENARIO))]
    return [
        Sample(record_id=i, kind=kind, user_id=(i - 1) % len(USERS) + 1)
        for i, kind in enumerate(kinds, start=1)
    ]


@dataclass(frozen=True)
class Expected:
    archived: int
    failed: int
    retried: int
    swept: int
    dlq: int = 1  # the malformed message

    @classmethod
    def of(cls, samples: list[Sample]) -> Expected:
        kinds = [s.kind for s in samples]
        return cls(
            archived=sum(k not in FAILS for k in kinds),
            failed=sum(k in FAILS for k in kinds),
            retried=sum(RETRIES.get(k, 0) for k in kinds),
            swept=sum(k in SWEPT for k in kinds),
        )


# -- output ----------------------------------------------------------------------------------


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


# -- the services ----------------------------------------------------------------------------


@dataclass
class Services:
    cluster: PostgresCluster | None  # None: a database on an existing server (--database-url)
    dsn: str
    moto: MotoServer
    sqs: SQSClient
    queues: QueuePair
    upstream: UpstreamServer
    lsky: LskyStandIn


def _local_aws_environment(endpoint_url: str) -> None:
    """Point boto3 (here and in the containers, which inherit it) at moto, and make
    sure no real credentials or profile can be picked up by accident."""
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        os.environ.pop(name, None)
    os.environ.update(
        {
            "AWS_ENDPOINT_URL_SQS": endpoint_url,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
    )


def _throwaway_database(stack: contextlib.ExitStack, server_url: str) -> str:
    """A fresh database on an existing server, dropped when the run ends."""
    from urllib.parse import urlsplit, urlunsplit  # noqa: PLC0415

    from devkit.postgres import connect  # noqa: PLC0415

    name = f"archive_demo_{os.getpid()}_{int(time.time())}"
    admin = connect(server_url)
    admin.run(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        admin.run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

    stack.callback(drop)
    return urlunsplit(urlsplit(server_url)._replace(path="/" + name))


def start_services(
    stack: contextlib.ExitStack, data_dir: Path, database_url: str | None = None
) -> Services:
    """Every service bound to 127.0.0.1 on a free port; `stack` stops them in reverse."""
    import boto3  # noqa: PLC0415 - the slow imports wait until they are needed

    from devkit.lsky import LskyStandIn  # noqa: PLC0415
    from devkit.postgres import PostgresCluster, apply_schema  # noqa: PLC0415
    from devkit.sqs import create_queue_pair, start_moto_server  # noqa: PLC0415
    from devkit.upstream import UpstreamServer  # noqa: PLC0415

    cluster: PostgresCluster | None = None
    if database_url:
        dsn = _throwaway_database(stack, database_url)
    else:
        cluster = stack.enter_context(PostgresCluster())
        dsn = cluster.create_database("archive")
    apply_schema(dsn)
    moto = stack.enter_context(start_moto_server())
    _local_aws_environment(moto.endpoint_url)
    sqs = boto3.client("sqs")
    queues = create_queue_pair(sqs, "local-archive", max_receive_count=5, visibility_timeout=720)
    upstream = stack.enter_context(UpstreamServer())
    lsky = stack.enter_context(LskyStandIn(storage_dir=data_dir / "lsky"))
    return Services(cluster, dsn, moto, sqs, queues, upstream, lsky)


def function_environment(services: Services, profile: Profile) -> dict[str, str]:
    """Both functions' environment: what template.yaml sets, pointed at the local services."""
    return {
        "DATABASE_URL": services.dsn,
        "DB_SSLMODE": "disable",
        "LSKY_BASE_URL": services.lsky.base_url,
        "LSKY_TOKEN": services.lsky.token,
        "ARCHIVE_QUEUE_URL": services.queues.url,
        "ARCHIVE_DLQ_URL": services.queues.dlq_url,
        "ARCHIVE_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "ARCHIVE_RETRY_DELAYS": ",".join(map(str, profile.retry_delays)),
        "ARCHIVE_LOCK_TTL_SECONDS": "180",
        # The upstream is on loopback, which the SSRF guard refuses by default.
        "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8",
        "ARCHIVE_SWEEP_GRACE_SECONDS": str(profile.sweep_grace),
        "ARCHIVE_REQUEUE_INTERVAL_SECONDS": str(profile.requeue_interval),
        "ARCHIVE_SWEEP_MAX_ROWS": "5000",
        "POWERTOOLS_SERVICE_NAME": "image-archive",
        "POWERTOOLS_METRICS_NAMESPACE": "ImageArchive",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "POWERTOOLS_TRACE_DISABLED": "true",
    }


# -- seeding ------------------------------------------------------------------------------------


def seed(services: Services, db: Database, samples: list[Sample], profile: Profile) -> int:
    """Rows and messages as the generation service makes them; returns messages sent."""
    from lib.enqueue import enqueue  # noqa: PLC0415
    from lib.queue import Queue  # noqa: PLC0415

    for user_id, username in USERS.items():
        db.run("INSERT INTO users (id, username) VALUES (:id, :name)", id=user_id, name=username)
    now = datetime.now(UTC)
    for sample in samples:
        up = services.upstream
        match sample.kind:
            case Kind.GONE:
                url = up.add(sample.path, b"gone", status=404, content_type="text/plain")
            case Kind.BROKEN:
                url = up.add(sample.path, sample.body(), fail_first=10**6)
            case Kind.FLAKY | Kind.FLAKY_TWICE:
                fail = 1 if sample.kind is Kind.FLAKY else 2
                url = up.add(sample.path, sample.body(), fail_first=fail)
            case Kind.SLOW:
                url = up.add(sample.path, sample.body(), delay=profile.slow_seconds)
            case _:
                mime = images.sniff(sample.body()) or "image/png"
                url = up.add(sample.path, sample.body(), content_type=mime)
        db.run(
            "INSERT INTO image_generation_records (id, user_id, status, prompt, image_url, "
            "started_at) VALUES (:id, :user_id, 'SUCCEEDED', :prompt, :url, :started)",
            id=sample.record_id,
            user_id=sample.user_id,
            prompt=f"sample {sample.kind}",
            url=url,
            started=now - timedelta(minutes=len(samples) - sample.record_id),
        )
    # A producer whose SendMessage failed after its UPDATE: PENDING, due, never sent.
    lost = [s.record_id for s in samples if s.kind is Kind.LOST]
    db.run(
        "UPDATE image_generation_records SET archive_status = 'PENDING', "
        "archive_next_run_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))",
        ids=lost,
    )
    # An attempt whose container crashed an hour ago: RUNNING under an expired lock.
    stale = [s.record_id for s in samples if s.kind is Kind.STALE]
    db.run(
        "UPDATE image_generation_records SET archive_status = 'RUNNING', archive_attempts = 1, "
        "archive_locked_by = 'crashed-invocation', archive_locked_at = now() - interval '1 hour', "
        "archive_next_run_at = now() - interval '1 hour', "
        "archive_enqueued_at = now() - interval '1 hour' WHERE id = ANY(CAST(:ids AS bigint[]))",
        ids=stale,
    )
    normal = [s.record_id for s in samples if s.kind not in SWEPT]
    report = enqueue(db, Queue(), services.queues.url, normal)
    if not report.ok or report.skipped:
        raise RuntimeError(f"seeding could not enqueue every record: {report}")
    services.sqs.send_message(QueueUrl=services.queues.url, MessageBody='{"record": 7}')
    return len(report.sent) + 1


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    swept: int = 0  # messages the sweeper sent
    sweeper_failed: int = 0
    function_errors: int = 0


class Run:
    def __init__(self, services: Services, samples: list[Sample], profile: Profile) -> None:
        self.services = services
        self.samples = samples
        self.profile = profile
        self.printer = Printer()
        self.tally = Tally()
        self.deliveries: queue.Queue[Delivery] = queue.Queue()

    def show(self, delivery: Delivery) -> None:
        invocation = delivery.invocation
        if invocation.error is not None:
            self.tally.function_errors += 1
            self.printer.line(delivery.container, f"function error: {invocation.error}")
        if delivery.source == "schedule":
            summary = invocation.response if isinstance(invocation.response, dict) else {}
            sent, failed = int(summary.get("requeued", 0)), int(summary.get("failed", 0))
            self.tally.swept += sent
            self.tally.sweeper_failed += failed
            if sent or failed:
                self.printer.line(
                    delivery.container,
                    f"re-sent {sent} (expired locks taken over: {summary.get('expired_locks', 0)})"
                    f", failed {failed}",
                )
            return
        for entry in invocation.logs:
            if entry.get("outcome"):
                self.tally.outcomes[str(entry["outcome"])] += 1
            text = describe_log(entry)
            if text is not None:
                self.printer.line(delivery.container, text)

    def states(self, db: Database) -> Counter[str]:
        rows = db.run(
            "SELECT COALESCE(archive_status, 'NULL'), count(*) FROM image_generation_records "
            "WHERE id = ANY(CAST(:ids AS bigint[])) GROUP BY 1",
            ids=[s.record_id for s in self.samples],
        )
        return Counter({str(state): int(n) for state, n in rows})

    def queue_counts(self) -> tuple[int, int, int]:
        attributes = self.services.sqs.get_queue_attributes(
            QueueUrl=self.services.queues.url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return (
            int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]),
            int(attributes["ApproximateNumberOfMessagesDelayed"]),
        )

    def wait_until_settled(self, db: Database, in_flight: Callable[[], int]) -> bool:
        """Show deliveries until every record is concluded and the queue is empty;
        False on timeout."""
        now = time.monotonic()
        deadline = now + self.profile.timeout
        next_check, next_status = now + 0.5, now + self.profile.status_every
        while True:
            try:
                self.show(self.deliveries.get(timeout=0.25))
                continue
            except queue.Empty:
                pass
            now = time.monotonic()
            if now < min(next_check, next_status) and now < deadline:
                continue
            states = self.states(db)
            visible, hidden, delayed = self.queue_counts()
            concluded = states["SUCCEEDED"] + states["FAILED"] == len(self.samples)
            if concluded and visible + hidden + delayed == 0 and in_flight() == 0:
                return True
            if now >= deadline:
                return False
            if now >= next_status:
                counts = ", ".join(f"{state} {states[state]}" for state in STATES)
                self.printer.line(
                    "status",
                    f"queue {visible} visible, {hidden} in flight or backing off | {counts}",
                )
                next_status = now + self.profile.status_every
            next_check = now + 0.5


def dlq_depth(services: Services) -> int:
    attributes = services.sqs.get_queue_attributes(
        QueueUrl=services.queues.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


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


def summarise(run: Run, db: Database, seconds: float, *, completed: bool) -> Summary:
    rows = db.run(
        "SELECT id, archive_status, archive_attempts, hosted_image_url, archive_error, "
        "hosted_response ->> 'origin_name' FROM image_generation_records "
        "WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY id",
        ids=[s.record_id for s in run.samples],
    )
    summary = Summary(
        records=len(run.samples),
        archived=sum(1 for r in rows if r[1] == "SUCCEEDED"),
        retried=run.tally.outcomes["retry"],
        failed=sum(1 for r in rows if r[1] == "FAILED"),
        dlq=dlq_depth(run.services),
        swept=run.tally.swept,
        duplicates=run.tally.outcomes["duplicate"],
        seconds=round(seconds, 1),
        completed=completed,
        function_errors=run.tally.function_errors,
    )
    for record_id, state, attempts, url, error, origin in rows:
        if state == "SUCCEEDED" and url:
            path = run.services.lsky.stored_path(url)
            summary.files.append(
                {"record_id": record_id, "name": origin, "url": url, "path": str(path)}
            )
        elif state == "FAILED":
            summary.failures.append({"record_id": record_id, "attempts": attempts, "error": error})
    return summary


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
            f"  also: {summary.duplicates} duplicate deliveries acknowledged, "
            f"{summary.function_errors} function errors"
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


# -- main -------------------------------------------------------------------------------------


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI runner, `kill`) stops the run the way Ctrl-C does."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def no_interrupts() -> Iterator[None]:
    """Cleanup must finish: a second Ctrl-C while stopping would leave things running."""
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.demo",
        description="Run the image archive end to end on this machine (what `make local` does).",
    )
    parser.add_argument("--records", type=int, help=f"records to seed (default {NORMAL.records})")
    parser.add_argument(
        "--short", action="store_true", help=f"CI mode: {SHORT.records} records, 1 s/2 s backoff"
    )
    parser.add_argument(
        "--concurrency", type=int, default=2, help="archive containers = MaximumConcurrency (2)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="the mapping's BatchSize (1)")
    parser.add_argument(
        "--data-dir", type=Path, help="where files and logs go (default local-data/<time>)"
    )
    parser.add_argument("--timeout", type=float, help="give up after this many seconds")
    parser.add_argument("--summary-json", type=Path, help="also write the summary here")
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="use a fresh database on this server instead of a throwaway cluster "
        "(for machines without PostgreSQL's binaries; the tests pass TEST_DATABASE_URL)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    profile = SHORT if args.short else NORMAL
    records = args.records if args.records is not None else profile.records
    if records < 1 or args.concurrency < 1 or not 1 <= args.batch_size <= 10:
        build_parser().error("--records and --concurrency must be >= 1, --batch-size 1..10")
    if args.timeout:
        profile = Profile(**{**profile.__dict__, "timeout": args.timeout})
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    data_dir = (args.data_dir or REPO_ROOT / "local-data" / stamp).resolve()
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    samples = plan(records)
    # SIGINT re-armed: a non-interactive shell starts background jobs with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with signals_as_interrupt():
        return _run(args, profile, samples, data_dir)


def make_containers(env: dict[str, str], concurrency: int, logs: Path) -> list[Container]:
    """`concurrency` archive containers, then the sweeper's."""
    from devkit.containers import Container  # noqa: PLC0415

    archive = [
        Container(
            f"archive-{n}",
            "handlers.archive:lambda_handler",
            env=env,
            log_path=logs / f"archive-{n}.log",
            function_name="ArchiveFunction",
            timeout_seconds=120,  # template.yaml
        )
        for n in range(1, concurrency + 1)
    ]
    sweeper = Container(
        "sweeper",
        "handlers.sweeper:lambda_handler",
        env=env,
        log_path=logs / "sweeper.log",
        function_name="SweeperFunction",
        timeout_seconds=60,
    )
    return [*archive, sweeper]


class Demo:
    """Owns everything a run starts, so that `close` can stop all of it."""

    def __init__(
        self, args: argparse.Namespace, profile: Profile, samples: list[Sample], data_dir: Path
    ) -> None:
        self.args = args
        self.profile = profile
        self.samples = samples
        self.data_dir = data_dir
        self.printer = Printer()
        self.stack = contextlib.ExitStack()
        self.containers: list[Container] = []
        self.sources: list[Any] = []
        self.run: Run | None = None
        self.db: Database | None = None
        self.started = time.monotonic()

    def setup(self) -> Services:
        from lib.config import DatabaseConfig  # noqa: PLC0415
        from lib.db import Database  # noqa: PLC0415

        printer, args = self.printer, self.args
        printer.plain(
            f"image-archive, locally: {len(self.samples)} records, {args.concurrency} archive "
            f"containers (BatchSize {args.batch_size}, MaximumConcurrency {args.concurrency}), "
            f"sweeper every {self.profile.sweep_every:g} s; Ctrl-C stops everything"
        )
        services = start_services(self.stack, self.data_dir, args.database_url)
        if services.cluster is not None:
            printer.line("postgres", f"127.0.0.1:{services.cluster.port} (throwaway cluster)")
        else:
            printer.line(
                "postgres", f"database {services.dsn.rsplit('/', 1)[-1]} (dropped at exit)"
            )
        printer.line("sqs", f"{services.moto.endpoint_url} (moto), queue and DLQ local-archive")
        printer.line("lsky", f"{services.lsky.base_url}, files in {services.lsky.storage_dir}")
        printer.line("upstream", f"{services.upstream.base_url} (sample images)")
        logs = self.data_dir / "logs"
        env = function_environment(services, self.profile)
        self.containers = make_containers(env, args.concurrency, logs)
        for container in self.containers:
            container.launch()  # the inits run in parallel
        for container in self.containers:
            container.wait_ready()
        pids = ", ".join(f"{c.name} pid {c.pid}" for c in self.containers)
        printer.line("containers", f"{pids}; logs in {logs}")
        self.db = Database(DatabaseConfig(url=services.dsn), application_name="local-demo")
        self.run = Run(services, self.samples, self.profile)
        self.run.printer = printer
        return services

    def seed_and_drive(self, services: Services) -> Summary:
        import boto3  # noqa: PLC0415

        from devkit.event_sources import Schedule, SqsEventSource  # noqa: PLC0415

        assert self.run is not None
        assert self.db is not None
        run, db, profile = self.run, self.db, self.profile
        sent = seed(services, db, self.samples, profile)
        expected = Expected.of(self.samples)
        self.printer.line(
            "seed",
            f"{len(self.samples)} records, {sent} messages (1 malformed); "
            f"{expected.swept} left for the sweeper (a lost message, an expired lock); "
            f"backoff {','.join(map(str, profile.retry_delays))} s, {MAX_ATTEMPTS} attempts",
        )
        self.started = time.monotonic()
        *archive, sweeper = self.containers
        source = SqsEventSource(
            clients=[boto3.client("sqs") for _ in archive],
            queue=services.queues,
            containers=archive,
            on_delivery=run.deliveries.put,
            batch_size=self.args.batch_size,
        )
        self.sources.append(source.start())
        schedule = Schedule(
            container=sweeper, interval=profile.sweep_every, on_delivery=run.deliveries.put
        )
        self.sources.append(schedule.start())
        completed = run.wait_until_settled(db, lambda: source.in_flight)
        return summarise(run, db, time.monotonic() - self.started, completed=completed)

    def interrupted_summary(self) -> Summary | None:
        if self.run is None or self.db is None:
            return None
        try:
            summary = summarise(self.run, self.db, time.monotonic() - self.started, completed=False)
        except Exception:  # a half-started run has nothing worth summarising
            return None
        summary.interrupted = True
        return summary

    def close(self) -> None:
        for source in self.sources:
            source.stop()
        for container in self.containers:
            container.stop()
        if self.db is not None:
            self.db.close()
        self.stack.close()


def _run(args: argparse.Namespace, profile: Profile, samples: list[Sample], data_dir: Path) -> int:
    demo = Demo(args, profile, samples, data_dir)
    summary: Summary | None = None
    try:
        services = demo.setup()
        summary = demo.seed_and_drive(services)
    except KeyboardInterrupt:
        demo.printer.plain()
        demo.printer.line("stopping", "interrupted: stopping the poller, containers, servers")
        with no_interrupts():
            summary = demo.interrupted_summary()
    finally:
        with no_interrupts():
            demo.close()
    if summary is None:
        return EXIT_INTERRUPTED
    print_summary(summary, demo.printer)
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary.__dict__, indent=2, default=str))
    if summary.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if summary.completed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
