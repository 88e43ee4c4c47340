"""The lane's ledger (issue 26, the ledger's half) through the archive handler and the
real statements: every entry is an upload Lsky may have counted or a booking that will be
used, a named window frees as Lsky counts (its limit-th newest upload leaving, its month
PHP's "-1 month"), pacing keeps the longest month, and a paced burst whose sources are
partly gone drains the rest at the limiter's pace."""

from __future__ import annotations

import hashlib
import json
import math
import time
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from devkit import images
from devkit.lsky import Behaviour
from lib.archive.message import encode
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.ratelimit import margins
from lib.state.claim import Task
from lib.state.records import ArchiveRecords, Recorded
from lib.state.sweeps import SweepRecords
from tests.integration.lane_model import time_passes
from tests.integration.world import World
from tests.limiter_model import Window, latest_free
from tests.support import lane_row, seed_record

PNG = images.png(16, 16, size=3_000, seed=26)
STEM = "alice_{}_20261202T120005Z"
STARTED = datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC)
PRC = ZoneInfo("Asia/Shanghai")
LONGEST_MONTH = 31 * 86_400  # PHP's "-1 month" reaches back 28 to 31 days


def ledger(db: Any, record_id: int | None = None) -> list[tuple[str, int | None]]:
    """(state, record id) of the ledger's rows, of one record or all."""
    rows = db.run("SELECT state, record_id FROM image_archive_uploads ORDER BY at")
    return [(s, r) for s, r in rows if record_id is None or r == record_id]


def booked_ahead(db: Any, seconds: float, record_id: int = 999) -> None:
    """Another record's slot booked `seconds` ahead: a queue of bookings exists, so a
    record takes (or books) its slot before fetching anything."""
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, record_id, state)"
        " VALUES ('lsky', now() + make_interval(secs => :s), :id, 'booked')",
        s=seconds,
        id=record_id,
    )


def record(world: World, record_id: int, **columns: Any) -> str:
    columns.setdefault("started_at", STARTED)
    return world.record(record_id, PNG, **columns)


# -- 1. a slot taken before the fetch is given back when no upload follows ---------------


@pytest.fixture
def paced(world: World) -> World:
    """Pacing at two uploads a minute, a booking 30 s ahead: a record takes its slot
    before it fetches (the window holds one entry, the booking)."""
    world.settings(LSKY_RATE_LIMITS="2/minute", ARCHIVE_RETRY_DELAYS="30")
    booked_ahead(world.db, 30)
    return world


