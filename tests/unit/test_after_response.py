"""The after-response extension's decisions without a Runtime API: which job an INVOKE
runs, with how much time, and how long it waits for one (lib.platform.after_response).
The extension against a runtime is tests/integration/test_after_response.py."""

from __future__ import annotations

import threading
import time

import pytest

from lib.platform import after_response
from lib.platform.after_response import (
    DEADLINE_MARGIN_MS,
    MAX_INVOCATION_MS,
    MAX_WAITING,
    AfterResponse,
)
from tests.support import HANG_SECONDS


def extension() -> AfterResponse:
    return AfterResponse("127.0.0.1:9", "id")  # never started: no call is made


def now_ms() -> int:
    return int(time.time() * 1000)


def invoke(request_id: str, deadline_ms: object) -> dict[str, object]:
    return {"eventType": "INVOKE", "requestId": request_id, "deadlineMs": deadline_ms}


@pytest.mark.parametrize(
    "value",
    [None, "soon", True, [], {"ms": 1}, -1, 0, float("nan"), float("inf"), 10**30, -(10**30)],
)
def test_an_absurd_deadline_is_bounded_to_now_and_lambda_s_longest_timeout(value: object) -> None:
    before = now_ms()
    deadline = after_response._deadline_ms(value)
    assert before <= deadline <= now_ms() + MAX_INVOCATION_MS


def test_a_deadline_ahead_is_kept() -> None:
    ahead = now_ms() + 30_000
    assert after_response._deadline_ms(ahead) == ahead


def test_the_job_handed_off_before_its_invoke_runs_with_the_time_left() -> None:
    ext = extension()
    given: list[int] = []
    ext.hand_off("r1", given.append)
    deadline = now_ms() + 30_000
    ext._serve(invoke("r1", deadline))
    [remaining] = given
    assert 0 < remaining <= 30_000


def test_the_job_handed_off_after_its_invoke_is_waited_for() -> None:
    ext = extension()
    given: list[int] = []
    served = threading.Thread(
        target=ext._serve, args=(invoke("r2", now_ms() + 1000 * int(HANG_SECONDS)),)
    )
    served.start()
    ext.hand_off("r2", given.append)
    served.join(HANG_SECONDS)
    assert not served.is_alive()
    assert len(given) == 1


def test_an_invoke_without_its_id_takes_the_hand_off_that_comes() -> None:
    ext = extension()
    given: list[int] = []
    ext.hand_off("r6", given.append)
    ext._serve({"eventType": "INVOKE", "deadlineMs": now_ms() + 30_000})
    assert len(given) == 1
    assert ext._jobs == {}


def test_no_hand_off_waits_only_until_the_deadline_s_margin_and_runs_nothing() -> None:
    ext = extension()
    ran: list[int] = []
    ext.hand_off("another", ran.append)  # a stale hand-off is not this invocation's
    ext._serve(invoke("r3", now_ms() + DEADLINE_MARGIN_MS))  # nothing left to wait
    assert ran == []
    assert ext._jobs == {}


def test_a_none_job_and_an_event_other_than_invoke_run_nothing() -> None:
    ext = extension()
    ext.hand_off("r4", None)
    ext._serve(invoke("r4", now_ms() + 30_000))
    ran: list[int] = []
    ext.hand_off("r5", ran.append)
    ext._serve({"eventType": "SHUTDOWN", "requestId": "r5"})
    assert ran == []
    assert list(ext._jobs) == ["r5"]


def test_hand_offs_never_announced_are_kept_to_a_bound() -> None:
    ext = extension()
    for n in range(MAX_WAITING + 5):
        ext.hand_off(f"r{n}", None)
    assert list(ext._jobs) == [f"r{n}" for n in range(5, MAX_WAITING + 5)]
