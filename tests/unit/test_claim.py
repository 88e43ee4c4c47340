"""Reading a claim that did not win: duplicate, stray, or a copy that came early."""

from __future__ import annotations

import pytest

from lib.state.claim import ClaimSnapshot, SentImage, early_delay, skip_reason


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


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        ({"sha1": "ab", "width": 4, "height": 3}, SentImage("ab", (4, 3))),
        # An older release also wrote md5: read, not needed (sha1 decides).
        ({"md5": "m", "sha1": "ab", "width": None, "height": None}, SentImage("ab", None)),
        ({"md5": "m", "sha1": "", "width": 4, "height": 3}, None),  # nothing to compare by
        ({"md5": "m"}, None),
        ({"sha1": 5}, None),
        (["ab"], None),
        (None, None),
    ],
)
def test_what_an_upload_sent_is_read_from_any_release_s_column(value: object, sent: object) -> None:
    assert SentImage.from_json(value) == sent
    if isinstance(sent, SentImage):
        assert SentImage.from_json(sent.as_json()) == sent  # and written back the same
