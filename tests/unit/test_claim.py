"""Reading a claim that did not win: duplicate, stray, or a copy that came early."""

from __future__ import annotations

import pytest

from lib.state.claim import ClaimSnapshot, early_delay, skip_reason


@pytest.mark.parametrize(
    ("snapshot", "reason"),
    [
        (ClaimSnapshot(exists=False), "record not found"),
        (ClaimSnapshot(True, "RUNNING", "PENDING"), "generation status is RUNNING"),
        (ClaimSnapshot(True, "SUCCEEDED", "SUCCEEDED"), "archive already SUCCEEDED"),
        (ClaimSnapshot(True, "SUCCEEDED", "FAILED"), "archive already FAILED"),
        (ClaimSnapshot(True, "SUCCEEDED", "RUNNING"), "archive is RUNNING under a live lock"),
        (ClaimSnapshot(True, "SUCCEEDED", None), "archive was never queued"),
        (ClaimSnapshot(True, "SUCCEEDED", "PENDING"), "claimed concurrently (archive PENDING)"),
    ],
)
def test_skip_reason(snapshot: ClaimSnapshot, reason: str) -> None:
    assert skip_reason(snapshot) == reason


@pytest.mark.parametrize(
    ("snapshot", "hold"),
    [
        (ClaimSnapshot(True, "SUCCEEDED", "PENDING", due_in_seconds=90.2), 91),
        (ClaimSnapshot(True, "SUCCEEDED", "PENDING", due_in_seconds=-3.0), None),  # past due
        (ClaimSnapshot(True, "SUCCEEDED", "PENDING", due_in_seconds=0.0), None),
        (ClaimSnapshot(True, "SUCCEEDED", "PENDING", due_in_seconds=10**6), 10**6),
        (ClaimSnapshot(True, "SUCCEEDED", "RUNNING", due_in_seconds=90.0), None),
        (ClaimSnapshot(True, "SUCCEEDED", "FAILED", due_in_seconds=90.0), None),
        (ClaimSnapshot(True, "RUNNING", "PENDING", due_in_seconds=90.0), None),
        (ClaimSnapshot(exists=False), None),
    ],
)
def test_early_delay_holds_only_pending_rows_not_yet_due(
    snapshot: ClaimSnapshot, hold: int | None
) -> None:
    assert early_delay(snapshot) == hold
