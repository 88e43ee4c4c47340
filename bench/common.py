"""Shared bench plumbing: result rows, raw-number files, medians, process memory."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The code under test. BENCH_SRC points the benches at another tree's src/ (e.g. a
# `git archive` of main) to measure before and after in one sitting.
SRC = Path(os.environ.get("BENCH_SRC") or ROOT / "src").resolve()
RESULTS = ROOT / "bench" / "results"
MB = 1_000_000
MIB = 1024 * 1024


@dataclass(frozen=True)
class Row:
    """One line of the final table."""

    point: str  # "1", "2a", ...
    what: str
    measured: str
    target: str
    ok: bool | None  # None: reported, no target
    command: str

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "info"}[self.ok]


def command_for(only: str) -> str:
    return f".venv/bin/python -m bench.run --only {only}"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()


def commit() -> str:
    """The checkout's commit (and whether it had changes), for the raw numbers."""
    try:
        head, dirty = _git("rev-parse", "--short", "HEAD"), _git("status", "--porcelain", "-uno")
    except OSError:
        return "unknown"
    return f"{head or 'unknown'}{' (with changes)' if dirty else ''}"


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Raw numbers of one bench, for anyone who wants more than the table: when, on
    which commit and machine."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "bench": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": commit(),
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("inf")


def mb(value: float) -> str:
    return f"{value / MB:.1f} MB"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# -- process memory (Linux /proc; no psutil) ---------------------------------------------


def _status() -> dict[str, int]:
    """VmRSS/VmHWM etc. of this process, in bytes."""
    values: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.startswith("Vm") and rest.strip().endswith("kB"):
            values[name] = int(rest.split()[0]) * 1024
    return values


def rss() -> int:
    return _status()["VmRSS"]


def peak_rss() -> int:
    return _status()["VmHWM"]


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS ("5" > clear_refs, Linux >= 4.0).

    Without it the peak would include whatever the warm-up touched; callers fall
    back to the (larger, so conservative) process-lifetime peak when this fails.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return (
        f"{platform.system()} {platform.release()} {platform.machine()}, {cpu}, "
        f"{os.cpu_count()} CPUs, {mem_kb / 1024 / 1024:.0f} GiB RAM, "
        f"Python {sys.version.split()[0]}"
    )


def revision() -> str:
    """The commit measured (`-dirty` with uncommitted changes), for bench/results/: the
    docs carry the figures and the machine, the results file when and on what."""

    def git(*args: str) -> str:
        root = Path(__file__).resolve().parents[1]
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def as_dict(row: Row) -> dict[str, Any]:
    return {**asdict(row), "verdict": row.verdict}
