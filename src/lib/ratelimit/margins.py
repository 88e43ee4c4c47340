"""The margins a slot keeps under Lsky's windows (LSKY_RATE_LIMITS), and how early one may
be taken: the two clocks, ours and Lsky's, tick apart."""

from __future__ import annotations

from collections.abc import Sequence

# The ledger dates an upload when Lsky answered, after Lsky counted it (one under way, as
# late as it can answer), so the time a transfer takes needs no margin; a slot keeps this
# much more than the window for the two clocks (our database's and Lsky's ticking apart,
# a step): at most this, and a four-hundredth of the window (2,500 ppm; scaled-down
# windows in tests and benchmarks), so the margin costs at most 0.25 % of the rate.
SLOT_MARGIN_SECONDS = 2.0
# A slot due within this is taken now (the two clocks' noise), and within a quarter of the
# margin at most: taken any earlier, it would spend the margin it was given.
SLOT_TOLERANCE_SECONDS = 0.05


def slot_margin(limits: Sequence[tuple[float, int]]) -> float:
    """The margin every window of `limits` keeps (the shortest window sets it)."""
    shortest = min(seconds for seconds, _ in limits)
    return min(SLOT_MARGIN_SECONDS, shortest / 400)


def slot_tolerance(limits: Sequence[tuple[float, int]]) -> float:
    """How early a slot may be taken: the clocks' noise, never more than a quarter of the
    margin (a one-second window keeps 2.5 ms, and a slot taken 50 ms early was refused)."""
    return min(SLOT_TOLERANCE_SECONDS, slot_margin(limits) / 4)
