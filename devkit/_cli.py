"""Shared bits of the `python -m devkit.*` entry points."""

from __future__ import annotations

import signal
import sys


def exit_cleanly_on_signals() -> None:
    """Make SIGTERM and SIGINT unwind normally, so `finally`/`with` clean up.

    SIGTERM (kill, a Makefile) becomes SystemExit. SIGINT is re-armed because a
    non-interactive shell starts background jobs with it ignored.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
