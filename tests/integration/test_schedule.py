"""When a record may run (issue 18), against a real PostgreSQL, moto's SQS and the Lsky
stand-in: pacing books slots and never spends an attempt or sleeps through a transfer's
time, every reader shares one ledger, a pause binds every slot, adoption takes none, and
every hold is a visibility SQS accepts."""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour, LskyStandIn
from lib.archive import conclusion, retry, schedule
from lib.archive.message import encode
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.ratelimit.limiter import counts_until
from lib.state.lane_store import LaneStore, SlotAnswer
from tests.integration.conftest import ArchiveHarness
from tests.support import emf_metrics, fetch_record, lane_row, seed_record, set_uploads

PNG = images.png(16, 16, size=3_000, seed=11)
OTHER = images.png(32, 8, size=3_000, seed=12)
STEM = "alice_{}_20261202T120005Z"
STARTED = datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC)


@pytest.fixture
def lanes(pg_dsn: str) -> Any:
    database = Database(DatabaseConfig(url=pg_dsn), application_name="schedule-test")
    yield LaneStore(database)
    database.close()


@pytest.fixture
def paced(archive_env: Callable[..., dict[str, str]], archive: ArchiveHarness) -> ArchiveHarness:
    """Pacing on: one upload a minute (so a second one must wait for its slot)."""
    archive.env = archive_env(LSKY_RATE_LIMITS="1/minute", ARCHIVE_RETRY_DELAYS="1")
    return archive


def seed(db: Any, upstream: Any, record_id: int, **columns: Any) -> str:
    path = f"/s/{record_id}.png"
    delay = columns.pop("delay", 0.0)
    seed_record(
        db,
        record_id,
        username="alice",
        started_at=STARTED,
        image_url=upstream.add(path, PNG, delay=delay),
        **columns,
    )
    return path


def seconds_until(db: Any, record_id: int) -> float:
    [[seconds]] = db.run(
        "SELECT EXTRACT(EPOCH FROM archive_next_run_at - now()) FROM image_generation_records"
        " WHERE id = :id",
        id=record_id,
    )
    return float(seconds)


def take(lanes: LaneStore, record_id: int, limits: list[tuple[int, int]], **options: float) -> Any:
    """A slot at test scale: a 0.1 s margin, taken within 50 ms, booked within 15 min."""
    settings = {"margin": 0.1, "tolerance": 0.05, "stale": 120.0, "book_within": 900.0}
    return lanes.take_slot(record_id, limits=limits, **(settings | options))


# -- 1. pacing books a slot: it never spends an attempt nor a transfer's time -------------


def test_a_paced_record_is_given_back_with_a_booked_slot_and_its_attempt(
    paced: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 1)
    slow = seed(db, upstream, 2, delay=0.5)  # a slow source: its time is the transfer's
    queued = seed(db, upstream, 3)

    assert paced.deliver(encode(1)) == {"batchItemFailures": []}
    held = paced.deliver(encode(2))
    paced.deliver(encode(3))

    assert len(held["batchItemFailures"]) == 1  # held until its slot, not failed
    for record_id in (2, 3):
        row = fetch_record(db, record_id)
        assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
        assert row["archive_wait_reason"] == "paced"
        assert row["archive_error"] is None  # waiting is nothing gone wrong
    # The next slot: a minute after the first (and Lsky's whole second, and the margin).
    assert 55 <= seconds_until(db, 2) <= 63
    assert 115 <= seconds_until(db, 3) <= 125  # and the one after, first come first served
    assert lsky.upload_count == 1
    assert upstream.hits(slow) == 1
    # A queue already formed: with staging off, its source is left alone until its slot
    # (tests/integration/test_ledger.py: with staging on, its image is kept as it waits).
    assert upstream.hits(queued) == 0
    assert lane_row(db)["booked"] == 2
    assert paced.log_for("paced: message held until its upload slot")["booked"] is True


