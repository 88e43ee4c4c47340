"""The rest of the system around an `archive-ctl backfill` that runs on a fake clock: the
archive function taking the queue's messages at the lane's speed (upload slots from the
real take_slot statement when pacing is on), live records arriving, and the database's
clock following the fake one (every timestamp the lane reads moves back as time passes,
less the real time that passed meanwhile: on a loaded machine that is seconds a run)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devkit.sqs import QueuePair
from lib.archive import pacing
from lib.archive.message import encode
from lib.ratelimit import margins
from lib.state.lane_store import LaneStore, SlotAnswer
from tests.integration.test_cli import URL, record_ids
from tests.support import seed_record

SHIFTS = (
    "UPDATE image_archive_uploads SET at = at - make_interval(secs => :s)",
    # The hours are a primary key, checked row by row: a shift in place could meet an hour
    # not moved yet. Far away first (no row there), then back.
    "UPDATE image_archive_upload_hours"
    " SET hour = hour - make_interval(secs => :s) - interval '1000 years'",
    "UPDATE image_archive_upload_hours SET hour = hour + interval '1000 years'",
    "UPDATE image_generation_records SET"
    " archive_next_run_at = archive_next_run_at - make_interval(secs => :s),"
    " archive_enqueued_at = archive_enqueued_at - make_interval(secs => :s),"
    " archived_at = archived_at - make_interval(secs => :s)"
    " WHERE archive_status IN ('PENDING', 'RUNNING')",
    "UPDATE image_archive_lane SET"
    " paused_until = CASE WHEN isfinite(paused_until)"
    "   THEN paused_until - make_interval(secs => :s) ELSE paused_until END,"
    " paused_since = paused_since - make_interval(secs => :s)",
)


def time_passes(db: Any, seconds: float) -> None:
    """The database's clock moves `seconds` on: everything it dated moves back instead."""
    for statement in SHIFTS:
        db.run(statement, s=seconds)


def bulk_never_queued(db: Any, first: int, count: int, *, url: str = URL) -> None:
    """`count` SUCCEEDED generations never queued, ids from `first`, oldest id first."""
    db.run("INSERT INTO users (id, username) VALUES (1, 'alice') ON CONFLICT (id) DO NOTHING")
    db.run(
        "INSERT INTO image_generation_records (id, user_id, status, image_url, started_at)"
        " SELECT g, 1, 'SUCCEEDED', :url, now() - interval '30 days' + g * interval '1 s'"
        " FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g",
        url=url,
        first=first,
        last=first + count - 1,
    )


