"""Point 10: the audit of hosted images (docs/explanation/audit-and-repair.md).

- Throughput: one audit invocation (the handler, in a fresh process: one container) over
  CHECKS archived records whose 1 MB hosted copies the Lsky stand-in serves on loopback,
  at a rate that does not bind (ARCHIVE_AUDIT_RATE 1000): checks a second of the whole run
  (the walk, each batch taken, every GET read and hashed, the verdicts recorded).
- The rotation at scale: 1,000,000 archived records enrolled in the audit in a database of
  their own; the plans of the rotation's statements (take_audits, enrol_archived,
  audit_found, record_audits, request_restores, record_keeping) must read indexes, never a
  table whole; `status`'s coverage, one pass over the audit table by design, is timed.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from bench.child import child_main, run_child
from bench.common import Row, command_for, write_results
from bench.services import Services

CHECKS = 200
IMAGE_BYTES = 1_000_000
TARGET_CHECKS_PER_SECOND = 20.0
RECORDS = 1_000_000
# The tables that grow with the archive; a restore's own table holds the restores under
# way (a handful: read whole, as the planner prefers for a few rows).
LARGE = ("image_generation_records", "image_archive_audits", "image_archive_originals")
# Statements whose plans must read an index (the rotation and a repair's).
INDEXED = (
    "take_audits",
    "enrol_archived",
    "audit_found",
    "record_audits",
    "request_restores",
    "record_keeping",
)


def measure(args: dict[str, Any]) -> dict[str, Any]:
    from devkit.context import LambdaContext  # noqa: PLC0415
    from handlers.auditor import lambda_handler  # noqa: PLC0415

    started = time.perf_counter()
    summary = lambda_handler({}, LambdaContext(function_name="AuditFunction", timeout_seconds=900))
    return {"seconds": time.perf_counter() - started, "summary": summary}


def plant(services: Services, count: int) -> list[int]:
    """`count` archived records whose hosted copies (1 MB PNGs, each its own) the Lsky
    stand-in serves from its storage, each enrolled and due."""
    from devkit import images  # noqa: PLC0415

    storage = services.lsky_storage / "plain" / "bench-audit"
    storage.mkdir(parents=True, exist_ok=True)
    ids = services.seed("/unused.png", count)
    rows = []
    for record_id in ids:
        data = images.png(64, 64, size=IMAGE_BYTES, seed=record_id)
        (storage / f"{record_id}.png").write_bytes(data)
        sha1 = hashlib.sha1(data, usedforsecurity=False).hexdigest()
        rows.append((record_id, sha1, len(data) / 1024))
    for record_id, sha1, size_kb in rows:
        services.db.run(
            "UPDATE image_generation_records SET archive_status = 'SUCCEEDED',"
            " archived_at = now(), hosted_image_url = :url,"
            " hosted_response = jsonb_build_object('sha1', CAST(:sha1 AS text),"
            " 'size', CAST(:size AS float8), 'key', CAST(:id AS text)) WHERE id = :id",
            url=f"{services.lsky_url}/i/bench-audit/{record_id}.png",
            sha1=sha1,
            size=size_kb,
            id=record_id,
        )
    services.db.run(
        "INSERT INTO image_archive_audits (record_id, due_at)"
        " SELECT id, now() FROM unnest(CAST(:ids AS bigint[])) AS id",
        ids=ids,
    )
    # The other benches' archives are enrolled too, their hosts long stopped: checked,
    # they would be unreachable (the host down). This run checks its own copies only.
    services.db.run(
        "UPDATE image_archive_audits SET due_at = now() + interval '30 days'"
        " WHERE record_id <> ALL(CAST(:ids AS bigint[]))",
        ids=ids,
    )
    # The walk has nothing to enrol: it finished a pass just now.
    services.db.run(
        "UPDATE image_archive_audit_walk SET after_id = NULL, started_at = now(),"
        " finished_at = now()"
    )
    return ids


def throughput(services: Services) -> dict[str, Any]:
    plant(services, CHECKS)
    env = services.handler_env(
        ARCHIVE_QUEUE_URL=f"{services.start_moto()}/123456789012/bench-audit",
        ARCHIVE_AUDIT_RATE="1000",
    )
    result: dict[str, Any] = run_child("bench.audit", {}, env, log_name="audit")
    summary = result["summary"]
    if summary["intact"] != CHECKS:
        raise RuntimeError(f"audit: not every copy was found intact: {summary}")
    result["checks_per_second"] = summary["intact"] / result["seconds"]
    return result


FILL_SQL = """
INSERT INTO image_generation_records
    (id, user_id, status, image_url, started_at, archive_status, archive_attempts,
     archived_at, hosted_image_url, image_mime_type, hosted_response)
