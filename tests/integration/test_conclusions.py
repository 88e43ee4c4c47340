"""The conclusion table walked for real (issue 20): every Outcome produced by a real
attempt against PostgreSQL, moto's SQS and the Lsky stand-in, and its row and message
checked against what lib.archive.conclusion.CONCLUSIONS says."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from devkit import images
from devkit.lsky import AccountState, Behaviour, LskyStandIn
from devkit.postgres import connect
from lib.archive.conclusion import CONCLUSIONS, Attempt, Send
from lib.archive.message import encode
from lib.archive.outcome import Outcome
from tests.integration.conftest import ArchiveHarness
from tests.support import FakeLambdaContext, fetch_record, queue_attrs, seed_record

PNG = images.png(size=2_000)
ID = 70


@dataclass
class World:
    archive: ArchiveHarness
    archive_env: Callable[..., dict[str, str]]
    db: Any
    upstream: Any
    lsky: LskyStandIn
    pg_dsn: str
    monkeypatch: pytest.MonkeyPatch

    def seed(self, **columns: Any) -> None:
        columns.setdefault("image_url", self.upstream.add("/c.png", PNG))
        columns.setdefault("enqueued_at", 0)  # stamped when its message was sent
        seed_record(self.db, ID, **columns)


def archived(w: World) -> Any:
    w.seed()
    return w.archive.deliver(encode(ID))


def retry(w: World) -> Any:
    w.seed()
    w.lsky.script(Behaviour.server_error())
    return w.archive.deliver(encode(ID))


def failed(w: World) -> Any:
    w.seed(image_url=w.upstream.add("/gone.png", b"", status=404))
    return w.archive.deliver(encode(ID))


def duplicate(w: World) -> Any:
    w.seed(archive_status="SUCCEEDED")
    return w.archive.deliver(encode(ID))


def early(w: World) -> Any:
    w.seed(next_run_at=-120)  # due in two minutes: a copy during the backoff
    return w.archive.deliver(encode(ID))


def paused(w: World) -> Any:
    w.seed()
    w.lsky.script(Behaviour.status_false("每分钟内你最多可以上传 20 张图片"))
    return w.archive.deliver(encode(ID))


def parked(w: World) -> Any:
    w.seed()
    w.lsky.account_state = AccountState.QUOTA_FULL  # a pause until cleared: parked
    return w.archive.deliver(encode(ID))


def released(w: World) -> Any:
    w.seed()
    # 20 s left: too little to start, checked before the claim.
    return w.archive.deliver(encode(ID), FakeLambdaContext(timeout_seconds=20))


def own_fault(w: World) -> Any:
    w.seed()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    w.monkeypatch.setattr("lib.archive.copier.Copier.fetch", broken)
    return w.archive.deliver(encode(ID))


def unconcluded(w: World) -> Any:
    w.seed()
    w.archive_env(DATABASE_URL="postgresql://nobody@127.0.0.1:9/none")
    return w.archive.deliver(encode(ID))


def lost_lock(w: World) -> Any:
    w.seed(image_url=w.upstream.add("/slow.png", PNG, delay=0.8, fail_first=1))
    other = connect(w.pg_dsn)

    def take_over() -> None:
        while w.upstream.hits("/slow.png") < 1:
            threading.Event().wait(0.01)
        other.run(f"UPDATE image_generation_records SET archive_locked_by = 'x' WHERE id = {ID}")

    thread = threading.Thread(target=take_over)
    thread.start()
    try:
        return w.archive.deliver(encode(ID))
    finally:
        thread.join()
        other.close()


def malformed(w: World) -> Any:
    return w.archive.deliver('{"recordId": "not a number"}')


def malformed_left(w: World) -> Any:
    w.archive_env(ARCHIVE_DLQ_URL=None)
    return w.archive.deliver("{}")


SCENARIOS: dict[Outcome, Callable[[World], Any]] = {
    Outcome.ARCHIVED: archived,
    Outcome.RETRY: retry,
    Outcome.FAILED: failed,
    Outcome.DUPLICATE: duplicate,
    Outcome.EARLY: early,
    Outcome.PAUSED: paused,
    Outcome.PARKED: parked,
    Outcome.RELEASED: released,
    Outcome.OWN_FAULT: own_fault,
    Outcome.UNCONCLUDED: unconcluded,
    Outcome.LOST_LOCK: lost_lock,
    Outcome.MALFORMED: malformed,
    Outcome.MALFORMED_LEFT: malformed_left,
}
# Outcomes whose scenario never claims the row: the attempt count cannot move.
UNCLAIMED = {Outcome.DUPLICATE, Outcome.EARLY, Outcome.RELEASED, Outcome.UNCONCLUDED}


def test_every_outcome_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome), ids=[str(o) for o in Outcome])
def test_each_outcome_is_concluded_as_the_table_says(
    outcome: Outcome,
    archive: ArchiveHarness,
    archive_env: Callable[..., dict[str, str]],
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rule = CONCLUSIONS[outcome]
    world = World(archive, archive_env, db, upstream, lsky, pg_dsn, monkeypatch)

    response = SCENARIOS[outcome](world)

    logged = [line for line in archive.logs() if line.get("outcome") == str(outcome)]
    assert logged, (
        f"no log line with outcome {outcome}: {[x.get('message') for x in archive.logs()]}"
    )
    assert logged[-1]["level"] == str(rule.level).upper()
    # The message: deleted, held (a batch item failure in flight), or moved to the DLQ.
    redelivered = len(response["batchItemFailures"]) == 1
    assert redelivered is (rule.send in (Send.HOLD, Send.NOW))
    queue, dlq = (
        queue_attrs(archive.sqs, archive.queues.url),
        queue_attrs(archive.sqs, archive.queues.dlq_url),
    )
    if rule.send is Send.HOLD:
        assert (queue.visible, queue.not_visible) == (0, 1)  # held for its delay
    elif rule.send is Send.DELETE:
        assert (queue.visible, queue.not_visible) == (0, 0)
    elif rule.send is Send.DLQ:
        assert (queue.visible, queue.not_visible, dlq.visible) == (0, 0, 1)
    # The row: what the statement leaves, and whether the attempt counts.
    if outcome in (Outcome.MALFORMED, Outcome.MALFORMED_LEFT):
        return
    row = fetch_record(db, ID)
    attempts = row["archive_attempts"]
    if outcome in UNCLAIMED:
        assert attempts == 0
    elif rule.attempt is Attempt.SPENT:
        assert attempts == 1
    elif rule.attempt is Attempt.GIVEN_BACK:
        assert (attempts, row["archive_status"], row["archive_locked_by"]) == (0, "PENDING", None)
        assert row["archive_wait_reason"] is not None
        parked_row = row["archive_enqueued_at"] is None
        assert parked_row is (outcome is Outcome.PARKED)
    expected_status = {
        Outcome.ARCHIVED: "SUCCEEDED",
        Outcome.RETRY: "PENDING",
        Outcome.FAILED: "FAILED",
        Outcome.DUPLICATE: "SUCCEEDED",
        Outcome.LOST_LOCK: "RUNNING",  # the new holder concludes it
    }
    if outcome in expected_status:
        assert row["archive_status"] == expected_status[outcome]
