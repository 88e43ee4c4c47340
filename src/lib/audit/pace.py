"""The audit's load on the host: at most `rate` GETs a second, started evenly."""

from __future__ import annotations

import time
from collections.abc import Callable


class Pace:
    """Each `wait()` returns no sooner than 1/rate seconds after the previous one did."""

    def __init__(
        self,
        rate: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("a rate is a positive number of GETs a second")
        self.interval = 1.0 / rate
        self._clock = clock
        self._sleep = sleep
        self._next: float | None = None

    def wait(self) -> float:
        """Sleep until the next GET may start; returns the seconds slept."""
        now = self._clock()
        slept = 0.0
        if self._next is not None and now < self._next:
            slept = self._next - now
            self._sleep(slept)
            now = self._next
        self._next = now + self.interval
        return slept
