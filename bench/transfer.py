"""Point 2: archiving a 10 MB image on loopback vs a plain download + plain upload.

One fresh process, warmed up (a tiny archive and a 10 MB one on each side), then
`reps` pairs in alternating order:

- plain:   urllib3 GET of the image into bytes, then a POST of a multipart body built
           from those bytes; only the two requests are timed (building the body is
           not), so the yardstick is as fast as urllib3 on this machine gets;
- handler: `lambda_handler` on an SQS event for a record with the same image, timed
           whole: claim, transfer, recording the result, Powertools logging/metrics.

So the database part is INCLUDED on the handler side only (two statements on a warm
connection), which makes the comparison stricter, not looser. No SQS call happens on
either side (the happy path does not call SQS; the event is synthetic).
"""

from __future__ import annotations

import time
from typing import Any

from bench.child import child_main, run_child
from bench.common import MB, Row, command_for, median, ms, ratio, write_results
from bench.services import TINY, Services

IMAGE_PATH = "/img-10mb.png"
IMAGE_BYTES = 10 * MB
TARGET_RATIO = 1.15


def measure(args: dict[str, Any]) -> dict[str, Any]:
    from bench.lambda_call import archive  # noqa: PLC0415
    from bench.plain import PlainClient  # noqa: PLC0415

    client = PlainClient(args["lsky_url"])

    def plain() -> float:
        started = time.perf_counter()
        data = client.download(args["image_url"])
        got = time.perf_counter() - started
        if len(data) != IMAGE_BYTES:
            raise RuntimeError(f"plain download got {len(data)} bytes")
        body, content_type = client.body(data)
        started = time.perf_counter()
        client.upload(body, content_type)
        return got + time.perf_counter() - started

    def handler(record_id: int) -> float:
        started = time.perf_counter()
        archive(record_id)
        return time.perf_counter() - started

    ids: list[int] = list(args["record_ids"])
    archive(args["tiny_id"])
    client.archive(args["tiny_url"])
    plain()
    handler(ids.pop())
    plain_s, handler_s = [], []
    for index, record_id in enumerate(ids):
        if index % 2:
            handler_s.append(handler(record_id))
            plain_s.append(plain())
        else:
            plain_s.append(plain())
            handler_s.append(handler(record_id))
    return {"plain": plain_s, "handler": handler_s}


def run(services: Services, reps: int = 21) -> list[Row]:
    tiny_id = services.seed(TINY)[0]
    record_ids = services.seed(IMAGE_PATH, reps + 1)
    args = {
        "tiny_id": tiny_id,
        "record_ids": record_ids,
        "tiny_url": services.image_url(TINY),
        "image_url": services.image_url(IMAGE_PATH),
        "lsky_url": services.lsky_url,
    }
    result = run_child("bench.transfer", args, services.handler_env(), log_name="transfer")
    statuses = services.statuses([tiny_id, *record_ids])
    if statuses != {"SUCCEEDED": reps + 2}:
        raise RuntimeError(f"transfer: not every archive succeeded: {statuses}")
    plain, handler = median(result["plain"]), median(result["handler"])
    paired = median([h / p for h, p in zip(result["handler"], result["plain"], strict=True)])
    value = ratio(handler, plain)
    write_results(
        "transfer",
        {
            "image_bytes": IMAGE_BYTES,
            "reps": reps,
            "median_plain_s": plain,
            "median_handler_s": handler,
            "ratio_of_medians": value,
            "median_of_paired_ratios": paired,
            **result,
        },
    )
    return [
        Row(
            "2",
            "10 MB archive (whole handler) vs plain GET + POST",
            f"{ms(handler)} vs {ms(plain)} = {value:.2f} x (paired median {paired:.2f} x)",
            f"<= {TARGET_RATIO} x",
            value <= TARGET_RATIO,
            command_for("transfer"),
        )
    ]


if __name__ == "__main__":
    child_main(measure)
