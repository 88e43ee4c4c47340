"""Point 7: the host-aware lane draining a rate-limited burst, as `make local` runs it.

A burst of records is seeded and all its messages are sent at once to a moto SQS queue.
devkit's event source (Lambda's SQS event source mapping: BatchSize 1, MaximumConcurrency
= the number of containers) feeds two archive containers (the handler, each in a process
of its own, the template's 120 s timeout) that copy a tiny image from the upstream to a
Lsky stand-in whose sliding-window limiter refuses uploads as Lsky 2.x does
("每分钟内你最多可以上传 N 张图片"; `window_scale` sets how long its "minute" lasts).

Two runs, each in a fresh child process (which holds the stand-in and the event source;
the containers are its children), with the lane row cleared before each, with the
benches' environment (staging on: a moto S3 bucket):

- paced: LSKY_RATE_LIMITS describes Lsky's limit ("10/20 seconds" for a "minute" of
  20 s): the worker takes a slot in the lane's ledger for each upload, or books the next
  one and holds its message until then (it sleeps only for a slot a moment away);
- two windows, slow source: Lsky counts a "minute" of 10 s and an "hour" of 60 s (4 and
  14 uploads), LSKY_RATE_LIMITS says the same, and every download takes SLOW_SECONDS, a
  third of a 30 s function's budget (the two containers alone would upload 4 per 10 s):
  pacing must neither spend an attempt nor eat the transfer's time;
- unpaced: LSKY_RATE_LIMITS empty, Lsky's refusal is the only signal. Our rules read
  分钟 as 60 s, and the bench patches nothing in the service, so this run uses a real
  minute (a smaller burst); it is reported without a target.

Measured: the drain time, from the send to the last row's archived_at (the database's
clock, the same machine's); invocations per record (deliveries counted by the event
source's callback; BatchSize 1); the waiting share (seconds slept for a slot, from the
"archive started" log lines, over the billed seconds of every invocation); attempts
spent; Lsky's refusals and the most uploads it stored in any window. The theoretical
minimum is `greedy_schedule` under Lsky's limits (its windows, without our margin) and
the two containers, plus one transfer: the median time
from "archive started" to "archive succeeded" in the handler's logs, in the same run.
One run each (a drain lasts a minute); when the paced drain misses its target, the
per-upload timeline against the ideal schedule is printed (and is in lane.json).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.child import child_main, run_child
from bench.common import RESULTS, Row, command_for, ratio, write_results
from bench.services import GONE, SLOW, TINY, Services

TARGET_DRAIN_RATIO = 1.05
TARGET_INVOCATIONS_PER_RECORD = 1.2
TARGET_WAITING_SHARE = 0.05
CONTAINERS = 2  # MaximumConcurrency (template.yaml's ArchiveConcurrency default)
FUNCTION_TIMEOUT_SECONDS = 120  # template.yaml
DRAIN_TIMEOUT_SECONDS = 240


@dataclass(frozen=True)
class Scenario:
    name: str
    records: int
    windows: tuple[tuple[str, float, int], ...]  # Lsky: (its window name, seconds, limit)
    pacing: str  # LSKY_RATE_LIMITS ("" = off)
    target: str  # "drain" (drain time, waiting), "slow" (attempts, invocations), "" (none)
    source: str = TINY  # the upstream route
    timeout: int = FUNCTION_TIMEOUT_SECONDS  # the archive function's, as the template sets
    gone: float = 0.0  # the share of records whose source answers 403 (FAILED at once)
    adopted: float = 0.0  # the share an earlier attempt stored on Lsky (adopted, no upload)

    @property
    def slug(self) -> str:
        """The name in a file or queue name: `paced-some-sources-gone-some-adopted`."""
        return "-".join(self.name.replace(",", "").split())[:40]

    @property
    def limits(self) -> list[tuple[float, int]]:
        return [(seconds, limit) for _, seconds, limit in self.windows]


PACED = Scenario("paced", 40, (("minute", 20.0, 10),), pacing="10/20 seconds", target="drain")
# A download takes SLOW_SECONDS, a third of what a 30 s function has after its 15 s
# finish reserve: pacing must leave the transfer its time.
TWO_WINDOWS = Scenario(
    "two windows, slow source",
    16,
    (("minute", 10.0, 4), ("hour", 60.0, 14)),
    pacing="4/10 seconds, 14/60 seconds",
    target="slow",
    source=SLOW,
    timeout=30,
)
UNPACED = Scenario("unpaced", 20, (("minute", 60.0, 10),), pacing="", target="")
# Some records never upload: a fifth of the sources are gone, a tenth of the images were
# stored by an earlier attempt whose answer was lost. The rest drain at the limiter's pace.
SOME_GONE = Scenario(
    "paced, some sources gone, some adopted",
    50,
    (("minute", 20.0, 10),),
    pacing="10/20 seconds",
    target="drain",
    gone=0.2,
    adopted=0.1,
)
SCENARIOS = (PACED, SOME_GONE, TWO_WINDOWS, UNPACED)


def greedy_schedule(
    count: int,
    limits: Sequence[tuple[float, int]],
    *,
    concurrency: int | None = None,
    transfer: float = 0.0,
    start: float = 0.0,
) -> list[float]:
    """The earliest start of each of `count` uploads, all ready at 0, when every sliding
    window (seconds, uploads) may hold at most `uploads` of them and at most `concurrency`
    transfers of `transfer` seconds run at once. Greedy is optimal here: the i-th upload
    can start no earlier than the (i-limit)-th has left the window, nor than the
    (i-concurrency)-th plus a transfer. Lsky dates an upload in whole seconds of its clock
    and counts both ends of a window, so an upload leaves it when its second plus the
    window plus one begins: `start` is the wall-clock time of 0 (the clock's seconds)."""
    starts: list[float] = []
    for i in range(count):
        earliest = 0.0
        for seconds, limit in limits:
            if i >= limit:
                leaves = math.floor(start + starts[i - limit]) + seconds + 1 - start
                earliest = max(earliest, leaves)
        if concurrency is not None and i >= concurrency:
            earliest = max(earliest, starts[i - concurrency] + transfer)
        starts.append(earliest)
    return starts


def theoretical_drain(
    count: int,
    limits: Sequence[tuple[float, int]],
    *,
    concurrency: int,
    transfer: float,
    start: float = 0.0,
) -> float:
    """Seconds from the burst to the end of its last transfer, at best."""
    starts = greedy_schedule(count, limits, concurrency=concurrency, transfer=transfer, start=start)
    return (starts[-1] if starts else 0.0) + transfer


# -- the child: services of one run, containers, the burst ---------------------------------


def _log_time(entry: dict[str, Any]) -> float | None:
    """A Powertools log line's timestamp, as time.time()."""
    text = entry.get("timestamp")
    if not isinstance(text, str):
        return None
    with contextlib.suppress(ValueError):
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f%z").timestamp()
    return None


def _transfer_seconds(logs: list[dict[str, Any]]) -> float | None:
    """From "archive started" (after the pacing slot) to "archive succeeded"."""
    started = next((e for e in logs if e.get("message") == "archive started"), None)
    done = next((e for e in logs if e.get("message") == "archive succeeded"), None)
    if started is None or done is None:
        return None
    begin, end = _log_time(started), _log_time(done)
    return None if begin is None or end is None else end - begin


def _slot_wait(logs: list[dict[str, Any]]) -> float:
    """Seconds the invocation slept for an upload slot ("archive started")."""
    started = next((e for e in logs if e.get("message") == "archive started"), None)
    return float(started.get("slot_wait_seconds") or 0.0) if started else 0.0


def _clear_lane(db: Any) -> None:
    """A fresh lane: no pause, an empty ledger (other benches' uploads are logged too)."""
    db.run(
        "UPDATE image_archive_lane SET paused_until = NULL, pause_reason = NULL, "
        "pause_window = NULL, pause_detail = NULL, paused_since = NULL, "
        "version = version + 1 WHERE lane = 'lsky'"
    )
    db.run("DELETE FROM image_archive_uploads")
    db.run("DELETE FROM image_archive_upload_hours")


# -- the take's time against a month of ledger ----------------------------------------------

# Lsky's default group limits (config/convention.php), as an operator would pace them.
DEFAULT_LIMITS = "20/minute,100/hour,300/day,600/week,999/month"
TAKE_SAMPLES = 101
TARGET_TAKE_MS = 20.0


def fill_month(db: Any) -> None:
    """The ledger as a month paced at Lsky's default limits leaves it, every window short
    of its limit by a few uploads (so a take writes a slot): 80 uploads in each of the last
    two hours (exact rows, one every 45 s), the day's other 90, the week's other 300 and the
    month's other 349 rolled up into hourly counts."""
    db.run("DELETE FROM image_archive_uploads")
    db.run("DELETE FROM image_archive_upload_hours")
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, record_id, state)"
        " SELECT 'lsky', now() - g * interval '45 seconds', NULL, 'done'"
        " FROM generate_series(1, 159) AS g"
    )
    spread = [(2, 24, 90), (24, 7 * 24, 300), (7 * 24, 31 * 24, 349)]
    for first, last, uploads in spread:
        hours = last - first
        db.run(
            "INSERT INTO image_archive_upload_hours (lane, hour, uploads, backfill_uploads)"
            " SELECT 'lsky', date_trunc('hour', now()) - g * interval '1 hour',"
            " CAST(:uploads AS int) / CAST(:hours AS int)"
            " + CASE WHEN g - :first < CAST(:uploads AS int) % CAST(:hours AS int)"
            " THEN 1 ELSE 0 END, 0"
            " FROM generate_series(CAST(:first AS int), CAST(:last AS int) - 1) AS g",
            uploads=uploads,
            hours=hours,
            first=first,
            last=last,
        )


