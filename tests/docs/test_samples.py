"""Every sample output of archive-ctl in the docs is what it prints.

A sample is a fenced block marked `<!-- sample: NAME -->` whose `$ archive-ctl ...` lines
are run, in-process, against the test services (PostgreSQL, moto's SQS) after the
scenario of the same name below has made the state the doc describes. The output, scrubbed
and loosened (tests/docs/samples.py), must be the sample's. After changing what a command
prints, `UPDATE_DOC_SAMPLES=1 .venv/bin/pytest tests/docs/test_samples.py` writes the new
output into the docs (then read the diff)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from devkit.postgres import connect
from lib.cli import main as cli
from lib.platform import schema
from tests.docs.markdown import Sample, every_doc, fenced_blocks, samples
from tests.docs.samples import commands, mismatch, rewrite, scrub

UPDATE = os.environ.get("UPDATE_DOC_SAMPLES") == "1"
CLI_SAMPLES = [s for s in samples() if any("archive-ctl" in c for c, _ in commands(s.body))]
# The queues of the docs' examples: `<stack>-queue` and `<stack>-dlq`, as the template
# names them.
QUEUE, DLQ = "image-archive-prod-queue", "image-archive-prod-dlq"
PACING = "20/minute,100/hour,300/day"  # Lsky Pro's default group limits


@dataclass
class Stage:
    """What a scenario works with: the test database, SQS, and the environment of the
    commands to come."""

    db: Any
    dsn: str
    sqs: Any
    queue: str
    dlq: str
    env: dict[str, str] = field(default_factory=dict)

    def send(self, url: str, body: str, reason: str | None = None) -> None:
        attributes = {"archive-error": {"DataType": "String", "StringValue": reason}}
        self.sqs.send_message(
            QueueUrl=url, MessageBody=body, MessageAttributes=attributes if reason else {}
        )


Scenario = Callable[[Stage], Iterator[None]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(function: Scenario) -> Scenario:
        SCENARIOS[name] = function
        return function

    return register


def add(db: Any, first: int, count: int = 1, **columns: str) -> None:
    """`count` SUCCEEDED generations of alice's from id `first`, each column an SQL
    expression of `s`, the row's number from 1 (times relative to the database's now)."""
    db.run("INSERT INTO users (id, username) VALUES (1, 'alice') ON CONFLICT DO NOTHING")
    values = {
        "id": f"{first} - 1 + s",
        "user_id": "1",
        "status": "'SUCCEEDED'",
        "image_url": "'https://cdn.example.com/gen/' || s || '.png'",
        **columns,
    }
    db.run(
        f"INSERT INTO image_generation_records ({', '.join(values)})"
        f" SELECT {', '.join(values.values())} FROM generate_series(1, {count}) AS s"
    )


def uploads(db: Any, count: int, *, since: str, until: str = "0 seconds") -> None:
    """`count` uploads in the lane's ledger, spread from `since` ago to `until` ago."""
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        f" SELECT 'lsky', now() - interval '{until}'"
        f"   - (interval '{since}' - interval '{until}') * s / {count}, 'done'"
        f" FROM generate_series(1, {count}) AS s"
    )


def pause(db: Any, *, reason: str, until: str, since: str, detail: str, window: str = "") -> None:
    db.run(
        f"UPDATE image_archive_lane SET paused_until = {until}, pause_reason = '{reason}',"
        f" pause_window = NULLIF('{window}', ''), paused_since = now() - interval '{since}',"
        f" pause_detail = :detail WHERE lane = 'lsky'",
        detail=detail,
    )


def pending(due: str, **columns: str) -> dict[str, str]:
    return {
        "archive_status": "'PENDING'",
        "archive_next_run_at": f"now() + interval '{due}'",
        **columns,
    }


