"""Point 9: every record's story at scale: `archive-ctl show` on 1,000,000 records with
10,000,000 events, what the events table costs per archive, and its retention.

Database `history_bench` in the bench cluster: the schema, then 1,000,000 records and ten
events each, made inside PostgreSQL (INSERT ... SELECT generate_series, the indexes built
after the rows). Each record's ten events are a story with one failure, shaped as the code
writes them (enqueued, received, claimed, fetched, retried; received, claimed, fetched,
upload_answered, archived), their details as long as real ones; one record in ten was
concluded 40 days ago, for the retention. Then:

- `show`: the statements `archive-ctl show` runs (record_story, record_events, lane_state)
  for 200 random records on one warm connection, timed together; their plans must read
  indexes only (no Seq Scan);
- the story's reads on the archive path at this size: the claim's (a record with no events
  yet) and the sweeper's plans must not scan the events table;
- the table's size: bytes per event (heap, TOAST and indexes), per archive, per million;
- the retention: one batch (expire_events, 1,000 records), timed.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from bench.common import Row, command_for, median, ms, write_results
from bench.services import Services

RECORDS = 1_000_000
EVENTS_PER_RECORD = 10
SHOWS = 200
TARGET_SHOW_SECONDS = 0.100
EXPIRY_BATCH = 1_000

RECORDS_SQL = """
INSERT INTO image_generation_records
    (id, user_id, status, prompt, image_url, started_at, archive_status, archive_attempts,
     archived_at, hosted_image_url, image_mime_type)
SELECT g, 1, 'SUCCEEDED', 'a prompt of some length for generation ' || g,
       'https://provider.example/generated/' || g || '.png?sig=' || md5(g::text),
       now() - interval '41 days' + g * interval '1 second', 'SUCCEEDED', 2,
       now() - interval '40 days' + g * interval '1 second',
       'https://img.example.com/i/2026/12/04/' || substr(md5(g::text), 1, 13) || '.png',
       'image/png'
FROM generate_series(1, :records) AS g
"""

# One story with a failure, as the code writes it: (kind, attempt, detail) for event k.
EVENTS_SQL = """
INSERT INTO image_archive_events (record_id, at, attempt, seq, kind, detail)
SELECT g,
       CASE WHEN g % 10 = 0 THEN now() - interval '40 days' ELSE now() END
           - make_interval(secs => (g % 2000000) + 60 - k * 5),
       CASE WHEN k <= 2 THEN 0 WHEN k <= 5 THEN 1 WHEN k = 6 THEN 1 ELSE 2 END,
       k,
       (ARRAY['enqueued', 'received', 'claimed', 'fetched', 'retried', 'received', 'claimed',
              'fetched', 'upload_answered', 'archived'])[k],
       CASE k
           WHEN 1 THEN jsonb_build_object('by', 'producer', 'inferred', true)
           WHEN 2 THEN jsonb_build_object('message_id', m.id, 'receive_count', 1)
           WHEN 3 THEN jsonb_build_object('owner', m.owner)
           WHEN 4 THEN jsonb_build_object('source', 'provider', 'error',
                                          'upstream answered HTTP 503 for https://provider'
                                          || '.example/generated/' || g || '.png?[redacted]',
                                          'status', 503)
           WHEN 5 THEN jsonb_build_object('error', 'download failed (HTTP 503): upstream '
                                          || 'answered HTTP 503 [attempt 1/3]',
                                          'delay_seconds', 30, 'outcome', 'retry',
                                          'error_class', 'transient',
                                          'next_run_at', now())
           WHEN 6 THEN jsonb_build_object('message_id', m.id, 'receive_count', 2)
           WHEN 7 THEN jsonb_build_object('owner', m.owner)
           WHEN 8 THEN jsonb_build_object('source', 'provider', 'bytes', 1843221,
                                          'type', 'image/png', 'seconds', 0.412)
           WHEN 9 THEN jsonb_build_object('status', 200, 'key', substr(m.id, 1, 6),
                                          'bytes', 1843221, 'seconds', 1.377)
           ELSE jsonb_build_object('url', 'https://img.example.com/i/2026/12/04/'
                                          || substr(m.id, 1, 13) || '.png',
                                   'altered', false, 'key', substr(m.id, 1, 6))
       END
