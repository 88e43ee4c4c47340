"""Capture now, publish later: images staged in a (moto) S3 bucket while the host cannot
take them are published from there, after the provider's URL has expired."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour
from devkit.s3 import staged_keys
from devkit.upstream import StreamBody
from lib.archive import runtime
from lib.archive.message import encode
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.state.lane_store import LaneStore
from lib.state.operations import OperatorRecords
from lib.state.selection import Selection
from lib.state.sweeps import SweepRecords
from tests.integration.conftest import ArchiveHarness
from tests.integration.world import World
from tests.support import emf_metrics, fetch_record, make_due, run_python, seed_record

IMAGE = images.png(16, 16, size=300_000, seed=3)
SHA = hashlib.sha256(IMAGE).hexdigest()
RATE_LIMITED = "每分钟内你最多可以上传 20 张图片"
ROOT = Path(__file__).resolve().parents[2]


class Records:
    """The state's statements, as an operator's or a test's second connection."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.lane = LaneStore(db)
        self.sweeps = SweepRecords(db)
        self.operator = OperatorRecords(db)


@pytest.fixture
def records(pg_dsn: str) -> Iterator[Records]:
    db = Database(DatabaseConfig(url=pg_dsn), application_name="staging-test")
    yield Records(db)
    db.close()


@pytest.fixture
def staged(
    archive_env: Callable[..., dict[str, str]], archive: ArchiveHarness, staging_bucket: str
) -> ArchiveHarness:
    """The archive harness with staging on (ARCHIVE_STAGING_BUCKET set)."""
    archive.env = archive_env(ARCHIVE_STAGING_BUCKET=staging_bucket)
    return archive


def pause_for_an_hour(records: Records) -> None:
    lane = records.lane.state()
    records.lane.pause(
        until=lane.now + timedelta(hours=1),
        reason="rate_limit",
        window="hour",
        detail="每小时内你最多可以上传 100 张图片",
    )


def source(upstream: Any, path: str, *, chunked: bool, downloads: int) -> str:
    """The provider's URL: good for `downloads` fetches, then 403 (expired)."""
    return str(upstream.add(path, IMAGE, chunked=chunked, fail_after=downloads))