@scenario("status")
def _status(stage: Stage) -> Iterator[None]:
    """A lane paused for the hour's window, rows waiting for it, a backlog and a DLQ."""
    db = stage.db
    due = pending("-5 minutes -10 seconds", archive_enqueued_at="now() - interval '5 minutes'")
    add(db, 1, **due)
    add(db, 2, **pending("0 seconds", archive_enqueued_at="now()"))
    held = {"archive_enqueued_at": "now()", "archive_attempts": "1"}
    add(db, 3, 2, **pending("90 seconds", archive_wait_reason="'backoff'", **held))
    staged = {
        "archive_staged_key": "'staged/' || (4 + s) || '/a1b2.png'",
        "archive_staged_at": "now() - interval '14 minutes 10 seconds'",
    }
    add(db, 5, 2, **pending("25 minutes", archive_wait_reason="'paused'", **held, **staged))
    add(db, 7, 3, **pending("25 minutes", archive_wait_reason="'paused'"))
    add(
        db,
        10,
        archive_status="'RUNNING'",
        archive_attempts="1",
        archive_locked_by="'invocation-1'",
        archive_locked_at="now() - interval '20 seconds'",
    )
    add(
        db,
        11,
        3,
        archive_status="'FAILED'",
        archive_attempts="3",
        started_at="now() - interval '3 hours'",
        archive_error="'download failed (HTTP 404): upstream answered HTTP 404 [attempt 1/3]'",
    )
    # Ages and the ETA sit mid-way between two roundings, so that a slow run (up to about
    # 25 s from here to the command) prints the same minutes.
    pause(
        db,
        reason="rate_limit",
        window="hour",
        until="now() + interval '25 minutes 15 seconds'",
        since="14 minutes",
        detail="每小时内你最多可以上传 100 张图片",
    )
    uploads(db, 90, since="14 minutes 50 seconds", until="14 minutes 10 seconds")
    # Two completion events EventBridge throttled, left to the sweeper.
    for record_id, age in ((14, "6 minutes 20 seconds"), (15, "2 minutes")):
        db.run(
            "INSERT INTO image_archive_outbox (event_id, record_id, detail_type, detail,"
            " created_at, tries, last_error) VALUES (gen_random_uuid(), :id, 'Image Archived',"
            " '{}', now() - CAST(:age AS interval), 1, 'ThrottlingException: Rate exceeded')",
            id=record_id,
            age=age,
        )
    for record_id in (1, 2, 3):
        stage.send(stage.queue, json.dumps({"recordId": str(record_id)}))
    stage.send(stage.dlq, '{"record": 7}', reason="body has no recordId")
    stage.send(stage.dlq, '{"recordId": "8"}')
    yield


def _live_day(db: Any) -> None:
    """A day of live uploads: 120, five in the last hour, one in the last 15 minutes."""
    uploads(db, 1, since="10 minutes")
    uploads(db, 4, since="55 minutes", until="20 minutes")
    uploads(db, 115, since="23 hours", until="1 hour")


@scenario("status-paced")
def _status_paced(stage: Stage) -> Iterator[None]:
    """Pacing at Lsky's default limits, a day of live uploads, a backlog of 60 and a
    history of 10,000 generations never queued."""
    _live_day(stage.db)
    add(stage.db, 1, 60, **pending("0 seconds", archive_enqueued_at="now()"))
    add(stage.db, 1001, 10_000, started_at="now() - interval '60 days' + s * interval '1 minute'")
    yield


@scenario("enqueue")
def _enqueue(stage: Stage) -> Iterator[None]:
    add(stage.db, 1)
    add(
        stage.db,
        10,
        archive_status="'SUCCEEDED'",
        hosted_image_url="'https://img.example.com/a.png'",
    )
    yield


def _failures(db: Any) -> None:
    """Three records failed in the last two hours, the oldest by a release that did not
    record when (its failure time is estimated from its last send), and one parked by the
    lane. Ages are whole minutes, so a slow run (up to about 30 s from here to the
    command) prints the same ones."""
    failed = {"archive_status": "'FAILED'", "archive_attempts": "3"}
    add(
        db,
        7,
        **failed,
        started_at="now() - interval '2 hours'",
        archive_first_claimed_at="now() - interval '100 minutes'",
        archive_enqueued_at="now() - interval '67 minutes'",
        archive_error="'download failed: timed out waiting for https://cdn.example.com/a.png"
        " [attempt 3/3]'",
    )
    add(
        db,
        8,
        **failed,
        started_at="now() - interval '3 hours'",
        archive_failed_at="now() - interval '50 minutes'",
        archive_error="'upload failed (HTTP 500): 服务异常，请稍后再试 [attempt 3/3]'",
    )
    add(
        db,
        9,
        **failed,
        started_at="now() - interval '26 hours'",
        archive_failed_at="now() - interval '25 minutes'",
        archive_error="'download failed (HTTP 503): upstream answered HTTP 503 [attempt 3/3]'",
    )
    add(
        db,
        12,
        **pending("10 minutes 15 seconds", archive_wait_reason="'paused'"),
        archive_error="'upload failed (HTTP 429): Too Many Attempts. [attempt 1/3]'",
    )


