"""The standalone Python producer of docs/how-to/connect-the-generation-service.md, as a
reader would save and run it:
a script of its own in a process of its own (isolated: no PYTHONPATH, no checkout on the
path), against the test database and moto's SQS. It imports nothing of this repository."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from devkit.sqs import QueuePair
from lib.archive.message import parse_record_id
from tests.integration.test_cli import drain, record_ids
from tests.support import HANG_SECONDS, fetch_record, seed_record

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### Python (boto3 and a PostgreSQL driver)"
# What the snippet may import besides the standard library.
THIRD_PARTY = {"boto3", "botocore", "pg8000", "psycopg"}
URL = "https://upstream.invalid/gen.png"


def doc_block(heading: str, language: str) -> str:
    """The one `language` code block under `heading` in the producer's how-to."""
    text = (ROOT / "docs" / "how-to" / "connect-the-generation-service.md").read_text(
        encoding="utf-8"
    )
    section = text.split(heading, 1)[1].split("\n### ", 1)[0]
    [block] = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    return str(block)


def snippet() -> str:
    return doc_block(SECTION, "python")


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


def seed_three(db: Any) -> None:
    """Record 123 to queue; 124 (FAILED) and 125 (a generation that failed) to leave alone."""
    seed_record(db, 123, image_url=URL, archive_status=None)
    seed_record(db, 124, image_url=URL, archive_status="FAILED")
    seed_record(db, 125, image_url=URL, archive_status=None, status="FAILED")


def assert_only_the_first_queued(db: Any) -> None:
    row = fetch_record(db, 123)
    assert row["archive_status"] == "PENDING"
    assert row["archive_enqueued_at"] is not None
    assert fetch_record(db, 124)["archive_status"] == "FAILED"
    assert fetch_record(db, 125)["archive_status"] is None


def assert_pending_without_a_stamp(db: Any) -> None:
    """A failed send: PENDING, and the producer's stamp dropped, so the sweeper sends it
    after its grace period rather than a whole requeue interval later."""
    row = fetch_record(db, 123)
    assert row["archive_status"] == "PENDING"
    assert row["archive_enqueued_at"] is None


def test_it_writes_the_row_then_sends_and_leaves_the_others_alone(
    tmp_path: Path, pg_dsn: str, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_three(db)

    out = run_snippet(tmp_path, producer_env(pg_dsn, queues.url), 123, 124, 125)

    assert out.splitlines() == ["123 sent", "124 not sent", "125 not sent"]
    assert record_ids(drain(sqs, queues.url)) == [123]
    assert_only_the_first_queued(db)


def test_a_failed_send_leaves_the_row_pending_without_our_stamp(
    tmp_path: Path, pg_dsn: str, db: Any, queues: QueuePair
) -> None:
    seed_record(db, 123, image_url=URL, archive_status=None)

    out = run_snippet(tmp_path, producer_env(pg_dsn, queues.url + "-does-not-exist"), 123)

    assert out.splitlines() == ["123 not sent"]
    assert_pending_without_a_stamp(db)


# -- the TypeScript producer, as an application would hold it: the doc's block saved as
# -- imageArchive.ts beside a driver (tests/producer_ts), type-checked, then run by Node ----

TS_SECTION = "### TypeScript (Nuxt, `@aws-sdk/client-sqs`)"


TS_PROJECT = ROOT / "tests" / "producer_ts"


def ts_snippet() -> str:
    return doc_block(TS_SECTION, "ts")


def ts_project(tmp_path: Path) -> Path:
    """A copy of tests/producer_ts holding the doc's block as imageArchive.ts."""
    installed = TS_PROJECT / "node_modules" / ".installed"
    assert installed.exists(), "the TypeScript producer's packages: run `make node-deps`"
    project = tmp_path / "producer_ts"
    project.mkdir()
    for name in ("package.json", "tsconfig.json", "enqueue.ts"):
        shutil.copy(TS_PROJECT / name, project / name)
    (project / "node_modules").symlink_to(TS_PROJECT / "node_modules")
    (project / "imageArchive.ts").write_text(ts_snippet(), encoding="utf-8")
    return project


def run_node(project: Path, tool: str, *args: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [str(project / "node_modules" / ".bin" / tool), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stderr


def test_the_typescript_producer_type_checks_as_written(tmp_path: Path) -> None:
    project = ts_project(tmp_path)
    run_node(project, "tsc", "-p", ".", env={"PATH": os.environ["PATH"]})


def test_the_typescript_producer_writes_the_row_then_sends_and_leaves_the_others_alone(
    tmp_path: Path, pg_dsn: str, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_three(db)
    project = ts_project(tmp_path)

    run_node(
        project, "tsx", "enqueue.ts", "123", "124", "125", env=producer_env(pg_dsn, queues.url)
    )

    [message] = drain(sqs, queues.url)
    assert message["Body"] == '{"recordId":"123"}'  # a string: safe for any BIGINT
    assert parse_record_id(message["Body"]) == 123
    assert_only_the_first_queued(db)


def test_the_typescript_producer_s_failed_send_leaves_the_row_pending_without_its_stamp(
    tmp_path: Path, pg_dsn: str, db: Any, queues: QueuePair
) -> None:
    seed_record(db, 123, image_url=URL, archive_status=None)
    project = ts_project(tmp_path)
    env = producer_env(pg_dsn, queues.url + "-does-not-exist")

    stderr = run_node(project, "tsx", "enqueue.ts", "123", env=env)

    assert "SendMessage failed; the sweeper will send it" in stderr
    assert_pending_without_a_stamp(db)


def ts_statements() -> tuple[str, str]:
    """The snippet's two statements, its `$n` parameters as the test driver's `:pn`."""
    enqueue, unstamp = re.findall(r"`(UPDATE .*?)`", ts_snippet(), re.S)
    return re.sub(r"\$(\d+)", r":p\1", enqueue), re.sub(r"\$(\d+)", r":p\1", unstamp)


def test_the_typescript_producer_s_statements_run_on_the_schema_as_written(db: Any) -> None:
    enqueue, unstamp = ts_statements()
    seed_three(db)

    # The id goes as text (String(recordId)), the stamp comes back as text.
    [[stamp]] = db.run(enqueue, p1="123")
    assert db.run(enqueue, p1="124") == []
    assert db.run(enqueue, p1="125") == []
    row = fetch_record(db, 123)
    assert row["archive_status"] == "PENDING"
    [[same]] = db.run(
        "SELECT archive_enqueued_at = CAST(:s AS timestamptz)"
        " FROM image_generation_records WHERE id = 123",
        s=stamp,
    )
    assert same is True  # the text keeps the microseconds the unstamp compares
    assert (fetch_record(db, 124)["archive_status"], fetch_record(db, 125)["archive_status"]) == (
        "FAILED",
        None,
    )

    # A failed send: the stamp it wrote is dropped; a newer stamp would be left alone.
    db.run(unstamp, p1="123", p2="2000-01-01 00:00:00+00")
    assert fetch_record(db, 123)["archive_enqueued_at"] is not None
    db.run(unstamp, p1="123", p2=stamp)
    assert fetch_record(db, 123)["archive_enqueued_at"] is None


def test_the_typescript_producer_s_message_is_one_the_worker_reads() -> None:
    source = ts_snippet()
    assert "const id = String(recordId)" in source
    assert "MessageBody: JSON.stringify({ recordId: id })" in source
    # JSON.stringify of that object, for a BIGINT id beyond JavaScript's safe integers.
    body = json.dumps({"recordId": "9007199254740993"}, separators=(",", ":"))
    assert parse_record_id(body) == 9_007_199_254_740_993
