"""The standalone Python producer of docs/operations.md, as a reader would save and run it:
a script of its own in a process of its own (isolated: no PYTHONPATH, no checkout on the
path), against the test database and moto's SQS. It imports nothing of this repository."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from devkit.sqs import QueuePair
from tests.integration.test_cli import drain, record_ids
from tests.support import HANG_SECONDS, fetch_record, seed_record

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### Python (boto3 and a PostgreSQL driver)"
# What the snippet may import besides the standard library.
THIRD_PARTY = {"boto3", "botocore", "pg8000", "psycopg"}
URL = "https://upstream.invalid/gen.png"


def snippet() -> str:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n### ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, re.S)
    return str(block)


def imported(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_it_imports_only_the_standard_library_boto3_and_a_driver() -> None:
    outside = imported(snippet()) - set(sys.stdlib_module_names)
    assert outside <= THIRD_PARTY, outside
    assert {"boto3", "pg8000"} <= outside


def run_snippet(tmp_path: Path, env: dict[str, str], *ids: int) -> str:
    script = tmp_path / "image_archive_producer.py"
    script.write_text(snippet(), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-I", str(script), *map(str, ids)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def producer_env(pg_dsn: str, queue_url: str) -> dict[str, str]:
    inherited = ("PATH", "AWS_ENDPOINT_URL_SQS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    return {
        **{name: os.environ[name] for name in inherited},
        "AWS_REGION": os.environ["AWS_REGION"],
        "DATABASE_URL": pg_dsn,
        "ARCHIVE_QUEUE_URL": queue_url,
    }


def test_it_writes_the_row_then_sends_and_leaves_the_others_alone(
    tmp_path: Path, pg_dsn: str, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_record(db, 123, image_url=URL, archive_status=None)
    seed_record(db, 124, image_url=URL, archive_status="FAILED")
    seed_record(db, 125, image_url=URL, archive_status=None, status="FAILED")

    out = run_snippet(tmp_path, producer_env(pg_dsn, queues.url), 123, 124, 125)

    assert out.splitlines() == ["123 sent", "124 not sent", "125 not sent"]
    assert record_ids(drain(sqs, queues.url)) == [123]
    row = fetch_record(db, 123)
    assert row["archive_status"] == "PENDING"
    assert row["archive_enqueued_at"] is not None
    assert fetch_record(db, 124)["archive_status"] == "FAILED"
    assert fetch_record(db, 125)["archive_status"] is None


def test_a_failed_send_leaves_the_row_pending_without_our_stamp(
    tmp_path: Path, pg_dsn: str, db: Any, queues: QueuePair
) -> None:
    seed_record(db, 123, image_url=URL, archive_status=None)

    out = run_snippet(tmp_path, producer_env(pg_dsn, queues.url + "-does-not-exist"), 123)

    assert out.splitlines() == ["123 not sent"]
    row = fetch_record(db, 123)
    assert row["archive_status"] == "PENDING"  # the sweeper sends it after its grace period
    assert row["archive_enqueued_at"] is None