def sha256_of(chunks: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def assert_published_from_the_copy(
    db: Any, s3: Any, bucket: str, lsky: Any, record_id: int, *, uploads: int
) -> None:
    row = fetch_record(db, record_id)
    assert row["archive_status"] == "SUCCEEDED", row["archive_error"]
    assert row["archive_staged_key"] is None
    assert row["archive_staged_at"] is None
    assert staged_keys(s3, bucket) == [], "the staged copy outlived the success"
    assert lsky.upload_count == uploads
    assert lsky.uploads[-1].sha256 == SHA  # the very bytes the provider served
    assert lsky.successful_uploads == 1


def test_a_record_claimed_while_the_lane_is_paused_is_captured_then_published(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed_record(db, 1, image_url=source(upstream, "/gen/1.png", chunked=False, downloads=1))
    pause_for_an_hour(records)

    # Paused for an hour: captured at once, the attempt given back, the row parked.
    assert staged.deliver(encode(1)) == {"batchItemFailures": []}
    row = fetch_record(db, 1)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_staged_key"].startswith("staged/1/")
    assert row["archive_staged_at"] is not None
    assert staged_keys(s3, staging_bucket) == [row["archive_staged_key"]]
    obj = s3.get_object(Bucket=staging_bucket, Key=row["archive_staged_key"])
    assert obj["ContentType"] == "image/png"
    assert hashlib.sha256(obj["Body"].read()).hexdigest() == SHA
    assert lsky.upload_count == 0
    assert staged.log_for("image staged")["reason"] == "lane paused"
    assert emf_metrics(capsys).get("Staged") == 1

    # The URL expires; an hour later the lane opens and the row is due.
    assert upstream.hits("/gen/1.png") == 1
    records.lane.clear()
    make_due(db, 1)
    assert staged.deliver(encode(1)) == {"batchItemFailures": []}

    assert_published_from_the_copy(db, s3, staging_bucket, lsky, 1, uploads=1)
    assert upstream.hits("/gen/1.png") == 1  # never fetched again
    assert fetch_record(db, 1)["archive_attempts"] == 1


def test_a_staged_row_waits_for_the_lane_without_being_captured_again(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
) -> None:
    seed_record(db, 2, image_url=source(upstream, "/gen/2.png", chunked=False, downloads=1))
    pause_for_an_hour(records)
    staged.deliver(encode(2))
    key = fetch_record(db, 2)["archive_staged_key"]
    make_due(db, 2)  # still paused

    assert staged.deliver(encode(2)) == {"batchItemFailures": []}  # parked again

    row = fetch_record(db, 2)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_staged_key"] == key
    assert staged_keys(s3, staging_bucket) == [key]
    assert upstream.hits("/gen/2.png") == 1


# The provider's URL works once, then answers 403 (its signature expired): with or without
# a Content-Length, the bytes of that one download are the ones staged and published.
@pytest.mark.parametrize("chunked", [True, False], ids=["no-length", "content-length"])
def test_lsky_rate_limit_stages_the_image_and_the_expired_url_does_not_matter(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
    chunked: bool,
) -> None:
    downloads = 1
    seed_record(
        db, 3, image_url=source(upstream, "/gen/3.png", chunked=chunked, downloads=downloads)
    )
    lsky.script(Behaviour.status_false(RATE_LIMITED))

    staged.deliver(encode(3))  # the lane pauses for Lsky's minute window

    row = fetch_record(db, 3)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert "lane paused (rate_limit)" in row["archive_error"]
    assert staged_keys(s3, staging_bucket) == [row["archive_staged_key"]]
    assert staged.log_for("image staged")["reason"] == "upload failed"
    assert upstream.hits("/gen/3.png") == downloads

    records.lane.clear()  # the minute has passed
    make_due(db, 3)
    staged.deliver(encode(3))

    assert_published_from_the_copy(db, s3, staging_bucket, lsky, 3, uploads=2)
    assert upstream.hits("/gen/3.png") == downloads


@pytest.mark.parametrize("chunked", [True, False], ids=["no-length", "content-length"])
def test_lsky_failing_transiently_publishes_from_the_staged_copy(
    staged: ArchiveHarness,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
    chunked: bool,
) -> None:
    downloads = 1  # the first download's bytes are staged: never fetched again
    seed_record(
        db, 4, image_url=source(upstream, "/gen/4.png", chunked=chunked, downloads=downloads)
    )
    lsky.script(Behaviour.server_error(), Behaviour.server_error())

    staged.deliver(encode(4))  # attempt 1: HTTP 500, staged, retried
    row = fetch_record(db, 4)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 1)
    assert "HTTP 500" in row["archive_error"]
    key = row["archive_staged_key"]
    assert staged_keys(s3, staging_bucket) == [key]

    make_due(db, 4)
    staged.deliver(encode(4))  # attempt 2, from the copy: HTTP 500 again, still staged
    row = fetch_record(db, 4)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 2)
    assert row["archive_staged_key"] == key

    make_due(db, 4)
    staged.deliver(encode(4))  # attempt 3, from the copy: published

    assert_published_from_the_copy(db, s3, staging_bucket, lsky, 4, uploads=3)
    assert upstream.hits("/gen/4.png") == downloads


def test_an_upload_from_the_copy_whose_answer_was_lost_is_adopted_not_repeated(
    staged: ArchiveHarness,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
) -> None:
    seed_record(db, 14, image_url=source(upstream, "/gen/14.png", chunked=True, downloads=1))
    # Attempt 1: a 500 (stored nothing), staged. Attempt 2, from the copy: Lsky stores the
    # image but the answer is lost. Attempt 3 must find it, not upload the copy again.
    lsky.script(Behaviour.server_error(), Behaviour.drop(store=True))
    staged.deliver(encode(14))
    make_due(db, 14)
    staged.deliver(encode(14))
    assert fetch_record(db, 14)["archive_may_be_hosted"] is True
    make_due(db, 14)

    assert staged.deliver(encode(14)) == {"batchItemFailures": []}

    row = fetch_record(db, 14)
    assert row["archive_status"] == "SUCCEEDED"
    [image] = lsky.image_records()
    assert row["hosted_image_url"].endswith(image.pathname)
    assert lsky.upload_count == 2  # the 500 and the lost answer; none after


def failed_keeping_its_copy(
    staged: ArchiveHarness, db: Any, upstream: Any, lsky: Any, record_id: int
) -> None:
    """Record `record_id` FAILED by three Lsky 500s; the provider served its image once
    (the URL is gone after that), so only the staged copy is left."""
    path = f"/gen/{record_id}.png"
    seed_record(db, record_id, image_url=source(upstream, path, chunked=True, downloads=1))
    lsky.script(*[Behaviour.server_error()] * 3)
    for _ in range(3):
        staged.deliver(encode(record_id))
        make_due(db, record_id)


