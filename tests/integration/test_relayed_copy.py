"""The relayed copy: the upload reads the download as it lands in the spool, which still
ends holding the whole image (lib.transfer.relay, docs/explanation/transfers.md, "The
relayed copy").

The provider's route holds the second half of the image until Lsky has seen what the test
waits for (an upload's body begin, or its refusal): so "while the download is still
arriving" is an event, however fast or slow the machine. The stand-ins record when the
download's last byte went out and when the upload's body began to arrive (one clock).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour
from devkit.s3 import staged_keys
from lib.archive.schedule import MIN_ATTEMPT_MS
from tests.integration.world import World
from tests.support import (
    HANG_SECONDS,
    FakeLambdaContext,
    assert_nothing_sent_to_lsky,
    lane_row,
    make_due,
    reset_lane,
    set_uploads,
)

IMAGE = images.png(16, 16, size=2_000_000, seed=29)  # past the spool's 1 MiB in memory
HALF = len(IMAGE) // 2
SHA256 = hashlib.sha256(IMAGE).hexdigest()
SHA1 = hashlib.sha1(IMAGE, usedforsecurity=False).hexdigest()


def sent_while_arriving(world: World, record_id: int) -> bool:
    """Whether the upload's body began before the download's last byte went out."""
    [upload] = [u for u in world.lsky.uploads if u.body_started_at is not None][:1]
    [last_byte] = world.upstream.bodies_sent(world.path(record_id))[:1]
    assert upload.body_started_at is not None
    return upload.body_started_at < last_byte


def test_the_upload_starts_while_the_download_is_still_arriving(world: World) -> None:
    # Half the image, then nothing until Lsky sees the upload's body begin: only an upload
    # that reads the download as it lands gets the rest sent.
    world.record(1, IMAGE, route={"gate_after": HALF, "gate": world.lsky.body_arriving})

    assert world.deliver(1) == {"batchItemFailures": []}

    assert world.state(1) == ("SUCCEEDED", 1)
    assert sent_while_arriving(world, 1)
    [upload] = world.lsky.uploads
    assert (upload.size, upload.sha256) == (len(IMAGE), SHA256)
    # The sha1 was taken once, as the bytes landed, and set against Lsky's answer.
    note = world.row(1)["hosted_response"]["_archive"]
    assert note["sent"] == {"sha1": SHA1, "bytes": len(IMAGE)}
    assert note["altered"] is False
    assert world.downloads(1) == 1


@pytest.mark.parametrize(
    "refusal",
    [Behaviour.server_error(), Behaviour.rate_limited(retry_after=30)],
    ids=["failing", "rate-limiting"],
)
def test_an_upload_refused_mid_download_is_archived_from_the_whole_image_staged(
    world: World, s3: Any, staging_bucket: str, refusal: Behaviour
) -> None:
    world.settings(ARCHIVE_STAGING_BUCKET=staging_bucket)
    # The provider serves once (403 after that), and holds its second half until Lsky's
    # proxy has refused the upload as its body began: the rest must land all the same.
    world.record(
        2,
        IMAGE,
        route={"fail_after": 1, "gate_after": HALF, "gate": world.lsky.upload_answered},
    )
    world.lsky.script(Behaviour.before_body(refusal))

    world.deliver(2)

    row = world.row(2)
    assert row["archive_status"] == "PENDING"
    # The refusal was read (a 500: retried; a 429: the lane paused), or the proxy's close
    # reset the connection under it (retried): staged from the whole image either way.
    [refused] = world.lsky.uploads
    assert refused.before_body
    assert world.lsky.image_records() == []
    assert staged_keys(s3, staging_bucket) == [row["archive_staged_key"]]
    staged = s3.get_object(Bucket=staging_bucket, Key=row["archive_staged_key"])["Body"].read()
    assert hashlib.sha256(staged).hexdigest() == SHA256  # every byte: the rest landed
    assert world.downloads(2) == 1

    reset_lane(world.db)  # a pause, if the 429 was read, has run out
    make_due(world.db, 2)
    assert world.deliver(2) == {"batchItemFailures": []}

    assert world.state(2)[0] == "SUCCEEDED"
    assert world.lsky.uploads[-1].sha256 == SHA256
    assert len(world.lsky.image_records()) == 1
    assert staged_keys(s3, staging_bucket) == []
    assert world.downloads(2) == 1  # the provider's URL was never needed again


def test_a_download_cut_mid_upload_leaves_nothing_on_lsky(world: World) -> None:
    # Half the image; once Lsky sees the upload's body begin, the provider drops the
    # connection. Lsky would store anything handed to it (its default answer).
    world.record(
        3,
        IMAGE,
        route={"gate_after": HALF, "drop_after": HALF, "gate": world.lsky.body_arriving},
    )

    assert len(world.deliver(3)["batchItemFailures"]) == 1

    row = world.row(3)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 1)
    assert "download failed" in row["archive_error"]
    assert row["archive_may_be_hosted"] is False  # nothing to look up next time
    # The upload had begun; it was cut before its last byte, and never reached the app.
    assert world.lsky.wait_for_cut_bodies(1, timeout=HANG_SECONDS)
    assert_nothing_sent_to_lsky(world.lsky)


def test_a_source_without_a_length_is_held_whole_before_the_upload(world: World) -> None:
    world.record(4, IMAGE, route={"chunked": True})  # no Content-Length: no body length

    assert world.deliver(4) == {"batchItemFailures": []}

    assert world.state(4) == ("SUCCEEDED", 1)
    assert not sent_while_arriving(world, 4)  # the spool filled first
    assert world.lsky.uploads[0].sha256 == SHA256


def test_a_lookup_that_needs_the_bytes_comes_before_the_upload(world: World) -> None:
    # An earlier attempt may have stored the image, and what it sent is not known: the
    # look-up compares the bytes in hand, so they are whole before anything is sent.
    world.record(5, IMAGE, route={"gate_after": HALF, "gate": world.lsky.body_arriving}, attempts=1)
    world.db.run("UPDATE image_generation_records SET archive_may_be_hosted = true")
    world.lsky.body_arriving.set()  # nothing to wait for: the provider sends it all

    assert world.deliver(5) == {"batchItemFailures": []}

    assert world.state(5) == ("SUCCEEDED", 2)
    assert len(world.lsky.listings) == 1
    assert not sent_while_arriving(world, 5)


def test_paced_with_a_slot_free_the_upload_starts_while_the_download_arrives(
    world: World,
) -> None:
    world.settings(LSKY_RATE_LIMITS="10/minute")
    reset_lane(world.db)
    world.record(6, IMAGE, route={"gate_after": HALF, "gate": world.lsky.body_arriving})

    assert world.deliver(6) == {"batchItemFailures": []}

    assert world.state(6) == ("SUCCEEDED", 1)
    assert sent_while_arriving(world, 6)
    lane = lane_row(world.db)
    assert (lane["uploads"], lane["booked"]) == (1, 0)  # its slot, taken before the fetch


def test_paced_with_no_slot_now_the_fetch_comes_first_as_ever(world: World) -> None:
    world.settings(LSKY_RATE_LIMITS="10/minute")
    set_uploads(world.db, 10, within_seconds=30)  # the minute is full for half a minute
    world.record(7, IMAGE)

    assert len(world.deliver(7)["batchItemFailures"]) == 1  # held for its booked slot

    assert world.state(7) == ("PENDING", 0)
    assert world.downloads(7) == 1  # fetched before pacing said wait
    assert world.lsky.upload_count == 0
    assert world.lsky.cut_bodies == 0  # no upload was begun
    lane = lane_row(world.db)
    # The uploads, and the one booking the fetched record made (the look before the fetch
    # wrote nothing).
    assert (lane["uploads"], lane["booked"]) == (10, 1)


def test_a_relayed_upload_cut_by_its_own_deadline_mid_body_is_not_taken_for_stored(
    world: World,
) -> None:
    # The download lands at once; Lsky reads the upload's body so slowly (a limited link)
    # that the shortest invocation's deadline cuts it part way, the image larger than the
    # sockets' buffers: the body never went out whole, so Lsky stores nothing and the
    # next attempt has nothing to look up.
    image = images.png(16, 16, size=6_000_000, seed=35)
    world.record(8, image)
    world.lsky.config.link_bytes_per_sec = 50_000.0  # 2 min for the body: past any deadline
    context = FakeLambdaContext(timeout_seconds=MIN_ATTEMPT_MS / 1000 + 1, from_first_look=True)

    assert len(world.deliver(8, context)["batchItemFailures"]) == 1

    row = world.row(8)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 1)
    assert row["archive_error"].startswith("upload failed")  # cut: a timeout, or a reset
    assert row["archive_may_be_hosted"] is False
    assert world.downloads(8) == 1