@pytest.mark.parametrize(
    "route",
    [
        # The provider fails at once (a 500: a retry): the slot taken goes back.
        {"status": 500},
        # It sends the headers, then drops the body half way: the slot taken goes.
        {"drop_after": len(PNG) // 2},
    ],
    ids=["fails-at-once", "fails-the-body"],
)
def test_a_slot_taken_before_a_download_that_fails_is_given_back(
    paced: World, route: dict[str, int]
) -> None:
    record(paced, 1, route=route)

    paced.deliver(1)

    assert paced.downloads(1) == 1
    assert paced.state(1) == ("PENDING", 1)
    assert paced.row(1)["archive_wait_reason"] == "backoff"
    assert ledger(paced.db, 1) == []
    # The next record takes the slot the first never used: it uploads now. (The slot
    # left `taken` made it wait a minute, and counted as an upload for a month.)
    record(paced, 2)
    paced.deliver(2)
    assert paced.state(2) == ("SUCCEEDED", 1)


def test_an_adoption_gives_back_the_slot_it_took(paced: World) -> None:
    # The last attempt may have stored the image (answer lost; what it sent unknown):
    # the attempt takes its slot, fetches, finds the image, and adopts it.
    record(paced, 3, archive_may_be_hosted=True)
    stored = paced.lsky.add_image(PNG, origin_name=STEM.format(3) + ".png")

    paced.deliver(3)

    assert paced.row(3)["hosted_response"]["key"] == stored.key
    assert paced.lsky.upload_count == 0
    assert ledger(paced.db) == [("booked", 999)]


def test_a_look_up_that_fails_gives_back_the_slot(paced: World) -> None:
    record(paced, 4, archive_may_be_hosted=True, archive_sent='{"sha1": "ab", "size": [1, 1]}')
    paced.lsky.listing_fault = 500

    paced.deliver(4)

    assert paced.state(4) == ("PENDING", 1)  # retried after the backoff
    assert ledger(paced.db) == [("booked", 999)]


def test_a_staged_copy_that_does_not_match_gives_back_the_slot(
    paced: World, s3: Any, staging_bucket: str
) -> None:
    paced.settings(LSKY_RATE_LIMITS="2/minute", ARCHIVE_STAGING_BUCKET=staging_bucket)
    s3.put_object(Bucket=staging_bucket, Key="staged/5/x.png", Body=b"not what was captured")
    record(
        paced,
        5,
        archive_staged_key="staged/5/x.png",
        archive_staged_sha256=hashlib.sha256(PNG).hexdigest(),
        archive_staged_bytes=len(PNG),
        archive_staged_at=datetime.now(UTC),
    )

    paced.deliver(5)

    assert paced.row(5)["archive_wait_reason"] == "own_fault"
    assert ledger(paced.db) == [("booked", 999)]


# -- 2. a booking goes with an attempt that will not use it ----------------------------------


def booking_now(db: Any, record_id: int) -> None:
    """The record's slot, booked by an earlier invocation: due now (its message is back)."""
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, record_id, state)"
        " VALUES ('lsky', now(), :id, 'booked')",
        id=record_id,
    )


@pytest.mark.parametrize(
    ("status", "outcome"), [(403, ("FAILED", 1)), (500, ("PENDING", 1))], ids=["403", "500"]
)
def test_a_booked_record_whose_source_fails_leaves_no_booking(
    world: World, status: int, outcome: tuple[str, int]
) -> None:
    world.settings(LSKY_RATE_LIMITS="2/minute")
    record(world, 6, route={"status": status})
    booking_now(world.db, 6)

    world.deliver(6)

    assert world.state(6) == outcome
    assert ledger(world.db) == []
    assert lane_row(world.db)["booked"] == 0  # the queue's end no longer holds a backfill


def test_a_record_parked_on_its_third_receive_leaves_no_booking_and_is_staged(
    world: World, s3: Any, staging_bucket: str
) -> None:
    world.settings(LSKY_RATE_LIMITS="1/minute", ARCHIVE_STAGING_BUCKET=staging_bucket)
    world.db.run(
        "INSERT INTO image_archive_uploads (lane, at, state) VALUES ('lsky', now(), 'done')"
    )
    record(world, 7)
    world.archive.send(encode(7))
    for _ in range(2):  # received twice already (held, or a redelivery)
        world.archive.fast_forward(world.archive.receive())
    event = world.archive.receive()
    assert event["Records"][0]["attributes"]["ApproximateReceiveCount"] == "3"

    world.archive.settle(event, world.archive.invoke(event))

    row = world.row(7)
    assert (row["archive_status"], row["archive_wait_reason"]) == ("PENDING", "paced")
    assert row["archive_enqueued_at"] is None  # parked: the sweeper sends it when due
    assert ledger(world.db, 7) == []
    # Its bytes are staged: a parked row may outwait its source URL.
    assert row["archive_staged_key"] is not None