def test_a_booked_record_takes_its_slot_when_it_comes_back(
    paced: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 4)
    seed(db, upstream, 5)
    paced.deliver(encode(4))
    paced.deliver(encode(5))  # booked a minute from now
    # A minute passes for the ledger: the first upload and the booking move back. Lsky
    # counts whole seconds at both ends of its window, so an upload leaves a minute up to
    # 61 s and the margin after its date: 62 s clears it whatever the date's fraction.
    db.run("UPDATE image_archive_uploads SET at = at - interval '62 seconds'")
    db.run("UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = 5")

    assert paced.deliver(encode(5)) == {"batchItemFailures": []}

    row = fetch_record(db, 5)
    assert (row["archive_status"], row["archive_attempts"]) == ("SUCCEEDED", 1)
    lane = lane_row(db)
    assert (lane["booked"], lane["uploads"]) == (0, 2)


def test_an_upload_enters_the_ledger_when_lsky_answered_and_the_next_slot_counts_from_then(
    paced: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 31)
    seed(db, upstream, 32)
    lsky.script(Behaviour.slow(0.6))  # Lsky counts the image, then answers 0.6 s later
    [[before]] = db.run("SELECT now()")

    paced.deliver(encode(31))
    paced.deliver(encode(32))

    [[answered]] = db.run(
        "SELECT at FROM image_archive_uploads WHERE record_id = 31 AND state = 'done'"
    )
    # Dated when the answer came, not when the upload began: no margin has to cover how
    # long a transfer takes.
    assert (answered - before).total_seconds() >= 0.6
    assert booking_of(db, 32) >= answered + timedelta(seconds=60)


def test_an_upload_under_way_counts_as_now_and_never_for_longer_than_an_invocation(
    lanes: LaneStore, db: Any
) -> None:
    assert take(lanes, 1, [(3, 1)]).answer is SlotAnswer.GO
    time.sleep(0.3)
    # The first upload has not answered yet: Lsky may count it at any moment from now.
    second = take(lanes, 2, [(3, 1)])
    assert second.answer is SlotAnswer.BOOKED
    assert second.at >= second.now + timedelta(seconds=3.1)
    db.run("DELETE FROM image_archive_uploads WHERE record_id = 2")
    # A slot taken by an invocation that never came back (20 minutes ago) stops counting
    # once no invocation could still be uploading (15 minutes).
    db.run("UPDATE image_archive_uploads SET at = now() - interval '20 minutes'")
    assert take(lanes, 3, [(3, 1)]).answer is SlotAnswer.GO


# -- 2. one ledger serves every reader ------------------------------------------------------


def test_a_daily_refusal_pauses_until_the_ledger_s_oldest_counted_upload_leaves_the_day(
    paced: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn, lanes: LaneStore
) -> None:
    # 300 uploads over the last 23.1 hours (pacing at a minute's window kept them all).
    set_uploads(db, 300, within_seconds=23.1 * 3600)
    assert lanes.state().drain_uploads == lanes.uploads_within(900)
    seed(db, upstream, 6)
    lsky.script(Behaviour.status_false("每天内你最多可以上传 300 张图片"))

    paced.deliver(encode(6))

    lane = lane_row(db)
    assert lane["reason"] == "rate_limit"
    [[paused_for]] = db.run(
        "SELECT EXTRACT(EPOCH FROM paused_until - now()) FROM image_archive_lane"
    )
    # The oldest of the 300 leaves the day in 0.9 h: not a whole day.
    assert 0.85 * 3600 <= float(paused_for) <= 0.95 * 3600
    # Rolled up into hourly counts, the answer stays within the hour it was in.
    lanes.roll_up()
    frees = lanes.window_frees_at(86_400, 300, margin=2.0)
    [[now]] = db.run("SELECT now()")
    assert frees is not None
    assert timedelta(hours=0.85) <= frees - now <= timedelta(hours=1.95)


def answered(db: Any, record_id: int) -> None:
    """The record's upload answered now: its slot is an upload dated now (succeed)."""
    db.run(
        "UPDATE image_archive_uploads SET state = 'done', at = now()"
        " WHERE record_id = :id AND state = 'taken'",
        id=record_id,
    )


# -- 4. a pause set anywhere binds every slot given after it ------------------------------


def test_a_pause_set_while_a_record_downloads_is_respected_by_its_slot(
    paced: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn, lanes: LaneStore
) -> None:
    seed(db, upstream, 7, delay=0.6)

    def pause_meanwhile() -> None:
        # Another container meets Lsky's limit while this one is still downloading.
        lanes.pause(until="infinity", reason="account", window=None, detail="储存空间不足")

    timer = threading.Timer(0.2, pause_meanwhile)
    timer.start()
    try:
        paced.deliver(encode(7))
    finally:
        timer.join()

    row = fetch_record(db, 7)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_wait_reason"] == "paused"
    assert lsky.upload_count == 0


