"""The host-aware lane against a Lsky stand-in that rate-limits like Lsky 2.x (windows
scaled down): bursts end with nothing FAILED and no attempt spent on the host's limits."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from devkit import images
from devkit.lsky import AccountState
from lib.archive import lane as lane_rules
from lib.archive import runtime
from lib.archive.message import encode
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.state.lane_store import LaneStore
from tests.integration.world import World
from tests.support import FakeLambdaContext, db_now, emf_metrics, lane_row, seed_record

PNG = images.png(size=2_000)
MINUTE = 2.0  # the stand-in's (and our rules') minute, scaled down


@pytest.fixture
def scaled_windows(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Lsky says 每分钟; in this test a minute lasts MINUTE seconds, on both sides."""
    windows = dict(lane_rules.WINDOWS)
    windows["分钟"] = ("minute", int(MINUTE))
    monkeypatch.setattr(lane_rules, "WINDOWS", windows)
    monkeypatch.setattr(lane_rules, "MAX_JITTER_SECONDS", 0.3)
    return


def drain(world: World, ids: list[int], *, timeout: float) -> int:
    """Deliver messages as the event source mapping would, one per invocation, until every
    row is concluded; when the queue is empty, sweep as the schedule would (a message held
    on its third receive parks its row, and the sweeper sends it once due). Returns the
    number of archive invocations."""
    from handlers.sweeper import lambda_handler as sweep

    invocations = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if {world.state(i)[0] for i in ids} <= {"SUCCEEDED", "FAILED"}:
            return invocations
        event = world.archive.receive(wait_seconds=1)
        if not event["Records"]:
            runtime.reset()
            sweep({}, FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60))
            runtime.reset()
            continue
        invocations += 1
        response = world.archive.invoke(event, FakeLambdaContext(timeout_seconds=60))
        world.archive.settle(event, response)
    raise AssertionError(f"not concluded: { {i: world.state(i)[0] for i in ids} }")


def burst(world: World, count: int) -> list[int]:
    """`count` records queued at once (one message each), their image the same one."""
    url = world.upstream.add("/burst.png", PNG)
    ids = list(range(500, 500 + count))
    for record_id in ids:
        seed_record(world.db, record_id, image_url=url, enqueued_at=0)
        world.archive.send(encode(record_id))
    return ids


def paused(pg_dsn: str, seconds: float, **cause: str) -> datetime:
    """The lane paused for `seconds` from now by another container; returns its end."""
    lanes = LaneStore(Database(DatabaseConfig(url=pg_dsn)))
    until = datetime.now(UTC) + timedelta(seconds=seconds)
    try:
        lanes.pause(until=until, **cause)  # type: ignore[arg-type]
    finally:
        lanes.db.close()
    return until