@scenario("list")
def _list(stage: Stage) -> Iterator[None]:
    _failures(stage.db)
    yield
    yield


@scenario("requeue")
def _requeue(stage: Stage) -> Iterator[None]:
    _failures(stage.db)
    yield
    yield  # the dry run by id: what the real run then does
    yield


@scenario("backfill-dry-run")
def _backfill(stage: Stage) -> Iterator[None]:
    _live_day(stage.db)
    db = stage.db
    db.run("INSERT INTO users (id, username) VALUES (7, 'bob') ON CONFLICT DO NOTHING")
    add(
        db,
        100_001,
        10_000,
        user_id="7",
        started_at="now() - interval '29 days' + s * interval '4 minutes'",
    )
    yield


@scenario("lane-clear")
def _lane_clear(stage: Stage) -> Iterator[None]:
    pause(
        stage.db,
        reason="account",
        until="'infinity'",
        since="5 hours",
        detail="upload failed (HTTP 401): Authentication failed.",
    )
    add(stage.db, 1, 37, **pending("10 minutes", archive_wait_reason="'paused'"))
    yield
    yield


@scenario("redrive-dlq")
def _redrive(stage: Stage) -> Iterator[None]:
    stage.send(stage.dlq, '{"record": 7}', reason="body has no recordId")
    stage.send(stage.dlq, '{"recordId": "8"}')
    yield
    yield


def story(db: Any, record_id: int, *events: tuple[str, int, str, dict[str, Any]]) -> None:
    """The record's events, oldest first: (how long ago, attempt, kind, detail), the detail
    as the code writes it for that kind (what a real life of the record wrote)."""
    for seq, (ago, attempt, kind, detail) in enumerate(events):
        db.run(
            "INSERT INTO image_archive_events (record_id, at, attempt, seq, kind, detail)"
            " VALUES (:id, now() - CAST(:ago AS interval), :attempt, :seq, :kind,"
            " CAST(:detail AS jsonb))",
            id=record_id,
            ago=ago,
            attempt=attempt,
            seq=seq,
            kind=kind,
            detail=json.dumps(detail, ensure_ascii=False),
        )


def ago(db: Any, interval: str) -> str:
    """The database's now() less `interval`, as a detail holds a time."""
    [[moment]] = db.run(f"SELECT now() - interval '{interval}'")
    return str(moment.isoformat())


MESSAGE, OWNER = "897df595-f524-4654-90bb-d863ac05435f", "aeac4c53-02d5-4936-baa5-2c44f18921a9"
EVENT = "0b3f6a5c-2f1e-4f7a-9a59-5d3b8c1e7f20"
SWEEPER_FAILED, REDRIVE = "lock expired after the last attempt", "archive-ctl redrive-dlq"
UPSTREAM_503 = "upstream answered HTTP 503 for https://cdn.example.com/gen/123.png?[redacted]"


@scenario("show")
def _show(stage: Stage) -> Iterator[None]:
    """Record 123's first attempt met a 503 a moment ago: its backoff holds its message."""
    error = f"download failed (HTTP 503): {UPSTREAM_503} [attempt 1/3]"
    add(
        stage.db,
        123,
        **pending("28 seconds", archive_wait_reason="'backoff'"),
        archive_attempts="1",
        archive_enqueued_at="now() - interval '40 seconds'",
        archive_first_claimed_at="now() - interval '2 seconds'",
        archive_error=f"'{error}'",
        image_url="'https://cdn.example.com/gen/123.png'",
    )
    fetched = {"error": UPSTREAM_503, "source": "provider", "status": 503}
    retried = {
        "error": error,
        "outcome": "retry",
        "error_class": "transient",
        "next_run_at": ago(stage.db, "-28 seconds"),
        "delay_seconds": 30,
    }
    story(
        stage.db,
        123,
        ("40 seconds", 0, "enqueued", {"by": "producer", "inferred": True}),
        ("2 seconds", 0, "received", {"message_id": MESSAGE, "receive_count": 1}),
        ("2 seconds", 1, "claimed", {"owner": f"{OWNER}/{MESSAGE}"}),
        ("2 seconds", 1, "fetched", fetched),
        ("2 seconds", 1, "retried", retried),
    )
    yield