def measure_take(args: dict[str, Any]) -> dict[str, Any]:
    """Median time of LaneStore.take_slot (a fresh record: read, decide, write) against a
    month of ledger at Lsky's default limits; each take's booking is removed, untimed."""
    from devkit.postgres import connect  # noqa: PLC0415
    from lib.archive import pacing  # noqa: PLC0415
    from lib.platform.config import DatabaseConfig  # noqa: PLC0415
    from lib.platform.db import Database  # noqa: PLC0415
    from lib.platform.env_values import rate_limits  # noqa: PLC0415
    from lib.ratelimit import margins  # noqa: PLC0415
    from lib.state.lane_store import LaneStore  # noqa: PLC0415

    db = connect(args["dsn"])
    _clear_lane(db)
    fill_month(db)
    limits = rate_limits({"LSKY_RATE_LIMITS": DEFAULT_LIMITS})
    store = LaneStore(Database(DatabaseConfig(url=args["dsn"]), application_name="bench-take"))
    samples: list[float] = []
    answers: Counter[str] = Counter()
    for n in range(TAKE_SAMPLES + 1):
        record_id = 10_000_000 + n
        began = time.perf_counter()
        slot = store.take_slot(
            record_id,
            limits=limits,
            margin=margins.slot_margin(limits),
            tolerance=margins.slot_tolerance(limits),
            stale=pacing.BOOKING_STALE_SECONDS,
            book_within=pacing.BOOK_WITHIN_SECONDS,
            sleep_within=pacing.SLEEP_LIMIT_SECONDS,
            lead=0.5,
            upload=0.2,
        )
        elapsed = time.perf_counter() - began
        if n:  # the first take prepares the statements
            samples.append(elapsed)
        answers[str(slot.answer)] += 1
        db.run("DELETE FROM image_archive_uploads WHERE record_id = :id", id=record_id)
    [[rows]] = db.run("SELECT count(*) FROM image_archive_uploads")
    [[hours]] = db.run("SELECT count(*) FROM image_archive_upload_hours")
    store.db.close()
    db.close()
    return {
        "median_ms": statistics.median(samples) * 1000,
        "p90_ms": sorted(samples)[int(len(samples) * 0.9)] * 1000,
        "answers": dict(answers),
        "ledger_rows": int(rows),
        "hour_rows": int(hours),
    }