def test_a_shorter_pause_never_shortens_a_longer_one(lanes: LaneStore, db: Any) -> None:
    [[now]] = db.run("SELECT now()")
    lanes.pause(until=now + timedelta(hours=1), reason="rate_limit", window="hour", detail="h")
    lanes.pause(until=now + timedelta(seconds=10), reason="retry_after", window=None, detail="s")
    lane = lane_row(db)
    assert (lane["reason"], lane["window"]) == ("rate_limit", "hour")
    assert lane["paused_until"] >= now + timedelta(minutes=59)


def test_slots_taken_at_once_by_many_containers_never_exceed_the_limit(
    pg_dsn: str, db: Any
) -> None:
    answers: list[SlotAnswer] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def container(record_id: int) -> None:
        database = Database(DatabaseConfig(url=pg_dsn), application_name=f"c{record_id}")
        try:
            store = LaneStore(database)
            store.state()  # connected before the race
            start.wait()
            slot = store.take_slot(
                record_id, limits=[(60, 3)], margin=0.5, tolerance=0.05, stale=120,
                book_within=900,
            )  # fmt: skip
            with lock:
                answers.append(slot.answer)
        finally:
            database.close()

    threads = [threading.Thread(target=container, args=(900 + i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert answers.count(SlotAnswer.GO) == 3
    assert answers.count(SlotAnswer.BOOKED) == 5
    rows = db.run("SELECT state, at FROM image_archive_uploads ORDER BY at")
    assert sorted(state for state, _ in rows) == ["booked"] * 5 + ["taken"] * 3
    # Each booking its own slot: at no upload's time do more than the limit count as Lsky
    # counts them (two slots may free at one instant, when two uploads shared a second:
    # then two bookings share it too, and the window still holds three).
    times = [at.timestamp() for _, at in rows]
    for at in times:
        counting = [u for u in times if u <= at < counts_until(u, 60, 0.5)]
        assert len(counting) <= 3, (at, times)


def booking_of(db: Any, record_id: int) -> datetime:
    [[at]] = db.run(
        "SELECT at FROM image_archive_uploads WHERE record_id = :id AND state = 'booked'",
        id=record_id,
    )
    return at  # type: ignore[no-any-return]


def test_a_slot_an_attempt_sleeps_for_is_booked_as_it_is_and_a_booking_keeps_its_date(
    lanes: LaneStore, db: Any
) -> None:
    assert take(lanes, 1, [(3, 1)]).answer is SlotAnswer.GO
    answered(db, 1)

    # Bytes in hand, a slot ~4 s away it may sleep for: booked at the slot itself...
    sleeper = take(lanes, 2, [(3, 1)], sleep_within=6)
    assert sleeper.answer is SlotAnswer.BOOKED
    assert booking_of(db, 2) == sleeper.at
    # ...while a message that will be held is booked at the first time whole seconds from
    # now plus its lead (half a second: it uploads that long after it comes back) at or
    # after its slot (the one after the sleeper's: its window, Lsky's second and the margin).
    held = take(lanes, 3, [(3, 1)], lead=0.5)
    assert held.answer is SlotAnswer.BOOKED
    ahead = (booking_of(db, 3) - held.now).total_seconds() - 0.5
    frees = counts_until(sleeper.at.timestamp(), 3, 0.1)  # Lsky's second and the margin
    if ahead != pytest.approx(round(ahead), abs=1e-6):
        # That whole second fell within the tolerance (50 ms) before the slot: the upload
        # takes the slot, so the booking is dated at it (slots._held).
        assert 0 < ahead - math.floor(ahead) <= 0.05 + 1e-6
        assert held.at.timestamp() == pytest.approx(frees, abs=1e-6)
    assert booking_of(db, 3) == held.at
    assert held.at.timestamp() >= frees

    # A later look at its own booking neither moves it on nor rounds it again (each look
    # once pushed it by up to a second, and a sleeping attempt never caught its slot).
    again = take(lanes, 2, [(3, 1)])
    assert again.answer is SlotAnswer.BOOKED
    assert booking_of(db, 2) == sleeper.at == again.at


@pytest.mark.parametrize(("uploads", "answer"), [(299, SlotAnswer.GO), (300, SlotAnswer.WAIT)])
def test_an_hour_rolled_up_counts_as_its_uploads_in_a_day_s_window(
    lanes: LaneStore, db: Any, uploads: int, answer: SlotAnswer
) -> None:
    # An hour three hours back, rolled up: one row of `uploads`, counted at the hour's end.
    db.run(
        "INSERT INTO image_archive_upload_hours (lane, hour, uploads, backfill_uploads)"
        " VALUES ('lsky', date_trunc('hour', now()) - interval '3 hours', :n, 0)",
        n=uploads,
    )
    slot = take(lanes, 1, [(86_400, 300)])
    assert slot.answer is answer
    if answer is SlotAnswer.WAIT:
        # Free again once that hour's end leaves the day (plus Lsky's whole second, the
        # margin, and up to the whole second a held message comes back on).
        [[frees]] = db.run(
            "SELECT date_trunc('hour', now()) - interval '2 hours' + interval '1 day'"
        )
        assert frees + timedelta(seconds=1.1) <= slot.at <= frees + timedelta(seconds=2.2)


def test_slots_taken_any_which_way_never_put_more_than_a_limit_in_a_window(
    lanes: LaneStore, db: Any
) -> None:
    # Fresh records, records that may sleep, records held with any lead, in any order:
    # every schedule the statement builds keeps every window within its limit.
    chooser = random.Random(18)  # noqa: S311 - a repeatable mix, not a secret
    limits = [(3, 2), (8, 4)]
    for record_id in range(1, 41):
        slot = take(
            lanes, record_id, limits, sleep_within=chooser.choice([0.0, 1.0, 5.0]),
            lead=chooser.choice([0.0, 0.3, 0.75, 2.0]),
        )  # fmt: skip
        assert slot.answer in (SlotAnswer.GO, SlotAnswer.BOOKED)
    assert_within_limits(db, limits)


def assert_within_limits(db: Any, limits: list[tuple[float, int]]) -> None:
    """No closed window of any limit's length holds more than its limit of entries
    (uploads and bookings), as Lsky counts them."""
    times = sorted(row[0] for row in db.run("SELECT at FROM image_archive_uploads"))
    for seconds, uploads in limits:
        for i in range(len(times) - uploads):
            span = (times[i + uploads] - times[i]).total_seconds()
            assert span > seconds, (seconds, uploads, times[i : i + uploads + 1])


# -- 5. an adoption takes no slot and logs no upload ---------------------------------------


def test_an_adoption_takes_no_slot_and_logs_no_upload(
    paced: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 8, archive_may_be_hosted=True)
    stored = lsky.add_image(PNG, origin_name=STEM.format(8) + ".png")

    assert paced.deliver(encode(8)) == {"batchItemFailures": []}

    assert fetch_record(db, 8)["hosted_response"]["key"] == stored.key
    lane = lane_row(db)
    assert (lane["uploads"], lane["booked"]) == (0, 0)


# -- 6. a 429 on the look-up pauses the lane ------------------------------------------------


def test_a_429_on_the_look_up_pauses_the_lane_and_spends_nothing_on_the_last_attempt(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 9, archive_may_be_hosted=True, attempts=2)  # the last attempt next
    lsky.listing_fault = 429

    archive.deliver(encode(9))

    row = fetch_record(db, 9)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 2)
    assert row["archive_wait_reason"] == "paused"
    assert lane_row(db)["reason"] == "rate_limit"
    assert lsky.upload_count == 0


# -- 7. every hold is a visibility SQS accepts ----------------------------------------------


def test_a_message_for_a_row_due_in_twelve_hours_parks_it_instead_of_holding(
    archive: ArchiveHarness, db: Any, upstream: Any
) -> None:
    seed(db, upstream, 10, next_run_at=-43_200)  # due 12 h from now (a long backoff)

    assert archive.deliver(encode(10)) == {"batchItemFailures": []}  # acknowledged

    row = fetch_record(db, 10)
    assert row["archive_status"] == "PENDING"
    assert row["archive_enqueued_at"] is None  # parked: the sweeper sends it when due
    assert archive.log_for("message arrived long before the row is due; record parked")


def test_a_message_is_held_twice_at_most_and_parks_the_row_on_its_third_receive(
    archive: ArchiveHarness, db: Any, upstream: Any
) -> None:
    # Every receive counts towards the redrive policy's maxReceiveCount: a row that keeps its
    # message waiting is parked on the third (docs/explanation/lane-and-pacing.md), never sent to
    # the DLQ.
    seed(db, upstream, 15, next_run_at=-120, enqueued_at=0)  # due in 2 min: short enough to hold
    archive.send(encode(15))
    for receive in (1, 2, 3):
        event = archive.receive()
        [record] = event["Records"]
        assert record["attributes"]["ApproximateReceiveCount"] == str(receive)
        archive.settle(event, archive.invoke(event))
        row = fetch_record(db, 15)
        if receive < 3:
            assert row["archive_enqueued_at"] is not None  # held: its message is out
            assert archive.in_flight() == 1
            archive.fast_forward(event)
    held = [seconds for seconds in archive.holds() if seconds]  # 0: the test's fast-forward
    assert len(held) == 2
    assert all(100 <= seconds <= 121 for seconds in held)  # until due, each time
    assert row["archive_status"] == "PENDING"
    assert row["archive_enqueued_at"] is None  # parked: the sweeper sends it when due
    assert archive.visible() + archive.in_flight() == 0  # the message was acknowledged
    assert archive.log_for("message arrived long before the row is due; record parked")


def test_a_hold_sqs_refuses_parks_the_row_at_its_due_time(
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Fault injection: a hold SQS refuses (InvalidParameterValue): 12 h after a receive.
    monkeypatch.setattr(retry, "retry_delay", lambda attempt, delays: 50_000)
    monkeypatch.setattr(conclusion.schedule, "max_hold_seconds", lambda received_at: 60_000)
    seed(db, upstream, 11)
    lsky.script(Behaviour.server_error())

    response = archive.deliver(encode(11))

    assert response == {"batchItemFailures": []}  # acknowledged: the row says when
    row = fetch_record(db, 11)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 1)
    assert row["archive_enqueued_at"] is None
    assert 43_190 <= seconds_until(db, 11) <= 43_200  # the backoff, as the row recorded it
    assert archive.log_for("could not change message visibility")["code"] == (
        "InvalidParameterValue"
    )
    assert emf_metrics(capsys)["VisibilityRefused"] == 1


TOO_LONG = (
    "Value 600 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout"
    " for the message is beyond the limit [43200 seconds]"
)


def test_a_copy_whose_hold_sqs_refuses_leaves_the_held_message_its_booking(
    archive: ArchiveHarness, db: Any, upstream: Any
) -> None:
    # Two messages for one row: its own, held for its booked slot 10 minutes ahead, and a
    # copy that comes early, whose hold SQS refuses (its 12 hours in flight used up).
    seed(db, upstream, 12, next_run_at=-600, enqueued_at=0)
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, record_id, state)"
        " VALUES ('lsky', now() + interval '600 seconds', 12, 'booked')"
    )
    archive.send(encode(12))
    assert len(archive.receive()["Records"]) == 1  # the row's own, held meanwhile
    archive.moto.refuse("ChangeMessageVisibility", "InvalidParameterValue", TOO_LONG)

    response = archive.deliver(encode(12))  # the copy

    assert response == {"batchItemFailures": []}  # acknowledged
    row = fetch_record(db, 12)
    assert row["archive_status"] == "PENDING"
    assert row["archive_enqueued_at"] is not None  # its own message is still out
    assert 590 <= seconds_until(db, 12) <= 600
    assert db.run("SELECT state FROM image_archive_uploads WHERE record_id = 12") == [["booked"]]
    assert archive.visible() + archive.in_flight() == 1  # the held one, and no other
    assert archive.log_for("could not change message visibility")
    line = archive.log_for(
        "message visibility refused; a copy acknowledged, the row's own is held for its slot"
    )
    assert line["outcome"] == "duplicate"


