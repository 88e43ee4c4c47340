"""Point 5: the sweeper's run time with 1,000,000 records vs 10,000, 1,000 stale in each.

Two databases in the bench cluster, filled with INSERT ... SELECT generate_series and
then VACUUM ANALYZE. Both hold the same 1,000 stale rows (500 lost PENDING messages,
500 RUNNING rows under expired locks, attempts left so all are re-sent) and the same
small set of live rows that must be left alone (PENDING due later or just sent,
RUNNING under live locks); the rest are concluded archives (SUCCEEDED, FAILED) and
generations never queued.

One child process holds a sweeper for each database (lib.archive.runtime.build_sweeper,
what the handler calls, minus Powertools' decorators) and a moto SQS queue. After a
warm-up sweep of each, it alternates: make the 1,000 rows stale again and VACUUM
ANALYZE, on a fresh queue (untimed), then time one `Sweeper.run`. The run time includes sending the
1,000 messages (100 SendMessageBatch calls to moto, a fresh queue per run because
moto's sends slow down as a queue fills); the time spent in SQL is reported beside it
(Database.run, timed in the child).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from bench.child import child_main, run_child
from bench.common import Row, command_for, median, ms, ratio, write_results
from bench.services import Services

TARGET_RATIO = 1.5
SIZES = {"small": 10_000, "big": 1_000_000}
STALE_LOST, STALE_EXPIRED = 500, 500
LIVE_PENDING_LATER, LIVE_PENDING_SENT, LIVE_RUNNING = 200, 100, 100
SPECIAL = STALE_LOST + STALE_EXPIRED + LIVE_PENDING_LATER + LIVE_PENDING_SENT + LIVE_RUNNING

# Concluded rows: 1 in 50 FAILED, 1 in 20 never queued (NULL), the rest SUCCEEDED.
FILL_SQL = """
INSERT INTO image_generation_records
    (id, user_id, status, image_url, started_at, archive_status, archive_attempts,
     archived_at, hosted_image_url, image_mime_type, archive_error)
SELECT g, 1 + g % 1000,
       CASE WHEN g % 97 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END,
       'https://provider.example/generated/' || g || '.png?sig=' || md5(g::text),
       now() - (g % 2592000) * interval '1 second',
       CASE WHEN g % 20 = 1 THEN NULL WHEN g % 50 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END,
       CASE WHEN g % 20 = 1 THEN 0 WHEN g % 50 = 0 THEN 3 ELSE 1 END,
       CASE WHEN g % 20 = 1 OR g % 50 = 0 THEN NULL
            ELSE now() - (g % 2592000) * interval '1 second' END,
       CASE WHEN g % 20 = 1 OR g % 50 = 0 THEN NULL
            ELSE 'https://img.example/i/2026/12/02/' || md5(g::text) || '.png' END,
       CASE WHEN g % 20 = 1 OR g % 50 = 0 THEN NULL ELSE 'image/png' END,
       CASE WHEN g % 50 = 0 THEN 'download: upstream answered HTTP 404 (attempt 3/3)' END
FROM generate_series(1, :count) AS g
"""

# The special rows, ids first+0 .. first+SPECIAL-1, in the order of the constants above.
# Integers are formatted in with str.format (constants, never input): pg8000 sends
# parameters untyped, and PostgreSQL has no "unknown + unknown".
LIVE_SQL = """
INSERT INTO image_generation_records
    (id, user_id, status, image_url, archive_status, archive_attempts,
     archive_next_run_at, archive_enqueued_at, archive_locked_by, archive_locked_at)
SELECT {first} + g, 1, 'SUCCEEDED', 'https://provider.example/live/' || g || '.png',
       CASE WHEN g < {lost} + {expired} THEN 'PENDING'  -- made stale by STALE_SQL
            WHEN g < {lost} + {expired} + {later} + {sent} THEN 'PENDING'
            ELSE 'RUNNING' END,
       1,
       CASE WHEN g < {lost} + {expired} THEN now()
            WHEN g < {lost} + {expired} + {later} THEN now() + interval '10 minutes'
            WHEN g < {lost} + {expired} + {later} + {sent} THEN now() - interval '1 hour'
            ELSE now() - interval '1 minute' END,
       CASE WHEN g >= {lost} + {expired} + {later} THEN now() - interval '1 minute' END,
       CASE WHEN g >= {lost} + {expired} + {later} + {sent} THEN 'live-invocation' END,
       CASE WHEN g >= {lost} + {expired} + {later} + {sent} THEN now() - interval '30 seconds' END
