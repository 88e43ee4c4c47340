"""archive-ctl behaves like the tools operators know (git, kubectl, the AWS CLI): exit codes,
help that lists only a command's own codes, quiet on a closed pipe, shared flags before or
after the command, --json everywhere, --version, AWS_REGION honoured. Every test runs the
real command in a process of its own against the test services."""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

import pytest

from devkit.sqs import QueuePair
from lib import __version__
from lib.archive.message import encode
from lib.cli.context import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_MISSING_GRANTS,
    EXIT_NO_ROLE,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
)
from tests.integration.conftest import ArchiveCtl
from tests.support import fetch_record, seed_record

URL = "https://upstream.invalid/gen.png"


def codes_in_help(text: str) -> set[int]:
    block = text.split("exit codes:", 1)[1]
    return {int(code) for code in re.findall(r"^  (\d+) ", block, re.M)}


# -- exit codes ---------------------------------------------------------------------------


def test_a_usage_error_of_our_own_exits_2_with_the_usage(archive_ctl: ArchiveCtl) -> None:
    result = archive_ctl("requeue")
    assert result.returncode == EXIT_USAGE
    assert result.stderr.startswith("usage: archive-ctl requeue")
    assert "error: say what to requeue: --failed" in result.stderr

    result = archive_ctl("enqueue", "12", "abc")
    assert result.returncode == EXIT_USAGE
    assert "'abc' is not a record id" in result.stderr

    result = archive_ctl("list", "--state", "RUNNING", "--failed-since", "2h")
    assert result.returncode == EXIT_USAGE
    assert "select FAILED records, not RUNNING" in result.stderr


def test_grants_tells_missing_privileges_from_no_such_role(
    archive_ctl: ArchiveCtl, db: Any
) -> None:
    role = "conventions_bare_role"
    db.run(f"DROP ROLE IF EXISTS {role}")
    db.run(f"CREATE ROLE {role}")
    try:
        lacking = archive_ctl("grants", "--role", role)
        absent = archive_ctl("grants", "--role", "no_such_role_at_all")
    finally:
        db.run(f"DROP ROLE {role}")

    assert lacking.returncode == EXIT_MISSING_GRANTS, lacking.stderr
    assert f"GRANT SELECT, UPDATE ON image_archive_lane TO {role};" in lacking.stdout
    assert absent.returncode == EXIT_NO_ROLE
    assert "there is no role 'no_such_role_at_all'" in absent.stderr
    assert len({lacking.returncode, absent.returncode, EXIT_ERROR, EXIT_OK}) == 4


def test_status_with_an_unreadable_part_is_a_partial_answer(
    archive_ctl: ArchiveCtl, queues: QueuePair
) -> None:
    result = archive_ctl("status", "--dlq-url", queues.dlq_url + "-gone")
    assert result.returncode == EXIT_PARTIAL
    assert "PENDING" in result.stdout  # the database's part is there
    assert "note: queue depths incomplete: SQS GetQueueAttributes" in result.stdout


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        ("status", {0, 1, 2, 3, 130}),
        ("list", {0, 1, 2, 130}),
        ("enqueue", {0, 1, 2, 3, 130}),
        ("requeue", {0, 1, 2, 3, 130}),
        ("backfill", {0, 1, 2, 3, 130}),
        ("lane clear", {0, 1, 2, 130}),
        ("redrive-dlq", {0, 1, 2, 3, 130}),
        ("migrate", {0, 1, 2, 130}),
        ("grants", {0, 1, 2, 3, 4, 5, 130}),
    ],
)
def test_each_command_lists_only_the_exit_codes_it_can_return(
    archive_ctl: ArchiveCtl, command: str, codes: set[int]
) -> None:
    result = archive_ctl(*command.split(), "--help")
    assert result.returncode == EXIT_OK, result.stderr
    assert codes_in_help(result.stdout) == codes


# -- pipes, flags, --version, region --------------------------------------------------------


def test_a_closed_pipe_ends_quietly(archive_ctl: ArchiveCtl, db: Any) -> None:
    """`archive-ctl requeue --failed --dry-run | head -1`, with the reader gone before the
    first line (a pipe whose read end is closed: every write fails, as after `head` exits)."""
    for record_id in range(1, 6):
        seed_record(db, record_id, image_url=URL, archive_status="FAILED", attempts=3)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = archive_ctl("requeue", "--failed", "--dry-run", stdout=write_end)
    finally:
        os.close(write_end)
    assert result.returncode == EXIT_BROKEN_PIPE
    assert result.stderr == ""  # no traceback, no "Exception ignored"


def test_shared_flags_go_before_or_after_the_command(
    archive_ctl: ArchiveCtl, sqs: Any, queues: QueuePair
) -> None:
    sqs.send_message(QueueUrl=queues.dlq_url, MessageBody=encode(7))
    bare = {"ARCHIVE_QUEUE_URL": None, "ARCHIVE_DLQ_URL": None}

    before = archive_ctl("--queue-url", queues.url, "--json", "status", env=bare)
    after = archive_ctl("status", "--queue-url", queues.url, "--json", env=bare)

    for result in (before, after):
        assert result.returncode == EXIT_OK, result.stderr
        depths = {q["name"]: q["visible"] for q in json.loads(result.stdout)["queues"]}
        assert depths == {"queue": 0, "DLQ": 1}  # the DLQ found through the redrive policy
    # Given after the command, a flag wins over the one given before it.
    result = archive_ctl("--dlq-url", "http://nowhere.invalid/q", "status", "--dlq-url",
                         queues.dlq_url)  # fmt: skip
    assert result.returncode == EXIT_OK, result.stdout


