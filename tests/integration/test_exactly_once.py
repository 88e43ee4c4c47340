"""Exactly one stored copy per record: an upload whose answer was lost is found on Lsky by
its name and adopted by the next attempt, never uploaded again (issue 13)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from devkit import images
from devkit.lsky import AccountState, Behaviour, LskyStandIn
from lib.archive.message import encode
from lib.archive.naming import hosted_names
from lib.transfer.lsky import LskyClient
from tests.integration.conftest import ArchiveHarness
from tests.integration.world import World
from tests.support import (
    HANG_SECONDS,
    FakeLambdaContext,
    emf_metrics,
    fetch_record,
    lane_row,
    lock_expired,
    reset_lane,
    seed_record,
    wait_until,
)

PNG = images.png(8, 8)
STARTED = datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC)


def name(record_id: int, extension: str = "png") -> str:
    return f"alice_{record_id}_20261202T120005Z.{extension}"


def seed(db: Any, upstream: Any, record_id: int, **columns: Any) -> str:
    path = f"/gen/{record_id}.png"
    if "image_url" not in columns:
        columns["image_url"] = upstream.add(path, PNG)
    seed_record(db, record_id, username="alice", started_at=STARTED, **columns)
    return path


def assert_points_at_the_one_image(db: Any, lsky: LskyStandIn, record_id: int) -> None:
    row = fetch_record(db, record_id)
    assert row["archive_status"] == "SUCCEEDED"
    [image] = lsky.image_records()
    assert image.origin_name == name(record_id)
    assert row["hosted_image_url"] == f"{lsky.public_url}/i/{image.pathname}"
    assert row["hosted_response"]["key"] == image.key
    assert row["archive_may_be_hosted"] is False


@pytest.fixture
def retry_at_once(archive_env: Any, archive: ArchiveHarness) -> None:
    # The claim takes a PENDING row due within its 5 s slack: the next delivery runs now.
    archive_env(ARCHIVE_RETRY_DELAYS="1")


# -- the cost: nothing on a first attempt, nothing after a failure that stored nothing -------


def test_a_first_attempt_makes_one_request_to_the_host(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 1)

    assert archive.deliver(encode(1)) == {"batchItemFailures": []}

    assert lsky.listings == []  # no look-up
    assert lsky.upload_count == 1
    assert_points_at_the_one_image(db, lsky, 1)


@pytest.mark.parametrize(
    "first",
    [
        pytest.param({"fail_first": 1}, id="download-503"),
        pytest.param({"drop_after": 10}, id="download-dropped-mid-upload"),
    ],
)
def test_a_retry_after_a_download_failure_makes_no_lookup(
    retry_at_once: None,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    first: dict[str, Any],
) -> None:
    seed(db, upstream, 2, image_url=upstream.add("/gen/2.png", PNG, **first))

    assert len(archive.deliver(encode(2))["batchItemFailures"]) == 1
    assert fetch_record(db, 2)["archive_may_be_hosted"] is False
    upstream.add("/gen/2.png", PNG)
    assert archive.deliver(encode(2)) == {"batchItemFailures": []}

    assert lsky.listings == []
    assert_points_at_the_one_image(db, lsky, 2)


@pytest.mark.parametrize(
    "refusal",
    [
        Behaviour.status_false("每分钟内你最多可以上传 20 张图片"),
        Behaviour.status_false("图片上传失败"),
        Behaviour.rate_limited(retry_after=1),
    ],
    ids=["window-limiter", "write-failed", "http-429"],
)
def test_a_retry_after_a_definite_refusal_makes_no_lookup(
    retry_at_once: None,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    refusal: Behaviour,
) -> None:
    seed(db, upstream, 3)
    lsky.script(refusal)

    assert len(archive.deliver(encode(3))["batchItemFailures"]) == 1
    assert fetch_record(db, 3)["archive_may_be_hosted"] is False
    # A limit pauses the lane (the row is due when the pause ends): let that time pass.
    reset_lane(db)
    db.run("UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = 3")
    assert archive.deliver(encode(3)) == {"batchItemFailures": []}

    assert lsky.listings == []
    assert_points_at_the_one_image(db, lsky, 3)


# -- the answer is lost: adopted, not uploaded again ------------------------------------------


@pytest.mark.parametrize(
    "lost",
    [
        Behaviour.drop(store=True),
        Behaviour.drop(store=True, partial=False),
        Behaviour.status_false("服务异常，请稍后再试", store=True),
        replace(Behaviour.server_error(), store=True),
        replace(Behaviour.html_200(), store=True),
    ],
    ids=["dropped-mid-answer", "dropped-before-answer", "catch-all", "http-500", "html-200"],
)
@pytest.mark.parametrize("chunked", [False, True], ids=["streamed", "spooled"])
def test_a_stored_upload_whose_answer_was_lost_is_adopted(
    retry_at_once: None,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    capsys: pytest.CaptureFixture[str],
    lost: Behaviour,
    chunked: bool,
) -> None:
    seed(db, upstream, 4, image_url=upstream.add("/gen/4.png", PNG, chunked=chunked))
    lsky.script(lost)

    assert len(archive.deliver(encode(4))["batchItemFailures"]) == 1
    row = fetch_record(db, 4)
    assert (row["archive_status"], row["archive_may_be_hosted"]) == ("PENDING", True)
    assert len(lsky.image_records()) == 1

    assert archive.deliver(encode(4)) == {"batchItemFailures": []}

    assert lsky.upload_count == 1  # never sent again
    assert upstream.hits("/gen/4.png") == 1  # nor downloaded again
    assert lsky.listings == [{"keyword": name(4)[:-3], "order": "earliest", "page": "1"}]
    assert_points_at_the_one_image(db, lsky, 4)
    row = fetch_record(db, 4)
    assert row["archive_attempts"] == 2
    assert row["hosted_response"]["_archive"] == {"adopted": True}
    assert "human_date" not in row["hosted_response"]
    done = archive.log_for("archive succeeded")
    assert (done["outcome"], done["attempt"]) == ("archived", 2)
    assert archive.log_for(
        "an earlier attempt had stored the image; adopted it instead of uploading"
    )
    metrics = emf_metrics(capsys)
    assert metrics["Reconciled"] == 1
    assert metrics["Archived"] == 1


def test_a_client_that_gives_up_after_sending_everything_is_adopted_next_time(
    retry_at_once: None,
    short_invocation: Callable[[], FakeLambdaContext],
    gate: threading.Event,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
) -> None:
    seed(db, upstream, 5)
    # Lsky holds the whole body unanswered past the attempt's deadline, then stores it.
    lsky.script(Behaviour.held(gate))

    archive.deliver(encode(5), short_invocation())
    row = fetch_record(db, 5)
    assert "timed out waiting for Lsky" in row["archive_error"]
    assert row["archive_may_be_hosted"] is True
    gate.set()
    # Stored, with no one left to read the answer.
    assert lsky.wait_for_uploads(1, timeout=HANG_SECONDS)

    assert archive.deliver(encode(5)) == {"batchItemFailures": []}
    assert lsky.upload_count == 1
    assert_points_at_the_one_image(db, lsky, 5)


def test_a_database_outage_between_upload_and_success_write(
    world: World, archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    world.settings(ARCHIVE_LOCK_TTL_SECONDS="2", ARCHIVE_FUNCTION_TIMEOUT_SECONDS="1")
    seed(db, upstream, 6)

    with world.records_table_gone_during_the_upload():
        archive.send(encode(6))
        event = archive.receive()
        response = archive.invoke(event)

    assert len(response["batchItemFailures"]) == 1
    assert archive.log_for("archived on Lsky, but the success could not be recorded; "
                           "message will be redelivered")  # fmt: skip
    row = fetch_record(db, 6)
    assert (row["archive_status"], row["archive_may_be_hosted"]) == ("RUNNING", True)
    assert len(lsky.image_records()) == 1

    # The database is back; the lock expires and the message returns (fast-forwarded).
    wait_until(lambda: lock_expired(db, 6, ttl=2), "the lock expired")
    archive.fast_forward(event)
    assert archive.invoke(archive.receive(wait_seconds=2)) == {"batchItemFailures": []}

    assert lsky.upload_count == 1
    assert_points_at_the_one_image(db, lsky, 6)
    assert fetch_record(db, 6)["archive_attempts"] == 2


def test_the_default_album_does_not_hide_the_stored_image(
    retry_at_once: None, archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    lsky.config.default_album_id = lsky.add_album("uploads")
    seed(db, upstream, 7)
    lsky.script(Behaviour.drop(store=True))

    archive.deliver(encode(7))
    [stored] = lsky.image_records()
    assert stored.album_id is not None
    assert archive.deliver(encode(7)) == {"batchItemFailures": []}

    assert lsky.upload_count == 1
    assert_points_at_the_one_image(db, lsky, 7)


# -- the look-up itself ---------------------------------------------------------------------


def test_only_an_exact_origin_name_is_adopted(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 8, archive_may_be_hosted=True)
    lsky.add_image(origin_name="renamed.png", alias_name=name(8))
    lsky.add_image(origin_name="copy of " + name(8))
    lsky.add_image(origin_name=name(8) + ".bak")
    lsky.add_image(owner="bob", origin_name=name(8))
    planted = {image.key for image in lsky.image_records()}

    assert archive.deliver(encode(8)) == {"batchItemFailures": []}

    assert len(lsky.listings) == 1
    assert lsky.upload_count == 1  # nothing matched: uploaded
    [uploaded] = [image for image in lsky.image_records() if image.key not in planted]
    row = fetch_record(db, 8)
    assert row["hosted_response"]["key"] == uploaded.key
    assert row["hosted_response"]["_archive"]["altered"] is False


def test_another_extension_of_the_same_name_is_adopted(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    # A save format on the group (e.g. webp) renames the extension in origin_name.
    seed(db, upstream, 9, archive_may_be_hosted=True)
    stored = lsky.add_image(PNG, origin_name=name(9, "webp"))

    assert archive.deliver(encode(9)) == {"batchItemFailures": []}

    assert lsky.upload_count == 0
    # What the lost upload sent is not on the row (a crash): the image is fetched once
    # to compare it with the one found.
    assert upstream.hits("/gen/9.png") == 1
    assert fetch_record(db, 9)["hosted_response"]["key"] == stored.key


def test_duplicates_stored_earlier_are_reported_and_the_oldest_adopted(
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Three earlier attempts whose answers were lost: three copies with our name and bytes.
    seed(db, upstream, 10, archive_may_be_hosted=True)
    older = lsky.add_image(PNG, origin_name=name(10), age=60)
    newer = lsky.add_image(PNG, origin_name=name(10), age=5)
    newest = lsky.add_image(PNG, origin_name=name(10, "jpg"), age=1)

    assert archive.deliver(encode(10)) == {"batchItemFailures": []}

    assert fetch_record(db, 10)["hosted_response"]["key"] == older.key
    assert lsky.upload_count == 0
    # The others are named, each by its key, for an operator to delete, and counted.
    warning = archive.log_for("the host holds more than one image for this record")
    assert warning["level"] == "WARNING"
    assert warning["hosted_key"] == older.key
    assert warning["duplicate_keys"] == [newer.key, newest.key]
    assert warning["duplicates"] == 2
    metrics = emf_metrics(capsys)
    assert metrics["DuplicateImages"] == 2
    assert metrics["Reconciled"] == 1
    assert {image.key for image in lsky.image_records()} == {older.key, newer.key, newest.key}


def test_an_upload_listed_in_the_hour_the_host_s_clocks_repeat_is_adopted(
    archive_env: Any, archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    """Lsky lists `date` in its own zone. In Berlin, 2026-10-25 02:12 happens twice (00:12
    and 01:12 UTC): our upload at 01:12 UTC, after the first claim at 01:10 UTC, is ours."""
    archive_env(LSKY_TIMEZONE="Europe/Berlin")
    lsky.config.app_timezone = ZoneInfo("Europe/Berlin")
    claimed = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    seed(db, upstream, 12, archive_may_be_hosted=True, archive_first_claimed_at=claimed)
    stored = lsky.add_image(
        PNG, origin_name=name(12), created_at=datetime(2026, 10, 25, 1, 12, tzinfo=UTC)
    )
    [listed] = lsky_listing(lsky, 12)
    assert listed["date"] == "2026-10-25 02:12:00"  # as Lsky writes it: no offset

    assert archive.deliver(encode(12)) == {"batchItemFailures": []}

    assert lsky.upload_count == 0  # not a second copy
    row = fetch_record(db, 12)
    assert row["hosted_response"]["key"] == stored.key
    assert row["hosted_response"]["_archive"] == {"adopted": True}


def lsky_listing(lsky: LskyStandIn, record_id: int) -> list[dict[str, Any]]:
    """The listed items with the record's name, as the look-up reads them."""
    client = LskyClient(base_url=lsky.base_url, token=lambda force: lsky.token)
    stem = name(record_id).rsplit(".", 1)[0]
    found = client.find(hosted_names(stem), keyword=f"{stem}.", deadline=time.monotonic() + 10)
    return [image.data for image in found]


