"""Point 2: archiving an image vs a plain download then a plain upload.

Four pairings, each in a fresh process warmed up (a tiny archive and a big one on each
side): 10 MB and 50 MB images on plain loopback, and 10 MB and 50 MB images with the
provider and Lsky each behind a link of the same limited rate
(bench.services.LINK_BYTES_PER_SEC), as two remote hosts are. Each runs `reps` pairs
in alternating order:

- plain:   urllib3 GET of the image into bytes, then a POST of a multipart body built
           from those bytes; only the two requests are timed (building the body is
           not), so the yardstick is as fast as urllib3 on this machine gets;
- handler: `lambda_handler` on an SQS event for a record with the same image, timed
           whole: claim, transfer, recording the result, Powertools logging/metrics.

So the database part is INCLUDED on the handler side only (two statements on a warm
connection), which makes the comparison stricter, not looser. No SQS call happens on
either side (the happy path does not call SQS; the event is synthetic).

The plain yardstick downloads, then uploads; the handler's upload reads the download as
it lands (lib.transfer.relay). On limited links the least it can take is the slower
link's time: half the yardstick's when both run at one rate.

On loopback, a third side, interleaved with the two, runs the handler with the sha1 of
the fidelity check switched off (lib.transfer.held.Digests.update only counting), which
prices the hashing in the same process; every request the handler sends to Lsky is
counted; and the same pairing with a 200-byte image (TINY_PAIRS, after the big ones)
prices the handler's own part, which no transfer hides: the claim, the success write,
the logs, a fresh connection to the provider.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from bench.child import child_main, run_child
from bench.common import MB, Row, command_for, median, ms, ratio, write_results
from bench.services import LINK_BYTES_PER_SEC, TINY, TINY_BYTES, Services

IMAGE_PATH = "/img-10mb.png"
IMAGE_BYTES = 10 * MB
TARGET_RATIO = 1.0
HASHING_TARGET_RATIO = 1.05
# Limited links: (label, path, size, pairs). Both links at one rate, the least the handler
# can take is half the yardstick's (one link's time, not two).
LIMITED = (
    ("10 MB", "/img-10mb.png", 10 * MB, 11),
    ("50 MB", "/img-50mb.png", 50 * MB, 5),
)
LIMITED_TARGET_RATIO = 0.65
# The larger image on plain loopback too: (label, path, size, pairs).
LOOPBACK_LARGE = ("50 MB", "/img-50mb.png", 50 * MB, 7)
# Pairs of a 200-byte image's archive vs its plain GET + POST (loopback): the handler's own part.
TINY_PAIRS = 21
# What a first attempt sent to Lsky before issue 13: one POST /api/v1/upload.
REQUESTS_BEFORE = 1


def _count_lsky_requests(base_url: str) -> tuple[Counter[str], Callable[[bool], None]]:
    """Count `METHOD /path` of every urllib3 request to Lsky while switched on."""
    import urllib3  # noqa: PLC0415

    seen: Counter[str] = Counter()
    active = [False]
    original = urllib3.PoolManager.urlopen

    def counting(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if active[0] and url.startswith(base_url):
            seen[f"{method} {urlsplit(url).path}"] += 1
        return original(self, method, url, *args, **kwargs)

    urllib3.PoolManager.urlopen = counting  # type: ignore[method-assign]

    def switch(on: bool) -> None:
        active[0] = on

    return seen, switch


def _hashing_switch() -> Callable[[bool], contextlib.AbstractContextManager[None]] | None:
    """Turn the fidelity hashing off and on (None: the code under test has none)."""
    try:
        from lib.transfer import held  # noqa: PLC0415
    except ImportError:
        return None
    real = held.Digests.update

    def count_only(self: Any, chunk: bytes) -> None:
        self.size += len(chunk)

    @contextlib.contextmanager
    def hashing(on: bool) -> Iterator[None]:
        held.Digests.update = real if on else count_only  # type: ignore[method-assign]
        try:
            yield
        finally:
            held.Digests.update = real  # type: ignore[method-assign]

    return hashing


def _hashing_cpu_seconds() -> float | None:
    """The hashing alone: what the happy path takes (sha1) over 10 MB in 256 KiB chunks,
    median of 5."""
    try:
        from lib.transfer.held import Digests  # noqa: PLC0415
    except ImportError:
        return None
    chunk = bytes(range(256)) * 1024
    times = []
    for _ in range(5):
        digest = Digests()
        started = time.process_time()
        for _ in range(IMAGE_BYTES // len(chunk)):
            digest.update(chunk)
        times.append(time.process_time() - started)
    return statistics.median(times)


def measure(args: dict[str, Any]) -> dict[str, Any]:
    from bench.lambda_call import archive  # noqa: PLC0415
    from bench.plain import PlainClient  # noqa: PLC0415

    client = PlainClient(args["lsky_url"])
    requests, counting = _count_lsky_requests(args["lsky_url"])
    hashing = _hashing_switch()

    def plain(url: str = args["image_url"], size: int = args["image_bytes"]) -> float:
        started = time.perf_counter()
        data = client.download(url)
        got = time.perf_counter() - started
        if len(data) != size:
            raise RuntimeError(f"plain download got {len(data)} bytes")
        body, content_type = client.body(data)
        started = time.perf_counter()
        client.upload(body, content_type)
        return got + time.perf_counter() - started

    def handler(record_id: int, *, hashed: bool = True) -> float:
        with hashing(hashed) if hashing else contextlib.nullcontext():
            counting(hashed)
            started = time.perf_counter()
            archive(record_id)
            elapsed = time.perf_counter() - started
            counting(False)
        return elapsed

    ids: list[int] = list(args["record_ids"])
    archive(args["tiny_id"])
    client.archive(args["tiny_url"])
    plain()
    handler(ids.pop(), hashed=False)
    requests.clear()  # count the measured first attempts only
    runs = 0
    plain_s: list[float] = []
    handler_s: list[float] = []
    unhashed_s: list[float] = []
    unhashed_side = hashing is not None and args["unhashed_side"]
    for index in range(args["pairs"]):
        sides: list[Callable[[], None]] = [
            lambda: plain_s.append(plain()),
            lambda: handler_s.append(handler(ids.pop())),
        ]
        if unhashed_side:
            sides.append(lambda: unhashed_s.append(handler(ids.pop(), hashed=False)))
        shift = index % len(sides)  # rotate which side goes first
        for side in sides[shift:] + sides[:shift]:
            side()
        runs += 1
    tiny_plain: list[float] = []
    tiny_handler: list[float] = []
    for index, record_id in enumerate(args["tiny_ids"]):  # counting is off
        if index % 2:
            tiny_plain.append(plain(args["tiny_url"], args["tiny_bytes"]))
        started = time.perf_counter()
        archive(record_id)
        tiny_handler.append(time.perf_counter() - started)
        if not index % 2:
            tiny_plain.append(plain(args["tiny_url"], args["tiny_bytes"]))
    return {
        "plain": plain_s,
        "handler": handler_s,
        "handler_without_hashing": unhashed_s,
        "lsky_requests": dict(requests),
        "first_attempts_counted": runs,
        "hashing_cpu_s": _hashing_cpu_seconds(),
        "tiny_plain": tiny_plain,
        "tiny_handler": tiny_handler,
    }


def _pairing(
    services: Services,
    *,
    path: str,
    size: int,
    pairs: int,
    name: str,
    upstream: str | None = None,
    lsky: str | None = None,
    unhashed_side: bool = False,
    tiny_pairs: int = 0,
) -> dict[str, Any]:
    """One pairing in a fresh child: its raw result, with the medians and ratios."""
    upstream = upstream or services.upstream_url
    lsky = lsky or services.lsky_url
    tiny_id = services.seed(TINY, upstream=upstream)[0]
    archives = 2 if unhashed_side else 1  # handler sides a round; one warm-up more
    record_ids = services.seed(path, archives * pairs + 1, upstream=upstream)
    tiny_ids = services.seed(TINY, tiny_pairs, upstream=upstream) if tiny_pairs else []
    args = {
        "tiny_id": tiny_id,
        "record_ids": record_ids,
        "tiny_url": upstream + TINY,
        "tiny_bytes": TINY_BYTES,
        "tiny_ids": tiny_ids,
        "image_url": upstream + path,
        "image_bytes": size,
        "lsky_url": lsky,
        "pairs": pairs,
        "unhashed_side": unhashed_side,
    }
    env = services.handler_env(LSKY_BASE_URL=lsky)
    result = run_child("bench.transfer", args, env, log_name=name)
    statuses = services.statuses([tiny_id, *record_ids, *tiny_ids])
    used = 1 + 1 + len(result["handler"]) + len(result["handler_without_hashing"])
    used += len(result["tiny_handler"])
    if statuses.get("SUCCEEDED") != used:
        raise RuntimeError(f"{name}: not every archive succeeded: {statuses}")
    plain, handler = median(result["plain"]), median(result["handler"])
    paired = median([h / p for h, p in zip(result["handler"], result["plain"], strict=True)])
    value = ratio(handler, plain)
    summary = {
        "image_bytes": size,
        "pairs": pairs,
        "median_plain_s": plain,
        "median_handler_s": handler,
        "ratio_of_medians": value,
        "median_of_paired_ratios": paired,
    }
    write_results(name, {**summary, **result})
    return {**summary, **result}


def _measured(result: dict[str, Any]) -> str:
    return (
        f"{ms(result['median_handler_s'])} vs {ms(result['median_plain_s'])} = "
        f"{result['ratio_of_medians']:.2f} x (paired median "
        f"{result['median_of_paired_ratios']:.2f} x)"
    )


def _own_part(result: dict[str, Any]) -> Row:
    """The handler's own part: what a tiny image's archive takes beyond its plain GET +
    POST; and the 10 MB ratio with that part taken off (what the transfer alone comes to)."""
    tiny_handler, tiny_plain = median(result["tiny_handler"]), median(result["tiny_plain"])
    own = tiny_handler - tiny_plain
    transfer_only = ratio(result["median_handler_s"] - own, result["median_plain_s"])
    return Row(
        "2",
        "the handler's own part: a 200-byte image's archive (whole handler) vs plain GET + "
        "POST, loopback",
        f"{ms(tiny_handler)} vs {ms(tiny_plain)}: {ms(own)} of its own; the 10 MB archive "
        f"less that part {transfer_only:.2f} x the plain GET + POST",
        "reported",
        None,
        command_for("transfer"),
    )


def run(services: Services, reps: int = 41) -> list[Row]:
    result = _pairing(
        services,
        path=IMAGE_PATH,
        size=IMAGE_BYTES,
        pairs=reps,
        name="transfer",
        unhashed_side=True,
        tiny_pairs=TINY_PAIRS,
    )
    handler, value = result["median_handler_s"], result["ratio_of_medians"]
    rows = [
        Row(
            "2",
            "10 MB archive (whole handler) vs plain GET + POST, loopback",
            _measured(result),
            f"<= {TARGET_RATIO} x",
            value <= TARGET_RATIO,
            command_for("transfer"),
        )
    ]
    unhashed = result["handler_without_hashing"]
    if unhashed:
        without = median(unhashed)
        cost = ratio(handler, without)
        paired_cost = median([h / u for h, u in zip(result["handler"], unhashed, strict=True)])
        cpu = result["hashing_cpu_s"]
        rows.append(
            Row(
                "2",
                "sha1 as the bytes pass: the 10 MB archive with vs without hashing",
                f"{ms(handler)} vs {ms(without)} = {cost:.2f} x (paired median "
                f"{paired_cost:.2f} x); the hashing alone {ms(cpu)} CPU",
                f"<= {HASHING_TARGET_RATIO} x",
                cost <= HASHING_TARGET_RATIO,
                command_for("transfer"),
            )
        )
    rows.append(_own_part(result))
    counted = result["lsky_requests"]
    per_attempt = sum(counted.values()) / max(result["first_attempts_counted"], 1)
    detail = ", ".join(f"{name} {count}" for name, count in sorted(counted.items()))
    rows.append(
        Row(
            "2",
            "requests to Lsky per first attempt (counted)",
            f"{per_attempt:g} ({detail} over {result['first_attempts_counted']} archives)",
            f"<= {REQUESTS_BEFORE} (before issue 13: {REQUESTS_BEFORE})",
            per_attempt <= REQUESTS_BEFORE,
            command_for("transfer"),
        )
    )
    label, path, size, pairs = LOOPBACK_LARGE
    result = _pairing(
        services, path=path, size=size, pairs=pairs, name=f"transfer-loopback-{size // MB}mb"
    )
    value = result["ratio_of_medians"]
    rows.append(
        Row(
            "2",
            f"{label} archive (whole handler) vs plain GET + POST, loopback",
            _measured(result),
            f"<= {TARGET_RATIO} x",
            value <= TARGET_RATIO,
            command_for("transfer"),
        )
    )
    limited = services.limited()
    rate = f"{LINK_BYTES_PER_SEC / MB:g} MB/s"
    for label, path, size, pairs in LIMITED:
        result = _pairing(
            services,
            path=path,
            size=size,
            pairs=pairs,
            name=f"transfer-limited-{size // MB}mb",
            upstream=limited.upstream_url,
            lsky=limited.lsky_url,
        )
        value = result["ratio_of_medians"]
        rows.append(
            Row(
                "2",
                f"{label} archive vs plain GET + POST, provider and Lsky each behind {rate}",
                _measured(result),
                f"<= {LIMITED_TARGET_RATIO} x (the least: 0.5 x)",
                value <= LIMITED_TARGET_RATIO,
                command_for("transfer"),
            )
        )
    return rows


if __name__ == "__main__":
    child_main(measure)
