#!/usr/bin/env bash
# The test suite beside a busy machine (issue 19): BUSY processes spin on the CPUs while
# pytest runs RUNS times; the spinners are stopped however the runs end. A test that
# passes alone and fails here waits on the wall clock's luck instead of on its event.
#
#   scripts/test-busy.sh                      3 runs of the whole suite beside $(nproc) spinners
#   BUSY=4 RUNS=1 scripts/test-busy.sh tests/integration -x
#
# Extra arguments go to pytest. Exits non-zero if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

busy=${BUSY:-$(nproc)}
runs=${RUNS:-3}
pytest=${PYTEST:-.venv/bin/pytest}

spinners=()
stop_spinners() {
  for pid in "${spinners[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true  # reaped: nothing of them is left
  done
}
trap stop_spinners EXIT
trap 'exit 130' INT TERM

for ((i = 0; i < busy; i++)); do
  (while :; do :; done) &
  spinners+=("$!")
done
echo "== spinning: ${spinners[*]}"

failed=()
for ((run = 1; run <= runs; run++)); do
  echo "== run $run of $runs beside $busy busy processes"
  if ! "$pytest" -q "$@"; then
    failed+=("$run")
  fi
done

if ((${#failed[@]})); then
  echo "== failed: run(s) ${failed[*]} of $runs" >&2
  exit 1
fi
echo "== all $runs runs passed beside $busy busy processes"
