"""Pacing (LSKY_RATE_LIMITS), the pure part an attempt decides: how long it may sleep for a
slot, and whether to fetch first. The slots and their margins are lib.ratelimit's, given
by lib.state.lane_store's take_slot; docs/explanation/lane-and-pacing.md says why an
attempt never sleeps long.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.archive.budget import stage_needs, time_left, upload_needs

# An upload under way or booked counts in the windows from when it should answer (this
# container's recent uploads) and this much later: its pickup, fetch and transfer vary,
# and Lsky's whole seconds turn a later answer across a second into a whole second more
# for every slot measured from it. Within this, a booked slot stays free when it comes.
ANSWER_SLACK_SECONDS = 0.25
# A booked slot missed by more than this is given up and a fresh one taken.
BOOKING_STALE_SECONDS = 120.0
# Slots further away than this are not booked: the record is parked (no message held)
# and queues afresh when the sweeper sends it (a hold is at most this long).
BOOK_WITHIN_SECONDS = 900.0
# An attempt with the bytes in hand sleeps for a slot at most this long, or as long as it
# took to fetch them, whichever is more: a short sleep is cheaper than a second invocation
# (and a slow source's bytes are worth keeping), a long one is billed time spent waiting.
# Lsky counts whole seconds, so a booked slot that moves moves by a second (an upload
# before it answered just past one): held again, that costs an invocation of tens of
# milliseconds; slept, most of a second billed.
SLEEP_LIMIT_SECONDS = 0.25
SLEEP_TRIES = 3
# A booked record's lateness behind its booking (the queue's pickup, the claim) is learnt
# from lateness up to this, and booked for up to this; anything later is not the pickup
# (a redelivery, a retry) and teaches nothing.
LATENESS_LIMIT_SECONDS = 1.0


def longest_sleep(*, fetched_seconds: float | None, fetch_estimate: float) -> float:
    """The longest an attempt may wait for its slot in this invocation: with its bytes in
    hand (fetched in `fetched_seconds`), SLEEP_LIMIT_SECONDS or as long as the fetch took
    (waiting never exceeds the work it saves); before fetching, what the fetch is expected
    to take (this container's recent fetches) and SLEEP_LIMIT_SECONDS more."""
    if fetched_seconds is None:
        return fetch_estimate + SLEEP_LIMIT_SECONDS
    return max(SLEEP_LIMIT_SECONDS, fetched_seconds)


def affordable_sleep(
    wait_seconds: float, *, longest: float, deadline: float, size: int, staging: bool
) -> bool:
    """Whether an attempt with `size` bytes in hand may sleep `wait_seconds` for its slot: no
    longer than `longest` (its `longest_sleep`), and only what the budget can pay after
    the upload (and, with staging on, after staging the bytes should the upload fail)."""
    if wait_seconds > longest:
        return False
    after = upload_needs(size) + (stage_needs(size) if staging else 0.0)
    return time_left(deadline) - wait_seconds >= after


def fetch_first(wait_seconds: float, *, fetch_estimate: float) -> bool:
    """Whether a record booked before fetching, `wait_seconds` from its slot, should fetch
    now rather than hand its message back: the fetch covers the wait, but for a moment
    the attempt may sleep once its bytes are in hand. Handing it back would cost a second
    invocation that only fetches then."""
    return wait_seconds <= longest_sleep(fetched_seconds=None, fetch_estimate=fetch_estimate)


def learn_lateness(previous: float, observed: float) -> float:
    """The lateness to book for after a booked record with its bytes in hand was
    `observed` seconds behind its booking (early: negative): half the error corrects
    the estimate, which stays within [0, LATENESS_LIMIT_SECONDS]."""
    if abs(observed) > LATENESS_LIMIT_SECONDS:
        return previous
    return min(LATENESS_LIMIT_SECONDS, max(0.0, previous + observed / 2))


@dataclass
class Timings:
    """What this container has seen of its own transfers, to date its bookings by.

    fetch: how long its last fetches took (a booked record comes back that much before
    its slot, to have its bytes in hand when the slot comes: it fetches first, unless its
    image is kept in the staging bucket, read back in moments; a relayed
    copy's download counts as a fetch, the upload beside it does not slow it); upload: how
    long its last uploads took from their slot to Lsky's answer (a booked slot, or an
    upload under way, counts in the windows from when it should answer; a relayed copy's
    upload runs beside its download, and counts from its start); lateness: how late
    booked records reached their slot besides the fetch (the queue's pickup, the claim),
    learnt from each that came back."""

    fetch: float = 0.0
    upload: float = 0.0
    lateness: float = 0.0

    def lead(self, *, image_kept: bool = False) -> float:
        """How long after its message comes back a held record's upload starts: the
        queue's pickup and the claim, and the fetch unless its image is kept (staged)."""
        return self.lateness + (0.0 if image_kept else self.fetch)

    def fetched(self, seconds: float) -> None:
        self.fetch = (self.fetch + seconds) / 2

    def uploaded(self, seconds: float) -> None:
        self.upload = (self.upload + seconds) / 2

    def came_back(self, late: float) -> None:
        """A booked record, bytes in hand, looked at its slot `late` seconds after it."""
        self.lateness = learn_lateness(self.lateness, late)