def take_row(services: Services, command: str) -> tuple[Row, dict[str, Any]]:
    result = run_child(
        "bench.lane",
        {"mode": "take", "dsn": services.dsn},
        services.handler_env(),
        log_name="lane-take",
    )
    measured = (
        f"median {result['median_ms']:.1f} ms, p90 {result['p90_ms']:.1f} ms over "
        f"{TAKE_SAMPLES} takes ({result['ledger_rows']} exact rows, {result['hour_rows']} "
        f"hourly counts; answers {result['answers']})"
    )
    row = Row(
        "7",
        f"lane: one upload slot (take_slot: read, decide, write) against a month of ledger at "
        f"Lsky's default limits ({DEFAULT_LIMITS})",
        measured,
        f"< {TARGET_TAKE_MS:.0f} ms",
        result["median_ms"] < TARGET_TAKE_MS,
        command,
    )
    return row, result


def _plant(db: Any, lsky: Any, record_ids: list[int]) -> None:
    """Each record's image on Lsky already, named as its upload would be: stored by an
    earlier attempt whose answer was lost, a minute ago (out of every window)."""
    import urllib3  # noqa: PLC0415

    from lib.archive.naming import hosted_file_stem  # noqa: PLC0415

    for record_id, url, started in db.run(
        "SELECT id, image_url, started_at FROM image_generation_records"
        " WHERE id = ANY(CAST(:ids AS bigint[]))",
        ids=record_ids,
    ):
        stem = hosted_file_stem(
            username="bench", user_id=1, record_id=record_id, started_at=started
        )
        image = urllib3.request("GET", url).data
        lsky.add_image(image, origin_name=f"{stem}.png", age=60.0)