FROM generate_series(1, :records) AS g
CROSS JOIN LATERAL (SELECT md5(g::text) AS h) AS x
CROSS JOIN LATERAL (
    SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) || '-'
           || substr(h, 17, 4) || '-' || substr(h, 21, 12) AS id,
           md5(h) || '/' || h AS owner
) AS m
CROSS JOIN generate_series(1, :events) AS k
"""
EVENTS = "image_archive_events"
INDEXES = ("image_archive_events_record_idx", "image_archive_events_concluded_idx")


def fill(services: Services) -> tuple[str, dict[str, float]]:
    """The database, filled; its DSN and how long each step took."""
    from devkit.postgres import apply_schema, connect  # noqa: PLC0415
    from lib.platform import migration_file  # noqa: PLC0415

    dsn = services.cluster.create_database("history_bench")
    apply_schema(dsn)
    declared = {index.name: index.sql for index in migration_file.load_declaration().indexes}
    conn = connect(dsn)
    took: dict[str, float] = {}
    try:
        [[filled]] = conn.run("SELECT count(*) FROM image_archive_events")
        if filled != RECORDS * EVENTS_PER_RECORD:
            conn.run("TRUNCATE image_archive_events, image_generation_records, users CASCADE")
            conn.run("INSERT INTO users (id, username) VALUES (1, 'bench')")
            conn.run("SET synchronous_commit = off")
            conn.run("SET maintenance_work_mem = '256MB'")
            started = time.monotonic()
            conn.run(RECORDS_SQL, records=RECORDS)
            took["records_seconds"] = time.monotonic() - started
            for name in INDEXES:
                conn.run(f"DROP INDEX IF EXISTS {name}")
            started = time.monotonic()
            conn.run(EVENTS_SQL, records=RECORDS, events=EVENTS_PER_RECORD)
            took["events_seconds"] = time.monotonic() - started
            started = time.monotonic()
            for name in INDEXES:
                conn.run(declared[name])
            took["index_seconds"] = time.monotonic() - started
        conn.run("VACUUM ANALYZE image_generation_records")
        conn.run("VACUUM ANALYZE image_archive_events")
    finally:
        conn.close()
    return dsn, took


# The story's events (seq) an archive the first time writes: the story less its failure.
HAPPY_PATH = (1, 2, 3, 8, 9, 10)


def sizes(conn: Any) -> dict[str, Any]:
    """The table's bytes (heap, TOAST, indexes) per event and per archive. An archive the
    first time writes six of the story's ten events: its share is the share of their rows'
    own sizes (pg_column_size, sampled) in the story's."""
    [[heap, toast, indexes, events]] = conn.run(
        "SELECT pg_relation_size('image_archive_events'),"
        " pg_table_size('image_archive_events') - pg_relation_size('image_archive_events'),"
        " pg_indexes_size('image_archive_events'),"
        " (SELECT count(*) FROM image_archive_events)"
    )
    rows = conn.run(
        "SELECT seq, avg(pg_column_size(e.*)) FROM image_archive_events AS e"
        " WHERE record_id <= 10000 GROUP BY seq"
    )
    row_bytes = {int(seq): float(size) for seq, size in rows}
    happy_share = sum(row_bytes[seq] for seq in HAPPY_PATH) / sum(row_bytes.values())
    total = heap + toast + indexes
    per_record = total / (events / EVENTS_PER_RECORD)
    return {
        "events": float(events),
        "heap_bytes": float(heap),
        "toast_bytes": float(toast),
        "index_bytes": float(indexes),
        "row_bytes_by_seq": row_bytes,
        "bytes_per_event": total / events,
        "bytes_per_archive_with_a_retry": per_record,
        "bytes_per_archive_first_time": per_record * happy_share,
    }


