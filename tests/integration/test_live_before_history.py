"""A live record never waits behind history: with `archive-ctl backfill` running, each
live record waits no longer than 1.2 times what it waits without one (plus a step of the
fake clock), at every pacing setting, including a window history alone would fill: it may
take the slot a backfilled record booked (that one books again), and history keeps within
what live demand leaves of every window. On a fake clock, the rest of the system modelled
(tests.integration.lane_model), the slots from the real statements."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devkit.sqs import QueuePair
from lib.cli.context import EXIT_INTERRUPTED
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.state.lane_store import LaneStore, SlotAnswer
from tests.integration.lane_model import LaneModel, bulk_never_queued
from tests.integration.test_cli import URL
from tests.integration.test_cli_backfill import Ctl, ctl, live_every, stop_at
from tests.support import reset_lane, seed_record

LIVE_FROM = 100_000
__all__ = ["ctl"]  # the fixture: archive-ctl on a fake clock, the lane modelled
STEP = 1.0  # the fake clock moves a second at a time: a wait is known to within that

SETTINGS = [
    # (LSKY_RATE_LIMITS, the limits, a live record every so many seconds, seconds run)
    pytest.param("20/20 seconds", ((20, 20),), 20.0, 80.0, id="full-use-one-a-window"),
    pytest.param("5/10 seconds", ((10, 5),), 10.0, 60.0, id="history-alone-fills-it"),
    pytest.param("8/5 seconds,30/30 seconds", ((5, 8), (30, 30)), 2.0, 40.0, id="two-windows"),
    pytest.param("20/minute,100/hour", ((60, 20), (3600, 100)), 60.0, 240.0, id="lsky-s"),
]
WINDOW = [(20.0, 20)]  # pacing at 20 per 20 s, for the slots taken directly below


def live_waits(
    ctl: Ctl,
    db: Any,
    *,
    limits: tuple[tuple[int, int], ...],
    every: float,
    seconds: float,
    backfill: bool,
) -> dict[int, float]:
    """Each live record's wait (fake seconds from its arrival to its upload) over `seconds`
    of live records arriving `every` seconds (as they did for a window before), with or
    without a backfill of 3,000 rows."""
    lane = ctl.lane
    lane.limits, lane.shift, lane.speed = limits, True, 10
    # Live demand before the run: a live upload every `every` seconds for a window.
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        " SELECT 'lsky', now() - g * make_interval(secs => :every), 'done'"
        " FROM generate_series(1, CAST(:n AS int)) AS g",
        every=every,
        n=int(max(seconds for seconds, _ in limits) // every),
    )
    lane.producer = live_every(every, first_id=LIVE_FROM)
    ctl.time.max_sleeps = int(seconds) + 50
    if backfill:
        bulk_never_queued(db, 1, 3_000)
        stop_at(ctl, seconds)
        assert ctl("backfill") == EXIT_INTERRUPTED, ctl.err
        assert [i for i in lane.uploads if i < LIVE_FROM], "the backfill sent nothing"
    else:
        for _ in range(int(seconds)):
            ctl.time.sleep(STEP)
    return lane.live_waits()


@pytest.mark.parametrize(("pacing", "limits", "every", "seconds"), SETTINGS)
def test_a_live_record_waits_no_longer_with_a_backfill_running(
    ctl: Ctl,
    db: Any,
    sqs: Any,
    queues: QueuePair,
    monkeypatch: pytest.MonkeyPatch,
    pacing: str,
    limits: tuple[tuple[int, int], ...],
    every: float,
    seconds: float,
) -> None:
    monkeypatch.setenv("LSKY_RATE_LIMITS", pacing)
    alone = live_waits(ctl, db, limits=limits, every=every, seconds=seconds, backfill=False)
    db.run("TRUNCATE image_generation_records")
    reset_lane(db)
    with_history = Ctl(ctl.capsys, LaneModel(db, sqs, queues))
    waits = live_waits(with_history, db, limits=limits, every=every, seconds=seconds, backfill=True)

    assert len(waits) >= int(seconds // every) - 1
    late = {
        i: (wait, alone.get(i))
        for i, wait in waits.items()
        if wait > 1.2 * alone.get(i, 0.0) + STEP
    }
    assert late == {}, f"live records waited behind history: {late}"


# -- the two ways history held live records back, slot by slot ---------------------------------


def history(db: Any, ids: range, *, at: str, state: str) -> None:
    """Backfilled records' ledger rows: uploads done, or slots booked, `at` an expression."""
    for record_id in ids:
        seed_record(db, record_id, image_url=URL, archive_backfilled=True)
        db.run(
            f"INSERT INTO image_archive_uploads (lane, at, record_id, state)"
            f" VALUES ('lsky', {at}, :id, :state)",
            id=record_id,
            state=state,
            n=record_id - ids.start,
        )


def take(lanes: LaneStore, record_id: int) -> Any:
    return lanes.take_slot(
        record_id, limits=WINDOW, margin=0.05, tolerance=0.0125, stale=120, book_within=900
    )


def test_a_live_record_takes_a_slot_history_booked(db: Any, lanes: LaneStore) -> None:
    # History uploaded ten in the last ten seconds and has booked every other slot of the
    # window: the live record arriving now takes one of them at once (it booked the next
    # window, 10 to 20 s away), and the backfilled record it took it from books again.
    history(db, range(1, 11), at="now() - :n * interval '1 second'", state="done")
    history(db, range(11, 21), at="now() + :n * interval '1 second'", state="booked")
    seed_record(db, 100, image_url=URL)

    live = take(lanes, 100)

    assert live.answer is SlotAnswer.GO
    [[booked]] = db.run("SELECT count(*) FROM image_archive_uploads WHERE state = 'booked'")
    assert booked == 9  # one backfilled record's booking gave way...
    [displaced] = [i for i in range(11, 21) if not booking(db, i)]
    again = take(lanes, displaced)  # ...and it books again when it comes back
    assert again.answer is SlotAnswer.BOOKED
    assert again.at > max(booking(db, i) for i in range(11, 21) if i != displaced)


def test_history_leaves_every_window_room_for_live_demand(db: Any, lanes: LaneStore) -> None:
    # A backfill alone would fill the window: 18 of its uploads in it, no live one lately.
    # History keeps one slot free (live demand 0, its margin 1): the 19th goes, the 20th
    # waits, and a live record arriving then goes at once.
    history(db, range(1, 19), at="now() - :n * interval '0.5 second'", state="done")
    for record_id in (19, 20):
        seed_record(db, record_id, image_url=URL, archive_backfilled=True)
    seed_record(db, 100, image_url=URL)

    assert take(lanes, 19).answer is SlotAnswer.GO
    assert take(lanes, 20).answer is not SlotAnswer.GO
    assert take(lanes, 100).answer is SlotAnswer.GO


def booking(db: Any, record_id: int) -> Any:
    rows = db.run(
        "SELECT at FROM image_archive_uploads WHERE record_id = :id AND state = 'booked'",
        id=record_id,
    )
    return rows[0][0] if rows else None


@pytest.fixture
def lanes(pg_dsn: str) -> Iterator[LaneStore]:
    database = Database(DatabaseConfig(url=pg_dsn), application_name="live-first-test")
    yield LaneStore(database)
    database.close()
