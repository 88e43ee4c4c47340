"""Run the benches and print one table with PASS/FAIL against each target of issue 7.

    python -m bench.run                 # everything (what `make bench` runs)
    python -m bench.run --only memory   # one bench (comma-separated for several)

Raw numbers go to bench/results/<bench>.json, the table to bench/results/table.md.
Targets are checked on medians of repeated runs (the machines are noisy). A FAIL
makes the exit status 1, so `make bench` fails loudly too.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from bench import (
    audit,
    coldstart,
    events,
    history,
    lane,
    memory,
    migrate,
    overhead,
    sweep,
    transfer,
)
from bench.common import (
    RESULTS,
    Row,
    as_dict,
    command_for,
    machine,
    revision,
    write_results,
)
from bench.services import Services

TIME_BUDGET_SECONDS = 600
NEEDS_SERVICES: dict[str, Callable[[Services], list[Row]]] = {
    "memory": memory.run,
    "transfer": transfer.run,
    "overhead": overhead.run,
    "events": events.run,
    "sweep": sweep.run,
    "lane": lane.run,
    "migrate": migrate.run,
    "history": history.run,
    "audit": audit.run,
}
ORDER = ("coldstart", *NEEDS_SERVICES)


def render(rows: list[Row], header: str) -> str:
    lines = [
        header,
        "",
        "| # | what | measured (medians) | target | result |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.point} | {r.what} | {r.measured} | {r.target} | {r.verdict} |" for r in rows]
    lines += ["", "Commands (from the repository root):", ""]
    seen: list[str] = []
    for row in rows:
        if row.command not in seen:
            seen.append(row.command)
            lines.append(f"- point {row.point}: `{row.command}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--only", default=",".join(ORDER), help=f"comma-separated: {ORDER}")
    args = parser.parse_args(argv)
    selected = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(selected) - set(ORDER))
    if unknown:
        parser.error(f"unknown bench {unknown}; choose from {ORDER}")

    started = time.monotonic()
    rows: list[Row] = []
    seconds: dict[str, float] = {}  # each bench's own time, for the whole run's budget

    def timed(name: str, bench: Callable[[], list[Row]]) -> list[Row]:
        print(f"{name} ...", flush=True)
        began = time.monotonic()
        try:
            return bench()
        except Exception as error:  # noqa: BLE001 - one bench's failure is one FAIL row
            # The other benches still run, and the table is still written: a run of
            # three quarters of an hour is not lost to one bench on a loaded machine.
            return [Row("-", f"{name} stopped", f"{type(error).__name__}: {error}"[:300],
                        "runs to its end", False, command_for(name))]  # fmt: skip
        finally:
            seconds[name] = round(time.monotonic() - began, 1)

    if "coldstart" in selected:
        rows += timed("coldstart", coldstart.run)
    wanted = [name for name in NEEDS_SERVICES if name in selected]
    if wanted:
        began = time.monotonic()
        with Services() as services:
            seconds["services"] = round(time.monotonic() - began, 1)
            for name in wanted:
                rows += timed(name, lambda run=NEEDS_SERVICES[name]: run(services))
    elapsed = time.monotonic() - started
    if selected == list(ORDER):
        rows.append(
            Row(
                "6",
                "whole bench run (`make bench`)",
                f"{elapsed:.0f} s",
                f"< {TIME_BUDGET_SECONDS} s",
                elapsed < TIME_BUDGET_SECONDS,
                "make bench",
            )
        )
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    commit = revision()
    header = f"Benchmarks, {when}, at {commit}, {machine()}"
    table = render(rows, header)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "table.md").write_text(table, encoding="utf-8")
    write_results(
        "summary",
        {
            "machine": machine(),
            "commit": commit,
            "seconds": elapsed,
            "bench_seconds": seconds,
            "rows": [as_dict(r) for r in rows],
        },
    )
    print()
    print(table)
    print("seconds:", ", ".join(f"{name} {value:.0f}" for name, value in seconds.items()))
    return 1 if any(row.ok is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