def test_the_longest_hold_is_within_twelve_hours_of_the_receive() -> None:
    assert schedule.max_hold_seconds(0.0, now=0.0) == 43_200 - schedule.RECEIVE_SAFETY_SECONDS
    assert schedule.max_hold_seconds(0.0, now=600.0) == 43_200 - 60 - 600
    assert schedule.max_hold_seconds(0.0, now=50_000.0) == 0


# -- 9. Retry-After is capped and read safely -----------------------------------------------


def retry_after_answered(
    db: Any, upstream: Any, lsky: LskyStandIn, archive: ArchiveHarness, asked: str
) -> tuple[dict[str, Any], float]:
    """A 503 with `Retry-After: asked` for a fresh record: (the row, seconds the lane is
    paused for from now, or 0)."""
    seed(db, upstream, 12)
    lsky.script(Behaviour.unavailable(asked))
    archive.deliver(encode(12))
    [[paused_for]] = db.run(
        "SELECT COALESCE(EXTRACT(EPOCH FROM paused_until - now()), 0) FROM image_archive_lane"
    )
    return fetch_record(db, 12), float(paused_for)


@pytest.mark.parametrize(
    "asked",
    [
        "1000000000",  # 31.7 years
        "1700000000000",  # a millisecond epoch: once an OverflowError
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "99999999999999999999999999",
    ],
)
def test_a_huge_retry_after_pauses_the_lane_an_hour_at_most(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn, asked: str
) -> None:
    row, paused_for = retry_after_answered(db, upstream, lsky, archive, asked)

    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert 0 < paused_for <= 3600
    assert lane_row(db)["reason"] == "retry_after"