def measure(args: dict[str, Any]) -> dict[str, Any]:  # noqa: PLR0915 - one linear story
    if args.get("mode") == "take":
        return measure_take(args)
    import os  # noqa: PLC0415

    import boto3  # noqa: PLC0415 - the child imports what it drives

    from devkit.containers import Container  # noqa: PLC0415
    from devkit.event_sources import Delivery, SqsEventSource  # noqa: PLC0415
    from devkit.lsky import LskyStandIn  # noqa: PLC0415
    from devkit.postgres import connect  # noqa: PLC0415
    from devkit.sqs import create_queue_pair  # noqa: PLC0415

    fields = args["scenario"]
    scenario = Scenario(**{**fields, "windows": tuple(tuple(w) for w in fields["windows"])})
    record_ids: list[int] = args["record_ids"]
    db = connect(args["dsn"])
    stack = contextlib.ExitStack()
    stack.callback(db.close)
    storage = Path(tempfile.mkdtemp(prefix="bench-lane-lsky-"))
    stack.callback(shutil.rmtree, storage, ignore_errors=True)
    lsky = stack.enter_context(
        LskyStandIn(
            storage_dir=storage,
            rate_limits={name: limit for name, _, limit in scenario.windows},
            window_scale={name: seconds for name, seconds, _ in scenario.windows},
        )
    )
    _plant(db, lsky, args.get("adopted", []))
    sqs = boto3.client("sqs")
    queues = create_queue_pair(
        sqs,
        f"bench-lane-{scenario.slug}-{int(time.time() * 1000)}",
        visibility_timeout=720,
    )
    env = {
        **os.environ,
        "LSKY_BASE_URL": lsky.base_url,
        "LSKY_TOKEN": lsky.token,
        "LSKY_RATE_LIMITS": scenario.pacing,
        "ARCHIVE_QUEUE_URL": queues.url,
        "ARCHIVE_DLQ_URL": queues.dlq_url,
        "DB_SSLMODE": "disable",
        "POWERTOOLS_LOG_LEVEL": "INFO",
    }
    logs = RESULTS / "logs"
    containers = [
        Container(
            f"archive-{n}",
            "handlers.archive:lambda_handler",
            env=env,
            log_path=logs / f"lane-{scenario.slug}-archive-{n}.log",
            function_name="ArchiveFunction",
            timeout_seconds=scenario.timeout,
        )
        for n in range(1, CONTAINERS + 1)
    ]
    for container in containers:
        container.log_path.unlink(missing_ok=True)
        stack.callback(container.stop)
        container.launch()  # the inits run in parallel
    for container in containers:
        container.wait_ready()

    deliveries: list[dict[str, Any]] = []
    lock = threading.Lock()
    t0 = 0.0

    def on_delivery(delivery: Delivery) -> None:
        invocation = delivery.invocation
        outcomes = [str(e["outcome"]) for e in invocation.logs if e.get("outcome")]
        with lock:
            deliveries.append(
                {
                    "at": round(time.monotonic() - t0, 3),
                    "container": delivery.container,
                    "records": len(delivery.event["Records"]),
                    "outcomes": outcomes,
                    "ms": invocation.duration_ms,
                    "error": invocation.error,
                    "transfer": _transfer_seconds(invocation.logs),
                    "slot_wait": _slot_wait(invocation.logs),
                    "receive_count": [
                        int(r["attributes"]["ApproximateReceiveCount"])
                        for r in delivery.event["Records"]
                    ],
                }
            )

    source = SqsEventSource(
        clients=[boto3.client("sqs") for _ in containers],
        queue=queues,
        containers=containers,
        on_delivery=on_delivery,
    )
    _clear_lane(db)
    stack.callback(source.stop)  # runs before the containers stop
    source.start()
    time.sleep(0.5)  # every poller is in its long poll
    bodies = [json.dumps({"recordId": str(i)}) for i in record_ids]
    sent_wall, t0 = time.time(), time.monotonic()
    for first in range(0, len(bodies), 10):
        sqs.send_message_batch(
            QueueUrl=queues.url,
            Entries=[
                {"Id": str(n), "MessageBody": body}
                for n, body in enumerate(bodies[first : first + 10])
            ],
        )
    sent_seconds = time.monotonic() - t0

    deadline = t0 + DRAIN_TIMEOUT_SECONDS
    concluded = False
    while time.monotonic() < deadline:
        [[done]] = db.run(
            "SELECT count(*) FROM image_generation_records "
            "WHERE id = ANY(CAST(:ids AS bigint[])) AND archive_status IN ('SUCCEEDED', 'FAILED')",
            ids=record_ids,
        )
        if done == len(record_ids) and source.in_flight == 0:
            concluded = True
            break
        time.sleep(0.2)
    observed = time.monotonic() - t0
    time.sleep(1.0)  # anything still coming (a stray redelivery) is counted too
    rows = db.run(
        "SELECT id, archive_status, archive_attempts, "
        "EXTRACT(EPOCH FROM archived_at) FROM image_generation_records "
        "WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY archived_at NULLS LAST",
        ids=record_ids,
    )
    stack.close()  # event source, containers, Lsky, the connection
    stored = [round(t - t0, 3) for t in lsky.stored_timestamps(include_planted=False)]
    with lock:
        delivered = list(deliveries)
    return {
        "scenario": asdict(scenario),
        "concluded": concluded,
        "observed_seconds": observed,
        "send_seconds": sent_seconds,
        "sent_wall": sent_wall,
        "archived_at": [
            round(float(at) - sent_wall, 3) if at is not None else None for *_, at in rows
        ],
        "archived_by_id": {
            str(record_id): round(float(at) - sent_wall, 3)
            for record_id, _, _, at in rows
            if at is not None
        },
        "statuses": dict(Counter(str(status) for _, status, _, _ in rows)),
        "attempts": dict(Counter(int(attempts) for _, _, attempts, _ in rows)),
        "deliveries": sorted(delivered, key=lambda d: d["at"]),
        "invocations": {c.name: c.invocations for c in containers},
        "source_errors": source.errors,
        "stored": stored,
        "upload_requests": lsky.upload_count,
        "rate_limited": lsky.rate_limited_count,
        "max_in_window": max(
            lsky.max_in_window(seconds) / limit for _, seconds, limit in scenario.windows
        ),
    }