def scans(conn: Any, sql: str, **params: Any) -> list[str]:
    """The tables the statement, run once (rolled back), reads whole."""
    from devkit.plans import explain, whole_table_reads  # noqa: PLC0415

    return whole_table_reads(explain(conn, sql, analyze=True, **params))


def show_times(dsn: str) -> tuple[list[float], dict[str, list[str]]]:
    """`show`'s statements for SHOWS random records on one warm connection, and the tables
    any of its plans reads whole."""
    from devkit.postgres import connect  # noqa: PLC0415
    from lib.platform.config import DatabaseConfig  # noqa: PLC0415
    from lib.platform.db import Database  # noqa: PLC0415
    from lib.state.lane_store import LaneStore  # noqa: PLC0415
    from lib.state.queries import QUERIES  # noqa: PLC0415
    from lib.state.stories import StoryRecords  # noqa: PLC0415

    rng = random.Random(9)
    ids = [rng.randrange(1, RECORDS + 1) for _ in range(SHOWS + 5)]
    db = Database(DatabaseConfig(url=dsn), application_name="history-bench")
    stories, lanes = StoryRecords(db), LaneStore(db)
    times: list[float] = []
    try:
        for n, record_id in enumerate(ids):
            started = time.perf_counter()
            story = stories.story(record_id, lock_ttl_seconds=180, limit=30)
            lanes.state()
            if n >= 5:  # the first few prepare the statements
                times.append(time.perf_counter() - started)
            if len(story.events) != EVENTS_PER_RECORD:
                raise RuntimeError(f"record {record_id}: {len(story.events)} events")
    finally:
        db.close()
    conn = connect(dsn)
    try:
        record = ids[0]
        plans = {
            "record_story": scans(conn, QUERIES["record_story"], record_id=record, lock_ttl=180),
            "record_events": scans(conn, QUERIES["record_events"], record_id=record, limit=30),
        }
    finally:
        conn.close()
    return times, plans


def archive_path_plans(dsn: str) -> dict[str, list[str]]:
    """Whether the claim of a record with no events yet, and the sweeper's statements, read
    the events table whole among 10,000,000 events (they look a record's up by its index)."""
    from devkit.postgres import connect  # noqa: PLC0415
    from lib.state.queries import QUERIES  # noqa: PLC0415

    conn = connect(dsn)
    try:
        conn.run(
            "INSERT INTO image_generation_records (id, user_id, status, image_url,"
            " archive_status, archive_next_run_at, archive_enqueued_at)"
            " SELECT g, 1, 'SUCCEEDED', 'https://p.example/a.png', 'PENDING',"
            " now() - interval '1 hour', NULL"
            " FROM generate_series(CAST(:a AS bigint), CAST(:b AS bigint)) AS g",
            a=RECORDS + 1,
            b=RECORDS + 100,
        )
        claim = {
            "record_id": RECORDS + 1, "owner": "bench", "lock_ttl": 180, "max_attempts": 3,
            "early_slack": 5, "capture_while_paused": False, "message_id": "m", "receive_count": 1,
            "queue_mark": None, "paced": False, "publish": True, "event_id": None,
            "published": [str(uuid.uuid4())], "published_at": [datetime.now(UTC)],
            "by": "archive function", "confirmed_records": [RECORDS + 2],
            "confirmed_keys": ["originals/1/x.png"], "confirmed_versions": ["v1"],
        }  # fmt: skip
        lost = {
            "limit": 100, "grace": 300, "lost_before": datetime.now(UTC), "after": "-infinity",
            "publish": True, "event_id": None,
        }  # fmt: skip
        plans = {
            name: [t for t in scans(conn, QUERIES[name], **params) if t == EVENTS]
            for name, params in (
                ("claim", claim),
                ("take_lost", lost),
                ("date_undated", {"limit": 100}),
            )
        }
        conn.run("DELETE FROM image_generation_records WHERE id > :n", n=RECORDS)
        conn.run("DELETE FROM image_archive_events WHERE record_id > :n", n=RECORDS)
    finally:
        conn.close()
    return plans