SELECT g, 1, 'SUCCEEDED', 'https://provider.example/generated/' || g || '.png',
       now() - interval '41 days', 'SUCCEEDED', 1, now() - interval '40 days',
       'https://img.example.com/i/2026/12/04/' || substr(md5(g::text), 1, 13) || '.png',
       'image/png',
       jsonb_build_object('key', substr(md5(g::text), 1, 6), 'sha1', md5(g::text),
                          'size', 1800.5)
FROM generate_series(1, :records) AS g
"""
AUDITS_SQL = """
INSERT INTO image_archive_audits (record_id, due_at, checked_at, verdict, verdict_since)
SELECT g, now() + (g % 2592000) * interval '1 second', now() - interval '1 day',
       CASE WHEN g % 10000 = 0 THEN 'missing' ELSE 'intact' END, now() - interval '1 day'
FROM generate_series(1, :records) AS g
"""


def rotation(services: Services) -> dict[str, Any]:
    """1,000,000 enrolled records: which of the rotation's statements read a table whole."""
    from devkit.plans import explain, whole_table_reads  # noqa: PLC0415
    from devkit.postgres import apply_schema, connect  # noqa: PLC0415
    from lib.state.queries import QUERIES  # noqa: PLC0415

    dsn = services.cluster.create_database("audit_bench")
    apply_schema(dsn)
    conn = connect(dsn)
    try:
        conn.run("INSERT INTO users (id, username) VALUES (1, 'bench')")
        conn.run("SET synchronous_commit = off")
        started = time.monotonic()
        conn.run(FILL_SQL, records=RECORDS)
        conn.run(AUDITS_SQL, records=RECORDS)
        conn.run(
            "INSERT INTO image_archive_originals"
            " (record_id, bucket, key, sha256, bytes, mime_type, source)"
            " SELECT g, 'b', 'originals/' || g || '.png', md5(g::text) || md5(g::text),"
            " 1843221, 'image/png', 'archive' FROM generate_series(1, :n, 2) AS g",
            n=RECORDS,
        )
        filled = time.monotonic() - started
        for table in ("image_generation_records", "image_archive_audits",
                      "image_archive_originals"):  # fmt: skip
            conn.run(f"VACUUM ANALYZE {table}")
        results = (
            '[{"record_id": 10, "verdict": "intact", "url": "u", "lost": false, "detail": {}},'
            ' {"record_id": 20000, "verdict": "missing", "url": "u", "lost": false,'
            ' "detail": {}}]'
        )
        params: dict[str, dict[str, Any]] = {
            "take_audits": {"limit": 10, "lease": 900},
            "enrol_archived": {"batch": 5000, "period": 30 * 86_400},
            "audit_found": {"verdict": "missing", "after_id": 0, "limit": 500},
            "record_audits": {"results": results, "period": 30 * 86_400, "retry": 900},
            "request_restores": {
                "ids": [20000], "urls": [None], "reason": "missing", "by": "bench",
                "need_original": True,
            },
            "record_keeping": {"record_id": 12345},
        }  # fmt: skip
        # The walk as it runs mid-pass: from a position in the table.
        conn.run("UPDATE image_archive_audit_walk SET after_id = 500000, started_at = now()")
        plans = {
            name: [
                table
                for table in whole_table_reads(
                    explain(conn, QUERIES[name], analyze=True, **params[name])
                )
                if table in LARGE
            ]
            for name in INDEXED
        }
        timings = {}
        for name in ("take_audits", "audit_coverage"):
            conn.run("BEGIN")
            try:
                began = time.perf_counter()
                conn.run(QUERIES[name], **params.get(name, {}))
                timings[name] = time.perf_counter() - began
            finally:
                conn.run("ROLLBACK")
    finally:
        conn.close()
    return {"fill_seconds": filled, "seq_scans": plans, "seconds": timings}


def run(services: Services) -> list[Row]:
    fast = throughput(services)
    scale = rotation(services)
    write_results("audit", {"throughput": fast, "rotation": scale})
    command = command_for("audit")
    reads = {name: tables for name, tables in scale["seq_scans"].items() if tables}
    return [
        Row(
            "10",
            f"one audit invocation, {CHECKS} hosted copies of 1 MB on loopback",
            f"{fast['checks_per_second']:.0f} checks a second ({fast['seconds']:.1f} s)",
            f">= {TARGET_CHECKS_PER_SECOND:.0f} a second",
            fast["checks_per_second"] >= TARGET_CHECKS_PER_SECOND,
            command,
        ),
        Row(
            "10",
            f"the rotation's statements at {RECORDS:,} archived records",
            "whole-table reads: "
            + (", ".join(f"{n} ({', '.join(t)})" for n, t in reads.items()) or "none")
            + f"; a batch taken in {scale['seconds']['take_audits'] * 1000:.1f} ms,"
            f" `status`'s coverage (one pass) {scale['seconds']['audit_coverage'] * 1000:.0f} ms",
            "none",
            not reads,
            command,
        ),
    ]


if __name__ == "__main__":
    child_main(measure)