@scenario("show-redriven")
def _show_redriven(stage: Stage) -> Iterator[None]:
    """Record 8 (one attempt allowed): its container died mid-upload, the sweeper failed it
    for the expired lock, its message reached the DLQ, `redrive-dlq --manual` gave it new
    attempts, and the next one adopted the image the first had stored."""
    stage.env["ARCHIVE_MAX_ATTEMPTS"] = "1"
    url = "https://img.example.com/i/' || to_char(now(), 'YYYY/MM/DD') || '/6b124edccbb7e.png"
    add(
        stage.db,
        8,
        archive_status="'SUCCEEDED'",
        archive_attempts="1",
        archive_enqueued_at="now() - interval '12 minutes'",
        archive_first_claimed_at="now() - interval '65 minutes'",
        archived_at="now() - interval '10 minutes'",
        hosted_image_url=f"'{url}'",
        image_mime_type="'image/png'",
    )
    [[hosted]] = stage.db.run("SELECT hosted_image_url FROM image_generation_records WHERE id = 8")
    first, second = (
        ("7e9bad63-4dd7-4e7e-b584-ad046072f392", "23549d93-31f0-459d-b265-21b02322c7d7"),
        ("0074255a-c36c-4d0e-b515-f3de38cff883", "8e42be3f-88e5-44e0-9765-f9058b771297"),
    )
    why = "the record's name, stored after its first claim, the sha1 of the bytes sent"
    taken_over = {"by": "sweeper", "owner": "/".join(first[::-1])}
    story(
        stage.db,
        8,
        ("65 minutes", 0, "enqueued", {"by": "producer", "inferred": True}),
        ("65 minutes", 0, "received", {"message_id": first[0], "receive_count": 1}),
        ("65 minutes", 1, "claimed", {"owner": "/".join(first[::-1])}),
        ("60 minutes", 1, "lock_taken_over", {**taken_over, "locked_at": ago(stage.db, "65 min")}),
        ("60 minutes", 1, "failed", {"by": "sweeper", "error": SWEEPER_FAILED}),
        (
            "12 minutes",
            0,
            "enqueued",
            {"by": REDRIVE, "was": "FAILED", "attempts": 1, "message_id": first[0]},
        ),
        ("10 minutes", 0, "received", {"message_id": second[0], "receive_count": 1}),
        ("10 minutes", 1, "claimed", {"owner": "/".join(second[::-1])}),
        (
            "10 minutes",
            1,
            "fetched",
            {"type": "image/png", "bytes": 164, "source": "provider", "seconds": 0.006},
        ),
        (
            "10 minutes",
            1,
            "looked_up",
            {"why": why, "adopted": "plFOv8", "refused": [], "duplicates": []},
        ),
        (
            "10 minutes",
            1,
            "archived",
            {
                "key": "plFOv8",
                "url": hosted,
                "adopted": True,
                "event_id": EVENT,
                # What the container's next claim noted: its event went out.
                "published_at": ago(stage.db, "10 minutes"),
                "published_by": "archive function",
                "detail_type": "Image Archived",
            },
        ),
    )
    yield


# The columns of the seed worker's schema: what the in-process TypeScript worker used.
SEED_COLUMNS = (
    "archive_status TEXT",
    "archive_attempts INT NOT NULL DEFAULT 0",
    "archive_next_run_at TIMESTAMPTZ",
    "archive_locked_by TEXT",
    "archive_locked_at TIMESTAMPTZ",
    "archive_enqueued_at TIMESTAMPTZ",
    "archive_error TEXT",
    "archived_at TIMESTAMPTZ",
    "hosted_image_url TEXT",
    "image_mime_type TEXT",
    "hosted_response JSONB",
)


@scenario("migrate")
def _migrate(stage: Stage) -> Iterator[None]:
    """The database the seed worker used: its archive columns, legacy status values, and
    rows it may have uploaded without recording it."""
    admin = connect(stage.dsn)
    name = f"seeded_{uuid.uuid4().hex[:10]}"
    admin.run(f'CREATE DATABASE "{name}"')
    dsn = stage.dsn.rsplit("/", 1)[0] + "/" + name
    try:
        old = connect(dsn)
        try:
            base = schema.BASE_SCHEMA.read_text(encoding="utf-8")
            for statement in schema.split_statements(base):
                old.run(statement)
            for column in SEED_COLUMNS:
                old.run(f"ALTER TABLE image_generation_records ADD COLUMN {column}")
            hosted = {"hosted_image_url": "'https://img.example.com/' || s || '.png'"}
            add(old, 1, 120, archive_status="'DONE'", archive_attempts="1", **hosted)
            add(old, 201, 3, archive_status="'pending'", archive_next_run_at="now()")
            add(old, 301, 14, archive_status="'PENDING'", archive_attempts="1")
            add(old, 401, 3, archive_status="'FAILED'", archive_attempts="3")
        finally:
            old.close()
        stage.env["DATABASE_URL"] = dsn
        yield
        yield
    finally:
        admin.run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


