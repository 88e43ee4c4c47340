"""Point 4: import time of `handlers.archive` against `import boto3` alone.

Each figure is `python -X importtime -c "import X"` in a fresh process: the cumulative
microseconds Python reports for the top-level module. The bytecode cache is warm but
private (PYTHONPYCACHEPREFIX in a temp dir, filled by one unmeasured run of each), as in
the deployed package, which `sam build` byte-compiles (mk/lambda/Makefile); the repo's
own `make` exports PYTHONDONTWRITEBYTECODE, so without this src/ would be compiled from
source on every run and the figure would depend on what ran before. Runs alternate
between the two imports; the medians are compared.

Also checked: which heavy modules `import handlers.archive` leaves in sys.modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from typing import Any

from bench.common import ROOT, SRC, Row, command_for, median, ms, ratio, write_results
from bench.services import python_env

TARGET_RATIO = 1.5
HEAVY = ("boto3", "botocore.session", "botocore.client", "s3transfer", "aws_xray_sdk", "moto")


def import_seconds(module: str, env: dict[str, str]) -> float:
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    for line in completed.stderr.splitlines():
        parts = line.split("|")
        # "import time: self | cumulative | name"; the top-level import has no indent.
        if len(parts) == 3 and parts[2].rstrip() == f" {module}":
            return int(parts[1]) / 1e6
    raise RuntimeError(f"no importtime line for {module}:\n{completed.stderr[-1000:]}")


def biggest_imports(env: dict[str, str], limit_s: float = 0.005) -> dict[str, float]:
    """What `import handlers.archive` spends its time on: modules over `limit_s`, cumulative."""
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import handlers.archive"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, float] = {}
    for line in completed.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            seconds = int(parts[1]) / 1e6
            if seconds >= limit_s:
                found[parts[2].rstrip()] = seconds
    return found


def heavy_modules(env: dict[str, str]) -> list[str]:
    probe = (
        "import json, sys, handlers.archive; "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    found: list[str] = json.loads(completed.stdout)
    return found


def run(reps: int = 15) -> list[Row]:
    modules = ("handlers.archive", "boto3")
    samples: dict[str, list[float]] = {m: [] for m in modules}
    with tempfile.TemporaryDirectory(prefix="bench-pycache-") as cache:
        env = python_env({"PYTHONPYCACHEPREFIX": cache, "POWERTOOLS_TRACE_DISABLED": "true"})
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for module in modules:
            import_seconds(module, env)  # fills the private bytecode cache
        for rep in range(reps):
            for module in modules if rep % 2 == 0 else reversed(modules):
                samples[module].append(import_seconds(module, env))
        heavy = heavy_modules(env)
        biggest = biggest_imports(env)
    archive, boto3 = median(samples["handlers.archive"]), median(samples["boto3"])
    value = ratio(archive, boto3)
    details: dict[str, Any] = {
        "reps": reps,
        "samples_s": samples,
        "median_s": {"handlers.archive": archive, "boto3": boto3},
        "ratio": value,
        "heavy_modules_loaded": heavy,
        "src": str(SRC),
        "imports_over_5ms_s": biggest,
    }
    write_results("coldstart", details)
    return [
        Row(
            "4",
            "import handlers.archive vs import boto3 (-X importtime)",
            f"{ms(archive)} vs {ms(boto3)} = {value:.2f} x; "
            f"heavy modules loaded: {', '.join(heavy) or 'none'}",
            f"<= {TARGET_RATIO} x, no boto3/X-Ray",
            value <= TARGET_RATIO and not heavy,
            command_for("coldstart"),
        )
    ]