def test_a_record_the_sweeper_fails_leaves_no_booking_and_its_slot_counts(
    world: World, pg_dsn: str
) -> None:
    world.crashed(8, attempts=3)  # its last attempt died an hour ago, slot and booking held
    world.db.run(
        "INSERT INTO image_archive_uploads (lane, at, record_id, state) VALUES"
        " ('lsky', now() - interval '59 minutes', 8, 'taken'),"
        " ('lsky', now() + interval '1 minute', 8, 'booked')"
    )
    database = Database(DatabaseConfig(url=pg_dsn))
    try:
        [swept] = SweepRecords(database).take_expired_locks(
            limit=10, lock_ttl_seconds=180, max_attempts=3
        )
    finally:
        database.close()

    assert swept.archive_status == "FAILED"
    # Lsky may have counted the vanished attempt's upload: it stays, dated the latest
    # it could have answered (15 minutes after it began); the booking goes.
    assert ledger(world.db) == [("done", 8)]
    [[age]] = world.db.run("SELECT EXTRACT(EPOCH FROM now() - at) FROM image_archive_uploads")
    assert 43 * 60 <= float(age) <= 45 * 60


# -- 3. a named window frees when its limit-th newest upload leaves it ----------------------


def test_a_daily_refusal_with_more_uploads_than_the_limit_waits_for_the_limit_th_newest(
    world: World,
) -> None:
    # 400 uploads, one every 3 minutes (more than Lsky's 300 a day: its deleted images,
    # another window's pacing): the day frees when the 300th newest leaves it, in 9.05 h.
    # The oldest leaves in 4.05 h; reopening then costs a refusal an hour for five hours.
    world.db.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        " SELECT 'lsky', now() - g * interval '3 minutes', 'done'"
        " FROM generate_series(0, 399) AS g"
    )
    hours = refused_for_hours(world, 9, "每天内你最多可以上传 300 张图片")

    assert 9.0 <= hours <= 9.1, hours


def refused_for_hours(world: World, record_id: int, refusal: str) -> float:
    """Deliver `record_id` to a Lsky that refuses it with `refusal`: the hours the lane
    is paused for (the record gives its attempt back)."""
    record(world, record_id)
    world.lsky.script(Behaviour.status_false(refusal))
    world.deliver(record_id)
    assert world.state(record_id) == ("PENDING", 0)
    [[paused_for]] = world.db.run(
        "SELECT EXTRACT(EPOCH FROM paused_until - now()) FROM image_archive_lane"
    )
    return float(paused_for) / 3_600


def test_unpaced_a_lost_answer_counts_and_the_refusal_after_it_waits_for_the_limit_th_newest(
    world: World,
) -> None:
    # Without pacing, an upload whose answer was lost (Lsky stored it) enters the ledger
    # as one Lsky may have counted: the next refusal of Lsky's day (two a day) ends when
    # the older of the two leaves it, in 4 h. Left out, the ledger held one upload, fewer
    # than the limit, and the lane waited out the whole day.
    world.db.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        " VALUES ('lsky', now() - interval '20 hours', 'done')"
    )
    record(world, 12)
    world.lsky.script(Behaviour.drop())

    world.deliver(12)

    row = world.row(12)
    assert (row["archive_status"], row["archive_may_be_hosted"]) == ("PENDING", True)
    hours = refused_for_hours(world, 13, "每天内你最多可以上传 2 张图片")

    assert 3.95 <= hours <= 4.05, hours
    assert ledger(world.db, 12) == [("done", 12)]


def test_unpaced_an_attempt_that_vanished_counts_once_when_its_row_is_taken_over(
    world: World,
) -> None:
    # Its container died an hour ago, mid-attempt, without pacing: the claim that takes the
    # row over enters the upload it may have made, dated 15 minutes after its lock.
    world.crashed(14, attempts=1)

    world.deliver(14)

    assert world.state(14)[0] == "SUCCEEDED"
    [[state, age]] = world.db.run(
        "SELECT state, EXTRACT(EPOCH FROM now() - at) FROM image_archive_uploads"
        " WHERE record_id = 14 ORDER BY at"
    )[:1]
    assert state == "done"
    assert 44 * 60 <= float(age) <= 46 * 60
    # Its own upload, answered: one more, dated now.
    assert len(ledger(world.db, 14)) == 2