@pytest.mark.parametrize("asked", ["-5", "Wed, 21 Oct 2015 07:28:00 GMT", "soon", "1.5"])
def test_a_retry_after_in_the_past_or_unreadable_is_a_short_pause(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn, asked: str
) -> None:
    row, paused_for = retry_after_answered(db, upstream, lsky, archive, asked)

    assert row["archive_status"] == "PENDING"
    assert paused_for <= 30  # a 503 without a usable Retry-After: a retry, no pause


# -- 11. a staged copy is what was captured, or it is never archived ----------------------


def test_a_replaced_staged_copy_is_never_archived_and_spends_no_attempt(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    s3: Any,
    staging_bucket: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive_env(ARCHIVE_STAGING_BUCKET=staging_bucket)
    seed(db, upstream, 14)
    lsky.script(Behaviour.server_error())
    archive.deliver(encode(14))  # HTTP 500: the bytes in hand are staged, retried
    row = fetch_record(db, 14)
    key = row["archive_staged_key"]
    assert row["archive_staged_sha256"] == hashlib.sha256(PNG).hexdigest()  # taken on the way
    assert row["archive_staged_bytes"] == len(PNG)
    s3.put_object(Bucket=staging_bucket, Key=key, Body=OTHER)  # replaced behind our back
    db.run("UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = 14")
    capsys.readouterr()

    archive.deliver(encode(14))

    row = fetch_record(db, 14)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 1)
    assert row["archive_staged_key"] is None  # forgotten: the source is tried next
    assert row["archive_wait_reason"] == "own_fault"
    assert lsky.successful_uploads == 0
    metrics = emf_metrics(capsys)
    assert metrics["StagedCopyMismatch"] == 1
    assert metrics["StagingError"] == 1


# -- 12. only an image that can be ours is adopted ------------------------------------------


@pytest.mark.parametrize(
    ("planted", "age", "why"),
    [
        (PNG, 3 * 3600, "before the record's first claim"),  # the same bytes, too old
        (OTHER, 0, "the image is 16x16"),  # a fresh one with other dimensions
    ],
    ids=["stored-before", "other-dimensions"],
)
def test_an_image_that_cannot_be_ours_is_not_adopted(
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    planted: bytes,
    age: float,
    why: str,
) -> None:
    seed(db, upstream, 15, archive_may_be_hosted=True)
    db.run(
        "UPDATE image_generation_records SET archive_first_claimed_at = now() - interval"
        " '1 hour' WHERE id = 15"
    )
    foreign = lsky.add_image(planted, origin_name=STEM.format(15) + ".png", age=age)

    assert archive.deliver(encode(15)) == {"batchItemFailures": []}

    row = fetch_record(db, 15)
    assert row["hosted_response"]["key"] != foreign.key
    assert lsky.upload_count == 1
    refused = archive.log_for("an image with the record's name is not ours")
    assert refused["key"] == foreign.key
    assert why in refused["why"]