@dataclass
class LaneModel:
    """What happens while the backfill sleeps `seconds`: live records arrive (`producer`),
    the database's clock moves on (`shift`), and the archive function uploads what the
    queue holds, at most `speed` a second, taking a slot first when `limits` pace it (a
    slot further away holds the record, as the worker does: PENDING, wait reason paced)."""

    db: Any
    sqs: Any
    queues: QueuePair
    limits: tuple[tuple[int, int], ...] = ()
    speed: float = math.inf
    shift: bool = False
    producer: Callable[[LaneModel], None] | None = None
    now: float = 0.0  # fake seconds since the run started
    received: list[int] = field(default_factory=list)
    uploads: dict[int, float] = field(default_factory=dict)  # record id -> fake time
    arrived: dict[int, float] = field(default_factory=dict)  # live record id -> fake time
    refused: list[tuple[str, int]] = field(default_factory=list)  # slots not given at once
    _held: list[tuple[float, int]] = field(default_factory=list)  # (due, record id)
    _budget: float = 0.0
    _real: float | None = None  # time.monotonic() at the last shift

    def __post_init__(self) -> None:
        self.store = LaneStore(self.db)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        if self.shift:
            # The database's own clock moved on by the real time since the last shift:
            # only the rest of the fake seconds is shifted (negative when real time ran
            # ahead), so what it dated is as old as the fake clock says.
            real = time.monotonic()
            ran = 0.0 if self._real is None else real - self._real
            self._real = real
            time_passes(self.db, seconds - ran)
        if self.producer is not None:
            self.producer(self)
        self.work(seconds)

    def add_live(self, record_id: int) -> None:
        """A generation finished: the producer marks its row, then sends its message."""
        seed_record(self.db, record_id, image_url=URL, next_run_at=0, enqueued_at=0)
        self.sqs.send_message(QueueUrl=self.queues.url, MessageBody=encode(record_id))
        self.arrived[record_id] = self.now

    def work(self, seconds: float) -> None:
        """Uploads for `seconds`: held records whose time came first, then new messages,
        received only while there is capacity left (as the event source mapping does)."""
        if math.isinf(self.speed):
            self._budget = math.inf
        else:
            self._budget = min(self._budget + self.speed * seconds, max(self.speed, 1.0))
        ready = sorted(item for item in self._held if item[0] <= self.now)
        self._held = [item for item in self._held if item[0] > self.now]
        for _, record_id in ready:
            self._take(record_id)
        while self._budget >= 1:
            wanted = 10 if math.isinf(self._budget) else min(10, math.floor(self._budget))
            messages = self.sqs.receive_message(
                QueueUrl=self.queues.url, MaxNumberOfMessages=wanted, WaitTimeSeconds=0
            ).get("Messages", [])
            if not messages:
                return
            self.sqs.delete_message_batch(
                QueueUrl=self.queues.url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                    for n, m in enumerate(messages)
                ],
            )
            for record_id in record_ids(messages):
                self.received.append(record_id)
                self._take(record_id)

    def _take(self, record_id: int) -> None:
        if self._budget < 1:
            self._held.append((self.now, record_id))
            return
        wait = self._slot(record_id)
        if wait is None:
            self._budget -= 1
            self._upload(record_id, taken=bool(self.limits))
        else:
            self._held.append((self.now + wait, record_id))

    def _slot(self, record_id: int) -> float | None:
        """None: upload now; else seconds until the slot the lane gave (or its pause ends)."""
        if not self.limits:
            return None
        slot = self.store.take_slot(
            record_id,
            limits=self.limits,
            margin=margins.slot_margin(self.limits),
            tolerance=margins.slot_tolerance(self.limits),
            stale=pacing.BOOKING_STALE_SECONDS,
            book_within=pacing.BOOK_WITHIN_SECONDS,
        )
        if slot.answer is SlotAnswer.GO:
            return None
        self.refused.append((str(slot.answer), record_id))
        wait = max(slot.wait_seconds, 1.0)
        self.db.run(
            "UPDATE image_generation_records SET archive_wait_reason = 'paced',"
            " archive_next_run_at = now() + make_interval(secs => :wait) WHERE id = :id",
            wait=wait,
            id=record_id,
        )
        return wait

    def _upload(self, record_id: int, *, taken: bool) -> None:
        self.db.run(
            "UPDATE image_generation_records SET archive_status = 'SUCCEEDED',"
            " archived_at = now(), archive_next_run_at = NULL, archive_wait_reason = NULL"
            " WHERE id = :id",
            id=record_id,
        )
        if taken:
            self.db.run(
                "UPDATE image_archive_uploads SET state = 'done', at = now()"
                " WHERE record_id = :id AND state = 'taken'",
                id=record_id,
            )
        else:
            self.db.run(
                "INSERT INTO image_archive_uploads (lane, at, record_id, state)"
                " VALUES ('lsky', now(), :id, 'done')",
                id=record_id,
            )
        self.uploads[record_id] = self.now

    def run_until_uploaded(self, ids: range) -> float:
        """Let time pass, from one upload slot to the next, until every record of `ids` is
        uploaded; returns the fake seconds that took."""
        started = self.now
        self.advance(0.0)
        while not set(ids) <= set(self.uploads):
            assert self._held, "nothing left to upload, and not every record was"
            due = min(at for at, _ in self._held)
            self.advance(max(due - self.now, 1.0))
        return max(self.uploads[i] for i in ids) - started

    def live_waits(self) -> dict[int, float]:
        """Each live record uploaded: fake seconds from its arrival to its upload."""
        return {i: self.uploads[i] - t for i, t in self.arrived.items() if i in self.uploads}
