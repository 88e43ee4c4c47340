"""Running one measurement in a fresh process (peak RSS and imports are per process).

The parent calls `run_child("bench.memory", {...}, env)`; the child module ends with
`if __name__ == "__main__": child_main(measure)`. Arguments and the result travel as
JSON files: the child's stdout belongs to the handler (Powertools logs and EMF metrics
go there), and is kept in bench/results/logs/ for when something fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, SRC

CHILD_TIMEOUT_SECONDS = 300


class ChildFailed(RuntimeError):
    pass


def run_child(module: str, args: dict[str, Any], env: dict[str, str], *, log_name: str) -> Any:
    logs = RESULTS / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{log_name}.log"
    with tempfile.TemporaryDirectory(prefix="bench-child-") as tmp:
        args_path, out_path = Path(tmp) / "args.json", Path(tmp) / "out.json"
        args_path.write_text(json.dumps(args), encoding="utf-8")
        with log_path.open("w", encoding="utf-8") as log:
            completed = subprocess.run(
                [sys.executable, "-m", module, str(args_path), str(out_path)],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=CHILD_TIMEOUT_SECONDS,
                check=False,
            )
        if completed.returncode != 0 or not out_path.exists():
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise ChildFailed(f"{module} exited {completed.returncode}; log {log_path}:\n{tail}")
        return json.loads(out_path.read_text(encoding="utf-8"))


def _use_code_under_test() -> None:
    """Make `lib` and `handlers` come from SRC (BENCH_SRC may point at another tree).

    `import devkit` puts this checkout's src/ first on sys.path, and devkit.postgres
    imports lib.platform.schema, so by now `lib` may be this checkout's: put SRC first and
    forget the modules that came from elsewhere, before `measure` imports the handler.
    """
    src = str(SRC)
    if src in sys.path:
        sys.path.remove(src)
    sys.path.insert(0, src)
    for name in list(sys.modules):
        if name.partition(".")[0] in ("lib", "handlers"):
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if not origin.startswith(src):
                del sys.modules[name]


def child_main(measure: Callable[[dict[str, Any]], Any]) -> None:
    _use_code_under_test()
    args_path, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    result = measure(json.loads(args_path.read_text(encoding="utf-8")))
    out_path.write_text(json.dumps(result), encoding="utf-8")
