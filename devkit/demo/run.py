"""Driving a `make local` run: start, seed, poll and schedule, wait, summarise, stop."""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devkit.demo.report import STATES, Printer, Summary, describe_log, print_summary
from devkit.demo.scenario import MAX_ATTEMPTS, NORMAL, SHORT, Expected, Profile, Sample, plan
from devkit.demo.seeding import seed
from devkit.demo.services import Services, function_environment, start_services
from lib.cli.words import plural

if TYPE_CHECKING:
    from devkit.containers import Container
    from devkit.event_sources import Delivery
    from lib.platform.db import Database

REPO_ROOT = Path(__file__).resolve().parents[2]
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


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
        "--keep",
        action="store_true",
        help="after the summary, leave the database, queues and stand-ins running (the "
        "functions stop) and print the variables to reach them; Ctrl-C stops them",
    )
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
        from lib.platform.config import DatabaseConfig  # noqa: PLC0415
        from lib.platform.db import Database  # noqa: PLC0415

        printer, args = self.printer, self.args
        printer.plain(
            f"image-archive, locally: {plural(len(self.samples), 'record')}, "
            f"{plural(args.concurrency, 'archive container')} "
            f"(BatchSize {args.batch_size}, MaximumConcurrency {args.concurrency}), "
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
        buckets = f"{services.staging_bucket}, {services.originals_bucket}"
        printer.line("s3", f"{services.moto.endpoint_url} (moto), buckets {buckets}")
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
            f"{plural(len(self.samples), 'record')}, {plural(sent, 'message')} (1 malformed); "
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

    def stop_functions(self) -> None:
        """The poller, the schedule and the containers; the services stay (--keep)."""
        for source in self.sources:
            source.stop()
        self.sources = []
        for container in self.containers:
            container.stop()
        self.containers = []
        if self.db is not None:
            self.db.close()
            self.db = None

    def close(self) -> None:
        self.stop_functions()
        self.stack.close()


def _run(args: argparse.Namespace, profile: Profile, samples: list[Sample], data_dir: Path) -> int:
    demo = Demo(args, profile, samples, data_dir)
    summary: Summary | None = None
    services: Services | None = None
    try:
        services = demo.setup()
        summary = demo.seed_and_drive(services)
    except KeyboardInterrupt:
        demo.printer.plain()
        demo.printer.line("stopping", "interrupted: stopping the poller, containers, servers")
        with no_interrupts():
            summary = demo.interrupted_summary()
    finally:
        keep = args.keep and services is not None and summary is not None
        with no_interrupts():
            if keep and summary is not None and not summary.interrupted:
                demo.stop_functions()
            else:
                demo.close()
    if summary is None:
        return EXIT_INTERRUPTED
    print_summary(summary, demo.printer)
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary.__dict__, indent=2, default=str))
    if summary.interrupted:
        return EXIT_INTERRUPTED
    code = EXIT_OK if summary.completed else EXIT_FAILED
    if args.keep and services is not None:
        _keep(demo, services, summary)
    return code


def _keep(demo: Demo, services: Services, summary: Summary) -> None:
    """--keep: the services stay until Ctrl-C, for `archive-ctl show` and friends."""
    from devkit.demo.stack import hold  # noqa: PLC0415

    example = summary.failures[0]["record_id"] if summary.failures else None
    try:
        hold(services, demo.printer, record_id=example)
    except KeyboardInterrupt:
        demo.printer.line("stopping", "the services kept by --keep")
    finally:
        with no_interrupts():
            demo.close()
