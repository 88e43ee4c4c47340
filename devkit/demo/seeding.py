"""The `make local` scenario's rows and messages, made as the generation service makes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from devkit import images
from devkit.demo.scenario import SWEPT, USERS, Kind, Profile, Sample
from devkit.demo.services import Services

if TYPE_CHECKING:
    from lib.platform.db import Database


def seed(services: Services, db: Database, samples: list[Sample], profile: Profile) -> int:
    """Rows and messages as the generation service makes them; returns messages sent."""
    from lib.archive.enqueue import enqueue  # noqa: PLC0415
    from lib.platform.sqs import Queue  # noqa: PLC0415
    from lib.state.operations import OperatorRecords  # noqa: PLC0415

    for user_id, username in USERS.items():
        db.run("INSERT INTO users (id, username) VALUES (:id, :name)", id=user_id, name=username)
    now = datetime.now(UTC)
    for sample in samples:
        up = services.upstream
        match sample.kind:
            case Kind.GONE:
                url = up.add(sample.path, b"gone", status=404, content_type="text/plain")
            case Kind.BROKEN:
                url = up.add(sample.path, sample.body(), fail_first=10**6)
            case Kind.FLAKY | Kind.FLAKY_TWICE:
                fail = 1 if sample.kind is Kind.FLAKY else 2
                url = up.add(sample.path, sample.body(), fail_first=fail)
            case Kind.SLOW:
                url = up.add(sample.path, sample.body(), delay=profile.slow_seconds)
            case _:
                mime = images.sniff(sample.body()) or "image/png"
                url = up.add(sample.path, sample.body(), content_type=mime)
        db.run(
            "INSERT INTO image_generation_records (id, user_id, status, prompt, image_url, "
            "started_at) VALUES (:id, :user_id, 'SUCCEEDED', :prompt, :url, :started)",
            id=sample.record_id,
            user_id=sample.user_id,
            prompt=f"sample {sample.kind}",
            url=url,
            started=now - timedelta(minutes=len(samples) - sample.record_id),
        )
    # A producer whose SendMessage failed after its UPDATE: PENDING, due, never sent.
    lost = [s.record_id for s in samples if s.kind is Kind.LOST]
    db.run(
        "UPDATE image_generation_records SET archive_status = 'PENDING', "
        "archive_next_run_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))",
        ids=lost,
    )
    # An attempt whose container crashed an hour ago: RUNNING under an expired lock.
    stale = [s.record_id for s in samples if s.kind is Kind.STALE]
    db.run(
        "UPDATE image_generation_records SET archive_status = 'RUNNING', archive_attempts = 1, "
        "archive_locked_by = 'crashed-invocation', archive_locked_at = now() - interval '1 hour', "
        "archive_next_run_at = now() - interval '1 hour', "
        "archive_enqueued_at = now() - interval '1 hour' WHERE id = ANY(CAST(:ids AS bigint[]))",
        ids=stale,
    )
    normal = [s.record_id for s in samples if s.kind not in SWEPT]
    report = enqueue(OperatorRecords(db), Queue(), services.queues.url, normal)
    if not report.ok or report.skipped:
        raise RuntimeError(f"seeding could not enqueue every record: {report}")
    services.sqs.send_message(QueueUrl=services.queues.url, MessageBody='{"record": 7}')
    return len(report.sent) + 1
