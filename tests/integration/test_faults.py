"""Faults against the real services: time running out, a database that drops or is down,
a worker killed mid-upload, and the same record delivered to several invocations at once."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from devkit import images
from devkit.lsky import Behaviour
from devkit.upstream import StreamBody
from lib.archive.message import encode
from tests.integration.conftest import start_child
from tests.integration.world import World
from tests.support import (
    HANG_SECONDS,
    FakeLambdaContext,
    assert_nothing_sent_to_lsky,
    db_now,
    lock_expired,
    wait_until,
)

ShortInvocation = Callable[[], FakeLambdaContext]


# -- the time guard --------------------------------------------------------------------


def test_too_little_time_to_start_gives_the_message_back_unclaimed(world: World) -> None:
    world.record(60)
    before = world.row(60)

    response = world.deliver(60, FakeLambdaContext(timeout_seconds=10))

    assert len(response["batchItemFailures"]) == 1
    after = world.row(60)
    # Not even claimed: only where its message is, held for a few seconds, is written
    # (the sweeper's lost-message rule reads a held message's return from the due time).
    assert {k for k in after if after[k] != before[k]} == {
        "archive_next_run_at",
        "archive_wait_reason",
    }
    assert after["archive_wait_reason"] == "no_time"
    due_in = (after["archive_next_run_at"] - db_now(world.db)).total_seconds()
    assert 0 < due_in <= 5
    assert world.downloads(60) == 0
    line = world.archive.log_for("not enough time left to start; redelivering")
    assert line["outcome"] == "released"


def test_a_transfer_found_too_big_for_the_time_left_spends_the_attempt(world: World) -> None:
    # At 2 MiB/s: 20 s for the bytes to cross both links at once (relayed), plus 7 s of
    # overheads, more than the 25 s a 40 s invocation has for transfers once the 15 s
    # finish reserve is kept back. The download has begun when its Content-Length is
    # known: running out of time now is a timeout that counts (a slow upstream could
    # otherwise loop forever unspent).
    size = 40 * 1024 * 1024
    world.record(61, StreamBody.of(lambda: images.png_stream(size=size), size), attempts=1)

    response = world.deliver(61, FakeLambdaContext(timeout_seconds=40, from_first_look=True))

    assert len(response["batchItemFailures"]) == 1
    row = world.row(61)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 2)  # spent
    assert row["archive_locked_by"] is None
    assert "not enough time left to transfer" in row["archive_error"]
    assert world.lsky.upload_count == 0
    assert world.archive.log_for("archive attempt failed, will retry")["outcome"] == "retry"


def test_the_time_left_is_judged_by_the_relayed_transfer_not_two_in_a_row(
    world: World,
) -> None:
    # At 2 MiB/s: 15 s down then 15 s up (plus overheads, 37 s) would not fit the 25 s a
    # 40 s invocation has for transfers; relayed, the bytes cross both links at once
    # (15 s, plus overheads: 22 s), and the budget admits it.
    size = 30 * 1024 * 1024
    world.record(64, StreamBody.of(lambda: images.png_stream(size=size), size))

    response = world.deliver(64, FakeLambdaContext(timeout_seconds=40, from_first_look=True))

    assert response == {"batchItemFailures": []}
    assert world.state(64) == ("SUCCEEDED", 1)
    assert world.lsky.uploads[-1].size == size


def test_redirects_that_outlast_the_deadline_spend_the_attempt(
    short_invocation: ShortInvocation, gate: threading.Event, world: World
) -> None:
    # The download has begun (a hop answered) when the time runs out on the next hop,
    # held until after the deadline. Before the fix that was "no time" and gave the attempt
    # back, forever.
    world.upstream.add("/final.png", images.png(size=10_000))
    world.upstream.add("/hop2", redirect_to="/final.png", gate=gate)
    world.record(63, b"", route={"redirect_to": "/hop2"})

    world.deliver(63, short_invocation())

    assert world.state(63) == ("PENDING", 1)  # spent, not given back
    assert "download failed" in world.row(63)["archive_error"]
    assert world.upstream.hits("/hop2") == 1
    assert world.upstream.hits("/final.png") == 0
    assert world.lsky.upload_count == 0


def test_a_slow_drip_download_ends_at_the_deadline_and_spends_the_attempt(
    short_invocation: ShortInvocation, world: World
) -> None:
    # 20 s of dripping: only the attempt's deadline (about 2 s) can end it.
    world.record(62, images.png(size=100_000), route={"drip_bytes_per_sec": 5_000})
    context = short_invocation()

    response = world.deliver(62, context)

    assert context.get_remaining_time_in_millis() > 0  # never held past its own timeout
    assert len(response["batchItemFailures"]) == 1
    assert world.state(62) == ("PENDING", 1)  # it started: a timeout spends its attempt
    assert "deadline" in world.row(62)["archive_error"]
    # The image was never whole in hand: nothing was sent to Lsky.
    assert_nothing_sent_to_lsky(world.lsky)


def test_a_slow_lsky_is_cut_at_the_time_left_not_its_read_timeout(
    short_invocation: ShortInvocation, gate: threading.Event, world: World
) -> None:
    world.record(63)
    world.lsky.script(Behaviour.held(gate))  # no answer before the test says so
    context = short_invocation()

    response = world.deliver(63, context)

    # Cut at the attempt's deadline (about 2 s), not at Lsky's 60 s read timeout.
    assert context.get_remaining_time_in_millis() > 0
    assert len(response["batchItemFailures"]) == 1
    assert world.state(63) == ("PENDING", 1)
    assert "timed out waiting for Lsky" in world.row(63)["archive_error"]
    # Let the stand-in finish the held request before the next test resets it.
    gate.set()
    assert world.lsky.wait_for_uploads(1, timeout=HANG_SECONDS)


# -- the database ----------------------------------------------------------------------


def test_database_down_then_back_loses_nothing(world: World, pg_dsn: str) -> None:
    archive = world.archive
    world.record(70)
    world.settings(DATABASE_URL="postgresql://postgres@127.0.0.1:9/none")
    archive.send(encode(70))
    event = archive.receive()
    response = archive.invoke(event)
    archive.settle(event, response)
    assert len(response["batchItemFailures"]) == 1
    assert world.row(70)["archive_attempts"] == 0
    assert archive.receive(wait_seconds=0)["Records"] == []  # held, not lost, not dropped

    # The database is back; the message's hold runs out (fast-forwarded here).
    world.settings(DATABASE_URL=pg_dsn)
    archive.fast_forward(event)
    again = archive.receive(wait_seconds=2)
    assert again["Records"][0]["attributes"]["ApproximateReceiveCount"] == "2"
    assert archive.invoke(again) == {"batchItemFailures": []}
    assert world.state(70) == ("SUCCEEDED", 1)
    assert world.lsky.upload_count == 1


def test_connection_killed_during_an_attempt_is_reopened_for_its_outcome(world: World) -> None:
    world.record(71)

    def kill_backends() -> None:
        world.db.run(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'image-archive'"
        )

    with world.during_the_upload(kill_backends):
        response = world.deliver(71)

    assert response == {"batchItemFailures": []}
    assert world.state(71) == ("SUCCEEDED", 1)
    assert world.archive.log_for("database connection lost, reconnecting")


# -- processes: a worker killed mid-upload, and concurrent invocations -------------------


def test_a_worker_killed_mid_upload_is_taken_over_and_its_upload_adopted(
    gate: threading.Event, world: World, tmp_path: Path
) -> None:
    archive, lsky = world.archive, world.lsky
    world.settings(ARCHIVE_LOCK_TTL_SECONDS="2", ARCHIVE_FUNCTION_TIMEOUT_SECONDS="1")
    world.record(80)
    lsky.script(Behaviour.held(gate))
    archive.send(encode(80))
    event = archive.receive()

    child = start_child(event, tmp_path, "killed")
    # Mid-upload: claimed, downloaded, and Lsky holds the whole request unanswered.
    assert lsky.wait_for_bodies(1, timeout=HANG_SECONDS)
    os.kill(child.process.pid, signal.SIGKILL)
    child.process.wait(timeout=HANG_SECONDS)

    row = world.row(80)
    assert (row["archive_status"], row["archive_attempts"]) == ("RUNNING", 1)
    assert row["archive_locked_by"]
    assert row["archive_may_be_hosted"] is True  # set by the claim, never cleared
    # Lsky finishes the killed attempt's upload with no one to read the answer.
    gate.set()
    assert lsky.wait_for_uploads(1, timeout=HANG_SECONDS)
    # No one concludes it until the lock expires; then the redelivered message takes over.
    wait_until(lambda: lock_expired(world.db, 80, ttl=2), "the killed attempt's lock expired")
    archive.fast_forward(event)
    assert archive.invoke(archive.receive(wait_seconds=2)) == {"batchItemFailures": []}

    row = world.row(80)
    assert (row["archive_status"], row["archive_attempts"]) == ("SUCCEEDED", 2)
    assert row["archive_locked_by"] is None
    # The takeover looked the image up by its name and adopted it: one stored copy.
    assert lsky.upload_count == 1
    [image] = lsky.image_records()
    assert row["hosted_image_url"] == f"{lsky.public_url}/i/{image.pathname}"
    assert row["hosted_response"]["key"] == image.key
    # The killed worker could not say what it sent: the taker downloads the image once
    # more to compare it with the one it finds (same bytes or size), then adopts it.
    assert world.downloads(80) == 2


def test_one_record_delivered_to_several_invocations_at_once_is_uploaded_once(
    gate: threading.Event, world: World, tmp_path: Path
) -> None:
    copies = 4
    world.record(81)
    # Lsky holds the winner's upload until every other copy is done, so the others claim
    # while it is in flight.
    world.lsky.script(Behaviour.held(gate))
    for _ in range(copies):
        world.archive.send(encode(81))
    records = world.archive.receive_all(copies)

    start = tmp_path / "go"
    children = [
        start_child({"Records": [record]}, tmp_path, f"c{n}", gate=start)
        for n, record in enumerate(records)
    ]
    wait_until(
        lambda: all((tmp_path / f"c{n}.ready").exists() for n in range(copies)),
        "every copy's process is ready",
    )
    start.touch()  # all at once
    wait_until(
        lambda: sum(child.process.poll() is not None for child in children) == copies - 1,
        "every copy but the winner's is done",
    )
    assert world.lsky.bodies_received == 1  # the winner's upload, still held
    gate.set()
    responses = [child.response() for child in children]

    assert responses == [{"batchItemFailures": []}] * copies  # all acknowledged
    assert world.lsky.upload_count == 1
    assert world.state(81) == ("SUCCEEDED", 1)
    assert world.downloads(81) == 1
    logs = [line for child in children for line in child.logs()]
    assert [line["message"] for line in logs].count("archive succeeded") == 1
    reasons = [line["reason"] for line in logs if line["message"] == "message skipped"]
    assert len(reasons) == copies - 1
    assert set(reasons) <= {
        "archive is RUNNING under a live lock",
        "claimed concurrently (archive PENDING)",
    }