# -- 4. Lsky's month ------------------------------------------------------------------------


def test_pacing_keeps_the_longest_month_lsky_may_count(world: World) -> None:
    # Two uploads a month, both made 30.5 days ago: after a 31-day month Lsky still counts
    # them, so the lane does not upload (a 30-day month let it, and Lsky refused).
    world.settings(LSKY_RATE_LIMITS="2/month")
    world.db.run(
        "INSERT INTO image_archive_uploads (lane, at, state) VALUES"
        " ('lsky', now() - interval '30 days 12 hours', 'done'),"
        " ('lsky', now() - interval '30 days 12 hours' + interval '1 second', 'done')"
    )
    record(world, 10)

    world.deliver(10)

    row = world.row(10)
    assert (row["archive_status"], row["archive_wait_reason"]) == ("PENDING", "paced")
    assert world.lsky.upload_count == 0
    # Its slot: once the second of them has left the longest month (31 days), about 12 h.
    assert (row["archive_next_run_at"] - datetime.now(UTC)).total_seconds() / 3_600 >= 11.9


def test_a_monthly_refusal_ends_when_lsky_s_month_has_left_the_upload(world: World) -> None:
    # An upload whose leaving Lsky's month (PHP's "-1 month", as long as the month before)
    # is not 30 days after it: one of the window's last days, so that it leaves in a month
    # that follows one of 28, 29 or 31 days.
    [[now]] = world.db.run("SELECT CAST(EXTRACT(EPOCH FROM now()) AS double precision)")
    month = Window("month", LONGEST_MONTH, 1)
    margin = margins.slot_margin([(LONGEST_MONTH, 1)])
    stored = next(
        at
        for hours in range(1, 30 * 24)
        if abs(
            latest_free(
                [at := now - hours * 3_600.5], now=now, window=month, zone=PRC, margin=margin
            )
            - (at + 30 * 86_400)
        )
        > 3_600
    )
    world.db.run(
        "INSERT INTO image_archive_uploads (lane, at, state) VALUES"
        " ('lsky', to_timestamp(:at), 'done')",
        at=stored,
    )
    record(world, 11)
    world.lsky.script(Behaviour.status_false("每月内你最多可以上传 1 张图片"))

    world.deliver(11)

    [[until]] = world.db.run(
        "SELECT CAST(EXTRACT(EPOCH FROM paused_until) AS double precision) FROM image_archive_lane"
    )
    expected = latest_free([stored], now=now, window=month, zone=PRC, margin=margin)
    assert expected <= until <= expected + 2 * margin + 1.0, (until - stored) / 86_400


def test_against_lsky_2_0_pacing_at_the_month_s_limit_pauses_by_the_week_s(world: World) -> None:
    # Lsky 2.0 to 2.0.4 hold the month's window to the week's limit. Two uploads ten days
    # ago: pacing at 5 a month lets the next go; Lsky refuses it, naming the week's 2, and
    # the lane pauses until its month holds fewer than 2 (the older leaves it), no attempt
    # spent; a pause by the month's 5 would have ended at once and been refused again.
    world.settings(LSKY_RATE_LIMITS="2/week,5/month")
    world.lsky.config.rate_limits = {"week": 2, "month": 5}
    world.lsky.config.month_limit = "week"
    for age in (10 * 86_400, 10 * 86_400 - 60):
        world.lsky.add_image(age=age)
        world.db.run(
            "INSERT INTO image_archive_uploads (lane, at, state)"
            " VALUES ('lsky', now() - make_interval(secs => :age), 'done')",
            age=age,
        )
    [[now]] = world.db.run("SELECT CAST(EXTRACT(EPOCH FROM now()) AS double precision)")
    record(world, 15)

    world.deliver(15)

    assert world.lsky.rate_limited_count == 1
    assert world.state(15) == ("PENDING", 0)
    row = lane_row(world.db)
    assert row["window"] == "month"
    assert row["detail"].endswith("每月内你最多可以上传 2 张图片")  # the week's number
    [[until]] = world.db.run(
        "SELECT CAST(EXTRACT(EPOCH FROM paused_until) AS double precision) FROM image_archive_lane"
    )
    month = Window("month", LONGEST_MONTH, 2)
    margin = margins.slot_margin([(LONGEST_MONTH, 2)])
    older = now - 10 * 86_400
    expected = latest_free([older, older + 60], now=now, window=month, zone=PRC, margin=margin)
    assert expected <= until <= expected + 2 * margin + 1.0, (until - now) / 86_400


