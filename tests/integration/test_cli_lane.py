"""The upload lane in archive-ctl against PostgreSQL and moto: `status` shows its pause,
drain rate and the backlog's ETA; `lane clear` reopens it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devkit.sqs import QueuePair
from lib.archive.message import encode
from lib.cli.context import EXIT_OK
from tests.integration.lane_model import LaneModel
from tests.integration.test_cli import URL, Ctl
from tests.integration.test_cli_backfill import pause_lane
from tests.support import seconds_ago, seed_record, set_uploads


@pytest.fixture
def ctl(cli_env: None, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


def lane_row(db: Any) -> dict[str, Any]:
    rows = db.run(
        "SELECT paused_until, pause_reason, pause_window, pause_detail, paused_since"
        " FROM image_archive_lane WHERE lane = 'lsky'"
    )
    return dict(zip(["until", "reason", "window", "detail", "since"], rows[0], strict=True))


def seed_backlog(db: Any, pending: int, running: int = 0) -> None:
    for record_id in range(1, pending + 1):
        seed_record(db, record_id, image_url=URL, archive_status="PENDING", next_run_at=30)
    for record_id in range(pending + 1, pending + running + 1):
        seed_record(db, record_id, image_url=URL, archive_status="RUNNING", locked_by="x")


# -- status ------------------------------------------------------------------------------


def test_status_shows_an_open_lane_its_drain_rate_and_the_backlog_eta(ctl: Ctl, db: Any) -> None:
    seed_backlog(db, pending=8, running=2)
    seed_record(db, 50, image_url=URL, archive_status="SUCCEEDED")
    set_uploads(db, 30)  # 2 a minute

    assert ctl("status") == EXIT_OK, ctl.err
    assert (
        "upload lane (lsky)\n"
        "  open\n"
        "  drain: 30 uploads in the last 15 min (2.0/min)\n"
        "  backlog: 10 records PENDING or RUNNING, ETA 5 min\n"
    ) in ctl.out

    assert ctl("status", "--json") == EXIT_OK
    report = json.loads(ctl.out)
    assert report["lane"] == {
        "name": "lsky",
        "paused": False,
        "paused_until": None,
        "paused_for_seconds": None,
        "reason": None,
        "window": None,
        "paused_since": None,
        "detail": None,
        "recent_uploads": 30,
        "drain_window_seconds": 900,
        "drain_per_minute": 2.0,
        "drain_basis": "ledger",
        "pacing": None,
    }
    assert report["backlog"] == {"records": 10, "eta_seconds": 300.0}


def test_status_shows_a_pause_until_a_time(ctl: Ctl, db: Any) -> None:
    seed_backlog(db, pending=6)
    set_uploads(db, 90)  # 6 a minute
    pause_lane(db, seconds=3600, reason="rate_limit", detail="每小时内你最多可以上传 100 张图片")
    db.run("UPDATE image_archive_lane SET pause_window = 'hour'")

    until = lane_row(db)["until"]
    left_before = -seconds_ago(db, until)
    assert ctl("status", "--json") == EXIT_OK, ctl.err
    left_after = -seconds_ago(db, until)
    lane = json.loads(ctl.out)["lane"]
    assert lane["paused"] is True
    assert lane["paused_until"] == until.isoformat(timespec="seconds")
    # What was left of the hour when the command looked (whole seconds).
    assert left_after - 1 <= lane["paused_for_seconds"] <= left_before + 1
    assert left_before <= 3600
    assert (lane["reason"], lane["window"]) == ("rate_limit", "hour")
    assert lane["paused_since"] == lane_row(db)["since"].isoformat(timespec="seconds")
    assert lane["detail"] == "每小时内你最多可以上传 100 张图片"
    eta = json.loads(ctl.out)["backlog"]["eta_seconds"]
    assert left_after + 60 - 1 <= eta <= left_before + 60 + 1  # the pause, then 6 at 6 a minute

    assert ctl("status") == EXIT_OK
    assert f"  paused until {lane['paused_until']} (for 60 min more): reason rate_limit, " in (
        ctl.out
    )
    assert f"window hour, since {lane['paused_since']}\n" in ctl.out
    assert "  detail: 每小时内你最多可以上传 100 张图片\n" in ctl.out
    assert "ETA 61 min" in ctl.out


def test_status_shows_a_pause_until_cleared(ctl: Ctl, db: Any) -> None:
    seed_backlog(db, pending=3)
    set_uploads(db, 15)
    pause_lane(db, seconds=None, reason="account", detail="HTTP 401: Authentication failed.")

    assert ctl("status") == EXIT_OK, ctl.err
    assert "  paused until cleared: reason account, since " in ctl.out
    assert "  detail: HTTP 401: Authentication failed.\n" in ctl.out
    assert "  backlog: 3 records PENDING or RUNNING, ETA - (the lane is paused until cleared)" in (
        ctl.out
    )

    assert ctl("status", "--json") == EXIT_OK
    report = json.loads(ctl.out)
    assert report["lane"]["paused_until"] == "infinity"
    assert report["lane"]["paused_for_seconds"] is None
    assert report["backlog"] == {"records": 3, "eta_seconds": None}


def test_status_without_recent_uploads_has_no_eta(ctl: Ctl, db: Any) -> None:
    seed_backlog(db, pending=2)
    set_uploads(db, 1, within_seconds=1, ago=7200)
    assert ctl("status") == EXIT_OK
    assert "  drain: 0 uploads in the last 15 min (0.0/min)" in ctl.out
    assert "ETA - (nothing uploaded in the last 15 min)" in ctl.out


def test_with_pacing_status_tells_the_drain_the_limits_allow_from_now(
    ctl: Ctl, db: Any, sqs: Any, queues: QueuePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 item 7: the drain of the last 15 minutes (104 uploads, 6.9/min) said a
    backlog of 30 takes 4 min; the hour those uploads filled makes it 50. With pacing on,
    status reads the limits, and what it says is what then happens."""
    monkeypatch.setenv("LSKY_RATE_LIMITS", "20/minute,100/hour")
    set_uploads(db, 104, within_seconds=880)
    seed_backlog(db, pending=30)

    assert ctl("status", "--json") == EXIT_OK, ctl.err
    report = json.loads(ctl.out)
    lane, eta = report["lane"], report["backlog"]["eta_seconds"]
    assert (lane["recent_uploads"], lane["drain_basis"]) == (104, "limits")
    assert [(w["window"], w["used"], w["free"]) for w in lane["pacing"]["windows"]] == [
        ("minute", 7, 13),
        ("hour", 104, 0),
    ]
    assert ctl("status") == EXIT_OK
    assert "  pacing 20/min, 100/h (LSKY_RATE_LIMITS)\n" in ctl.out
    assert f"  drain: {lane['drain_per_minute']:.1f}/min by the pacing limits, from now" in ctl.out

    # What then happens: the archive function takes the 30 records as the lane lets it.
    model = LaneModel(db, sqs, queues, limits=((60, 20), (3600, 100)), shift=True)
    for record_id in range(1, 31):
        sqs.send_message(QueueUrl=queues.url, MessageBody=encode(record_id))
    took = model.run_until_uploaded(range(1, 31))
    assert took / 2 <= eta <= took * 2, (eta, took)
    drained = 30 * 60 / took
    assert drained / 2 <= lane["drain_per_minute"] <= drained * 2, (lane, drained)


