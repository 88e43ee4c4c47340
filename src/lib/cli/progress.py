"""Progress of a long archive-ctl run on stderr: one line redrawn with \\r on a terminal
(fitted to its width, the reason it waits kept last to go), plain lines now and then
otherwise (logs, pipes). Meter and the renderers are pure; Display only writes."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

# Rates are measured over the last few minutes, so an ETA follows the pace of now.
RATE_WINDOW_SECONDS = 300.0
BAR_WIDTH = 24
# Off a terminal, a progress line is printed this often (of the run's clock) at most.
PLAIN_EVERY_SECONDS = 10.0


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

    def per_second(self, now: float) -> float | None:
        """Rows a second over the last RATE_WINDOW_SECONDS; None before any time passed."""
        since, done_then = self._samples[0]
        if now <= since:
            return None
        return (self.done - done_then) / (now - since)

    def remaining(self) -> int | None:
        return None if self.total is None else max(self.total - self.done, 0)


@dataclass(frozen=True)
class Progress:
    """What one progress line says."""

    done: int
    total: int | None
    rate: str  # e.g. 12.5/min
    eta: float | None  # seconds; None: unknown
    note: str = ""  # what it waits for

    def count(self, *, short: bool = False) -> str:
        if self.total is None:
            return f"{self.done} sent"
        if short:
            return f"{self.done}/{self.total}"
        percent = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.done}/{self.total} sent ({percent:.0f}%)"

    def bar(self) -> str:
        if not self.total:
            return ""
        filled = min(BAR_WIDTH, BAR_WIDTH * self.done // self.total)
        return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def plain_line(progress: Progress) -> str:
    """One line for logs: `backfill: 300/5000 sent (6%), 12.5/min, ETA 6.3 h; waiting: ...`."""
    line = f"backfill: {progress.count()}, {progress.rate}, ETA {duration(progress.eta)}"
    return f"{line}; {progress.note}" if progress.note else line


def bar_line(progress: Progress, width: int = 1000) -> str:
    """The terminal line, at most `width` characters:
    `[######......] 300/5000 sent (6%)  12.5/min  ETA 6.3 h  waiting: ...`. When it does
    not fit, the bar goes first, then the percentage, the rate, the ETA and the count;
    the reason it waits is cut only when it does not fit alone."""
    eta = f"ETA {duration(progress.eta)}"
    count, short = progress.count(), progress.count(short=True)
    bar = progress.bar()
    for parts in (
        [f"{bar} {count}" if bar else count, progress.rate, eta],
        [count, progress.rate, eta],
        [short, progress.rate, eta],
        [short, eta],
        [short],
        [],
    ):
        note = [progress.note] if progress.note else []
        line = "  ".join([part for part in parts if part] + note)
        if len(line) <= width:
            return line
    return progress.note[: max(width - 1, 0)] + "…"


class Display:
    """Writes progress to `stream`: redraws one line on a terminal, else prints lines."""

    def __init__(
        self, stream: TextIO, *, tty: bool, width: Callable[[], int] = lambda: 100
    ) -> None:
        self.stream = stream
        self.tty = tty
        self.width = width  # read at every redraw: a resized terminal is followed
        self._drawn = 0  # length of the terminal line drawn last
        self._printed_at: float | None = None  # run clock of the last plain line
        self._last_plain = ""

    def show(self, progress: Progress, now: float) -> None:
        if self.tty:
            self._draw(bar_line(progress, max(self.width() - 1, 20)))
            return
        self._last_plain = plain_line(progress)
        if self._printed_at is None or now - self._printed_at >= PLAIN_EVERY_SECONDS:
            self._print(self._last_plain)
            self._printed_at = now

    def message(self, text: str) -> None:
        """A line of its own (kept above the progress line on a terminal)."""
        self._end_line()
        self._print(text)

    def finish(self) -> None:
        """End the progress: the terminal line stays; off a terminal, the last state is
        printed if it was not."""
        if not self.tty and self._last_plain:
            self._print(self._last_plain)
            self._last_plain = ""
        self._end_line()

    def _end_line(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = 0

    def _draw(self, line: str) -> None:
        # Pad over the rest of a longer previous line rather than rely on escape codes.
        self.stream.write("\r" + line + " " * max(self._drawn - len(line), 0))
        self.stream.flush()
        self._drawn = len(line)

    def _print(self, line: str) -> None:
        if line == self._last_plain:
            self._last_plain = ""  # printed: `finish` need not repeat it
        self.stream.write(line + "\n")
        self.stream.flush()