def test_an_outage_longer_than_every_attempt_keeps_the_copy_for_a_replay(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
) -> None:
    failed_keeping_its_copy(staged, db, upstream, lsky, 5)

    row = fetch_record(db, 5)
    assert (row["archive_status"], row["archive_attempts"]) == ("FAILED", 3)
    assert "[attempt 3/3]" in row["archive_error"]
    # Not refused for good: the row keeps its copy (the URL is long gone).
    assert staged_keys(s3, staging_bucket) == [row["archive_staged_key"]]
    assert records.sweeps.staged_summary().failed_keeping_copy == 1

    # Lsky is back; the operator replays failures (archive-ctl requeue --failed).
    assert [
        record_id for record_id, _ in records.operator.requeue_failed(Selection(), limit=10)
    ] == [5]
    staged.deliver(encode(5))

    assert_published_from_the_copy(db, s3, staging_bucket, lsky, 5, uploads=4)
    assert upstream.hits("/gen/5.png") == 1


def test_a_staged_copy_refused_for_good_is_deleted_with_the_failure(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
) -> None:
    seed_record(db, 6, image_url=source(upstream, "/gen/6.png", chunked=False, downloads=1))
    pause_for_an_hour(records)
    staged.deliver(encode(6))
    records.lane.clear()
    make_due(db, 6)
    lsky.script(Behaviour.status_false("不支持的文件类型"))

    staged.deliver(encode(6))

    row = fetch_record(db, 6)
    assert row["archive_status"] == "FAILED"
    assert "不支持的文件类型" in row["archive_error"]
    assert row["archive_staged_key"] is None
    assert staged_keys(s3, staging_bucket) == []


def test_a_missing_staged_copy_falls_back_to_the_source(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
) -> None:
    upstream.add("/gen/7.png", IMAGE)
    seed_record(db, 7, image_url=upstream.url("/gen/7.png"))
    pause_for_an_hour(records)
    staged.deliver(encode(7))
    [key] = staged_keys(s3, staging_bucket)
    s3.delete_object(Bucket=staging_bucket, Key=key)  # as the lifecycle rule would
    records.lane.clear()
    make_due(db, 7)

    assert staged.deliver(encode(7)) == {"batchItemFailures": []}

    row = fetch_record(db, 7)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["archive_staged_key"] is None
    assert upstream.hits("/gen/7.png") == 2
    assert staged.log_for("staged copy missing; using the source")


@pytest.mark.parametrize("source_alive", [True, False], ids=["url-still-works", "url-expired"])
def test_a_replay_whose_copy_the_lifecycle_removed_tries_the_source_once(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
    source_alive: bool,
) -> None:
    # A FAILED row kept its copy for `archive-ctl requeue --failed`; the bucket's lifecycle
    # rule deleted it before the operator replayed the failure.
    failed_keeping_its_copy(staged, db, upstream, lsky, 8)
    [key] = staged_keys(s3, staging_bucket)
    s3.delete_object(Bucket=staging_bucket, Key=key)
    if source_alive:
        upstream.add("/gen/8.png", IMAGE)  # the provider still serves it
    records.operator.requeue_failed(Selection(), limit=10)

    staged.deliver(encode(8))

    row = fetch_record(db, 8)
    assert staged.log_for("staged copy missing; using the source")
    if source_alive:
        assert row["archive_status"] == "SUCCEEDED"
        assert lsky.successful_uploads == 1
    else:
        # One attempt, spent on a permanent answer: nothing retried for nothing, and the
        # error says both what was missing and what the source said.
        assert (row["archive_status"], row["archive_attempts"]) == ("FAILED", 1)
        assert row["archive_error"].startswith("download failed (HTTP 403): staged copy gone;")
        assert lsky.successful_uploads == 0
    assert row["archive_staged_key"] is None