# -- 10. a paced burst whose sources are partly gone ----------------------------------------


def test_a_paced_burst_drains_the_records_that_upload_at_the_limiter_s_pace(
    world: World, staging_bucket: str
) -> None:
    """Twelve records at once, pacing two uploads per 10 s, staging on; every third
    record's source is gone (403: FAILED at once). One container takes the messages as
    the queue holds them; the test moves the database's clock on to each held message's
    time instead of waiting. A record queued behind others captures its image before it
    waits, so a gone one fails then: the eight that upload drain in the time the limiter
    needs for eight (Lsky's whole seconds included), the gone ones holding no slot (they
    held 4 of 12), and every source is asked once."""
    world.settings(LSKY_RATE_LIMITS="2/10 seconds", ARCHIVE_STAGING_BUCKET=staging_bucket)
    ids = list(range(100, 112))
    for record_id in ids:
        gone = record_id % 3 == 2
        record(world, record_id, route={"status": 403} if gone else None, enqueued_at=0)
        world.archive.send(encode(record_id))
    clock = VirtualClock(world)

    clock.drain(ids)

    uploads = [i for i in ids if world.state(i)[0] == "SUCCEEDED"]
    assert len(uploads) == 8
    assert {world.state(i)[0] for i in set(ids) - set(uploads)} == {"FAILED"}
    assert ledger(world.db) == [("done", i) for i in sorted(uploads, key=clock.uploaded.get)]
    # The limiter's minimum for eight: two at once, then two each time a window has left
    # the second of the pair before (its 10 s, the whole second, the margin), each pair's
    # message held whole seconds from its receive (up to a second later than its slot).
    # Gone records holding slots would need five holds: more than 55 s.
    assert clock.elapsed <= 3 * (10 + 1 + 0.025 + 1) + 2.0, clock.uploaded
    assert {world.downloads(i) for i in ids} == {1}


@pytest.mark.parametrize("staging", [True, False], ids=["staging-on", "staging-off"])
def test_a_source_that_serves_once_queued_behind_others_is_archived(
    world: World, staging_bucket: str, staging: bool
) -> None:
    """A record that must queue behind a booking asks its source once: with staging on it
    captures the image before it waits (the URL may expire while it does), with staging
    off it leaves the source alone until its slot. Either way a URL that serves once is
    archived, never lost to a question asked before the download."""
    bucket = staging_bucket if staging else None
    world.settings(LSKY_RATE_LIMITS="1/10 seconds", ARCHIVE_STAGING_BUCKET=bucket)
    booked_ahead(world.db, 1)
    record(world, 7, route={"fail_after": 1})

    assert world.deliver(7)["batchItemFailures"]  # held for its slot
    assert world.downloads(7) == (1 if staging else 0)
    assert (world.row(7)["archive_staged_key"] is not None) is staging
    time_passes(world.db, 25)  # its slot came, and the booking ahead left the window

    world.deliver(7)

    assert world.state(7) == ("SUCCEEDED", 1)
    assert world.downloads(7) == 1
    assert world.lsky.upload_count == 1


