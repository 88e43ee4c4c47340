"""May Lsky hold an image for a failed attempt, and can a listed one be ours?
(lib.archive.reconcile, pure) And the names a record's image can have there
(lib.archive.naming)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from lib.archive.naming import hosted_file_name, hosted_file_stem, hosted_names
from lib.archive.reconcile import listed_instants, may_be_hosted, not_ours
from lib.transfer.failures import Failure, Kind, Stage

D, U, L = Stage.DOWNLOAD, Stage.UPLOAD, Stage.LOOKUP


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        # The upload's answer never came, or came in a form that may follow a store.
        (Failure(U, Kind.TIMEOUT, "timed out waiting for Lsky"), True),
        (Failure(U, Kind.CONNECTION, "Lsky dropped the response"), True),
        (Failure(U, Kind.BAD_RESPONSE, "Lsky answered HTTP 200 with a non-JSON body"), True),
        (Failure(U, Kind.HTTP_STATUS, "Lsky answered HTTP 500", status=500), True),
        (Failure(U, Kind.HTTP_STATUS, "Lsky answered HTTP 504", status=504), True),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 服务异常，请稍后再试"), True),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: something new"), True),
        # Answers that say no image row was kept.
        (Failure(U, Kind.HTTP_STATUS, "HTTP 401", status=401), False),
        (Failure(U, Kind.HTTP_STATUS, "HTTP 413", status=413), False),
        (Failure(U, Kind.HTTP_STATUS, "HTTP 429", status=429, retry_after=60), False),
        (Failure(U, Kind.REJECTED, "每分钟内你最多可以上传 20 张图片"), False),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 图片上传失败"), False),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 图片记录保存失败"), False),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 不支持的文件类型"), False),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 图片涉嫌违规，禁止上传。"), False),
        # Nothing reached Lsky.
        (Failure(D, Kind.HTTP_STATUS, "upstream answered HTTP 503", status=503), False),
        (Failure(D, Kind.CONNECTION, "upstream body did not match its length"), False),
        (Failure(D, Kind.TIMEOUT, "ran past the attempt's deadline"), False),
        # The look-up that should have settled the last attempt failed: still unknown.
        (Failure(L, Kind.HTTP_STATUS, "HTTP 403", status=403), True),
        (Failure(L, Kind.CONNECTION, "could not connect to Lsky"), True),
    ],
)  # fmt: skip
def test_after_a_complete_request(failure: Failure, expected: bool) -> None:
    assert may_be_hosted(failure, body_complete=True) is expected


@pytest.mark.parametrize(
    "failure",
    [
        Failure(U, Kind.TIMEOUT, "sending the image to Lsky ran past the deadline"),
        Failure(U, Kind.TIMEOUT, "not enough time left to upload"),
        Failure(U, Kind.CONNECTION, "could not connect to Lsky"),
        Failure(U, Kind.HTTP_STATUS, "HTTP 500", status=500),
    ],
)
def test_an_upload_never_started_or_cut_short_stored_nothing(failure: Failure) -> None:
    # Lsky (PHP behind nginx) never sees an incomplete request as an upload.
    assert may_be_hosted(failure, body_complete=False) is False


def test_a_failed_lookup_keeps_it_unknown_whatever_the_body() -> None:
    assert may_be_hosted(Failure(L, Kind.TIMEOUT, "x"), body_complete=False) is True


def test_the_names_of_a_record_s_image() -> None:
    started = datetime(2026, 12, 2, 20, 47, 35, tzinfo=UTC)
    stem = hosted_file_stem(username="a/b c", user_id=3, record_id=1234, started_at=started)
    assert stem == "a-b-c_1234_20261202T204735Z"
    name = hosted_file_name(
        username="a/b c", user_id=3, record_id=1234, started_at=started, extension="png"
    )
    assert name == stem + ".png"
    names = hosted_names(stem)
    assert name in names
    assert {stem + ".jpg", stem + ".jpeg", stem + ".webp", stem + ".avif"} <= names
    assert all(n.startswith(stem + ".") and "/" not in n for n in names)


# -- the listed date, read in the host's zone ------------------------------------------

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def judged(date: str, first_claimed_at: datetime, zone: ZoneInfo = BERLIN) -> str | None:
    return not_ours(
        {"date": date}, first_claimed_at=first_claimed_at, sent=None, host_timezone=zone
    )


def test_an_hour_the_clocks_repeat_is_read_both_ways() -> None:
    # 2026-10-25, Berlin falls back at 01:00 UTC (03:00 CEST -> 02:00 CET): 02:12 local is
    # 00:12 UTC (summer time) and again 01:12 UTC (winter time).
    assert listed_instants("2026-10-25 02:12:00", BERLIN) == (
        utc(2026, 10, 25, 0, 12),
        utc(2026, 10, 25, 1, 12),
    )
    # Our upload at 01:12 UTC, the first claim at 01:10 UTC: the second reading is ours.
    assert judged("2026-10-25 02:12:00", utc(2026, 10, 25, 1, 10)) is None
    # Either reading may be ours: the first one too (a claim at 00:10 UTC).
    assert judged("2026-10-25 02:12:00", utc(2026, 10, 25, 0, 10)) is None
    # Both readings before the claim (less the clock margin): not ours, both said.
    why = judged("2026-10-25 02:12:00", utc(2026, 10, 25, 1, 30))
    assert why == (
        "stored at 2026-10-25T00:12:00+00:00 or 2026-10-25T01:12:00+00:00,"
        " before the record's first claim"
    )
    # Either side of the repeated hour, one reading.
    assert listed_instants("2026-10-25 01:59:59", BERLIN) == (utc(2026, 10, 24, 23, 59, 59),)
    assert listed_instants("2026-10-25 03:00:00", BERLIN) == (utc(2026, 10, 25, 2, 0),)


def test_an_hour_the_clocks_skip_is_read_without_a_crash() -> None:
    # 2026-03-29, Berlin springs forward at 01:00 UTC (02:00 CET -> 03:00 CEST): 02:30 never
    # shows on its clocks; read with the offset on either side of the gap.
    readings = listed_instants("2026-03-29 02:30:00", BERLIN)
    assert readings == (utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30))
    assert judged("2026-03-29 02:30:00", utc(2026, 3, 29, 1, 0)) is None
    assert judged("2026-03-29 02:30:00", utc(2026, 3, 29, 1, 40)) is not None


@pytest.mark.parametrize(
    "value",
    [None, 20261025, "", "yesterday", "2026-13-01 00:00:00", "0001-01-01 00:00:00", "2026-10-25"],
)
def test_a_listed_date_that_cannot_be_read_leaves_the_time_undecided(value: object) -> None:
    assert listed_instants(value, BERLIN) == ()
    item = {"date": value}
    assert (
        not_ours(item, first_claimed_at=utc(2026, 10, 25), sent=None, host_timezone=BERLIN) is None
    )


def test_a_zone_without_daylight_saving_reads_one_instant() -> None:
    prc = timezone(timedelta(hours=8), "PRC")
    assert listed_instants("2026-10-25 09:12:00", prc) == (utc(2026, 10, 25, 1, 12),)
    assert listed_instants("9999-12-31 23:59:59", ZoneInfo("Asia/Shanghai")) == (
        utc(9999, 12, 31, 15, 59, 59),
    )
