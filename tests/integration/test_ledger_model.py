"""The ledger through its real statements (PostgreSQL) against a reference of Lsky's
limiter (tests.limiter_model): records are claimed, take slots, upload (stored, answer
lost, refused), fail to download, are adopted, retried, FAILED, held for a booked slot,
parked, vanish (the sweeper or the next claim takes over), hours roll up, the database's
clock moves. After every step the ledger holds exactly the uploads Lsky may have counted
and the bookings that will be used, Lsky refused nothing, and a named window frees as
Lsky counts. (tests/unit/test_slots_model.py drives the arithmetic at a far higher rate.)"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from devkit.postgres import connect
from lib.archive import pacing
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.ratelimit import limiter, margins
from lib.state.lane_store import LaneStore, SlotAnswer
from lib.state.records import ArchiveRecords
from lib.state.status import WaitReason
from lib.state.sweeps import SweepRecords
from tests.integration.lane_model import time_passes
from tests.limiter_model import Window, free_range, latest_free, refuses
from tests.support import model_examples, reset_lane, seed_record

ZONE = "Asia/Shanghai"
LOCK_TTL = 180
MAX_ATTEMPTS = 3
URL = "https://upstream.invalid/img.png"
DAY = 86_400
WINDOW_SETS = (
    (Window(None, 3, 2),),
    (Window(None, 2, 1), Window(None, 10, 3)),
    (Window("minute", 60, 2), Window("hour", 3_600, 4)),
    (Window("day", 86_400, 3), Window("month", limiter.LONGEST_MONTH_SECONDS, 4)),
)


@dataclass
class Attempt:
    owner: str
    task: Any
    slot: bool = False  # its upload slot is taken (a taken row)
    taken: float = 0.0  # when (the database's clock)
    created: float | None = None  # Lsky stores its upload then (when it is stored)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.db = connect(dsn)
        self.db.run("TRUNCATE users, image_generation_records RESTART IDENTITY CASCADE")
        reset_lane(self.db)
        self.database = Database(DatabaseConfig(url=dsn), application_name="ledger-model")
        self.lanes = LaneStore(self.database)
        self.records = ArchiveRecords(self.database, paced=True)
        self.sweeps = SweepRecords(self.database, paced=True)
        self.running: dict[int, Attempt] = {}
        self.held: set[int] = set()  # given back to come back for a booked slot
        self.idle: list[int] = []
        self.images: list[float] = []  # Lsky's rows, when stored (the database's clock)
        # Uploads Lsky may have counted, as the ledger should hold them: (date, the hour it
        # was rolled up into, or None while it is a row of its own).
        self.counted: list[tuple[float, float | None]] = []
        self.attempts = 0
        self.next_id = 0

    def teardown(self) -> None:
        self.database.close()
        self.db.close()

    @initialize(windows=st.sampled_from(WINDOW_SETS), history=st.lists(st.booleans(), min_size=4))
    def setup(self, windows: tuple[Window, ...], history: list[bool]) -> None:
        self.windows = windows
        self.spans = limiter.pacing_windows([(w.seconds, w.limit) for w in windows], ZONE)
        self.margin = margins.slot_margin(self.spans)
        for backfilled in history:
            self.arrive(backfilled)

    # -- records and their attempts -------------------------------------------------------

    @rule(history=st.booleans())
    def arrive(self, history: bool) -> None:
        self.next_id += 1
        seed_record(self.db, self.next_id, image_url=URL, next_run_at=0, archive_backfilled=history)
        self.idle.append(self.next_id)

    @precondition(lambda self: self.idle or self.held)
    @rule(
        data=st.data(),
        slot=st.booleans(),
        lead=st.sampled_from([0.0, 0.5]),
        stored=st.sampled_from([0, 0.4]),
    )
    def start(self, data: st.DataObject, slot: bool, lead: float, stored: float) -> None:
        """An attempt claims the record and (unless it ends before, `slot` false) takes its
        upload slot: goes, or is held for a booked one, or parked for one too far."""
        record_id = data.draw(st.sampled_from(sorted({*self.idle, *self.held})))
        self.db.run(
            "UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = :id",
            id=record_id,
        )
        self._forget(record_id)
        attempt = self._claim(record_id)
        if attempt is None or not slot:
            return
        taken = self.lanes.take_slot(
            record_id,
            limits=self.spans,
            margin=self.margin,
            tolerance=margins.slot_tolerance(self.spans),
            stale=pacing.BOOKING_STALE_SECONDS,
            book_within=pacing.BOOK_WITHIN_SECONDS,
            lead=lead,
        )
        event(f"take: {taken.answer}")
        now = taken.now.timestamp()
        if taken.answer is SlotAnswer.GO:
            assert not refuses(self.images, now, self.windows, ZoneInfo(ZONE), 0.0)
            attempt.slot, attempt.taken, attempt.created = True, now, now + stored
        elif taken.answer is SlotAnswer.BOOKED:
            # Held until its slot: the attempt is given back, the booking kept.
            self._release(record_id, keep_booking=True)
            self.held.add(record_id)
        else:
            self._release(record_id, park=True)  # too far to book: parked

    @precondition(lambda self: self._running(slot=True))
    @rule(data=st.data(), how=st.sampled_from(["stored", "answer lost", "lost, last attempt"]))
    def upload_stored(self, data: st.DataObject, how: str) -> None:
        """Lsky stored the upload: it answered (succeed), or the answer was lost (retry,
        or FAILED on the last attempt: the image may be hosted, and counted)."""
        record_id = data.draw(st.sampled_from(self._running(slot=True)))
        attempt = self.running.pop(record_id)
        self._pass_until(attempt.created)
        if how == "stored":
            self.records.succeed(
                attempt.task,
                owner=attempt.owner,
                hosted_url="https://h/x",
                mime_type="image/png",
                response={},
            )
        elif how == "answer lost":
            self.records.retry(
                attempt.task,
                owner=attempt.owner,
                error="read timeout",
                delay_seconds=30,
                counted=True,
            )
            self.idle.append(record_id)
        else:
            self.records.fail(attempt.task, owner=attempt.owner, error="read timeout", counted=True)
        self.images.append(self._created(attempt))
        self.counted.append((self._now(), None))

    @precondition(lambda self: self.running)
    @rule(
        data=st.data(),
        how=st.sampled_from(
            [
                "refused",
                "download failed",
                "adopted",
                "look-up failed",
                "staged copy mismatch",
                "FAILED",
                "lane paused",
            ]
        ),
    )
    def no_upload(self, data: st.DataObject, how: str) -> None:
        """The attempt ends without an upload Lsky counted, whether it took a slot or not."""
        record_id = data.draw(st.sampled_from(sorted(self.running)))
        attempt = self.running.pop(record_id)
        task, owner = attempt.task, attempt.owner
        if how == "adopted":
            self.records.succeed(
                task,
                owner=owner,
                hosted_url="https://h/y",
                mime_type="image/png",
                response={},
                log_upload=False,
            )
            return
        if how == "FAILED":
            self.records.fail(task, owner=owner, error="HTTP 403", counted=False)
            return
        if how in ("refused", "download failed", "look-up failed"):
            self.records.retry(task, owner=owner, error=how, delay_seconds=30, counted=False)
        else:
            reason = WaitReason.OWN_FAULT if how == "staged copy mismatch" else WaitReason.PAUSED
            self._release(record_id, attempt=attempt, wait_reason=reason)
        self.idle.append(record_id)

    @precondition(lambda self: self.running)
    @rule(taken_over_by=st.sampled_from(["sweeper", "claim"]), stored=st.booleans())
    def vanish(self, taken_over_by: str, stored: bool) -> None:
        """The containers die mid-attempt; their locks expire, and the sweeper (or the next
        claim of each message) takes the rows over: a slot taken may have been counted."""
        vanished, self.running = self.running, {}
        self._time_passes(LOCK_TTL + 1)
        now = self._now()
        for record_id, attempt in vanished.items():
            if attempt.slot:
                # Dated the latest it could have answered: now, 15 minutes after it began.
                self.counted.append((min(now, attempt.taken + 900), None))
                if stored:
                    self.images.append(self._created(attempt))
            self.idle.append(record_id)
        if taken_over_by == "sweeper":
            self.sweeps.take_expired_locks(
                limit=50, lock_ttl_seconds=LOCK_TTL, max_attempts=MAX_ATTEMPTS
            )
            return
        for record_id in vanished:
            self._forget(record_id)
            self._claim(record_id)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def park(self, data: st.DataObject) -> None:
        """A held record's hold SQS refused: parked, its booking goes."""
        record_id = data.draw(st.sampled_from(sorted(self.held)))
        self.records.park(record_id, delay_seconds=60, wait_reason=None)
        self.held.discard(record_id)
        self.idle.append(record_id)

    @rule(count=st.integers(1, 3))
    def unpaced(self, count: int) -> None:
        """Uploads logged without a slot (pacing was off, or set for other windows): the
        ledger, like Lsky (its deleted images, other clients), may hold more than a
        window's limit, and a window frees when its limit-th newest leaves."""
        now = self._now()
        for _ in range(count):
            self.db.run(
                "INSERT INTO image_archive_uploads (lane, at, state) VALUES ('lsky', now(), 'done')"
            )
            self.images.append(now)
            self.counted.append((now, None))

    @rule()
    def roll_up(self) -> None:
        """roll_up_ledger: rows older than two hours into hourly counts, hours older than
        32 days dropped (those it held before this run: one statement's snapshot)."""
        now = self._now()
        rolled, missed = self.lanes.roll_up()
        event(f"roll-up moved rows: {rolled > 0}")
        kept = [(at, hour) for at, hour in self.counted if hour is None or hour >= now - 32 * DAY]
        self.counted = [
            (at, math.floor(at / 3_600) * 3_600.0 if hour is None and at < now - 7_200 else hour)
            for at, hour in kept
        ]
        if missed:
            self._forget_missed()

    @rule(seconds=st.integers(1, 4))
    def a_moment_passes(self, seconds: int) -> None:
        self._time_passes(seconds)

    @precondition(lambda self: not self.running)  # no attempt outlives its lock
    @rule(seconds=st.sampled_from([61, 3_600, 7_300, 86_400, 31 * 86_400]))
    def time_goes_by(self, seconds: int) -> None:
        self._time_passes(seconds)

    # -- what must hold after every step ---------------------------------------------------

    @invariant()
    def the_ledger_holds_what_lsky_may_have_counted_and_bookings_that_will_be_used(
        self,
    ) -> None:
        if not hasattr(self, "windows"):
            return
        taken = {
            r
            for [r] in self.db.run(
                "SELECT record_id FROM image_archive_uploads WHERE state = 'taken'"
            )
        }
        assert taken == {r for r, a in self.running.items() if a.slot}
        booked = {
            r
            for [r] in self.db.run(
                "SELECT record_id FROM image_archive_uploads WHERE state = 'booked'"
            )
        }
        assert booked <= self.held | set(self.running)  # held, or back for its slot
        [[done]] = self.db.run(
            "SELECT (SELECT count(*) FROM image_archive_uploads WHERE state = 'done')"
            " + (SELECT COALESCE(sum(uploads), 0) FROM image_archive_upload_hours)"
        )
        assert done == len(self.counted)

    @invariant()
    def a_named_window_frees_as_lsky_counts(self) -> None:
        if not hasattr(self, "windows") or self.running or self.held:
            return
        [[now]] = self.db.run("SELECT CAST(EXTRACT(EPOCH FROM now()) AS double precision)")
        dates = [
            float(at)
            for [at] in self.db.run(
                "SELECT CAST(EXTRACT(EPOCH FROM at) AS double precision) FROM image_archive_uploads"
                " UNION ALL SELECT CAST(EXTRACT(EPOCH FROM hour + interval '1 hour')"
                " AS double precision) FROM image_archive_upload_hours"
                " CROSS JOIN LATERAL generate_series(1, uploads)"
            )
        ]
        for window, (span, limit) in zip(self.windows, self.spans, strict=True):
            answer = self.lanes.window_frees_at(
                span, limit, margin=self.margin, window=window.unit, zone=ZONE
            ).timestamp()
            [[after]] = self.db.run("SELECT CAST(EXTRACT(EPOCH FROM now()) AS double precision)")
            zone = ZoneInfo(ZONE)
            first, last = free_range(dates, now=now, window=window, zone=zone, margin=self.margin)
            if first <= after and now < last:
                continue  # full or not, depending on Lsky's clock, or the clock moved on
            if first > after:  # full: the limit-th newest upload leaves
                low = high = latest_free(
                    dates, now=now, window=window, zone=zone, margin=self.margin
                )
            else:  # fewer than the limit: an upload made now (when it read) leaves
                low, high = (
                    latest_free([at] * limit, now=at, window=window, zone=zone, margin=self.margin)
                    for at in (now, after)
                )
            assert low - 1e-3 <= answer <= high + 2 * self.margin + 1e-3, (window, answer, low)

    # -- helpers ---------------------------------------------------------------------------

    def _claim(self, record_id: int) -> Attempt | None:
        """A new attempt's claim; None when the claim failed the row (its attempts used)."""
        self.attempts += 1
        owner = f"attempt-{self.attempts}"
        claim = self.records.claim(
            record_id, owner=owner, lock_ttl_seconds=LOCK_TTL, max_attempts=MAX_ATTEMPTS
        )
        if claim.task is None:
            return None
        self.running[record_id] = Attempt(owner, claim.task)
        return self.running[record_id]

    def _running(self, *, slot: bool) -> list[int]:
        return sorted(r for r, a in self.running.items() if a.slot == slot)

    def _forget(self, record_id: int) -> None:
        self.held.discard(record_id)
        if record_id in self.idle:
            self.idle.remove(record_id)

    def _forget_missed(self) -> None:
        booked = {
            r
            for [r] in self.db.run(
                "SELECT record_id FROM image_archive_uploads WHERE state = 'booked'"
            )
        }
        for record_id in self.held - booked:
            self.held.discard(record_id)
            self.idle.append(record_id)

    def _release(
        self,
        record_id: int,
        *,
        attempt: Attempt | None = None,
        keep_booking: bool = False,
        park: bool = False,
        wait_reason: WaitReason = WaitReason.PACED,
    ) -> None:
        attempt = attempt or self.running.pop(record_id)
        self.records.release(
            attempt.task,
            owner=attempt.owner,
            delay_seconds=5,
            wait_reason=wait_reason,
            park=park,
            keep_booking=keep_booking,
        )
        if not keep_booking:
            self.idle.append(record_id)

    def _now(self) -> float:
        [[now]] = self.db.run("SELECT CAST(EXTRACT(EPOCH FROM now()) AS double precision)")
        return float(now)

    def _created(self, attempt: Attempt) -> float:
        assert attempt.created is not None
        return attempt.created

    def _pass_until(self, at: float | None) -> None:
        [[now]] = self.db.run("SELECT CAST(EXTRACT(EPOCH FROM now()) AS double precision)")
        if at is not None and at > now:
            self._time_passes(math.ceil(at - now))

    def _time_passes(self, seconds: int) -> None:
        """Whole seconds, so Lsky's seconds stay where they were for every row."""
        time_passes(self.db, seconds)
        self.db.run(
            "UPDATE image_generation_records SET archive_locked_at ="
            " archive_locked_at - make_interval(secs => :s)",
            s=seconds,
        )
        self.images = [c - seconds for c in self.images]
        self.counted = [
            (at - seconds, None if hour is None else hour - seconds) for at, hour in self.counted
        ]
        for attempt in self.running.values():
            if attempt.created is not None:
                attempt.created -= seconds


@pytest.mark.model
def test_the_ledger_s_statements_against_lsky_s_limiter(pg_dsn: str) -> None:
    run_state_machine_as_test(
        lambda: LedgerMachine(pg_dsn),
        settings=settings(max_examples=model_examples(25), stateful_step_count=40),
    )