def expiry(dsn: str) -> dict[str, Any]:
    """One retention batch: the stories of EXPIRY_BATCH records concluded 40 days ago."""
    from devkit.postgres import connect  # noqa: PLC0415
    from lib.state.queries import QUERIES  # noqa: PLC0415

    conn = connect(dsn)
    try:
        conn.run("BEGIN")
        try:
            started = time.perf_counter()
            rows = conn.run(QUERIES["expire_events"], retention=30 * 86_400, limit=EXPIRY_BATCH)
            seconds = time.perf_counter() - started
        finally:
            conn.run("ROLLBACK")  # the next run measures the same batch
        read_whole = scans(
            conn, QUERIES["expire_events"], retention=30 * 86_400, limit=EXPIRY_BATCH
        )
    finally:
        conn.close()
    return {
        "seconds": seconds,
        "records": len(rows),
        "events": sum(int(count) for _, count in rows),
        "scans": read_whole,
    }


def run(services: Services) -> list[Row]:
    from devkit.postgres import connect  # noqa: PLC0415

    dsn, took = fill(services)
    conn = connect(dsn)
    try:
        size = sizes(conn)
    finally:
        conn.close()
    times, show_plans = show_times(dsn)
    path_plans = archive_path_plans(dsn)
    batch = expiry(dsn)
    p90 = statistics.quantiles(times, n=10)[-1]
    write_results(
        "history",
        {
            "records": RECORDS,
            "events": RECORDS * EVENTS_PER_RECORD,
            "fill": took,
            "sizes": size,
            "show_seconds": times,
            "show_plans_seq_scans": show_plans,
            "archive_path_plans_seq_scans": path_plans,
            "expiry": batch,
        },
    )
    command = command_for("history")
    scene = f"{RECORDS:,} records, {RECORDS * EVENTS_PER_RECORD:,} events"
    no_scan = not any(show_plans.values())
    million = 1_000_000 / (1024**3)
    return [
        Row(
            "9",
            f"`archive-ctl show` statements ({scene}), {SHOWS} records",
            f"median {ms(median(times))}, p90 {ms(p90)}; plans read indexes only: {no_scan}",
            f"< {ms(TARGET_SHOW_SECONDS)}, no Seq Scan",
            p90 < TARGET_SHOW_SECONDS and no_scan,
            command,
        ),
        Row(
            "9",
            "events table per archive (heap, TOAST, its indexes)",
            f"{size['bytes_per_event']:.0f} B an event; an archive the first time "
            f"({len(HAPPY_PATH)} events) {size['bytes_per_archive_first_time']:.0f} B, "
            f"{size['bytes_per_archive_first_time'] * million:.2f} GiB per million; "
            f"with a retry ({EVENTS_PER_RECORD}) {size['bytes_per_archive_with_a_retry']:.0f} B",
            "reported",
            None,
            command,
        ),
        Row(
            "9",
            "the claim's and the sweeper's reads of the events table at this size",
            "whole-table reads: "
            + (", ".join(name for name, read in path_plans.items() if read) or "none"),
            "none",
            not any(path_plans.values()),
            command,
        ),
        Row(
            "9",
            f"retention: one batch of {EXPIRY_BATCH:,} concluded records",
            f"{ms(batch['seconds'])} for {batch['records']} records, {batch['events']} events; "
            f"whole-table reads: {', '.join(batch['scans']) or 'none'}",
            "reported",
            None,
            command,
        ),
    ]
