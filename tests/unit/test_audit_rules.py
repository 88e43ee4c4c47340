"""The audit's pure rules (lib.audit.verdict, lib.audit.pace): a GET's outcome to a verdict,
the host-down rule, what repair a verdict calls for, and the GETs' pace."""

from __future__ import annotations

import pytest

from lib.archive.fidelity import Digest
from lib.audit.pace import Pace
from lib.audit.verdict import (
    AuditVerdict,
    Expected,
    Judged,
    Repair,
    host_down,
    judge_bytes,
    judge_failure,
    repair_for,
)
from lib.transfer.failures import Failure, Kind, Stage

MISSING, ALTERED, INTACT = AuditVerdict.MISSING, AuditVerdict.ALTERED, AuditVerdict.INTACT


@pytest.mark.parametrize(
    ("kind", "status", "verdict"),
    [
        (Kind.HTTP_STATUS, 404, MISSING),
        (Kind.HTTP_STATUS, 410, MISSING),
        (Kind.NOT_IMAGE, None, MISSING),  # an error page served with 200
        (Kind.TOO_LARGE, None, ALTERED),
        # Says nothing about the file: no verdict, checked again.
        (Kind.HTTP_STATUS, 503, None),
        (Kind.HTTP_STATUS, 429, None),
        (Kind.HTTP_STATUS, 403, None),
        (Kind.HTTP_STATUS, 500, None),
        (Kind.TIMEOUT, None, None),
        (Kind.CONNECTION, None, None),
        (Kind.NO_SUCH_HOST, None, None),
        (Kind.REFUSED_URL, None, None),  # our own guard: the operator's to fix
    ],
)
def test_a_get_that_failed_is_judged_by_what_it_says_of_the_file(
    kind: Kind, status: int | None, verdict: AuditVerdict | None
) -> None:
    judged = judge_failure(Failure(Stage.DOWNLOAD, kind, "x", status=status))
    assert judged.verdict is verdict
    assert judged.why  # always says why, verdict or not


def test_a_whole_image_is_intact_only_with_the_bytes_lsky_reported() -> None:
    reported = Expected(sha1="a" * 40, size_kb=1.0)
    assert judge_bytes(Digest("a" * 40, 1024), reported) == Judged(
        INTACT, "sha1 and size as reported", True
    )
    assert judge_bytes(Digest("b" * 40, 1024), reported).verdict is ALTERED
    assert judge_bytes(Digest("a" * 40, 4096), reported).verdict is ALTERED
    # Nothing reported (an older release's row): intact by its presence, never an original.
    bare = judge_bytes(Digest("b" * 40, 10), Expected())
    assert (bare.verdict, bare.compared) == (INTACT, False)


@pytest.mark.parametrize("absurd", [float("nan"), "12e999", [], {"kb": 1}, "", None, True])
def test_a_reported_size_that_is_no_size_compares_nothing(absurd: object) -> None:
    judged = judge_bytes(Digest("a" * 40, 1024), Expected(sha1="a" * 40, size_kb=absurd))  # type: ignore[arg-type]
    assert judged.verdict is INTACT


def test_the_original_s_sha1_is_what_was_sent_or_what_lsky_stored_unaltered() -> None:
    assert Expected(sent_sha1=" ABC ").original_sha1 == "abc"
    assert Expected(sha1="DEF", altered=False).original_sha1 == "def"
    assert Expected(sha1="def", altered=True).original_sha1 is None  # re-encoded: unknown
    assert Expected(sha1="def").original_sha1 is None  # not compared at archive time


@pytest.mark.parametrize(
    ("unreachable", "checked", "down"),
    [(0, 0, False), (1, 1, True), (1, 2, False), (2, 3, True), (5, 10, False), (6, 10, True)],
)
def test_the_host_is_down_when_most_checks_of_a_batch_got_no_answer(
    unreachable: int, checked: int, down: bool
) -> None:
    assert host_down(unreachable, checked) is down


@pytest.mark.parametrize(
    ("judged", "original", "on", "refetch", "repair"),
    [
        (Judged(INTACT, "", compared=True), False, True, True, Repair.KEEP_ORIGINAL),
        (Judged(INTACT, "", compared=True), True, True, True, Repair.NONE),
        (Judged(INTACT, "", compared=True), False, False, True, Repair.NONE),
        (Judged(INTACT, "", compared=False), False, True, True, Repair.NONE),
        (Judged(MISSING, ""), True, True, True, Repair.RESTORE),
        (Judged(ALTERED, ""), True, False, False, Repair.RESTORE),
        (Judged(MISSING, ""), False, True, True, Repair.REFETCH),
        (Judged(MISSING, ""), False, False, True, Repair.REFETCH),
        (Judged(ALTERED, ""), False, True, False, Repair.LOST),
        (Judged(None, "timeout"), True, True, True, Repair.NONE),
    ],
)
def test_what_a_verdict_calls_for(
    judged: Judged, original: bool, on: bool, refetch: bool, repair: Repair
) -> None:
    assert repair_for(judged, has_original=original, originals_on=on, can_refetch=refetch) is repair


def test_the_gets_start_no_closer_than_the_rate_allows() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pace = Pace(4, clock=lambda: now[0], sleep=sleep)
    assert pace.wait() == 0  # the first at once
    now[0] += 0.1
    assert pace.wait() == pytest.approx(0.15)  # 0.25 s after the first
    now[0] += 1.0  # a slow GET: no debt carried
    assert pace.wait() == 0
    with pytest.raises(ValueError, match="positive"):
        Pace(0)
