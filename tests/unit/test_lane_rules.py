"""The lane's pure rules: which answers pause every upload, for how long, and pacing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lib.archive import pacing, schedule
from lib.archive.lane import (
    SAFE_PAUSE_SECONDS,
    HostCondition,
    host_condition,
    pause_until,
    probe_can_clear,
)
from lib.archive.outcome import Message
from lib.platform.env_values import rate_limits
from lib.platform.errors import ConfigError
from lib.ratelimit import margins
from lib.state.lane import PauseReason
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
        ("每月内你最多可以上传 999 张图片", "month", 2_678_400, 999),  # the longest month
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
    until = pause_until(condition, now=NOW, window_frees_at=None, max_retry_after_seconds=3600)
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
    assert pause_until(account, now=NOW, window_frees_at=None, max_retry_after_seconds=3600) is None
    asked = HostCondition(PauseReason.RETRY_AFTER, "503", seconds=42)
    assert pause_until(
        asked, now=NOW, window_frees_at=None, max_retry_after_seconds=3600
    ) == NOW + timedelta(seconds=42)


def test_a_window_pause_ends_when_the_ledger_says_the_window_frees() -> None:
    minute = HostCondition(PauseReason.RATE_LIMIT, "每分钟", "minute", 60, 3)
    frees = NOW + timedelta(seconds=10)

    def until(frees_at: datetime | None) -> datetime | None:
        return pause_until(minute, now=NOW, window_frees_at=frees_at, max_retry_after_seconds=60)

    assert until(frees) == frees
    # Fewer uploads in the ledger than the limit: others used the window; wait it out.
    assert until(None) == NOW + timedelta(seconds=60)
    # A ledger that says later than two windows (or already past) is not believed.
    assert until(NOW + timedelta(days=3)) == NOW + timedelta(seconds=60)
    assert until(NOW - timedelta(seconds=5)) == NOW + timedelta(seconds=60)


@pytest.mark.parametrize(
    ("asked", "cap", "expected"),
    [
        (42.0, 3600, 42.0),
        (1e9, 3600, 3600.0),  # 31.7 years asked: an hour at most
        (1e12, 3600, 3600.0),  # no overflow, however large
        (-5.0, 3600, 0.0),
        (0.4, 3600, 0.4),
        (7200.0, 43_200, 7200.0),  # the cap is the operator's
    ],
)
def test_a_retry_after_pause_is_capped(asked: float, cap: int, expected: float) -> None:
    condition = HostCondition(PauseReason.RETRY_AFTER, "503", seconds=asked)
    until = pause_until(condition, now=NOW, window_frees_at=None, max_retry_after_seconds=cap)
    assert until == NOW + timedelta(seconds=expected)


def test_a_429_on_the_look_up_pauses_the_lane_too() -> None:
    failure = Failure(Stage.LOOKUP, Kind.HTTP_STATUS, "429", status=429, retry_after=30)
    condition = host_condition(failure)
    assert condition is not None
    assert condition.reason == PauseReason.RATE_LIMIT


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


@pytest.mark.parametrize(
    ("wait", "fetch", "fetches_now"),
    [
        (0.2, 0.0, True),  # a moment away: fetch, then a short sleep at most
        (5.0, 5.0, True),  # the fetch covers the wait
        (5.2, 5.0, True),  # ...all but a moment of it
        (5.4, 5.0, False),  # a second invocation: no sleep longer than a moment
        (30.0, 5.0, False),
        (1.5, 0.01, False),  # a quick source does not stretch to a long wait
    ],
)
def test_a_record_booked_before_fetching_fetches_now_when_the_fetch_covers_the_wait(
    wait: float, fetch: float, fetches_now: bool
) -> None:
    assert pacing.fetch_first(wait, fetch_estimate=fetch) is fetches_now


@pytest.mark.parametrize(
    ("limits", "margin", "tolerance"),
    [
        ([(60, 20)], 0.15, 0.0375),
        ([(1, 3)], 0.0025, 0.000625),  # a one-second window: the margin is 2.5 ms
        ([(3_600, 100), (20, 10)], 0.05, 0.0125),  # the shortest window sets both
        ([(86_400, 300)], 2.0, 0.05),
    ],
)
def test_a_slot_is_never_taken_so_early_that_it_spends_its_margin(
    limits: list[tuple[int, int]], margin: float, tolerance: float
) -> None:
    assert margins.slot_margin(limits) == pytest.approx(margin)
    assert margins.slot_tolerance(limits) == pytest.approx(tolerance)
    assert margins.slot_tolerance(limits) < margins.slot_margin(limits)


@pytest.mark.parametrize(
    ("previous", "observed", "learnt"),
    [
        (0.0, 0.04, 0.02),  # late: half the error is booked for next time
        (0.03, -0.02, 0.02),  # early: less
        (0.01, -0.5, 0.0),  # never below nothing
        (0.9, 0.8, pacing.LATENESS_LIMIT_SECONDS),  # nor above the limit
        (0.03, 30.0, 0.03),  # a record half a minute late is not the pickup: ignored
        (0.03, -5.0, 0.03),
    ],
)
def test_a_booked_record_s_lateness_is_learnt_within_bounds(
    previous: float, observed: float, learnt: float
) -> None:
    assert pacing.learn_lateness(previous, observed) == pytest.approx(learnt)


@pytest.mark.parametrize(
    ("seconds", "early", "hold"),
    [
        (20.310_000_4, 0.31, 20),  # dated whole seconds from now plus the lead: exactly those
        (20.349_999, 0.31 + 0.05, 20),  # dated up to the tolerance past that: the same
        (20.5, 0.31 + 0.05, 21),  # a slot the attempt could have slept for: never early
        (0.2, 0.31, 1),  # at least a second
    ],
)
def test_a_held_message_comes_back_when_its_booking_says(
    seconds: float, early: float, hold: int
) -> None:
    message = Message("m-1", "{}", "receipt", "arn:aws:sqs:eu-west-1:1:q", receive_count=1)
    verdict = schedule.wait_for_slot(seconds, message, booked=True, early=early)
    assert verdict.delay_seconds == hold
