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

The 10 MB pairings (loopback and limited) have one side more: the handler keeping the
image's original in the originals bucket (moto's S3, in the parent process), against the
handler side without it, interleaved in the same process (lib.archive.originals: the
worker's collaborator switched on and off). It records, per archive, how long the write
took and how long the record waited for it after Lsky's answer: where the time goes.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from bench.child import child_main, run_child
from bench.common import MB, Row, command_for, median, ms, ratio, write_results
from bench.services import LINK_BYTES_PER_SEC, ORIGINALS_ENV, TINY, TINY_BYTES, Services

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
# Keeping the original may add this much to the 10 MB archive (loopback and limited links).
ORIGINAL_TARGET_RATIO = 1.05


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


# The two S3s an original is kept in, the first the target's: `bench.remote_s3` (S3 as a
# remote peer costs this machine: the body received) and moto's (S3's own work in Python on
# the bench's CPUs, beside the provider, Lsky and the function).
S3S = ("remote", "moto")


def _against(kept: Any, url: str) -> Any:
    """`kept` (lib.archive.originals.Originals) with its bucket's client sending to `url`."""
    from lib.archive.originals import Originals  # noqa: PLC0415

    bucket = copy.copy(kept.bucket)
    bucket.__dict__.pop("client", None)  # functools.cached_property: built again below
    before = os.environ.get("AWS_ENDPOINT_URL_S3")
    os.environ["AWS_ENDPOINT_URL_S3"] = url  # what boto3 reads when the client is built
    try:
        bucket.client  # noqa: B018 - built now, against url
    finally:
        if before is None:
            del os.environ["AWS_ENDPOINT_URL_S3"]
        else:
            os.environ["AWS_ENDPOINT_URL_S3"] = before
    return Originals(bucket)


class _OriginalsSide:
    """Keeping the original switched on (in one S3 of S3S) and off in this container's
    worker, each write timed: from its start to S3's answer, from its body's last byte to
    S3's answer, and the record's wait for it after Lsky's answer."""

    def __init__(self, remote_url: str) -> None:
        from lib.archive import originals, runtime  # noqa: PLC0415
        from lib.platform import s3_body  # noqa: PLC0415

        self.step = runtime.archive_worker().transfer.original
        moto = self.step.originals
        self.on = {"remote": _against(moto, remote_url), "moto": moto}
        self.off = originals.Originals(None)
        self.timings: dict[str, dict[str, list[float]]] = {
            s3: {
                "write_s": [],
                "write_cpu_s": [],  # its thread's CPU
                "after_body_s": [],
                "wait_s": [],
                "tail_cpu_s": [],  # the process's CPU after the handler returned, to S3's answer
            }
            for s3 in S3S
        }
        self.current = S3S[0]
        self.pending: list[Any] = []  # writes whose S3 answer may still be coming
        keeping_class: Any = originals.Keeping
        body_class: Any = s3_body.StreamedBody
        real_init, real_kept = keeping_class.__init__, keeping_class.kept
        real_read = body_class.read

        def read(body: Any, size: int = -1) -> bytes:
            data: bytes = real_read(body, size)
            if body._cut.sent and not hasattr(body._cut, "sent_at"):
                body._cut.sent_at = time.perf_counter()
            return data

        pending = self.pending

        def init(keeping: Any, record_id: int, key: str, write: Any, unconfirmed: Any) -> None:
            began, timings = time.perf_counter(), self.timings[self.current]
            pending.append(keeping)

            def timed(cut: Any) -> Any:
                cpu_began = time.thread_time()
                try:
                    return write(cut)
                finally:
                    ended = time.perf_counter()
                    timings["write_cpu_s"].append(time.thread_time() - cpu_began)
                    timings["write_s"].append(ended - began)
                    if hasattr(cut, "sent_at"):
                        timings["after_body_s"].append(ended - cut.sent_at)

            real_init(keeping, record_id, key, timed, unconfirmed)

        def kept(keeping: Any, wait: float, later: Any = None) -> Any:
            began = time.perf_counter()
            try:
                return real_kept(keeping, wait, later)
            finally:
                self.timings[self.current]["wait_s"].append(time.perf_counter() - began)

        keeping_class.__init__ = init
        keeping_class.kept = kept
        body_class.read = read
        self.step.originals = self.off

    @classmethod
    def of(cls, remote_url: str | None) -> _OriginalsSide | None:
        """None: not wanted (no URL), or the code under test keeps no originals (or its
        environment names no bucket)."""
        try:
            from lib.archive import original_step  # noqa: PLC0415, F401
        except ImportError:
            return None
        side = cls(remote_url) if remote_url else None
        return side if side is not None and side.on["moto"].enabled else None

    def timed(self, s3: str, run: Callable[[], float]) -> float:
        self.current, self.step.originals = s3, self.on[s3]
        try:
            return run()
        finally:
            self.step.originals = self.off
            started = time.process_time()
            self.settle()
            self.timings[s3]["tail_cpu_s"].append(time.process_time() - started)

    def forget(self) -> None:
        for timings in self.timings.values():
            for values in timings.values():
                values.clear()

    def settle(self) -> None:
        """Wait for the writes still waiting for S3's answer (the record did not): outside
        the archive's time, its CPU counted (tail_cpu_s), so the next side does not share
        the CPUs with this one's tail."""
        while self.pending:
            self.pending.pop()._writing.exception()


def _keeping(
    side: _OriginalsSide,
    s3: str,
    handler: Callable[..., float],
    ids: list[int],
    into: dict[str, list[float]],
) -> None:
    into[s3].append(side.timed(s3, lambda: handler(ids.pop(), counted=False, side=s3)))


def _tiny_pairs(
    archive: Callable[[int], object], plain: Callable[[], float], tiny_ids: list[int]
) -> tuple[list[float], list[float]]:
    """A 200-byte image's archive and its plain GET + POST, alternating which goes first."""
    tiny_plain: list[float] = []
    tiny_handler: list[float] = []
    for index, record_id in enumerate(tiny_ids):  # counting is off
        if index % 2:
            tiny_plain.append(plain())
        started = time.perf_counter()
        archive(record_id)
        tiny_handler.append(time.perf_counter() - started)
        if not index % 2:
            tiny_plain.append(plain())
    return tiny_plain, tiny_handler


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

    cpu: dict[str, list[float]] = {"handler": [], **{s3: [] for s3 in S3S}}  # all threads

    def handler(
        record_id: int, *, hashed: bool = True, counted: bool = True, side: str = ""
    ) -> float:
        with hashing(hashed) if hashing else contextlib.nullcontext():
            counting(hashed and counted)
            started, cpu_started = time.perf_counter(), time.process_time()
            archive(record_id)
            elapsed = time.perf_counter() - started
            counting(False)
        if side:
            cpu[side].append(time.process_time() - cpu_started)
        return elapsed

    ids: list[int] = list(args["record_ids"])
    archive(args["tiny_id"])  # builds the worker, which the originals' side switches
    originals = _OriginalsSide.of(args["remote_s3_url"])
    for s3 in S3S if originals is not None else ():  # a warm container's S3 clients, boto3
        originals.timed(s3, lambda: handler(ids.pop()))
    client.archive(args["tiny_url"])
    plain()
    handler(ids.pop(), hashed=False)
    requests.clear()  # count the measured first attempts only
    if originals is not None:
        originals.forget()
    runs = 0
    plain_s: list[float] = []
    handler_s: list[float] = []
    unhashed_s: list[float] = []
    original_s: dict[str, list[float]] = {s3: [] for s3 in S3S}
    unhashed_side = hashing is not None and args["unhashed_side"]
    for index in range(args["pairs"]):
        sides: list[Callable[[], None]] = [
            lambda: plain_s.append(plain()),
            lambda: handler_s.append(handler(ids.pop(), side="handler")),
        ]
        if unhashed_side:
            sides.append(lambda: unhashed_s.append(handler(ids.pop(), hashed=False)))
        for s3 in S3S if originals is not None else ():
            sides.append(functools.partial(_keeping, originals, s3, handler, ids, original_s))
        shift = index % len(sides)  # rotate which side goes first
        for run in sides[shift:] + sides[:shift]:
            run()
        runs += 1
    tiny_plain, tiny_handler = _tiny_pairs(
        archive, lambda: plain(args["tiny_url"], args["tiny_bytes"]), args["tiny_ids"]
    )
    return {
        "plain": plain_s,
        "handler": handler_s,
        "handler_without_hashing": unhashed_s,
        "handler_keeping_the_original": original_s,
        "cpu_s": cpu,
        "original_timings": originals.timings if originals is not None else {},
        "warm_ups": 1 + len(S3S) * (originals is not None),
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
    original_side: bool = False,
    tiny_pairs: int = 0,
) -> dict[str, Any]:
    """One pairing in a fresh child: its raw result, with the medians and ratios."""
    upstream = upstream or services.upstream_url
    lsky = lsky or services.lsky_url
    tiny_id = services.seed(TINY, upstream=upstream)[0]
    kept_sides = len(S3S) * original_side  # each with a warm-up
    archives = 1 + unhashed_side + kept_sides  # handler sides a round
    record_ids = services.seed(path, archives * pairs + 1 + kept_sides, upstream=upstream)
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
        "remote_s3_url": services.remote_s3() if original_side else None,
    }
    env = services.handler_env(LSKY_BASE_URL=lsky, **(ORIGINALS_ENV if original_side else {}))
    s3_before, remote_before = len(services.originals_requests()), services.remote_s3_puts()
    cpu_before = time.process_time()  # this process runs nothing but moto's server meanwhile
    result = run_child("bench.transfer", args, env, log_name=name)
    result["moto_cpu_s"] = time.process_time() - cpu_before
    result["originals_requests"] = services.originals_requests()[s3_before:]
    result["remote_s3_puts"] = services.remote_s3_puts() - remote_before
    statuses = services.statuses([tiny_id, *record_ids, *tiny_ids])
    used = 1 + result["warm_ups"] + len(result["handler"]) + len(result["handler_without_hashing"])
    used += len(result["tiny_handler"])
    used += sum(len(kept) for kept in result["handler_keeping_the_original"].values())
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


