"""`archive-ctl lane clear`, and the words for the upload lane's pause that `status` and
`backfill` use too (image_archive_lane, read with LaneStore.state)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from lib.archive.sweep_rules import named_ids
from lib.cli.context import EXIT_OK, Context
from lib.cli.progress import duration
from lib.cli.words import plural, verb
from lib.platform.redact import outside_text
from lib.state.events import Actor
from lib.state.lane import LaneState, PauseReason
from lib.state.lane_store import PAUSE_DETAIL_LIMIT as DETAIL_LIMIT

LANE = "lsky"
UNTIL_CLEARED = "infinity"  # how JSON reports a pause with no end
# The pause reasons of image_archive_lane.pause_reason.
REASONS = tuple(str(reason) for reason in PauseReason)


@dataclass(frozen=True)
class Pause:
    """A lane pause in words and ISO times (None fields: not known)."""

    until: str  # ISO time, or UNTIL_CLEARED
    reason: str | None
    window: str | None
    since: str | None
    detail: str | None
    remaining_seconds: float  # inf until cleared


def pause_of(lane: LaneState) -> Pause | None:
    """The lane's pause, or None when it is open."""
    if not lane.paused:
        return None
    remaining = lane.paused_for_seconds
    until = (
        UNTIL_CLEARED
        if math.isinf(remaining)
        else (lane.now + timedelta(seconds=remaining)).isoformat(timespec="seconds")
    )
    return Pause(
        until=until,
        reason=lane.reason,
        window=lane.window,
        since=_iso(lane.paused_since),
        # Stored redacted; redacted again here for rows an older version wrote.
        detail=None if lane.detail is None else outside_text(lane.detail, DETAIL_LIMIT),
        remaining_seconds=remaining,
    )


def as_json(pause: Pause) -> dict[str, object]:
    """The pause for --json: a pause until cleared has no remaining seconds (null)."""
    data = asdict(pause)
    if math.isinf(pause.remaining_seconds):
        data["remaining_seconds"] = None
    return data


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if isinstance(moment, datetime) else None


def describe(pause: Pause) -> str:
    """`paused until cleared: reason account, since 2026-12-02T08:00:00+00:00` and the
    window when the host named one."""
    if pause.until == UNTIL_CLEARED:
        until = "until cleared"
    else:
        until = f"until {pause.until} (for {duration(pause.remaining_seconds)} more)"
    words = [f"reason {pause.reason or 'unknown'}"]
    if pause.window:
        words.append(f"window {pause.window}")
    if pause.since:
        words.append(f"since {pause.since}")
    return f"paused {until}: {', '.join(words)}"


def brief(pause: Pause) -> str:
    """`paused until cleared: account`, `paused: rate_limit, window hour`: short enough for
    a progress line, whose countdown says the rest."""
    until = " until cleared" if pause.until == UNTIL_CLEARED else ""
    window = f", window {pause.window}" if pause.window else ""
    return f"paused{until}: {pause.reason or 'unknown'}{window}"


# Rows parked by the cleared pause come due over this many seconds, not all at once.
UNPARK_SPREAD_SECONDS = 60.0


def run_clear(ctx: Context) -> int:
    lanes = ctx.lanes()
    reason: str | None = ctx.args.reason
    pause = pause_of(lanes.state())
    answer: dict[str, object] = {
        "lane": LANE,
        "cleared": False,
        "pause": None if pause is None else as_json(pause),
        "unparked": 0,
    }
    if pause is None:
        ctx.answer(answer)
        ctx.say(f"the {LANE} lane was not paused: nothing to clear")
        return EXIT_OK
    if reason is not None and pause.reason != reason:
        ctx.answer(answer)
        ctx.say(
            f"the {LANE} lane is {describe(pause)}; not the reason asked for ({reason}): "
            "left as it is"
        )
        return EXIT_OK
    cleared = lanes.clear(reason=reason)
    if cleared is None:  # it ended, or was cleared, between the two statements
        ctx.answer({**answer, "pause": None})
        ctx.say(f"the {LANE} lane's pause ended meanwhile: nothing to clear")
        return EXIT_OK
    ctx.say(f"cleared the {LANE} lane's pause; it was {describe(pause)}")
    if pause.detail:
        ctx.say(f"  detail: {pause.detail}")
    unparked: list[int] = []
    while batch := lanes.unpark(spread_seconds=UNPARK_SPREAD_SECONDS, by=Actor.LANE_CLEAR):
        unparked += batch
    ctx.answer({**answer, "cleared": True, "unparked": len(unparked), "unparked_ids": unparked})
    if unparked:
        ctx.say(f"  unparked: {named_ids(unparked)}")
    ctx.say(
        f"{plural(len(unparked), 'row')} parked by the pause {verb(len(unparked), 'is', 'are')} "
        f"due now (spread over {UNPARK_SPREAD_SECONDS:.0f} s): the sweeper sends "
        f"{verb(len(unparked), 'it', 'them')} on its next run; new "
        "attempts start as messages arrive; `archive-ctl status` shows the lane"
    )
    return EXIT_OK