# -- the parent -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    scenario: Scenario
    seconds: float  # send -> last archived_at
    theoretical: float
    transfer: float  # median, seconds
    invocations: int
    refusals: int
    max_in_window: float  # the fullest window, as a share of its limit
    result: dict[str, Any]

    @property
    def ratio(self) -> float:
        return ratio(self.seconds, self.theoretical)

    @property
    def per_record(self) -> float:
        return self.invocations / self.scenario.records

    @property
    def billed_seconds(self) -> float:
        return sum(d["ms"] or 0.0 for d in self.result["deliveries"]) / 1000

    @property
    def waiting_seconds(self) -> float:
        return sum(d["slot_wait"] for d in self.result["deliveries"])

    @property
    def waiting_share(self) -> float:
        return self.waiting_seconds / self.billed_seconds if self.billed_seconds else 0.0

    @property
    def extra_attempts(self) -> int:
        """Attempts beyond one per record: what pacing (or anything) spent."""
        return sum((int(n) - 1) * count for n, count in self.result["attempts"].items())


def timeline(drain: Drain) -> str:
    """Each stored upload beside its slot in the theoretical schedule (seconds from send)."""
    scenario = drain.scenario
    ideal = greedy_schedule(
        len(drain.result["stored"]),
        scenario.limits,
        concurrency=CONTAINERS,
        transfer=drain.transfer,
        start=drain.result["sent_wall"],
    )
    lines = [f"lane {scenario.name}: upload  stored(s)  ideal start(s)  late(s)"]
    for n, (stored, start) in enumerate(zip(drain.result["stored"], ideal, strict=False), 1):
        lines.append(f"  {n:3d}  {stored:8.2f}  {start:8.2f}  {stored - start:+7.2f}")
    return "\n".join(lines)


