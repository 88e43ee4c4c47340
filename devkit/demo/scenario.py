"""The `make local` scenario: the records, their sample images, what each should end as.

Every path of the pipeline gets a record: plain and slow downloads, transient failures
that recover, a permanent failure, one that uses up its attempts, a lost message and an
expired lock for the sweeper, and a malformed message for the DLQ. `Expected` is what
the summary must show; the CI test compares them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from devkit import images

if TYPE_CHECKING:
    from devkit.demo.services import Services
    from lib.platform.db import Database

MAX_ATTEMPTS = 3


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


def seed(services: Services, db: Database, samples: list[Sample], profile: Profile) -> int:
    """Rows and messages as the generation service makes them; returns messages sent."""
    from lib.archive.enqueue import enqueue  # noqa: PLC0415
    from lib.platform.sqs import Queue  # noqa: PLC0415
    from lib.state.operations import OperatorRecords  # noqa: PLC0415

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
    report = enqueue(OperatorRecords(db), Queue(), services.queues.url, normal)
    if not report.ok or report.skipped:
        raise RuntimeError(f"seeding could not enqueue every record: {report}")
    services.sqs.send_message(QueueUrl=services.queues.url, MessageBody='{"record": 7}')
    return len(report.sent) + 1