# -- lane clear ------------------------------------------------------------------------------


def test_lane_clear_reopens_an_account_pause_and_says_what_it_was(ctl: Ctl, db: Any) -> None:
    pause_lane(db, seconds=None, reason="account", detail="HTTP 401: Authentication failed.")

    assert ctl("lane", "clear") == EXIT_OK, ctl.err
    assert ctl.out.startswith(
        "cleared the lsky lane's pause; it was paused until cleared: reason account, since "
    )
    assert "  detail: HTTP 401: Authentication failed.\n" in ctl.out
    assert lane_row(db) == dict.fromkeys(["until", "reason", "window", "detail", "since"])

    assert ctl("lane", "clear") == EXIT_OK  # nothing paused: still fine, and said
    assert ctl.out == "the lsky lane was not paused: nothing to clear\n"


def test_lane_clear_with_a_reason_clears_only_that_reason(ctl: Ctl, db: Any) -> None:
    pause_lane(db, seconds=600, reason="rate_limit")

    assert ctl("lane", "clear", "--reason", "account") == EXIT_OK, ctl.err
    assert ctl.out.startswith("the lsky lane is paused until 20")
    assert "reason rate_limit" in ctl.out
    assert ctl.out.endswith("; not the reason asked for (account): left as it is\n")
    assert lane_row(db)["reason"] == "rate_limit"

    assert ctl("lane", "clear", "--reason", "rate_limit") == EXIT_OK
    assert ctl.out.startswith("cleared the lsky lane's pause; it was paused until 20")
    assert lane_row(db)["until"] is None


def test_lane_clear_rejects_an_unknown_reason(capsys: pytest.CaptureFixture[str]) -> None:
    from lib.cli import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["lane", "clear", "--reason", "weather"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'weather'" in capsys.readouterr().err


def test_lane_clear_makes_the_rows_parked_by_the_pause_due_now(ctl: Ctl, db: Any) -> None:
    pause_lane(db, seconds=20 * 3600, reason="rate_limit", detail="每天内你最多可以上传 300 张图片")
    for record_id in (41, 42, 43):  # parked by the pause until its end, 20 h away
        seed_record(
            db, record_id, image_url=URL, next_run_at=-20 * 3600, archive_wait_reason="paused"
        )
    seed_record(db, 44, image_url=URL, next_run_at=-600, archive_wait_reason="backoff")

    assert ctl("lane", "clear") == EXIT_OK, ctl.err

    assert "3 rows parked by the pause are due now" in ctl.out
    due = dict(
        db.run(
            "SELECT id, EXTRACT(EPOCH FROM archive_next_run_at - now()) <= 60"
            " FROM image_generation_records"
        )
    )
    assert due == {41: True, 42: True, 43: True, 44: False}  # a backoff is not the pause's


def test_status_counts_the_waiting_rows_by_reason_held_and_parked(ctl: Ctl, db: Any) -> None:
    seed_record(db, 51, image_url=URL, next_run_at=-60, enqueued_at=1, archive_wait_reason="paced")
    seed_record(db, 52, image_url=URL, next_run_at=-600, archive_wait_reason="paced")
    seed_record(db, 53, image_url=URL, next_run_at=-3600, archive_wait_reason="paused")
    seed_record(db, 54, image_url=URL, next_run_at=30)  # due already: not waiting

    assert ctl("status", "--json") == EXIT_OK, ctl.err
    waiting = json.loads(ctl.out)["archive"]["waiting"]
    assert waiting == {
        "paced": {"held": 1, "parked": 1},
        "paused": {"held": 0, "parked": 1},
    }
    assert ctl("status") == EXIT_OK
    assert "  waiting            2   paced: 1 held (message out), 1 parked (no message)" in ctl.out