ROLE = "image_archive"


@scenario("grants")
def _grants(stage: Stage) -> Iterator[None]:
    """The functions' role before a release that added the staged copy's columns: every
    grant but those."""
    db = stage.db
    _drop_role(db)
    db.run(f"CREATE ROLE {ROLE}")
    try:
        from lib.platform import grants
        from lib.platform.migration_file import load_declaration

        needed = [
            p
            for p in grants.privileges(load_declaration())
            if p.column not in ("archive_staged_key", "archive_staged_at")
        ]
        for statement in grants.grant_statements(ROLE, needed):
            db.run(statement)
        output = yield
        # What the first run printed, as the tables' owner would run it.
        for line in (output or "").splitlines():
            if line.startswith("GRANT "):
                db.run(line.rstrip(";"))
        yield
    finally:
        _drop_role(db)


def _drop_role(db: Any) -> None:
    if db.run("SELECT 1 FROM pg_roles WHERE rolname = :r", r=ROLE):
        db.run(f"DROP OWNED BY {ROLE}")
        db.run(f"DROP ROLE {ROLE}")


# ---------------------------------------------------------------- running the samples


@pytest.fixture
def stage(pg_dsn: str, db: Any, sqs: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stage]:
    dlq = sqs.create_queue(QueueName=DLQ)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]
    policy = {"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": "5"}
    queue = sqs.create_queue(
        QueueName=QUEUE,
        Attributes={"VisibilityTimeout": "720", "RedrivePolicy": json.dumps(policy)},
    )["QueueUrl"]
    for name in ("DB_SECRET_ARN", "DB_SSLMODE", "ARCHIVE_LOCK_TTL_SECONDS", "LSKY_RATE_LIMITS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", pg_dsn)
    monkeypatch.setenv("ARCHIVE_QUEUE_URL", queue)
    monkeypatch.setenv("ARCHIVE_DLQ_URL", dlq)
    try:
        yield Stage(db=db, dsn=pg_dsn, sqs=sqs, queue=queue, dlq=dlq)
    finally:
        for url in (queue, dlq):
            with contextlib.suppress(Exception):
                sqs.delete_queue(QueueUrl=url)


def argv_of(command: str) -> tuple[dict[str, str], list[str]]:
    """`A=b archive-ctl x --y  # note` -> ({"A": "b"}, ["x", "--y"])."""
    words = shlex.split(command.split("  # ", 1)[0])
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words, command
    assert words[0].rsplit("/", 1)[-1] == "archive-ctl", command
    return env, words[1:]


def run(command: str, stage: Stage, capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> str:
    env, argv = argv_of(command)
    with monkeypatch.context() as scoped:
        for name, value in {**stage.env, **env}.items():
            scoped.setenv(name, value)
        capsys.readouterr()
        cli.main(argv)
        out, err = capsys.readouterr()
    return scrub(out + err)


def test_every_sample_has_a_scenario_and_every_scenario_a_sample() -> None:
    assert sorted(s.name for s in CLI_SAMPLES) == sorted(SCENARIOS)


def test_every_archive_ctl_output_in_the_docs_is_a_marked_sample() -> None:
    """An output block a reader sees (`$ archive-ctl ...` followed by what it printed)
    is one the tests run; `<!-- sample: NAME -->` marks it."""
    marked = {s.body for s in samples()}
    unmarked = [
        (doc, body.splitlines()[0])
        for doc, text in every_doc().items()
        for _, body in fenced_blocks(text)
        if any(line.startswith("$ ") and "archive-ctl" in line for line in body.splitlines())
        and body not in marked
    ]
    assert unmarked == []


@pytest.mark.parametrize("sample", CLI_SAMPLES, ids=lambda s: s.name)
def test_the_sample_is_what_the_command_prints(
    sample: Sample, stage: Stage, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    steps = SCENARIOS[sample.name](stage)
    next(steps)
    printed = []
    for command, shown in commands(sample.body):
        output = run(command, stage, capsys, monkeypatch)
        printed.append((command, output))
        if not UPDATE:
            problem = mismatch(shown, output)
            assert problem is None, f"{sample.doc}, sample {sample.name}, `{command}`: {problem}"
        with contextlib.suppress(StopIteration):
            steps.send(output)
    steps.close()
    if UPDATE:
        rewrite(sample.doc, sample.name, printed)