def test_verbose_logs_each_statement_and_aws_call_with_its_time(
    archive_ctl: ArchiveCtl, db: Any
) -> None:
    seed_record(db, 1, image_url=URL, archive_status="PENDING")

    def debug_lines(*argv: str) -> list[dict[str, Any]]:
        result = archive_ctl(*argv)
        assert result.returncode == EXIT_OK, result.stderr
        logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        return [line for line in logged if line["level"] == "DEBUG"]

    assert debug_lines("status") == []
    logged = debug_lines("-v", "status")
    statements = {line["statement"]: line for line in logged if line["message"] == "statement run"}
    assert {"live_counts", "lane_state"} <= set(statements)
    assert statements["live_counts"]["rows"] == 1
    assert statements["live_counts"]["ms"] >= 0
    calls = [line for line in logged if line["message"] == "AWS call"]
    assert "sqs.GetQueueAttributes" in {call["operation"] for call in calls}
    assert {call["http_status"] for call in calls} == {200}
    # The name, the time and the counts only: no parameters, no headers.
    assert all(
        set(line) <= {"level", "location", "message", "timestamp", "service", "statement", "ms",
                      "rows", "operation", "http_status", "retries", "error"}
        for line in logged
    ), logged  # fmt: skip


def test_version(archive_ctl: ArchiveCtl) -> None:
    result = archive_ctl("--version")
    assert result.returncode == EXIT_OK
    assert result.stdout == f"archive-ctl {__version__}\n"


def test_aws_region_alone_is_enough(archive_ctl: ArchiveCtl, queues: QueuePair) -> None:
    result = archive_ctl("status", env={"AWS_DEFAULT_REGION": None})
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    assert "You must specify a region" not in result.stdout + result.stderr
    assert queues.url in result.stdout  # the queue depths are there


# -- --json on every command that prints data -------------------------------------------------


def test_every_command_answers_in_json(
    archive_ctl: ArchiveCtl, db: Any, sqs: Any, queues: QueuePair
) -> None:
    seed_record(db, 1, image_url=URL, archive_status=None)
    seed_record(db, 2, image_url=URL, archive_status="FAILED", attempts=3, archive_error="x")
    seed_record(db, 3, image_url=URL, archive_status=None, started_at=3600)
    sqs.send_message(QueueUrl=queues.dlq_url, MessageBody="not json")

    answers = {
        "status": archive_ctl.json("status"),
        "list": archive_ctl.json("list"),
        "enqueue": archive_ctl.json("enqueue", "1", "99", code=EXIT_PARTIAL),
        "requeue --dry-run": archive_ctl.json("requeue", "--failed", "--dry-run"),
        "backfill --dry-run": archive_ctl.json("backfill", "--dry-run"),
        "lane clear": archive_ctl.json("lane", "clear"),
        "redrive-dlq --dry-run": archive_ctl.json("redrive-dlq", "--dry-run"),
        "migrate --dry-run": archive_ctl.json("migrate", "--dry-run"),
        "grants": archive_ctl.json("grants"),
    }
    requeued = archive_ctl("requeue", "--id", "2", "--json")
    assert requeued.returncode == EXIT_OK, requeued.stderr

    assert answers["status"]["archive"]["failed"] == 1
    assert [r["id"] for r in answers["list"]["records"]] == [3, 2, 1]
    assert (answers["enqueue"]["sent"], answers["enqueue"]["missing"]) == ([1], [99])
    assert [r["id"] for r in answers["requeue --dry-run"]["records"]] == [2]
    assert [r["id"] for r in answers["backfill --dry-run"]["records"]] == [3]
    assert answers["lane clear"]["cleared"] is False
    assert answers["redrive-dlq --dry-run"]["malformed"] == 1
    assert answers["migrate --dry-run"]["changes"] == 0
    assert answers["grants"]["superuser"] is True
    assert json.loads(requeued.stdout)["sent"] == [2]
    assert fetch_record(db, 2)["archive_status"] == "PENDING"


def test_json_output_keeps_progress_off_stdout(
    archive_ctl: ArchiveCtl, sqs: Any, queues: QueuePair
) -> None:
    for record_id in (1, 2):
        sqs.send_message(QueueUrl=queues.dlq_url, MessageBody=encode(record_id))
    result = archive_ctl("redrive-dlq", "--json")
    assert result.returncode == EXIT_OK, result.stderr
    assert json.loads(result.stdout)["moved"] == 2  # one document, nothing else
    assert "StartMessageMoveTask is not available" in result.stderr


def test_help_names_no_date(archive_ctl: ArchiveCtl) -> None:
    texts = [archive_ctl("--help").stdout]
    texts += [archive_ctl(command, "--help").stdout for command in ("list", "requeue")]
    for text in texts:
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), text


def test_a_broken_pipe_is_not_confused_with_a_failure(archive_ctl: ArchiveCtl) -> None:
    """The same run with a reader that stays: exit 0, the whole answer."""
    result = archive_ctl("list", stdout=subprocess.PIPE)
    assert result.returncode == EXIT_OK
    assert "no records match" in result.stdout