def test_a_look_up_refused_for_the_account_pauses_the_lane_and_spends_nothing(
    retry_at_once: None, archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 11, archive_may_be_hosted=True)
    lsky.account_state = AccountState.API_DISABLED  # 403 on every API route

    archive.deliver(encode(11))

    row = fetch_record(db, 11)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_error"].startswith("lane paused (account)")
    assert row["archive_may_be_hosted"] is True  # still unknown
    assert lane_row(db)["reason"] == "account"
    assert lsky.upload_count == 0

    lsky.account_state = AccountState.HEALTHY
    stored = lsky.add_image(PNG, origin_name=name(11))
    reset_lane(db)  # the operator clears the lane (archive-ctl lane clear)
    db.run("UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = 11")
    assert archive.deliver(encode(11)) == {"batchItemFailures": []}
    assert fetch_record(db, 11)["hosted_response"]["key"] == stored.key
    assert lsky.upload_count == 0


def test_a_look_up_that_keeps_failing_never_fails_the_record(
    retry_at_once: None, archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 13, archive_may_be_hosted=True)
    lsky.listing_fault = 500  # GET /api/v1/images answers HTTP 500

    for attempt in (1, 2):
        assert len(archive.deliver(encode(13))["batchItemFailures"]) == 1
        row = fetch_record(db, 13)
        assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", attempt)
        assert row["archive_error"].startswith("lookup failed (HTTP 500)")
    # The last attempt: the image is not lost to a look-up that cannot answer.
    assert archive.deliver(encode(13)) == {"batchItemFailures": []}

    row = fetch_record(db, 13)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["hosted_response"]["_archive"]["duplicate_possible"] is True
    assert archive.log_for(
        "the look-up failed on the last attempt; uploading, a duplicate is possible"
    )
    assert lsky.upload_count == 1


def test_a_lookup_that_finds_nothing_uploads_once(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    seed(db, upstream, 12, archive_may_be_hosted=True)

    assert archive.deliver(encode(12)) == {"batchItemFailures": []}

    assert len(lsky.listings) == 1
    assert lsky.upload_count == 1
    assert_points_at_the_one_image(db, lsky, 12)
