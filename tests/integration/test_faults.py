"""Faults against the real services: time running out, a database that drops or is down,
a worker killed mid-upload, and the same record delivered to several invocations at once."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devkit import images
from devkit.lsky import Behaviour
from devkit.upstream import StreamBody
from lib.archive.message import encode
from tests.integration.conftest import ArchiveHarness, start_child
from tests.support import (
    HANG_SECONDS,
    FakeLambdaContext,
    assert_nothing_sent_to_lsky,
    fetch_record,
    seed_record,
    wait_until,
)

PNG = images.png(8, 8)


# -- the time guard --------------------------------------------------------------------


def test_too_little_time_to_start_gives_the_message_back_unclaimed(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: Any
) -> None:
    seed_record(db, 60, image_url=upstream.add("/t.png", PNG))
    before = fetch_record(db, 60)

    response = archive.deliver(encode(60), FakeLambdaContext(timeout_seconds=10))

    assert len(response["batchItemFailures"]) == 1
    assert fetch_record(db, 60) == before  # not even claimed
    assert upstream.hits("/t.png") == 0
    assert archive.log_for("not enough time left to start; redelivering")["outcome"] == "released"


def test_a_transfer_found_too_big_for_the_time_left_spends_the_attempt(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: Any
) -> None:
    # At 2 MiB/s: 15 s down + 15 s up (plus overheads), more than the 25 s a 40 s
    # invocation has for transfers once the 15 s finish reserve is kept back. The
    # download has begun when its Content-Length is known: running out of time now is a
    # timeout that counts (a slow upstream could otherwise loop forever unspent).
    size = 30 * 1024 * 1024
    upstream.add("/big.png", StreamBody.of(lambda: images.png_stream(size=size), size))
    seed_record(db, 61, image_url=upstream.url("/big.png"), attempts=1)

    response = archive.deliver(
        encode(61), FakeLambdaContext(timeout_seconds=40, from_first_look=True)
    )

    assert len(response["batchItemFailures"]) == 1
    row = fetch_record(db, 61)
    assert row["archive_status"] == "PENDING"
    assert row["archive_attempts"] == 2  # spent
    assert row["archive_locked_by"] is None
    assert "not enough time left to transfer" in row["archive_error"]
    assert lsky.upload_count == 0
    assert archive.log_for("archive attempt failed, will retry")["outcome"] == "retry"


def test_redirects_that_outlast_the_deadline_spend_the_attempt(
    short_invocation: Callable[[], FakeLambdaContext],
    gate: threading.Event,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> None:
    # The download has begun (a hop answered) when the time runs out on the next hop,
    # held until after the deadline. Before the fix that was "no time" and gave the attempt
    # back, forever.
    upstream.add("/final.png", images.png(size=10_000))
    upstream.add("/hop2", redirect_to="/final.png", gate=gate)
    upstream.add("/hop1", redirect_to="/hop2")
    seed_record(db, 63, image_url=upstream.url("/hop1"))

    archive.deliver(encode(63), short_invocation())

    row = fetch_record(db, 63)
    assert row["archive_attempts"] == 1  # spent, not given back
    assert row["archive_status"] == "PENDING"
    assert "download failed" in row["archive_error"]
    assert upstream.hits("/hop2") == 1
    assert upstream.hits("/final.png") == 0
    assert lsky.upload_count == 0


def test_a_slow_drip_download_ends_at_the_deadline_and_spends_the_attempt(
    short_invocation: Callable[[], FakeLambdaContext],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> None:
    # 20 s of dripping: only the attempt's deadline (about 2 s) can end it.
    upstream.add("/drip.png", images.png(size=100_000), drip_bytes_per_sec=5_000)
    seed_record(db, 62, image_url=upstream.url("/drip.png"))
    context = short_invocation()

    response = archive.deliver(encode(62), context)

    assert context.get_remaining_time_in_millis() > 0  # never held past its own timeout
    assert len(response["batchItemFailures"]) == 1
    row = fetch_record(db, 62)
    assert row["archive_status"] == "PENDING"
    assert row["archive_attempts"] == 1  # it started: a timeout spends its attempt
    assert "deadline" in row["archive_error"]
    # The image was never whole in hand: nothing was sent to Lsky.
    assert_nothing_sent_to_lsky(lsky)


def test_a_slow_lsky_is_cut_at_the_time_left_not_its_read_timeout(
    short_invocation: Callable[[], FakeLambdaContext],
    gate: threading.Event,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> None:
    seed_record(db, 63, image_url=upstream.add("/s.png", PNG))
    lsky.script(Behaviour.held(gate))  # no answer before the test says so
    context = short_invocation()

    response = archive.deliver(encode(63), context)

    # Cut at the attempt's deadline (about 2 s), not at Lsky's 60 s read timeout.
    assert context.get_remaining_time_in_millis() > 0
    assert len(response["batchItemFailures"]) == 1
    row = fetch_record(db, 63)
    assert row["archive_status"] == "PENDING"
    assert row["archive_attempts"] == 1
    assert "timed out waiting for Lsky" in row["archive_error"]
    # Let the stand-in finish the held request before the next test resets it.
    gate.set()
    assert lsky.wait_for_uploads(1, timeout=HANG_SECONDS)


# -- the database ----------------------------------------------------------------------


def test_database_down_then_back_loses_nothing(
    archive_env: Any, archive: ArchiveHarness, db: Any, upstream: Any, lsky: Any, pg_dsn: str
) -> None:
    seed_record(db, 70, image_url=upstream.add("/d.png", PNG))
    archive_env(DATABASE_URL="postgresql://postgres@127.0.0.1:9/none")
    archive.send(encode(70))
    event = archive.receive()
    response = archive.invoke(event)
    archive.settle(event, response)
    assert len(response["batchItemFailures"]) == 1
    assert fetch_record(db, 70)["archive_attempts"] == 0
    assert archive.receive(wait_seconds=0)["Records"] == []  # held, not lost, not dropped

    # The database is back; the message's hold runs out (fast-forwarded here).
    archive_env(DATABASE_URL=pg_dsn)
    archive.fast_forward(event)
    again = archive.receive(wait_seconds=2)
    assert again["Records"][0]["attributes"]["ApproximateReceiveCount"] == "2"
    assert archive.invoke(again) == {"batchItemFailures": []}
    row = fetch_record(db, 70)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["archive_attempts"] == 1
    assert lsky.upload_count == 1


def test_connection_killed_during_an_attempt_is_reopened_for_its_outcome(
    gate: threading.Event, archive: ArchiveHarness, db: Any, upstream: Any, lsky: Any
) -> None:
    seed_record(db, 71, image_url=upstream.add("/k.png", PNG))
    lsky.script(Behaviour.held(gate))

    def kill_backends() -> None:
        # While Lsky holds the upload: the claim is done, the outcome not yet written.
        assert lsky.wait_for_bodies(1, timeout=HANG_SECONDS)
        db.run(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'image-archive'"
        )
        gate.set()

    killer = threading.Thread(target=kill_backends)
    killer.start()
    response = archive.deliver(encode(71))
    killer.join()

    assert response == {"batchItemFailures": []}
    row = fetch_record(db, 71)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["archive_attempts"] == 1
    assert archive.log_for("database connection lost, reconnecting")


# -- processes: a worker killed mid-upload, and concurrent invocations -------------------


def test_a_worker_killed_mid_upload_is_taken_over_and_its_upload_adopted(
    gate: threading.Event,
    archive_env: Any,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    tmp_path: Path,
) -> None:
    archive_env(ARCHIVE_LOCK_TTL_SECONDS="2")
    seed_record(db, 80, image_url=upstream.add("/m.png", PNG))
    lsky.script(Behaviour.held(gate))
    archive.send(encode(80))
    event = archive.receive()

    child = start_child(event, tmp_path, "killed")
    # Mid-upload: claimed, downloaded, and Lsky holds the whole request unanswered.
    assert lsky.wait_for_bodies(1, timeout=HANG_SECONDS)
    os.kill(child.process.pid, signal.SIGKILL)
    child.process.wait(timeout=HANG_SECONDS)

    row = fetch_record(db, 80)
    assert row["archive_status"] == "RUNNING"
    assert row["archive_attempts"] == 1
    assert row["archive_locked_by"]
    assert row["archive_may_be_hosted"] is True  # set by the claim, never cleared
    # Lsky finishes the killed attempt's upload with no one to read the answer.
    gate.set()
    assert lsky.wait_for_uploads(1, timeout=HANG_SECONDS)
    # No one concludes it until the lock expires; then the redelivered message takes over.
    wait_until(lambda: expired(db, 80, ttl=2), "the killed attempt's lock expired")
    archive.fast_forward(event)
    again = archive.receive(wait_seconds=2)
    assert archive.invoke(again) == {"batchItemFailures": []}

    row = fetch_record(db, 80)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["archive_attempts"] == 2
    assert row["archive_locked_by"] is None
    # The takeover looked the image up by its name and adopted it: one stored copy.
    assert lsky.upload_count == 1
    [image] = lsky.image_records()
    assert row["hosted_image_url"] == f"{lsky.public_url}/i/{image.pathname}"
    assert row["hosted_response"]["key"] == image.key
    # The killed worker could not say what it sent: the taker downloads the image once
    # more to compare it with the one it finds (same bytes or size), then adopts it.
    assert upstream.hits("/m.png") == 2


def expired(db: Any, record_id: int, *, ttl: int) -> bool:
    [[is_expired]] = db.run(
        "SELECT archive_locked_at < now() - make_interval(secs => :ttl) "
        "FROM image_generation_records WHERE id = :id",
        id=record_id,
        ttl=ttl,
    )
    return bool(is_expired)


def test_one_record_delivered_to_several_invocations_at_once_is_uploaded_once(
    gate: threading.Event,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    tmp_path: Path,
) -> None:
    copies = 4
    seed_record(db, 81, image_url=upstream.add("/c.png", PNG))
    # Lsky holds the winner's upload until every other copy is done, so the others claim
    # while it is in flight.
    lsky.script(Behaviour.held(gate))
    for _ in range(copies):
        archive.send(encode(81))
    records: list[dict[str, Any]] = []
    for _ in range(10):
        records += archive.receive(max_messages=10)["Records"]
        if len(records) == copies:
            break
    assert len(records) == copies

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
    assert lsky.bodies_received == 1  # the winner's upload, still held
    gate.set()
    responses = [child.response() for child in children]

    assert responses == [{"batchItemFailures": []}] * copies  # all acknowledged
    assert lsky.upload_count == 1
    row = fetch_record(db, 81)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["archive_attempts"] == 1
    assert upstream.hits("/c.png") == 1
    logs = [line for child in children for line in child.logs()]
    assert [line["message"] for line in logs].count("archive succeeded") == 1
    reasons = [line["reason"] for line in logs if line["message"] == "message skipped"]
    assert len(reasons) == copies - 1
    assert set(reasons) <= {
        "archive is RUNNING under a live lock",
        "claimed concurrently (archive PENDING)",
    }
