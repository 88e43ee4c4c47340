"""`make services` and what `make local ARGS=--keep` leaves running: the local services
(PostgreSQL, moto's SQS and S3, the Lsky stand-in, the image upstream) until Ctrl-C,
with the variables that reach them printed.

`make services` puts them on the ports and names env.json gives (so that `sam local invoke
--env-vars env.json` finds them) and queues record 123, the one events/archive_sqs.json
names, with an image to archive.

    python -m devkit.demo.stack [--env-json env.json] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devkit.demo.report import Printer
from devkit.demo.services import Layout, Services, start_services

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_JSON = REPO_ROOT / "env.json"
EVENT = REPO_ROOT / "events" / "archive_sqs.json"
EXIT_OK = 0


def layout_of(env: Mapping[str, Any]) -> Layout:
    """The services' ports and names as an env.json (sam local's --env-vars) gives them;
    ValueError when it names what one local stack cannot serve."""
    archive, sweeper = env["ArchiveFunction"], env["SweeperFunction"]
    database = urlsplit(archive["DATABASE_URL"])
    sqs, s3 = urlsplit(archive["AWS_ENDPOINT_URL_SQS"]), urlsplit(archive["AWS_ENDPOINT_URL_S3"])
    lsky = urlsplit(archive["LSKY_BASE_URL"])
    if sqs.port != s3.port:
        raise ValueError("env.json: SQS and S3 must be the one moto server (one port)")
    if database.username not in (None, "postgres"):
        raise ValueError("env.json: the local cluster's user is postgres")
    queues = {"the queue": sweeper["ARCHIVE_QUEUE_URL"], "the DLQ": archive["ARCHIVE_DLQ_URL"]}
    for name, url in queues.items():
        if urlsplit(url).port != sqs.port:
            raise ValueError(f"env.json: {name} is not on the SQS endpoint's moto server")
    return Layout(
        postgres_port=database.port or 5432,
        database=database.path.lstrip("/"),
        moto_port=sqs.port or 5000,
        lsky_port=lsky.port or 80,
        lsky_token=archive.get("LSKY_TOKEN") or None,
        queue=sweeper["ARCHIVE_QUEUE_URL"].rstrip("/").rsplit("/", 1)[-1],
        dlq=archive["ARCHIVE_DLQ_URL"].rstrip("/").rsplit("/", 1)[-1],
        bucket=archive["ARCHIVE_STAGING_BUCKET"],
        originals_bucket=archive["ARCHIVE_ORIGINALS_BUCKET"],
    )


def variables(services: Services) -> dict[str, str]:
    """What the functions and archive-ctl need to reach the services."""
    endpoint = services.moto.endpoint_url
    return {
        "DATABASE_URL": services.dsn,
        "DB_SSLMODE": "disable",
        "AWS_ENDPOINT_URL_SQS": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
        "ARCHIVE_QUEUE_URL": services.queues.url,
        "ARCHIVE_DLQ_URL": services.queues.dlq_url,
        "ARCHIVE_STAGING_BUCKET": services.staging_bucket,
        "ARCHIVE_ORIGINALS_BUCKET": services.originals_bucket,
        "LSKY_BASE_URL": services.lsky.base_url,
        "LSKY_TOKEN": services.lsky.token,
        "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8",
    }


def hold(services: Services, printer: Printer, *, record_id: int | None = None) -> None:
    """Print how to reach the services, then keep them until Ctrl-C (or SIGTERM)."""
    printer.plain()
    printer.plain("The services keep running. In another shell:")
    for name, value in variables(services).items():
        printer.plain(f"  export {name}='{value}'")
    example = record_id if record_id is not None else 1
    printer.plain(f"  scripts/archive-ctl show {example}    # a record's story")
    printer.plain("  scripts/archive-ctl status")
    printer.plain(
        f"Ctrl-C here (or kill -INT {os.getpid()}) stops them; the database goes with them."
    )
    stop = threading.Event()
    while not stop.wait(3600):
        pass


def seed_event_record(services: Services) -> int:
    """Record 123 of events/archive_sqs.json, PENDING with an image on the upstream
    stand-in, as the generation service leaves it (row first; the event is the message)."""
    from devkit import images  # noqa: PLC0415
    from devkit.postgres import connect  # noqa: PLC0415

    body = json.loads(EVENT.read_text())["Records"][0]["body"]
    record_id = int(json.loads(body)["recordId"])
    url = services.upstream.add(f"/gen/{record_id}.png", images.png(64, 64, size=20_000))
    conn = connect(services.dsn)
    try:
        conn.run("INSERT INTO users (id, username) VALUES (1, 'alice') ON CONFLICT DO NOTHING")
        conn.run(
            "INSERT INTO image_generation_records (id, user_id, status, image_url, started_at,"
            " archive_status, archive_next_run_at, archive_enqueued_at)"
            " VALUES (:id, 1, 'SUCCEEDED', :url, :started, 'PENDING', now(), now())",
            id=record_id,
            url=url,
            started=datetime.now(UTC),
        )
    finally:
        conn.close()
    return record_id


def main(argv: list[str] | None = None) -> int:
    from devkit._cli import exit_cleanly_on_signals  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="python -m devkit.demo.stack",
        description="Start the local services on env.json's ports (what `make services` does) "
        "and keep them until Ctrl-C.",
    )
    parser.add_argument("--env-json", type=Path, default=ENV_JSON, help="default: env.json")
    parser.add_argument("--data-dir", type=Path, help="where Lsky's files go (default: a temp dir)")
    args = parser.parse_args(argv)
    layout = layout_of(json.loads(args.env_json.read_text()))
    exit_cleanly_on_signals()
    printer = Printer()
    with contextlib.ExitStack() as stack:
        data_dir = args.data_dir or Path(stack.enter_context(_temporary_dir()))
        try:
            services = start_services(stack, data_dir, layout=layout)
            record_id = seed_event_record(services)
            printer.line(
                "services", f"on the ports {args.env_json.name} names; record {record_id} queued"
            )
            printer.plain(
                "  sam local invoke ArchiveFunction -e events/archive_sqs.json "
                f"--env-vars {args.env_json.name} --docker-network host"
            )
            hold(services, printer, record_id=record_id)
        except KeyboardInterrupt:
            printer.line("stopping", "the services and their data")
    return EXIT_OK


@contextlib.contextmanager
def _temporary_dir() -> Any:
    import tempfile  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="image-archive-services-") as path:
        yield path


if __name__ == "__main__":
    raise SystemExit(main())