def test_when_s3_cannot_take_the_capture_the_record_waits_as_without_staging(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    records: Records,
    db: Any,
    upstream: Any,
    lsky: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive_env(ARCHIVE_STAGING_BUCKET="no-such-staging-bucket")
    upstream.add("/gen/8.png", IMAGE)
    seed_record(db, 8, image_url=upstream.url("/gen/8.png"))
    pause_for_an_hour(records)

    assert archive.deliver(encode(8)) == {"batchItemFailures": []}  # parked, as before

    row = fetch_record(db, 8)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_staged_key"] is None
    assert "NoSuchBucket" in archive.log_for("could not stage the image; going on without")["error"]
    assert emf_metrics(capsys).get("StagingFailed") == 1


def test_an_unreadable_staged_copy_spends_no_attempt_and_comes_back(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.settings(ARCHIVE_STAGING_BUCKET="no-such-staging-bucket")
    world.record(9, b"", route={"status": 403}, archive_staged_key="staged/9/abc.png")

    response = world.deliver(9)

    assert len(response["batchItemFailures"]) == 1  # redelivered, like our own faults
    row = world.row(9)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_staged_key"] == "staged/9/abc.png"
    assert "staging error" in row["archive_error"]
    assert world.downloads(9) == 0  # the expired source is not a fallback for S3 down
    assert emf_metrics(capsys).get("StagingError") == 1


def test_the_happy_path_makes_no_s3_request_and_no_extra_round_trip(
    staged: ArchiveHarness,
    moto: Any,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
) -> None:
    upstream.add("/gen/10.png", IMAGE)  # Content-Length: streamed
    upstream.add("/gen/11.png", IMAGE, chunked=True)  # none: spooled
    seed_record(db, 10, image_url=upstream.url("/gen/10.png"))
    seed_record(db, 11, image_url=upstream.url("/gen/11.png"))
    s3_before = moto.requests("s3")

    staged.deliver(encode(10))  # the container's first message: connects, builds the worker
    worker = runtime.archive_worker()
    statements = worker.records.db.statements_run
    staged.deliver(encode(11))

    assert fetch_record(db, 10)["archive_status"] == "SUCCEEDED"
    assert fetch_record(db, 11)["archive_status"] == "SUCCEEDED"
    assert moto.requests("s3") == s3_before  # counted at the server
    bucket = worker.transfer.staging.bucket
    assert bucket is not None
    assert "client" not in vars(bucket)  # no S3 client was even built
    assert worker.records.db.statements_run - statements == 2  # claim + success write
    assert staged_keys(s3, staging_bucket) == []


def test_a_paused_capture_whose_source_failed_asks_lsky_nothing_and_keeps_may_be_hosted(
    staged: ArchiveHarness, records: Records, db: Any, upstream: Any, lsky: Any
) -> None:
    # An earlier attempt's answer was lost (the image may be on Lsky); the lane pauses; the
    # capture's download fails. Lsky is not asked while the lane is paused, and the row
    # still says its image may be hosted, so the next attempt looks before it uploads.
    url = upstream.add("/gen/2.png", b"", status=500)
    seed_record(db, 2, image_url=url, archive_may_be_hosted=True, archive_attempts=1)
    pause_for_an_hour(records)

    staged.deliver(encode(2))

    row = fetch_record(db, 2)
    assert (row["archive_status"], row["archive_wait_reason"]) == ("PENDING", "backoff")
    assert row["archive_may_be_hosted"] is True
    assert lsky.listings == []
    assert lsky.upload_count == 0


def test_without_a_bucket_a_paused_lane_is_not_claimed(
    archive: ArchiveHarness, records: Records, db: Any, upstream: Any, lsky: Any
) -> None:
    upstream.add("/gen/12.png", IMAGE)
    seed_record(db, 12, image_url=upstream.url("/gen/12.png"))
    pause_for_an_hour(records)

    assert archive.deliver(encode(12)) == {"batchItemFailures": []}  # parked

    row = fetch_record(db, 12)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_staged_key"] is None
    assert upstream.hits("/gen/12.png") == 0  # today's behaviour: nothing fetched


def test_status_counts_staged_copies(
    staged: ArchiveHarness, records: Records, db: Any, upstream: Any
) -> None:
    for record_id in (13, 14):
        upstream.add(f"/gen/{record_id}.png", StreamBody.repeat(IMAGE, 1))
        seed_record(db, record_id, image_url=upstream.url(f"/gen/{record_id}.png"))
    pause_for_an_hour(records)
    staged.deliver(encode(13))
    staged.deliver(encode(14))
    db.run(
        "UPDATE image_generation_records SET archive_staged_at = now() - interval '90 seconds'"
        " WHERE id = 13"
    )

    summary = records.sweeps.staged_summary()

    assert summary.waiting == 2
    assert 90 <= summary.oldest_age_seconds < 120
    assert summary.failed_keeping_copy == 0


BIG = 50_000_000
MEMORY_BOUND = 0.3 * BIG  # the bound the streamed and spooled archives meet (bench.memory)


def peak_growth_in_a_child(warm_id: int, record_id: int) -> int:
    """Peak RSS growth of one archive of `record_id`, in a fresh process warmed up by an
    archive of `warm_id` (tests.integration.staging_memory_child)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = run_python(
        "-m",
        "tests.integration.staging_memory_child",
        str(warm_id),
        str(record_id),
        env=env,
        timeout=180,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    assert lines, child.stdout[-3000:]
    return int(json.loads(lines[-1].removeprefix("RESULT "))["growth"])


def test_a_50_mb_image_without_content_length_is_staged_and_published_within_the_bound(
    staged: ArchiveHarness,
    records: Records,
    db: Any,
    s3: Any,
    staging_bucket: str,
    upstream: Any,
    lsky: Any,
) -> None:
    upstream.add("/tiny.png", images.png())
    body = StreamBody.of(lambda: images.png_stream(size=BIG, chunk_size=256 * 1024), BIG)
    upstream.add("/big.png", body, chunked=True, fail_after=1)  # no Content-Length
    seed_record(db, 20, image_url=upstream.url("/tiny.png"))
    seed_record(db, 21, image_url=upstream.url("/big.png"))
    pause_for_an_hour(records)  # captured, then parked: no SQS call in the child

    capture = peak_growth_in_a_child(20, 21)

    row = fetch_record(db, 21)
    assert row["archive_staged_key"] is not None, row
    stored = s3.get_object(Bucket=staging_bucket, Key=row["archive_staged_key"])["Body"]
    served = images.png_stream(size=BIG, chunk_size=256 * 1024)
    assert sha256_of(stored.iter_chunks(1 << 20)) == sha256_of(served)  # every part in order

    records.lane.clear()
    make_due(db, 20)
    make_due(db, 21)
    publish = peak_growth_in_a_child(20, 21)  # warmed up by publishing the tiny copy

    assert fetch_record(db, 21)["archive_status"] == "SUCCEEDED"
    assert lsky.uploads[-1].size == BIG
    assert staged_keys(s3, staging_bucket) == []
    print(
        f"50 MB, no Content-Length: peak RSS growth {capture / 1e6:.1f} MB staging it, "
        f"{publish / 1e6:.1f} MB publishing it from S3"
    )
    assert capture <= MEMORY_BOUND
    assert publish <= MEMORY_BOUND


def test_status_shows_the_staged_copies(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_dsn: str,
    db: Any,
) -> None:
    from lib.cli import main as cli

    seed_record(db, 30, image_url="https://upstream.invalid/a.png")
    for record_id, status, age in ((31, "PENDING", 7200), (32, "RUNNING", 60), (33, "FAILED", 9)):
        seed_record(
            db,
            record_id,
            image_url="https://upstream.invalid/a.png",
            archive_status=status,
            archive_staged_key=f"staged/{record_id}/k.png",
        )
        db.run(
            "UPDATE image_generation_records SET archive_staged_at = now() - make_interval("
            "secs => :age) WHERE id = :id",
            age=age,
            id=record_id,
        )
    monkeypatch.setenv("DATABASE_URL", pg_dsn)
    monkeypatch.delenv("ARCHIVE_QUEUE_URL", raising=False)
    capsys.readouterr()

    assert cli.main(["status", "--json"]) == 0
    staged = json.loads(capsys.readouterr().out)["staged"]
    assert (staged["waiting"], staged["failed_keeping_copy"]) == (2, 1)
    assert 7200 <= staged["oldest_age_seconds"] < 7300

    assert cli.main(["status"]) == 0
    assert "staged             2   oldest staged for: 2.0 h, FAILED keeping a copy: 1" in (
        capsys.readouterr().out
    )


def test_the_sweeper_emits_the_staged_metrics(
    records: Records, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from lib.archive.sweeper import Sweeper
    from lib.platform.config import DatabaseConfig, SweeperSettings
    from lib.platform.sqs import Queue

    seed_record(
        db, 34, image_url="https://upstream.invalid/a.png", archive_staged_key="staged/34/k.png"
    )
    db.run(
        "UPDATE image_generation_records SET archive_staged_at = now() - interval '600 seconds'"
        " WHERE id = 34"
    )
    settings = SweeperSettings(database=DatabaseConfig(url="postgresql://x"), queue_url="http://q")
    capsys.readouterr()

    summary = Sweeper(
        settings=settings, records=records.sweeps, lanes=records.lane, queue=Queue()
    ).run(remaining_ms=lambda: 600_000)
    from lib.platform.observability import metrics

    metrics.flush_metrics()
    emitted = emf_metrics(capsys)
    assert summary.staged is not None
    assert summary.staged.waiting == emitted["StagedWaiting"] == 1
    assert 600 <= emitted["StagedOldestAgeSeconds"] < 700
    assert emitted["StagedFailedKeepingCopy"] == 0
