"""The `make local` scenario: the records, their sample images, what each should end as.

Every path of the pipeline gets a record: plain and slow downloads, transient failures
that recover, a permanent failure, one that uses up its attempts, a lost message and an
expired lock for the sweeper, and a malformed message for the DLQ. `Expected` is what
the summary must show; the CI test compares them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from devkit import images

if TYPE_CHECKING:
    pass

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
