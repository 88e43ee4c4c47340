"""The redactor's cost, two trees side by side (docs/performance.md, "The redactor"):

    python -m bench.redaction /path/to/tree-a /path/to/tree-b [--rounds 10]

`lib.platform.redact` runs on every text an archive keeps: each field and key of every
event detail (`bounded_detail`), archive_error, the lane's pause detail. Each round runs a
fresh child per tree (the order alternating round by round); a child times, with that
tree's `src/` (BENCH_SRC), `outside_text` over a corpus of the texts an archive's story
holds (mostly short words and URLs, a few errors, one signed URL and one echoed token),
`bounded_detail` over the details of one archive's events, and the slowest of a few
hostile texts. Prints, per tree, the medians in microseconds and the ratio of the second
tree to the first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from bench.child import child_main, run_child

# What an archive's events carry (lib.archive.story), and the texts a failure adds.
TEXTS = (
    "image/png",
    "provider",
    "archive function",
    "plFOv8",
    "d41d8cd98f00b204e9800998ecf8427e",
    "alice_1_20240501T101500Z.png",
    "https://img.example.com/i/2024/05/01/663208e6c1d2a.png",
    "the record's name, stored after its first claim, the sha1 of the bytes sent",
    "download failed (HTTP 503): upstream answered HTTP 503 for "
    "https://cdn.example.com/gen/5.png [attempt 1/3]",
    "upload failed (HTTP 200): Lsky answered status false: 每分钟内你最多可以上传 20 张图片 "
    "[attempt 2/3]",
    'connection to server at "db.internal" (10.0.3.7), port 5432 failed: FATAL: '
    "remaining connection slots are reserved for non-replication superuser connections",
    "download failed: timed out after 20.0 s reading https://cdn.example.com/gen/77.png?"
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F20240501%2Fus-east-1"
    "&X-Amz-Signature=0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e",
    "upload failed (HTTP 401): Lsky answered HTTP 401: Unauthenticated. "
    "(sent Authorization: Bearer 5|DAdvTokQ9rXs8Lm2PzWq)",
)
DETAILS: tuple[dict[str, Any], ...] = (
    {"by": "producer", "inferred": True},
    {"message_id": "7e9bad63-4dd7-4e7e-b584-ad046072f392", "receive_count": 1},
    {"owner": "23549d93-31f0-459d-b265-21b02322c7d7/7e9bad63-4dd7-4e7e-b584-ad046072f392"},
    {"source": "provider", "bytes": 20_512, "type": "image/png", "seconds": 0.012},
    {"status": 200, "key": "plFOv8", "bytes": 20_512, "seconds": 0.031},
    {"url": "https://img.example.com/i/2024/05/01/663208e6c1d2a.png", "key": "plFOv8"},
)
# Hostile texts of 20,000 characters (a host's answer is redacted before it is cut): each
# is the worst case of one pattern, where a regex that backtracks goes quadratic.
HOSTILE = {
    "token" * 4_000: "a secret word repeated",
    "1" * 20_000 + "|": "digits before a pipe",
    "a1" * 10_000 + "@": "letters and digits before an @",
    '"password": "' + "\\x" * 10_000: "an unclosed quoted value",
    "https://a" * 2_222 + "?q": "schemes before a query",
}
LOOPS = 500  # calls per timing; each child takes the median of REPEATS timings
REPEATS = 7


def measure(args: dict[str, Any]) -> dict[str, float]:
    from lib.platform.redact import outside_text  # noqa: PLC0415
    from lib.state.events import bounded_detail  # noqa: PLC0415

    def per_call(work: Any, items: int) -> float:
        timings = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            for _ in range(LOOPS):
                work()
            timings.append((time.perf_counter() - started) / (LOOPS * items) * 1e6)
        return statistics.median(timings)

    def texts() -> None:
        for text in TEXTS:
            outside_text(text, 300)

    def details() -> None:
        for detail in DETAILS:
            bounded_detail(detail)

    def hostile() -> float:
        worst = 0.0
        for text in HOSTILE:
            started = time.perf_counter()
            outside_text(text, 300)
            worst = max(worst, time.perf_counter() - started)
        return worst * 1e6

    texts(), details()  # warm: the patterns compiled, the caches filled
    return {
        "text_us": per_call(texts, len(TEXTS)),
        "archive_details_us": per_call(details, 1),
        "worst_hostile_us": statistics.median(hostile() for _ in range(3)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redaction", description=__doc__)
    parser.add_argument("trees", nargs=2, help="two checkouts (each with its src/)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    got: dict[str, dict[str, list[float]]] = {tree: {} for tree in args.trees}
    for round_ in range(args.rounds):
        for tree in args.trees if round_ % 2 == 0 else args.trees[::-1]:
            env = {**os.environ, "BENCH_SRC": f"{tree}/src"}
            for key, value in run_child("bench.redaction", {}, env, log_name="redaction").items():
                got[tree].setdefault(key, []).append(value)
    first, second = args.trees
    for key in got[first]:
        a, b = statistics.median(got[first][key]), statistics.median(got[second][key])
        print(f"{key:<20} {first}: {a:.2f} µs  {second}: {b:.2f} µs  ratio {b / a:.2f} x")


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1].endswith(".json"):
        child_main(measure)
    else:
        main()
