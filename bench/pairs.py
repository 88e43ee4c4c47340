"""Two trees' handlers against one set of services, interleaved, for a change too small to
see from one sitting to the next (docs/performance.md, "The loopback rows"):

    python -m bench.pairs /path/to/tree-a /path/to/tree-b [--rounds 10] [--per 12]

Each round runs a fresh child per tree (the order alternating round by round); a child
archives `--per` records of the image with that tree's `src/` (BENCH_SRC), each archive
paired with bench.transfer's yardstick (a plain GET then POST) in the same child, sides
alternating. Prints, per tree, the median of the paired ratios (handler / plain) and the
medians of each side. The harness (this file, bench.plain) is this checkout's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.child import child_main, run_child
from bench.services import Services


def measure(args: dict[str, Any]) -> dict[str, list[float]]:
    from bench.lambda_call import archive  # noqa: PLC0415
    from bench.plain import PlainClient  # noqa: PLC0415

    client = PlainClient(args["lsky_url"])
    ids: list[int] = list(args["record_ids"])
    archive(ids.pop())  # warm: the database connection, the pools, Powertools
    client.archive(args["image_url"])
    handler: list[float] = []
    plain: list[float] = []

    def one_archive() -> None:
        started = time.perf_counter()
        archive(ids.pop())
        handler.append(time.perf_counter() - started)

    def one_plain() -> None:
        started = time.perf_counter()
        data = client.download(args["image_url"])
        got = time.perf_counter() - started
        body, content_type = client.body(data)  # not timed, as in bench.transfer
        started = time.perf_counter()
        client.upload(body, content_type)
        plain.append(got + time.perf_counter() - started)

    for index in range(len(ids)):
        sides = (one_archive, one_plain) if index % 2 else (one_plain, one_archive)
        for side in sides:
            side()
    return {"handler": handler, "plain": plain}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pairs", description=__doc__)
    parser.add_argument("trees", nargs=2, help="two checkouts (each with its src/)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per", type=int, default=12, help="pairs per child")
    parser.add_argument("--image", default="/img-10mb.png", help="a bench.services route")
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {tree: [] for tree in args.trees}
    sides: dict[str, dict[str, list[float]]] = {t: {"handler": [], "plain": []} for t in args.trees}
    with Services() as services:
        for round_ in range(args.rounds):
            order = args.trees if round_ % 2 == 0 else args.trees[::-1]
            for tree in order:
                child = {
                    "record_ids": services.seed(args.image, args.per + 1),
                    "image_url": services.upstream_url + args.image,
                    "lsky_url": services.lsky_url,
                }
                env = services.handler_env(LSKY_BASE_URL=services.lsky_url)
                env["BENCH_SRC"] = f"{tree}/src"
                got = run_child("bench.pairs", child, env, log_name="pairs")
                ratios[tree] += [h / p for h, p in zip(got["handler"], got["plain"], strict=True)]
                for side in ("handler", "plain"):
                    sides[tree][side] += got[side]
    for tree in args.trees:
        handler_ms = statistics.median(sides[tree]["handler"]) * 1000
        plain_ms = statistics.median(sides[tree]["plain"]) * 1000
        print(
            f"{tree}: paired median {statistics.median(ratios[tree]):.3f} x over "
            f"{len(ratios[tree])} pairs (handler {handler_ms:.1f} ms, plain {plain_ms:.1f} ms)"
        )


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1].endswith(".json"):  # a child of run_child
        child_main(measure)
    else:
        main()
