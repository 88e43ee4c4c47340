"""The lane's pure rules: which answers pause every upload, for how long, and pacing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lib.archive import sweeper
from lib.archive.lane import (
    SAFE_PAUSE_SECONDS,
    HostCondition,
    host_condition,
    next_upload_at,
    pause_until,
    probe_can_clear,
    upload_time_margin,
)
from lib.platform.config import rate_limits
from lib.platform.errors import ConfigError
from lib.state.lane import PauseReason, drain_per_second
from lib.transfer.failures import Failure, Kind, Stage

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
U, D = Stage.UPLOAD, Stage.DOWNLOAD


def rejected(message: str) -> Failure:
    return Failure(U, Kind.REJECTED, f"Lsky refused the upload: {message}")


@pytest.mark.parametrize(
    ("message", "window", "seconds", "limit"),
    [
        ("每分钟内你最多可以上传 20 张图片", "minute", 60, 20),
        ("每小时内你最多可以上传 100 张图片", "hour", 3_600, 100),
        ("每天内你最多可以上传 300 张图片", "day", 86_400, 300),
        ("每周内你最多可以上传 600 张图片", "week", 604_800, 600),
        ("每月内你最多可以上传 999 张图片", "month", 2_592_000, 999),
    ],
)
def test_every_lsky_window_is_read_from_the_message(
    message: str, window: str, seconds: int, limit: int
) -> None:
    condition = host_condition(rejected(message))
    assert condition == HostCondition(
        PauseReason.RATE_LIMIT, f"Lsky refused the upload: {message}", window, seconds, limit
    )


def test_unknown_rate_limit_wording_falls_back_to_a_safe_pause() -> None:
    condition = host_condition(rejected("你最多可以上传 很多 张图片"))
    assert condition is not None
    assert condition.window == "unknown"
    until = pause_until(condition, now=NOW, upload_times=())
    assert until == NOW + timedelta(seconds=SAFE_PAUSE_SECONDS)


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (Failure(U, Kind.HTTP_STATUS, "Lsky answered HTTP 401", status=401), "account"),
        (Failure(U, Kind.HTTP_STATUS, "Lsky answered HTTP 403", status=403), "account"),
        (rejected("储存空间不足"), "account"),
        (rejected("管理员关闭了游客上传"), "account"),
        (rejected("账户未验证"), "account"),
        (rejected("账号状态异常"), "account"),
        (Failure(U, Kind.HTTP_STATUS, "429", status=429, retry_after=30), "rate_limit"),
        (Failure(U, Kind.HTTP_STATUS, "503", status=503, retry_after=120), "retry_after"),
    ],
)
def test_host_level_answers(failure: Failure, reason: str) -> None:
    condition = host_condition(failure)
    assert condition is not None
    assert condition.reason == reason


@pytest.mark.parametrize(
    "failure",
    [
        rejected("不支持的文件类型"),  # the record's own type
        rejected("图片大小超出限制"),  # too large for the group
        rejected("图片涉嫌违规"),  # content flagged
        rejected("图片上传失败"),  # transient, the record retries
        Failure(U, Kind.HTTP_STATUS, "500", status=500),
        Failure(D, Kind.HTTP_STATUS, "401 at the provider", status=401),  # not the host
        Failure(D, Kind.HTTP_STATUS, "429 at the provider", status=429, retry_after=9),
    ],
)
def test_record_level_answers_do_not_touch_the_lane(failure: Failure) -> None:
    assert host_condition(failure) is None


def test_an_account_pause_has_no_end_and_a_retry_after_its_own() -> None:
    account = HostCondition(PauseReason.ACCOUNT, "储存空间不足")
    assert pause_until(account, now=NOW, upload_times=()) is None
    asked = HostCondition(PauseReason.RETRY_AFTER, "503", seconds=42)
    assert pause_until(asked, now=NOW, upload_times=()) == NOW + timedelta(seconds=42)


def test_a_window_pause_ends_when_the_oldest_counted_upload_leaves_it() -> None:
    minute = HostCondition(PauseReason.RATE_LIMIT, "每分钟", "minute", 60, 3)
    log = [NOW - timedelta(seconds=s) for s in (50, 30, 10)]
    until = pause_until(minute, now=NOW, upload_times=log)
    assert until == NOW + timedelta(seconds=10 + upload_time_margin(60))
    # Fewer uploads of ours in the window than the limit: others used it; wait it out.
    assert pause_until(minute, now=NOW, upload_times=log[:1]) == NOW + timedelta(seconds=60)


def test_pacing_finds_the_first_instant_every_window_has_room() -> None:
    limits = [(60, 2), (3_600, 3)]
    assert next_upload_at([], limits, NOW) == NOW
    log = [NOW - timedelta(seconds=s) for s in (3_000, 20, 10)]
    # The minute holds 2 (full until the older leaves); the hour holds 3 (full until the
    # 3,000 s-old one leaves, 600 s from now).
    assert next_upload_at(log, limits, NOW) == NOW + timedelta(
        seconds=600 + upload_time_margin(3_600)
    )
    assert upload_time_margin(3_600) == 2.0  # a transfer's worth
    assert upload_time_margin(1) == 0.05  # scaled-down windows keep their proportion


def test_only_pauses_the_profile_can_see_are_cleared_by_the_probe() -> None:
    assert probe_can_clear("Lsky answered HTTP 401: Authentication failed.")
    assert probe_can_clear("储存空间不足")
    assert not probe_can_clear("账号状态异常")
    assert not probe_can_clear("账户未验证")


def test_rate_limit_settings() -> None:
    assert rate_limits({"LSKY_RATE_LIMITS": "20/minute,100/hour"}) == ((60, 20), (3_600, 100))
    assert rate_limits({"LSKY_RATE_LIMITS": "5/seconds, 2/days"}) == ((1, 5), (86_400, 2))
    assert rate_limits({"LSKY_RATE_LIMITS": "10/30 seconds"}) == ((30, 10),)
    assert rate_limits({"LSKY_RATE_LIMITS": "20/minute, 100/hour"}) == ((60, 20), (3_600, 100))
    assert rate_limits({}) == ()


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("20/fortnight", 1),
        ("20/minute,0/hour", 2),
        ("20/minute,x/minute", 2),
        ("20/minute,", 2),
        ("10/32 days", 1),  # a window over 31 days
        ("10/2 months", 1),
        ("1000000/hour", 1),  # an absurd count
        ("20/Minute", 1),
    ],
)
def test_a_rate_limit_that_is_not_one_stops_the_start(value: str, part: int) -> None:
    # Pacing on the other parts alone would be looser than the operator asked.
    with pytest.raises(ConfigError, match=f"LSKY_RATE_LIMITS: part {part} is not a limit"):
        rate_limits({"LSKY_RATE_LIMITS": value})


def test_the_requeue_interval_grows_with_the_backlog() -> None:
    assert sweeper.requeue_interval(900, queued=None, rate=1.0) == 900
    assert sweeper.requeue_interval(900, queued=0, rate=0.0) == 900
    # 300 queued at 1 upload a second: twice the 300 s they need.
    assert sweeper.requeue_interval(900, queued=300, rate=1.0) == 1_500
    # Nothing drains (a paused lane): nothing sent looks lost, for up to a day.
    assert sweeper.requeue_interval(900, queued=5, rate=0.0) == 900 + 86_400
    log = [NOW - timedelta(seconds=s) for s in (10, 100, 1_000)]
    assert drain_per_second(log, NOW) == 2 / 900
