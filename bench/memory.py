"""Point 1: peak RSS growth while archiving a 50 MB image, against a naive version.

Every measurement is a fresh process (VmHWM is per process). In it: import and warm
up (one tiny archive: DB connection, HTTP pools, Powertools), collect garbage, reset
the peak (clear_refs), read the baseline RSS, archive the big image, read the peak.
growth = peak - baseline. Four variants, interleaved over the repetitions:

- streamed: the handler, upstream sends a Content-Length: the relayed copy (the spool
            fills from a thread while the upload reads it as it lands);
- spooled:  the handler, upstream sends no Content-Length (chunked; spooled to /tmp,
            then uploaded);
- staged:   the handler with the upload lane paused, no Content-Length: the image is
            captured into the staging bucket (moto's S3) instead (lib.archive.staging);
- kept:     streamed, with its original kept beside the upload (moto's S3 again,
            lib.archive.originals): the issue's bound is 0.05 x image plus a part buffer;
- naive:    plain urllib3 GET into bytes, multipart body in memory, POST (bench.plain).

The handler variants run the whole handler (claim, transfer, record); the naive one is
the transfer alone; the database part holds no image bytes either way.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from bench.child import child_main, run_child
from bench.common import MB, Row, command_for, mb, median, ratio, write_results
from bench.services import ORIGINALS_ENV, TINY, Services

IMAGE_BYTES = 50 * MB
TARGET_FRACTION = 0.3
# Keeping the original: a twentieth of the image plus one multipart part's buffer.
KEPT_FRACTION = 0.05
PART_BYTES = 5 * 1024 * 1024  # lib.platform.s3.PART_BYTES (the parent imports nothing of it)
VARIANTS = {
    "streamed": "/img-50mb.png",
    "spooled": "/img-50mb-chunked.png",
    "staged": "/img-50mb-chunked.png",
    "kept": "/img-50mb.png",
    "naive": "/img-50mb.png",
}
MEASURED = ("streamed", "spooled", "staged", "kept")
WHAT = {
    "streamed": "relayed (with a Content-Length)",
    "spooled": "held (no Content-Length)",
    "staged": "staged to S3 while the lane is paused (no Content-Length)",
    "kept": "relayed, its original kept beside the upload (moto's S3)",
}


def measure(args: dict[str, Any]) -> dict[str, Any]:
    """In the child: warm up, then archive one big image and report the peak growth."""
    from bench import common  # noqa: PLC0415 - the child imports what it measures

    if args["variant"] == "naive":
        from bench.plain import PlainClient  # noqa: PLC0415

        client = PlainClient(args["lsky_url"])
        client.archive(args["tiny_url"])

        def work() -> None:
            client.archive(args["image_url"])

    else:
        from bench.lambda_call import archive  # noqa: PLC0415

        archive(args["tiny_id"])

        def work() -> None:
            archive(args["record_id"])

    gc.collect()
    reset = common.reset_peak_rss()
    baseline = common.rss() if reset else common.peak_rss()
    started = time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    peak = common.peak_rss()
    return {
        "baseline": baseline,
        "peak": peak,
        "growth": peak - baseline,
        "seconds": seconds,
        "peak_reset": reset,
    }


def run(services: Services, reps: int = 5) -> list[Row]:
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for rep in range(reps):
        # Rotate the order so no variant always runs first (page cache, disk, drift).
        names = list(VARIANTS)
        names = names[rep % len(names) :] + names[: rep % len(names)]
        for name in names:
            path = VARIANTS[name]
            tiny_id, record_id = services.seed(TINY)[0], services.seed(path)[0]
            args = {
                "variant": name,
                "tiny_id": tiny_id,
                "record_id": record_id,
                "tiny_url": services.image_url(TINY),
                "image_url": services.image_url(path),
                "lsky_url": services.lsky_url,
            }
            if name == "staged":
                services.pause_lane()  # both records are captured (and parked), not uploaded
            env = services.handler_env(**(ORIGINALS_ENV if name == "kept" else {}))
            try:
                result = run_child("bench.memory", args, env, log_name=f"memory-{name}-{rep}")
            finally:
                services.open_lane()
            if name == "staged":
                if services.staged([tiny_id, record_id]) != 2:
                    raise RuntimeError("memory/staged: the images were not staged")
            elif name != "naive":
                statuses = services.statuses([tiny_id, record_id])
                if statuses != {"SUCCEEDED": 2}:
                    raise RuntimeError(f"memory/{name}: archive did not succeed: {statuses}")
            if name == "kept" and services.originals_kept([tiny_id, record_id]) != 2:
                raise RuntimeError("memory/kept: the originals were not kept")
            samples[name].append(result)

    growth = {name: median([s["growth"] for s in runs]) for name, runs in samples.items()}
    limit = TARGET_FRACTION * IMAGE_BYTES
    write_results(
        "memory",
        {
            "image_bytes": IMAGE_BYTES,
            "reps": reps,
            "median_growth": growth,
            "limit": limit,
            "samples": samples,
        },
    )
    command = command_for("memory")
    rows = []
    kept_limit = KEPT_FRACTION * IMAGE_BYTES + PART_BYTES
    for name in MEASURED:
        worst = max(s["growth"] for s in samples[name])
        bound = kept_limit if name == "kept" else limit
        target = (
            f"<= {KEPT_FRACTION} x image + a 5 MiB part ({mb(kept_limit)})"
            if name == "kept"
            else f"<= {TARGET_FRACTION} x image ({mb(limit)})"
        )
        rows.append(
            Row(
                "1",
                f"peak RSS growth, 50 MB image, {WHAT[name]}",
                f"{mb(growth[name])} = {growth[name] / IMAGE_BYTES:.3f} x image "
                f"(max {mb(worst)}); {ratio(growth[name], growth['naive']):.3f} x naive",
                target,
                growth[name] <= bound,
                command,
            )
        )
    rows.append(
        Row(
            "1",
            "peak RSS growth, 50 MB image, naive whole-image version",
            f"{mb(growth['naive'])} = {growth['naive'] / IMAGE_BYTES:.2f} x image",
            "reference",
            None,
            command,
        )
    )
    return rows


if __name__ == "__main__":
    child_main(measure)
