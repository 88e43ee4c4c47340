"""Progress of a long archive-ctl run on stderr: one line redrawn with \\r on a terminal,
plain lines otherwise (logs, pipes). Meter and the line renderers are pure; Display
only writes what they return."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TextIO

# Rates are measured over the last few minutes, so an ETA follows the pace of now.
RATE_WINDOW_SECONDS = 300.0
BAR_WIDTH = 24


def duration(seconds: float | None) -> str:
    """A short human duration: 40 s, 12 min, 1 h 48 min, 3.2 d; '-' when unknown."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "never"
    seconds = max(seconds, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        hours, rest = divmod(round(seconds / 60), 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    return f"{seconds / 86400:.1f} d"


@dataclass
class Meter:
    """Rows done over time; `now` readings come from the caller's clock."""

    total: int | None  # None: not counted
    started: float
    done: int = 0
    _samples: deque[tuple[float, int]] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        self._samples.append((self.started, 0))

    def add(self, count: int, now: float) -> None:
        self.done += count
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and self._samples[1][0] <= now - RATE_WINDOW_SECONDS:
            self._samples.popleft()

    def per_minute(self, now: float) -> float | None:
        """Rows a minute over the last RATE_WINDOW_SECONDS; None before any time passed."""
        since, done_then = self._samples[0]
        if now <= since:
            return None
        return (self.done - done_then) * 60.0 / (now - since)

    def remaining(self) -> int | None:
        return None if self.total is None else max(self.total - self.done, 0)

    def eta_seconds(self, now: float, drain_per_minute: float = 0.0) -> float | None:
        """At the slower of the send rate and the lane's drain rate: pacing keeps the
        sends from outrunning the lane for long."""
        remaining = self.remaining()
        if remaining is None:
            return None
        if remaining == 0:
            return 0.0
        rates = [r for r in (self.per_minute(now), drain_per_minute) if r is not None and r > 0]
        return remaining * 60.0 / min(rates) if rates else None


def _count(meter: Meter) -> str:
    if meter.total is None:
        return f"{meter.done} sent"
    percent = 100.0 * meter.done / meter.total if meter.total else 100.0
    return f"{meter.done}/{meter.total} sent ({percent:.0f}%)"


def _rate(rate: float | None) -> str:
    return "-/min" if rate is None else f"{rate:.1f}/min"


def plain_line(meter: Meter, now: float, drain_per_minute: float = 0.0) -> str:
    """One line for logs: `backfill: 300/5000 sent (6%), 120.0/min, ETA 39 min`."""
    eta = duration(meter.eta_seconds(now, drain_per_minute))
    return f"backfill: {_count(meter)}, {_rate(meter.per_minute(now))}, ETA {eta}"


def bar_line(meter: Meter, now: float, drain_per_minute: float = 0.0, note: str = "") -> str:
    """The terminal line: `[######......] 300/5000 sent (6%)  120.0/min  ETA 39 min`."""
    if meter.total:
        filled = min(BAR_WIDTH, BAR_WIDTH * meter.done // meter.total)
        bar = "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "] "
    else:
        bar = ""
    eta = duration(meter.eta_seconds(now, drain_per_minute))
    line = f"{bar}{_count(meter)}  {_rate(meter.per_minute(now))}  ETA {eta}"
    return f"{line}  {note}" if note else line


class Display:
    """Writes progress to `stream`: redraws one line on a terminal, else prints lines."""

    def __init__(self, stream: TextIO, *, tty: bool, width: int = 100) -> None:
        self.stream = stream
        self.tty = tty
        self.width = width
        self._drawn = 0  # length of the terminal line drawn last

    def show(self, meter: Meter, now: float, drain_per_minute: float, note: str = "") -> None:
        if self.tty:
            self._draw(bar_line(meter, now, drain_per_minute, note))
        else:
            line = plain_line(meter, now, drain_per_minute)
            self._print(f"{line}; {note}" if note else line)

    def message(self, text: str) -> None:
        """A line of its own (kept above the progress line on a terminal)."""
        self.finish()
        self._print(text)

    def finish(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = 0

    def _draw(self, line: str) -> None:
        line = line[: max(self.width - 1, 20)]
        # Pad over the rest of a longer previous line rather than rely on escape codes.
        self.stream.write("\r" + line + " " * max(self._drawn - len(line), 0))
        self.stream.flush()
        self._drawn = len(line)

    def _print(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()