def test_a_burst_against_the_limiter_fails_nothing_and_spends_no_attempt(
    scaled_windows: None, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    lsky = world.lsky
    lsky.config.window_scale = {"minute": MINUTE}
    lsky.config.rate_limits = {"minute": 3}
    ids = burst(world, 9)

    invocations = drain(world, ids, timeout=60)

    rows = [world.row(i) for i in ids]
    assert {r["archive_status"] for r in rows} == {"SUCCEEDED"}
    assert {r["archive_attempts"] for r in rows} == {1}  # none spent on a limit
    assert lsky.max_in_window(MINUTE) <= 3
    # Pacing off: Lsky's answer is the only signal, but the lane pauses on the first
    # one, so only a few uploads are ever refused (one per container and window).
    assert 1 <= lsky.rate_limited_count <= 4
    assert invocations < 9 * 3
    metrics = emf_metrics(capsys)
    assert metrics.get("RateLimited", 0) == lsky.rate_limited_count
    assert "Failed" not in metrics


def test_with_pacing_the_limiter_never_refuses(world: World) -> None:
    world.settings(LSKY_RATE_LIMITS="3/second")
    lsky = world.lsky
    lsky.config.window_scale = {"minute": 1.0}
    lsky.config.rate_limits = {"minute": 3}
    ids = burst(world, 9)

    invocations = drain(world, ids, timeout=60)

    assert {world.state(i)[0] for i in ids} == {"SUCCEEDED"}
    assert lsky.rate_limited_count == 0
    assert lsky.max_in_window(1.0) <= 3
    assert invocations <= 9 * 2


def test_an_account_problem_pauses_the_lane_until_the_probe_sees_it_healthy(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    db, lsky = world.db, world.lsky
    lsky.account_state = AccountState.QUOTA_FULL
    world.record(601)
    world.record(602)

    assert world.deliver(601) == {"batchItemFailures": []}  # parked, acked
    assert world.deliver(602) == {"batchItemFailures": []}  # never uploaded
    assert lsky.upload_count == 1
    lane = lane_row(db)
    assert lane["reason"] == "account"
    assert lane["paused_until"] is not None  # until cleared
    for record_id in (601, 602):
        assert world.state(record_id) == ("PENDING", 0)
        assert world.row(record_id)["archive_enqueued_at"] is None  # parked: no message out
    assert emf_metrics(capsys).get("AccountProblem") == 1

    # The sweeper probes Lsky's profile: still full, the pause stays.
    from handlers.sweeper import lambda_handler

    sweeper_context = FakeLambdaContext(function_name="SweeperFunction", timeout_seconds=60)
    runtime.reset()
    summary = lambda_handler({}, sweeper_context)
    assert summary["lane_paused"] == "account"
    assert summary["lane_resumed"] is False
    assert emf_metrics(capsys).get("LanePausedAccount") == 1

    lsky.account_state = AccountState.HEALTHY
    db.run("UPDATE image_generation_records SET archive_next_run_at = now() - interval '1 hour'")
    summary = lambda_handler({}, sweeper_context)
    assert summary["lane_resumed"] is True
    assert summary["requeued"] == 2  # the parked rows are sent once the lane is open
    assert lane_row(db)["paused_until"] is None


def test_a_pause_longer_than_a_hold_parks_the_row(world: World, pg_dsn: str) -> None:
    until = paused(pg_dsn, 7_200, reason="rate_limit", window="day", detail="每天内")
    world.record(603, enqueued_at=0)

    assert world.deliver(603) == {"batchItemFailures": []}

    row = world.row(603)
    assert world.state(603) == ("PENDING", 0)
    assert row["archive_enqueued_at"] is None
    assert abs((row["archive_next_run_at"] - until).total_seconds()) < 5
    parked = world.archive.log_for(
        "upload lane paused; record parked, the sweeper sends it when due"
    )
    assert parked["outcome"] == "parked"


def test_a_short_pause_holds_the_message_and_the_row_says_until_when(
    world: World, pg_dsn: str
) -> None:
    """Unclaimed, the row keeps its attempts and its stamp (its message is out); its due
    time is the hold's end, when the message comes back: the sweeper's lost-message rule
    reads a held message's return from it, so it never takes the held one for lost."""
    paused(pg_dsn, 60, reason="rate_limit", window="minute", detail="每分钟内")
    world.record(604, enqueued_at=0)
    before = world.row(604)

    assert len(world.deliver(604)["batchItemFailures"]) == 1

    after = world.row(604)
    assert world.archive.in_flight() == 1  # held until the pause ends
    held = world.archive.log_for("upload lane paused; message held")["retry_in_seconds"]
    assert held >= 59
    assert world.archive.holds() == [held]
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {"archive_next_run_at", "archive_wait_reason"}
    assert after["archive_wait_reason"] == "paused"
    assert after["archive_enqueued_at"] == before["archive_enqueued_at"]
    # Due when the hold ends (the statement ran a moment before the visibility was set).
    due_in = (after["archive_next_run_at"] - db_now(world.db)).total_seconds()
    assert held - 5 <= due_in <= held
