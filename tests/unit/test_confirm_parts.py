"""The pure parts of confirming originals recorded before S3's answer: what a HEAD must say
to confirm one (lib.audit.confirm.judge), and the container's kept answers
(lib.archive.confirmations): bounded, an unreadable version never recorded."""

from __future__ import annotations

import pytest

from lib.archive import confirmations as kept
from lib.archive.confirmations import Confirmations
from lib.audit.confirm import Look, judge
from lib.platform.s3_originals import Found
from lib.state.claim import Confirmed
from lib.state.originals import Unconfirmed

ORIGINAL = Unconfirmed(7, "originals-bucket", "originals/7/" + "a" * 32 + ".png", 1000)
OURS = {"record-id": "7", "source": "archive"}

pytestmark = pytest.mark.usefixtures("clean_metrics")


def test_the_object_sent_is_confirmed() -> None:
    assert judge(ORIGINAL, Found(1000, "3sL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY", OURS)) is Look.CONFIRMED
    assert judge(ORIGINAL, Found(1000, None, OURS)) is Look.CONFIRMED  # an unversioned bucket


@pytest.mark.parametrize(
    "found",
    [
        Found(999, "v1", OURS),
        Found(1001, "v1", OURS),
        Found(0, "v1", OURS),
        Found(1000, "v1", {"record-id": "8", "source": "archive"}),
        Found(1000, "v1", {"record-id": "07"}),
        Found(1000, "v1", {}),
        Found(1000, "with space", OURS),
        Found(1000, "v" * 2000, OURS),
    ],
    ids=[
        "shorter",
        "longer",
        "empty",
        "another record",
        "padded id",
        "no metadata",
        "unreadable version",
        "overlong version",
    ],
)
def test_anything_else_under_its_key_never_confirms_it(found: Found) -> None:
    assert judge(ORIGINAL, found) is Look.OTHER


def test_nothing_under_its_key_is_absent() -> None:
    assert judge(ORIGINAL, None) is Look.ABSENT


def test_an_unreadable_version_is_never_recorded_and_the_kept_answers_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kept, "MAX_UNRECORDED", 3)
    answers = Confirmations()
    answers.answered(Confirmed(1, "originals/1/x.png", "with space"))
    assert answers.unrecorded() == []
    assert answers.wait(1, 0.0)  # told as a failure instead
    for record_id in range(2, 8):
        answers.answered(Confirmed(record_id, f"originals/{record_id}/x.png", "v1"))
    assert [c.record_id for c in answers.unrecorded()] == [5, 6, 7]  # the newest kept
    assert not answers.wait(2, 0.0)
    answers.recorded(answers.unrecorded()[:2], 2)
    assert [c.record_id for c in answers.unrecorded()] == [7]