def test_with_staging_a_held_record_comes_back_once_for_its_slot(
    world: World, staging_bucket: str
) -> None:
    """A slow source (a second a download), pacing one upload per 10 s, staging on: the
    records that wait keep their images, so each comes back when its slot does (its lead
    the queue's pickup, not a download it will not make), and goes; none is held twice."""
    world.settings(LSKY_RATE_LIMITS="1/10 seconds", ARCHIVE_STAGING_BUCKET=staging_bucket)
    ids = [120, 121, 122]
    for record_id in ids:
        record(world, record_id, route={"delay": 1.0}, enqueued_at=0)
        world.archive.send(encode(record_id))

    VirtualClock(world).drain(ids)

    assert {world.state(i) for i in ids} == {("SUCCEEDED", 1)}
    received = dict(
        world.db.run(
            "SELECT record_id, count(*) FROM image_archive_events"
            " WHERE kind = 'received' GROUP BY record_id"
        )
    )
    assert received == {120: 1, 121: 2, 122: 2}
    assert {world.downloads(i) for i in ids} == {1}


class VirtualClock:
    """One container draining the queue as the event source mapping would; when no message
    is visible, the database's clock moves on (tests.integration.lane_model.time_passes,
    whole seconds: Lsky's seconds stay where they were) to the earliest held message's
    time, and that message is made visible."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.began = time.monotonic()
        self.shifted = 0
        self.held: list[tuple[float, dict[str, Any]]] = []
        self.uploaded: dict[int, float] = {}

    @property
    def now(self) -> float:
        """Seconds since the burst, on the database's clock as the test moves it."""
        return time.monotonic() - self.began + self.shifted

    @property
    def elapsed(self) -> float:
        return max(self.uploaded.values())

    def drain(self, ids: list[int]) -> None:
        for _ in range(10 * len(ids)):
            if {self.world.state(i)[0] for i in ids} <= {"SUCCEEDED", "FAILED"}:
                return
            event = self.world.archive.receive(wait_seconds=0)
            if not event["Records"]:
                self._next_held()
                continue
            response = self.world.archive.invoke(event)
            self.world.archive.settle(event, response)
            [record_id] = [int(json.loads(r["body"])["recordId"]) for r in event["Records"]]
            if response["batchItemFailures"]:
                self.held.append((self.now + self.world.archive.holds()[-1], event))
            elif self.world.state(record_id)[0] == "SUCCEEDED":
                self.uploaded[record_id] = self.now
        raise AssertionError("the burst did not drain")

    def _next_held(self) -> None:
        assert self.held, "nothing visible and nothing held"
        self.held.sort(key=lambda item: item[0])
        due, event = self.held.pop(0)
        gap = math.ceil(due - self.now)
        if gap > 0:
            time_passes(self.world.db, gap)
            self.shifted += gap
        self.world.archive.fast_forward(event)


# -- a success recorded after the lock passed on settles none of the new holder's rows -----


def test_a_success_after_the_lock_passed_on_leaves_the_new_holder_s_slot(
    db: Any, pg_dsn: str
) -> None:
    # Our attempt ran past its lock (an operator shortened ARCHIVE_LOCK_TTL_SECONDS below
    # the function's timeout); another attempt took the row over, and its slot is under
    # way. Our upload was answered: success wins the row, but the ledger's rows are the
    # new holder's (the takeover settled ours as an attempt that vanished).
    seed_record(db, 82, image_url="http://x/a.png", archive_status="RUNNING", locked_by="other")
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, record_id, state)"
        " VALUES ('lsky', now() - interval '2 seconds', 82, 'taken')"
    )
    records = ArchiveRecords(Database(DatabaseConfig(url=pg_dsn)))
    try:
        recorded = records.succeed(
            Task(82, 1, "alice", "http://x/a.png", None, 1),
            owner="me",
            hosted_url="http://h/82.png",
            mime_type="image/png",
            response={"key": "k"},
        )
    finally:
        records.db.close()

    assert recorded is Recorded.AFTER_LOCK_PASSED
    assert ledger(db) == [("taken", 82)]  # not settled as our upload, nor one added
