"""The host-aware lane against a Lsky stand-in that rate-limits like Lsky 2.x (windows
scaled down): bursts end with nothing FAILED and no attempt spent on the host's limits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devkit import images
from devkit.lsky import AccountState
from lib.archive import lane as lane_rules
from lib.archive import runtime
from lib.archive.message import encode
from lib.state.lane_store import LaneStore
from tests.integration.conftest import ArchiveHarness
from tests.support import FakeLambdaContext, emf_metrics, fetch_record, lane_row, seed_record

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


def drain(archive: ArchiveHarness, db: Any, ids: list[int], *, timeout: float) -> int:
    """Deliver messages as the event source mapping would, one per invocation, until every
    row is concluded; returns the number of invocations."""
    invocations = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {fetch_record(db, i)["archive_status"] for i in ids}
        if states <= {"SUCCEEDED", "FAILED"}:
            return invocations
        event = archive.receive(wait_seconds=1)
        if not event["Records"]:
            continue
        invocations += 1
        archive.settle(event, archive.invoke(event, FakeLambdaContext(timeout_seconds=60)))
    raise AssertionError(
        f"not concluded: { {i: fetch_record(db, i)['archive_status'] for i in ids} }"
    )


def burst(db: Any, archive: ArchiveHarness, upstream: Any, count: int) -> list[int]:
    url = upstream.add("/burst.png", PNG)
    ids = list(range(500, 500 + count))
    for record_id in ids:
        seed_record(db, record_id, image_url=url, enqueued_at=0)
        archive.send(encode(record_id))
    return ids


def test_a_burst_against_the_limiter_fails_nothing_and_spends_no_attempt(
    scaled_windows: None,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lsky.config.window_scale = {"minute": MINUTE}
    lsky.config.rate_limits = {"minute": 3}
    ids = burst(db, archive, upstream, 9)

    invocations = drain(archive, db, ids, timeout=60)

    rows = [fetch_record(db, i) for i in ids]
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


def test_with_pacing_the_limiter_never_refuses(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> None:
    archive_env(LSKY_RATE_LIMITS="3/second")
    lsky.config.window_scale = {"minute": 1.0}
    lsky.config.rate_limits = {"minute": 3}
    ids = burst(db, archive, upstream, 9)

    invocations = drain(archive, db, ids, timeout=60)

    assert {fetch_record(db, i)["archive_status"] for i in ids} == {"SUCCEEDED"}
    assert lsky.rate_limited_count == 0
    assert lsky.max_in_window(1.0) <= 3
    assert invocations <= 9 * 2


def test_an_account_problem_pauses_the_lane_until_the_probe_sees_it_healthy(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lsky.account_state = AccountState.QUOTA_FULL
    url = upstream.add("/a.png", PNG)
    seed_record(db, 601, image_url=url)
    seed_record(db, 602, image_url=url)

    assert archive.deliver(encode(601)) == {"batchItemFailures": []}  # parked, acked
    assert archive.deliver(encode(602)) == {"batchItemFailures": []}  # never uploaded
    assert lsky.upload_count == 1
    lane = lane_row(db)
    assert lane["reason"] == "account"
    assert lane["paused_until"] is not None  # until cleared
    for record_id in (601, 602):
        row = fetch_record(db, record_id)
        assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
        assert row["archive_enqueued_at"] is None  # parked: no message out for it
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


def test_a_pause_longer_than_a_hold_parks_the_row(
    archive: ArchiveHarness, db: Any, upstream: Any, pg_dsn: str
) -> None:
    from lib.platform.config import DatabaseConfig
    from lib.platform.db import Database

    records = LaneStore(Database(DatabaseConfig(url=pg_dsn)))
    until = datetime.now(UTC) + timedelta(hours=2)
    try:
        records.pause(until=until, reason="rate_limit", window="day", detail="每天内")
    finally:
        records.db.close()
    seed_record(db, 603, image_url=upstream.add("/p.png", PNG), enqueued_at=0)

    assert archive.deliver(encode(603)) == {"batchItemFailures": []}

    row = fetch_record(db, 603)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_enqueued_at"] is None
    assert abs((row["archive_next_run_at"] - until).total_seconds()) < 5
    assert (
        archive.log_for("upload lane paused; record parked, the sweeper sends it when due")[
            "outcome"
        ]
        == "parked"
    )


def test_a_short_pause_holds_the_message_without_touching_the_row(
    archive: ArchiveHarness, db: Any, upstream: Any, pg_dsn: str
) -> None:
    from lib.platform.config import DatabaseConfig
    from lib.platform.db import Database

    records = LaneStore(Database(DatabaseConfig(url=pg_dsn)))
    try:
        records.pause(
            until=datetime.now(UTC) + timedelta(seconds=60),
            reason="rate_limit",
            window="minute",
            detail="每分钟内",
        )
    finally:
        records.db.close()
    seed_record(db, 604, image_url=upstream.add("/h.png", PNG), enqueued_at=0)
    before = fetch_record(db, 604)

    assert len(archive.deliver(encode(604))["batchItemFailures"]) == 1

    assert fetch_record(db, 604) == before
    assert archive.in_flight() == 1  # held until the pause ends
    assert archive.log_for("upload lane paused; message held")["retry_in_seconds"] >= 59