def seed(services: Services, scenario: Scenario) -> tuple[list[int], list[int], list[int]]:
    """The burst's records, interleaved: (all, gone, adopted). A gone one's source answers
    403; an adopted one's image is on Lsky already (planted by the child), its row marked
    as an earlier attempt whose answer was lost leaves it."""
    ids = services.seed(scenario.source, scenario.records)
    gone = ids[2 :: round(1 / scenario.gone)] if scenario.gone else []
    rest = [i for i in ids if i not in gone]
    count = round(scenario.records * scenario.adopted)
    adopted = rest[4 :: len(rest) // count][:count] if count else []
    services.db.run(
        "UPDATE image_generation_records SET image_url = :url"
        " WHERE id = ANY(CAST(:ids AS bigint[]))",
        url=services.image_url(GONE),
        ids=gone,
    )
    services.db.run(
        "UPDATE image_generation_records SET archive_may_be_hosted = true"
        " WHERE id = ANY(CAST(:ids AS bigint[]))",
        ids=adopted,
    )
    return ids, gone, adopted


def drain_once(services: Services, scenario: Scenario) -> Drain:
    services.start_moto()
    record_ids, gone, adopted = seed(services, scenario)
    args = {
        "scenario": asdict(scenario),
        "record_ids": record_ids,
        "dsn": services.dsn,
        "adopted": adopted,
    }
    env = services.handler_env()
    result = run_child("bench.lane", args, env, log_name=f"lane-{scenario.slug}")
    expected = {"SUCCEEDED": scenario.records - len(gone)} | ({"FAILED": len(gone)} if gone else {})
    if not result["concluded"] or result["statuses"] != expected:
        raise RuntimeError(
            f"lane {scenario.name}: the burst did not drain: {result['statuses']} "
            f"after {result['observed_seconds']:.0f} s (see bench/results/logs/lane-*.log)"
        )
    uploading = [i for i in record_ids if i not in gone and i not in adopted]
    transfers = [d["transfer"] for d in result["deliveries"] if d["transfer"] is not None]
    transfer = statistics.median(transfers)
    theoretical = theoretical_drain(
        len(uploading),
        scenario.limits,
        concurrency=CONTAINERS,
        transfer=transfer,
        start=result["sent_wall"],
    )
    drain = Drain(
        scenario=scenario,
        seconds=max(result["archived_by_id"][str(i)] for i in uploading),
        theoretical=theoretical,
        transfer=transfer,
        invocations=len(result["deliveries"]),
        refusals=int(result["rate_limited"]),
        max_in_window=float(result["max_in_window"]),
        result=result,
    )
    if scenario.target == "drain" and drain.ratio > TARGET_DRAIN_RATIO:
        print(timeline(drain), flush=True)
    return drain


def rows_for(drain: Drain, command: str) -> list[Row]:
    s = drain.scenario
    pacing = f"LSKY_RATE_LIMITS {s.pacing!r}" if s.pacing else "pacing off"
    windows = ", ".join(f"{limit} per {seconds:g} s" for _, seconds, limit in s.windows)
    slow = ", a slow source" if s.source != TINY else ""
    some = (
        f", {s.gone:.0%} of the sources gone (403), {s.adopted:.0%} of the images adopted"
        if s.gone or s.adopted
        else ""
    )
    setup = (
        f"{s.records} records at once{some}, Lsky {windows}, {pacing}{slow}, "
        f"{CONTAINERS} containers"
    )
    refusals = f"{drain.refusals} refusal{'s' * (drain.refusals != 1)}"
    drain_text = (
        f"{drain.seconds:.1f} s vs {drain.theoretical:.1f} s theoretical = {drain.ratio:.2f}x "
        f"({refusals}, fullest window {drain.max_in_window:.0%} of its limit)"
    )
    per_record = f"{drain.per_record:.2f} ({drain.invocations} for {s.records} records)"
    waiting = (
        f"{drain.waiting_share:.1%} ({drain.waiting_seconds:.2f} s slept for slots of "
        f"{drain.billed_seconds:.1f} s billed; "
        f"{drain.waiting_seconds / s.records:.3f} s a record)"
    )
    attempts = f"{drain.extra_attempts} attempts beyond one a record; {drain.result['statuses']}"
    name = f"lane, {s.name}"
    rows = [Row("7", f"{name}: drain time ({setup})", drain_text, "reported", None, command)]
    if s.target == "drain":
        rows = [
            Row(
                "7",
                f"{name}: drain time{' of the records that upload' if some else ''} "
                f"vs the limits' minimum{' for them' if some else ''} ({setup})",
                drain_text,
                f"<= {TARGET_DRAIN_RATIO}x, no refusal",
                drain.ratio <= TARGET_DRAIN_RATIO and drain.refusals == 0,
                command,
            ),
            Row(
                "7",
                f"{name}: billed time spent waiting for a slot",
                waiting,
                f"<= {TARGET_WAITING_SHARE:.0%}",
                drain.waiting_share <= TARGET_WAITING_SHARE,
                command,
            ),
            Row("7", f"{name}: invocations per record", per_record, "reported", None, command),
        ]
    elif s.target == "slow":
        rows += [
            Row(
                "7",
                f"{name}: attempts spent, records FAILED",
                attempts,
                "0 spent on pacing, 0 FAILED",
                drain.extra_attempts == 0 and "FAILED" not in drain.result["statuses"],
                command,
            ),
            Row(
                "7",
                f"{name}: invocations per record",
                per_record,
                f"<= {TARGET_INVOCATIONS_PER_RECORD}",
                drain.per_record <= TARGET_INVOCATIONS_PER_RECORD,
                command,
            ),
            Row("7", f"{name}: billed time spent waiting", waiting, "reported", None, command),
        ]
    else:
        rows.append(
            Row("7", f"{name}: invocations per record", per_record, "reported", None, command)
        )
    return rows


def run(services: Services, scenarios: Sequence[Scenario] = SCENARIOS) -> list[Row]:
    command = command_for("lane")
    take, taken = take_row(services, command)
    rows: list[Row] = [take]
    raw: dict[str, Any] = {"take_slot": taken}
    for scenario in scenarios:
        drain = drain_once(services, scenario)
        raw[scenario.name] = {
            "seconds": drain.seconds,
            "theoretical": drain.theoretical,
            "transfer": drain.transfer,
            "ratio": drain.ratio,
            "invocations": drain.invocations,
            "per_record": drain.per_record,
            "waiting_share": drain.waiting_share,
            "extra_attempts": drain.extra_attempts,
            "timeline": timeline(drain).splitlines(),
            **drain.result,
        }
        rows += rows_for(drain, command)
    write_results("lane", {"containers": CONTAINERS, "runs": raw})
    return rows


if __name__ == "__main__":
    child_main(measure)
