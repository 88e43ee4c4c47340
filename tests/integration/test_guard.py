"""One guard around the whole attempt (issue 19): a fault injected at each step of the
transfer's decisions and of the conclusion leaves the row PENDING with its attempt given
back (or concluded as decided, when the write had happened), the message with a valid
visibility, and an InternalError counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour, LskyStandIn
from lib.archive.message import encode
from tests.integration.conftest import ArchiveHarness
from tests.support import emf_metrics, fetch_record, seed_record

PNG = images.png(size=2_000)
RATE_LIMITED = Behaviour.status_false("每分钟内你最多可以上传 20 张图片")


def broken(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected")


STEPS = [
    # (where the fault strikes, what Lsky answers first, the row's state after)
    ("lib.archive.transfer.pause_until", RATE_LIMITED, "PENDING"),
    ("lib.state.lane_store.LaneStore.pause", RATE_LIMITED, "PENDING"),
    ("lib.archive.schedule.wait_for_lane", RATE_LIMITED, "PENDING"),
    ("lib.archive.retry.decide", Behaviour.server_error(), "PENDING"),
    ("lib.archive.transfer.Transfer._attempt_failed", Behaviour.server_error(), "PENDING"),
    ("lib.state.records.ArchiveRecords.retry", Behaviour.server_error(), "PENDING"),
    ("lib.archive.staging.Staging.stage", Behaviour.server_error(), "PENDING"),
    # The success was written: the row is concluded as decided.
    ("lib.archive.conclusion.report_copy", None, "SUCCEEDED"),
]


@pytest.mark.parametrize(("target", "first", "state"), STEPS, ids=[s[0] for s in STEPS])
def test_a_fault_at_any_step_gives_the_attempt_back(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    staging_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    target: str,
    first: Behaviour | None,
    state: str,
) -> None:
    archive_env(ARCHIVE_STAGING_BUCKET=staging_bucket)
    seed_record(db, 1, image_url=upstream.add("/g.png", PNG))
    if first is not None:
        lsky.script(first)
    monkeypatch.setattr(target, broken)
    capsys.readouterr()

    response = archive.deliver(encode(1))

    row = fetch_record(db, 1)
    assert row["archive_status"] == state
    metrics = emf_metrics(capsys)
    assert metrics["InternalError"] == 1
    if state == "PENDING":
        assert row["archive_attempts"] == 0  # given back: our bug is not the record's
        assert row["archive_locked_by"] is None
        assert row["archive_wait_reason"] == "own_fault"
        assert len(response["batchItemFailures"]) == 1  # back in 5 minutes
        assert archive.in_flight() == 1
    assert archive.log_for("unexpected error while handling a message")["error_type"] == (
        "RuntimeError"
    )


def test_when_even_giving_back_fails_the_message_waits_for_the_lock_to_expire(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed_record(db, 2, image_url=upstream.add("/h.png", PNG))
    lsky.script(RATE_LIMITED)
    monkeypatch.setattr("lib.state.records.ArchiveRecords.release", broken)
    capsys.readouterr()

    response = archive.deliver(encode(2))

    assert len(response["batchItemFailures"]) == 1
    row = fetch_record(db, 2)
    # Nothing could be written: the lock expires and the row is taken over.
    assert (row["archive_status"], row["archive_attempts"]) == ("RUNNING", 1)
    metrics = emf_metrics(capsys)
    assert metrics["Unconcluded"] == 1
    assert metrics["InternalError"] >= 1
    assert archive.log_for("could not conclude the attempt; SQS will redeliver it")