FROM generate_series(0, {special} - 1) AS g
"""

# (Re)make the 1,000 stale rows: lost messages, then crashed attempts.
STALE_SQL = (
    """
UPDATE image_generation_records
SET archive_status = 'PENDING', archive_attempts = 1, archive_error = NULL,
    archive_next_run_at = now() - interval '1 hour',
    archive_enqueued_at = now() - interval '1 hour',
    archive_locked_by = NULL, archive_locked_at = NULL
WHERE id >= {first} AND id < {first} + {lost}
""",
    """
UPDATE image_generation_records
SET archive_status = 'RUNNING', archive_attempts = 1, archive_error = NULL,
    archive_next_run_at = now() - interval '1 hour',
    archive_enqueued_at = now() - interval '1 hour',
    archive_locked_by = 'crashed-invocation', archive_locked_at = now() - interval '1 hour'
WHERE id >= {first} + {lost} AND id < {first} + {lost} + {expired}
""",
)


def reset_special(conn: Any, total: int) -> None:
    """(Re)create the stale and live rows as of now, then VACUUM ANALYZE.

    Before every timed run: the live rows must not age into stale ones (a lock 30 s
    old expires after the lock TTL), and the stale ones were just swept.
    """
    first = total - SPECIAL + 1
    counts = {"first": first, "lost": STALE_LOST, "expired": STALE_EXPIRED}
    conn.run(f"DELETE FROM image_generation_records WHERE id >= {first}")
    conn.run(
        LIVE_SQL.format(**counts, later=LIVE_PENDING_LATER, sent=LIVE_PENDING_SENT, special=SPECIAL)
    )
    for statement in STALE_SQL:
        conn.run(statement.format(**counts))
    conn.run("VACUUM ANALYZE image_generation_records")


def fill(services: Services, name: str, total: int) -> tuple[str, float]:
    """Create and fill database `sweep_<name>`; returns its DSN and the seconds it took."""
    from devkit.postgres import apply_schema, connect  # noqa: PLC0415

    started = time.perf_counter()
    dsn = services.cluster.create_database(f"sweep_{name}")
    apply_schema(dsn)
    conn = connect(dsn)
    try:
        conn.run("TRUNCATE users, image_generation_records CASCADE")
        conn.run(
            "INSERT INTO users (id, username) SELECT g, 'user' || g FROM generate_series(1, 1000) g"
        )
        conn.run(FILL_SQL, count=total - SPECIAL)
        reset_special(conn, total)
        [[count]] = conn.run("SELECT count(*) FROM image_generation_records")
        if count != total:
            raise RuntimeError(f"sweep_{name} has {count} rows, not {total}")
    finally:
        conn.close()
    return dsn, time.perf_counter() - started


def measure(args: dict[str, Any]) -> dict[str, Any]:
    import boto3  # noqa: PLC0415 - the child imports what it measures

    from devkit.postgres import connect  # noqa: PLC0415
    from lib.archive.runtime import build_sweeper  # noqa: PLC0415
    from lib.platform.config import load_sweeper_settings  # noqa: PLC0415
    from lib.platform.db import Database  # noqa: PLC0415

    sql_seconds = 0.0
    original_run = Database.run

    def timed_run(self: Database, sql: str, **params: Any) -> list[list[Any]]:
        nonlocal sql_seconds
        started = time.perf_counter()
        try:
            return original_run(self, sql, **params)
        finally:
            sql_seconds += time.perf_counter() - started

    Database.run = timed_run  # type: ignore[method-assign]

    sqs = boto3.client("sqs")
    sweepers, admins = {}, {}
    for name, dsn in args["dsns"].items():
        env = {"DATABASE_URL": dsn, "ARCHIVE_QUEUE_URL": "http://replaced-per-run.invalid/q"}
        sweepers[name] = build_sweeper(load_sweeper_settings(env))
        admins[name] = connect(dsn)

    def remaining_ms() -> int:
        return 60_000  # the sweeper's function timeout

    def sweep(name: str) -> dict[str, Any]:
        nonlocal sql_seconds
        reset_special(admins[name], args["sizes"][name])
        # A fresh queue per run: moto's SendMessageBatch slows down as a queue fills.
        queue_url = sqs.create_queue(QueueName=f"bench-sweep-{uuid.uuid4().hex[:12]}")["QueueUrl"]
        sweeper = sweepers[name]
        sweeper.settings = dataclasses.replace(sweeper.settings, queue_url=queue_url)
        sql_seconds = 0.0
        started = time.perf_counter()
        summary = sweeper.run(remaining_ms=remaining_ms)
        seconds = time.perf_counter() - started
        sqs.delete_queue(QueueUrl=queue_url)
        return {"seconds": seconds, "sql_seconds": sql_seconds, **summary.as_dict()}

    for name in sweepers:
        sweep(name)  # warm-up: connection, prepared statements, boto3 client
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sweepers}
    for rep in range(args["reps"]):
        for name in list(sweepers) if rep % 2 == 0 else reversed(list(sweepers)):
            runs[name].append(sweep(name))
    for conn in admins.values():
        conn.close()
    return runs


def run(services: Services, reps: int = 3) -> list[Row]:
    services.start_moto()
    dsns, fill_seconds = {}, {}
    for name, total in SIZES.items():
        dsns[name], fill_seconds[name] = fill(services, name, total)
    args = {"dsns": dsns, "sizes": SIZES, "reps": reps}
    runs = run_child("bench.sweep", args, services.handler_env(), log_name="sweep")
    for name, samples in runs.items():
        for sample in samples:
            if sample["requeued"] != STALE_LOST + STALE_EXPIRED or sample["failed"]:
                raise RuntimeError(f"sweep/{name}: unexpected run {sample}")
    seconds = {name: median([s["seconds"] for s in samples]) for name, samples in runs.items()}
    sql = {name: median([s["sql_seconds"] for s in samples]) for name, samples in runs.items()}
    value = ratio(seconds["big"], seconds["small"])
    # Runs of one repetition are back to back, so their ratio cancels slow drift.
    paired = {
        key: median([b[key] / s[key] for b, s in zip(runs["big"], runs["small"], strict=True)])
        for key in ("seconds", "sql_seconds")
    }
    write_results(
        "sweep",
        {
            "sizes": SIZES,
            "stale": STALE_LOST + STALE_EXPIRED,
            "fill_seconds": fill_seconds,
            "median_seconds": seconds,
            "median_sql_seconds": sql,
            "ratio": value,
            "sql_ratio": ratio(sql["big"], sql["small"]),
            "median_of_paired_ratios": paired,
            "runs": runs,
        },
    )
    sql_value = ratio(sql["big"], sql["small"])
    command = command_for("sweep")
    return [
        Row(
            "5",
            "sweeper run, 1,000,000 vs 10,000 records, 1,000 stale in each (incl. moto sends)",
            f"{ms(seconds['big'])} vs {ms(seconds['small'])} = {value:.2f} x "
            f"(paired median {paired['seconds']:.2f} x)",
            f"<= {TARGET_RATIO} x",
            value <= TARGET_RATIO,
            command,
        ),
        Row(
            "5",
            "the same runs, time in SQL only (moto's sends excluded)",
            f"{ms(sql['big'])} vs {ms(sql['small'])} = {sql_value:.2f} x "
            f"(paired median {paired['sql_seconds']:.2f} x)",
            f"<= {TARGET_RATIO} x",
            sql_value <= TARGET_RATIO,
            command,
        ),
    ]


if __name__ == "__main__":
    child_main(measure)