def _original_rows(result: dict[str, Any], where: str) -> list[Row]:
    """Keeping the original against the handler without it (same child, interleaved), and
    where its time went, in each S3 of S3S; none when the code under test keeps no
    originals. The target is the remote peer's: moto's S3 shares the bench's CPUs."""
    rows: list[Row] = []
    for s3 in S3S:
        kept = result["handler_keeping_the_original"].get(s3) or []
        if kept:
            rows += _original_pair(result, s3, kept, where)
    return rows


def _original_pair(result: dict[str, Any], s3: str, kept: list[float], where: str) -> list[Row]:
    without = result["handler"]
    value = ratio(median(kept), median(without))
    paired = median([k / h for k, h in zip(kept, without, strict=True)])
    timings = result["original_timings"][s3]
    if s3 == "moto":
        which, target = "moto's S3 on the same CPUs", None
        calls = result["originals_requests"]
        methods = ", ".join(sorted({method for method, _ in calls}))
        moto_cpu = result["moto_cpu_s"] / max(len(calls), 1)
        requests = f"moto's CPU {ms(moto_cpu)} an original; {len(calls)} S3 requests ({methods})"
    else:
        which, target = "S3 a remote peer (bench.remote_s3)", ORIGINAL_TARGET_RATIO
        requests = f"{result['remote_s3_puts']} PUTs"
    # The function's CPU with it: the handler's, and its write's after the handler returned.
    tails = timings.get("tail_cpu_s") or [0.0] * len(result["cpu_s"][s3])
    with_cpu = [c + t for c, t in zip(result["cpu_s"][s3], tails, strict=False)]
    return [
        Row(
            "2",
            f"keeping the original: the 10 MB archive with vs without it, {where}, {which}",
            f"{ms(median(kept))} vs {ms(median(without))} = {value:.2f} x (paired median "
            f"{paired:.2f} x); the record's wait for it after Lsky's answer "
            f"{ms(median(timings['wait_s']))} (max {ms(max(timings['wait_s']))})",
            "reported" if target is None else f"<= {target} x",
            None if target is None else value <= target,
            command_for("transfer"),
        ),
        Row(
            "2",
            f"where keeping the original's time goes, {where}, {which}",
            f"its PUT {ms(median(timings['write_s']))} ({ms(median(timings['write_cpu_s']))} "
            "of its thread's CPU), S3's answer "
            f"{ms(median(timings['after_body_s']))} after the body's last byte; the function's "
            f"CPU an archive {ms(median(with_cpu))} with it ({ms(median(tails))} of it after "
            f"the handler returned), {ms(median(result['cpu_s']['handler']))} without; "
            f"{requests} for {len(kept) + 1} originals",
            "reported",
            None,
            command_for("transfer"),
        ),
    ]


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
        original_side=True,
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
    rows += _original_rows(result, "loopback")
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
            original_side=size == IMAGE_BYTES,
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
        rows += _original_rows(result, f"provider and Lsky each behind {rate} (S3 on loopback)")
    return rows


if __name__ == "__main__":
    child_main(measure)
