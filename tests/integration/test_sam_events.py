"""Invoke each handler with its events/ file and env.json, as `sam local invoke` would.

`sam local invoke -e events/X.json --env-vars env.json` runs the handler with the
template's environment overridden by env.json. Here the same files drive a direct
call; only the addresses of the local services are swapped for the test ones
(env.json names the defaults `make local` uses: 5432, 8080, 5000).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from devkit import images
from lib.archive import runtime
from tests.support import FakeLambdaContext, fetch_record, seed_record

ROOT = Path(__file__).resolve().parents[2]


def load_json(relative: str) -> Any:
    return json.loads((ROOT / relative).read_text())


def local_env(function: str, *, pg_dsn: str, lsky_url: str, sqs_url: str) -> dict[str, str]:
    """env.json's variables for `function`, pointed at this run's services."""
    env: dict[str, str] = load_json("env.json")[function]
    moto = urlsplit(sqs_url)
    for name, value in env.items():
        if name == "DATABASE_URL":
            env[name] = pg_dsn
        elif name == "LSKY_BASE_URL":
            env[name] = lsky_url
        elif value.startswith("http://127.0.0.1:5000"):
            env[name] = value.replace("http://127.0.0.1:5000", f"{moto.scheme}://{moto.netloc}")
    return env


@pytest.fixture
def sam_queues(sqs: Any) -> Iterator[dict[str, str]]:
    """The queues env.json and the event file name (fixed names, as the template makes)."""
    dlq = sqs.create_queue(QueueName="image-archive-dlq")["QueueUrl"]
    queue = sqs.create_queue(QueueName="image-archive-queue")["QueueUrl"]
    yield {"queue": queue, "dlq": dlq}
    sqs.purge_queue(QueueUrl=queue)
    sqs.purge_queue(QueueUrl=dlq)


def apply_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runtime.reset()


def test_archive_function_with_its_event_file(
    monkeypatch: pytest.MonkeyPatch,
    db: Any,
    pg_dsn: str,
    lsky: Any,
    upstream: Any,
    moto: Any,
    sam_queues: dict[str, str],
) -> None:
    event = load_json("events/archive_sqs.json")
    record_id = int(json.loads(event["Records"][0]["body"])["recordId"])
    upstream.add("/generated/event.png", images.png(6, 6))
    seed_record(db, record_id, image_url=upstream.url("/generated/event.png"))
    env = local_env(
        "ArchiveFunction", pg_dsn=pg_dsn, lsky_url=lsky.base_url, sqs_url=moto.endpoint_url
    )
    apply_env(monkeypatch, env)

    from handlers.archive import lambda_handler

    try:
        response = lambda_handler(event, FakeLambdaContext(function_name="ArchiveFunction"))
    finally:
        runtime.reset()

    assert response == {"batchItemFailures": []}
    row = fetch_record(db, record_id)
    assert row["archive_status"] == "SUCCEEDED"
    assert lsky.successful_uploads == 1
