"""What keeping every record's story costs and how long it is kept: the archive path's
database round trips and statements are what they were without it (counted as bench point
3 counts them), and the sweeper's retention removes a concluded record's events, never a
live record's."""

from __future__ import annotations

from typing import Any

import pytest

from devkit import roundtrips
from devkit.lsky import Behaviour
from lib.archive import runtime
from lib.archive.message import encode
from tests.integration.test_stories import story, sweep
from tests.integration.world import World


def counted_delivery(world: World, record_id: int) -> tuple[Any, int, int]:
    """Deliver the record's message in a warm container; (response, statements, round
    trips) of the handler's call alone."""
    world.archive.send(encode(record_id))
    event = world.archive.receive()
    db = runtime.archive_worker().records.db
    statements = db.statements_run
    with roundtrips.counted() as trips:
        response = world.archive.invoke(event)
    world.archive.settle(event, response)
    return response, db.statements_run - statements, trips.waits


@pytest.mark.parametrize("outcome", ["archived", "retried"])
def test_the_archive_path_keeps_its_round_trips_and_statements(world: World, outcome: str) -> None:
    refused = Behaviour.status_false("图片上传失败")  # stored nothing: the retry looks nothing up
    world.record(1)
    if outcome == "retried":
        world.lsky.script(refused)
    world.deliver(1)  # the container's first such message: it connects and prepares
    world.record(2)
    if outcome == "retried":
        world.lsky.script(refused)

    response, statements, trips = counted_delivery(world, 2)

    # The claim (received, claimed) and the conclusion (the attempt's fetched and
    # upload_answered, carried in memory, then archived or retried): two statements, two
    # round trips, as before the story was kept.
    assert (statements, trips) == (2, 2)
    assert len(response["batchItemFailures"]) == (outcome == "retried")
    assert [kind for kind, _ in story(world.db, 2)][-3:] == [
        "fetched",
        "upload_answered",
        outcome,
    ]


def age_events(db: Any, record_id: int, days: float) -> None:
    """`days` pass for the record's story: its events, and the row's conclusion time with
    them, move back."""
    db.run(
        "UPDATE image_archive_events SET at = at - make_interval(days => CAST(:d AS int))"
        " WHERE record_id = :id",
        d=days,
        id=record_id,
    )
    db.run(
        "UPDATE image_generation_records"
        " SET archived_at = archived_at - make_interval(days => CAST(:d AS int)),"
        "     archive_failed_at = archive_failed_at - make_interval(days => CAST(:d AS int))"
        " WHERE id = :id",
        d=days,
        id=record_id,
    )


def test_retention_removes_a_concluded_record_s_events_and_never_a_live_one_s(
    world: World,
) -> None:
    world.settings(ARCHIVE_EVENT_RETENTION_DAYS="30")
    for record_id in (1, 2, 3, 4):
        world.record(record_id)
        world.deliver(record_id)
    # 1: archived 31 days ago. 2: archived 29 days ago. 3: archived 40 days ago, then
    # requeued and PENDING again now (live). 4: archived 40 days ago, requeued, archived
    # again today: its first chapter goes, the second stays.
    age_events(world.db, 1, 31)
    age_events(world.db, 2, 29)
    age_events(world.db, 3, 40)
    world.db.run(
        "UPDATE image_generation_records SET archive_status = 'PENDING', archive_attempts = 0,"
        " archive_next_run_at = now(), archive_enqueued_at = now() WHERE id = 3"
    )
    age_events(world.db, 4, 40)
    world.db.run("UPDATE image_generation_records SET archive_status = 'PENDING' WHERE id = 4")
    world.deliver(4)
    # 5: a live record whose own events are all old (parked for weeks), never concluded.
    world.record(5, route={"fail_first": 9, "fail_status": 503})
    world.deliver(5)  # its download fails: retried, PENDING
    age_events(world.db, 5, 60)
    before = {record_id: len(story(world.db, record_id)) for record_id in (1, 2, 3, 4, 5)}

    summary = sweep()

    after = {record_id: len(story(world.db, record_id)) for record_id in (1, 2, 3, 4, 5)}
    assert after[1] == 0
    assert after[2] == before[2]
    assert after[3] == before[3]  # live: every event kept, however old
    assert after[5] == before[5]
    assert 0 < after[4] < before[4]  # the second chapter: received ... archived
    assert story(world.db, 4)[0][0] == "received"
    assert (summary["stories_expired"], summary["events_removed"]) == (
        2,
        before[1] + before[4] - after[4],
    )
    removed = world.archive.log_for("events of concluded records removed after the retention")
    assert removed["record_ids"] == ["1", "4"]
    assert sweep()["stories_expired"] == 0  # nothing left to remove


def test_retention_works_in_bounded_batches(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from lib.archive import sweeper

    monkeypatch.setattr(sweeper, "EXPIRY_RECORDS", 2)
    monkeypatch.setattr(sweeper, "EXPIRY_BATCHES", 2)
    for record_id in range(1, 7):
        world.record(record_id)
        world.deliver(record_id)
        age_events(world.db, record_id, 31)

    assert sweep()["stories_expired"] == 4  # two batches of two
    assert sweep()["stories_expired"] == 2
    assert world.db.run("SELECT count(*) FROM image_archive_events") == [[0]]


def test_retention_takes_what_came_after_the_last_conclusion_with_it(world: World) -> None:
    world.settings(ARCHIVE_EVENT_RETENTION_DAYS="30")
    for record_id in (1, 2, 3):
        world.record(record_id)
        world.deliver(record_id)
        world.deliver(record_id)  # a duplicate: received, not claimed (archived)
    # 1: archived and its duplicate 31 days ago. 2: archived 40 days ago, a duplicate
    # today. 3: the same, then requeued: live, it keeps all of it.
    age_events(world.db, 1, 31)
    age_events(world.db, 2, 40)
    world.deliver(2)
    age_events(world.db, 3, 40)
    world.deliver(3)
    world.db.run(
        "UPDATE image_generation_records SET archive_status = 'PENDING', archive_attempts = 0,"
        " archive_next_run_at = now(), archive_enqueued_at = now() WHERE id = 3"
    )
    assert [kind for kind, _ in story(world.db, 2)][-3:] == ["archived", "received", "received"]
    kept = story(world.db, 3)

    summary = sweep()

    assert story(world.db, 1) == []
    assert story(world.db, 2) == []  # today's duplicate went with the chapter it came after
    assert story(world.db, 3) == kept
    assert summary["stories_expired"] == 2
    # A stray message once the story is gone writes none: it would begin a story that no
    # conclusion ends (the producer's enqueue inferred 40 days back, then this message).
    world.deliver(2)
    assert world.state(2) == ("SUCCEEDED", 1)
    assert story(world.db, 2) == []
    assert sweep()["stories_expired"] == 0
