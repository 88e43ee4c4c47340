"""Every call to Lsky and to S3 ends by the attempt's deadline (issue 19): an answer sent a
byte at a time (the stand-ins' trickle) ends as a timeout in time to conclude, never holds
the invocation until Lambda kills it. "In time to conclude" is measured against the
deadline given: the worker keeps FINISH_RESERVE_MS after its transfer deadline to record
the outcome, and the handler must return before the invocation's own end."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devkit import images
from devkit._http import BackgroundServer, QuietHandler
from lib.archive import runtime
from lib.archive.schedule import MIN_ATTEMPT_MS
from lib.platform.config import FINISH_RESERVE_MS
from lib.platform.s3 import OriginalsError, StagingBucket, StagingError
from lib.platform.s3_originals import OriginalsBucket
from lib.state.lane_store import LaneStore
from lib.transfer.failures import ArchiveFailure, Kind, Stage
from lib.transfer.held import hold
from lib.transfer.imagetype import PNG as PNG_TYPE
from lib.transfer.imagetype import DownloadedImage
from lib.transfer.lsky import LskyClient
from tests.integration.world import World
from tests.support import (
    HANG_SECONDS,
    FakeLambdaContext,
    lane_row,
    reset_lane,
)

PNG = images.png(8, 8)
# Slow enough that a trickled answer (a few hundred bytes) would take minutes.
INTERVAL = 0.5
# How long after its deadline a call may return and the attempt still conclude.
CONCLUDE_SECONDS = FINISH_RESERVE_MS / 1000


def ended_in_time(deadline: float) -> bool:
    return time.monotonic() <= deadline + CONCLUDE_SECONDS


@pytest.fixture
def client(lsky: Any) -> LskyClient:
    return LskyClient(base_url=lsky.base_url, token=lambda force: lsky.token)


def upload(client: LskyClient, deadline: float) -> object:
    image = DownloadedImage(file=io.BytesIO(PNG), size=len(PNG), image_type=PNG_TYPE)
    return client.upload(image, filename="trickle.png", deadline=deadline)


def find(client: LskyClient, deadline: float) -> object:
    return client.find({"trickle.png"}, keyword="trickle.", deadline=deadline)


def probe(client: LskyClient, deadline: float) -> object:
    return client.account_healthy(deadline)


CALLS: dict[str, tuple[str, Callable[[LskyClient, float], object], Stage]] = {
    "upload answer": ("/api/v1/upload", upload, Stage.UPLOAD),
    "image list": ("/api/v1/images", find, Stage.LOOKUP),
    "profile probe": ("/api/v1/profile", probe, Stage.LOOKUP),
}


@pytest.mark.parametrize("from_body", [False, True], ids=["headers", "body"])
@pytest.mark.parametrize("call", list(CALLS))
def test_a_trickling_lsky_answer_ends_as_a_timeout_by_the_deadline(
    lsky: Any, client: LskyClient, call: str, from_body: bool
) -> None:
    path, request, stage = CALLS[call]
    lsky.trickle(path, interval=INTERVAL, from_body=from_body)
    deadline = time.monotonic() + 1.0
    with pytest.raises(ArchiveFailure) as failed:
        request(client, deadline)
    assert ended_in_time(deadline)
    assert (failed.value.failure.stage, failed.value.failure.kind) == (stage, Kind.TIMEOUT)
    # The next exchange on the client's pool is not stuck on the shut connection.
    lsky.reset()
    assert upload(client, time.monotonic() + HANG_SECONDS)


def test_a_trickling_upload_answer_is_concluded_before_the_invocation_ends(world: World) -> None:
    world.record(1)
    world.lsky.trickle("/api/v1/upload", interval=INTERVAL)
    # The shortest invocation that still starts an attempt: its transfer deadline is what
    # is left after the worker's reserve for concluding.
    context = FakeLambdaContext(timeout_seconds=MIN_ATTEMPT_MS / 1000 + 1, from_first_look=True)

    response = world.deliver(1, context)

    assert context.get_remaining_time_in_millis() > 0  # Lambda would not have killed it
    assert len(response["batchItemFailures"]) == 1  # redelivered after its retry delay
    row = world.row(1)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 1)
    assert "timed out" in row["archive_error"]
    # The body went out whole: Lsky may hold the image, the next attempt looks it up.
    assert row["archive_may_be_hosted"] is True
    line = world.archive.log_for("archive attempt failed, will retry")
    assert line["error_class"] == "transient"


def test_a_trickling_profile_leaves_the_sweep_time_for_its_pages(
    archive_env: Callable[..., dict[str, str]], db: Any, lsky: Any, pg_dsn: str
) -> None:
    from handlers.sweeper import lambda_handler
    from lib.archive.sweep_rules import PROBE_RESERVE_MS
    from lib.platform.config import DatabaseConfig
    from lib.platform.db import Database

    archive_env()
    runtime.reset()
    reset_lane(db)
    LaneStore(Database(DatabaseConfig(url=pg_dsn))).pause(
        until="infinity", reason="account", window=None, detail="Lsky answered HTTP 403"
    )
    lsky.trickle("/api/v1/profile", interval=INTERVAL, from_body=True)
    # Three seconds for the probe beyond what the rest of the run keeps.
    context = FakeLambdaContext(
        function_name="SweeperFunction",
        timeout_seconds=PROBE_RESERVE_MS / 1000 + 3,
        from_first_look=True,
    )

    summary = lambda_handler({}, context)

    assert context.get_remaining_time_in_millis() > 0
    assert (summary["lane_paused"], summary["lane_resumed"]) == ("account", False)
    assert summary["stop_reason"] == "done"  # the pages still ran
    assert lane_row(db)["reason"] == "account"
    reset_lane(db)


# -- S3 ------------------------------------------------------------------------------------


class _TrickleS3(QuietHandler):
    """Any S3 request answered a byte at a time: a 200 with an ETag (PUT, DELETE), or a
    GET's object whose headers come at once and whose body trickles."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        owner: TrickleS3 = self.server.owner
        body = owner.body if self.command == "GET" else b""
        head = (
            'HTTP/1.1 200 OK\r\nETag: "0"\r\nContent-Type: image/png\r\n'
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        self.close_connection = True
        try:
            slow = body if self.command == "GET" else head
            if self.command == "GET":
                self.connection.sendall(head)
            for index in range(len(slow)):
                self.connection.sendall(slow[index : index + 1])
                time.sleep(INTERVAL)
        except OSError:
            return

    do_GET = do_PUT = do_DELETE = do_POST = _answer


class TrickleS3(BackgroundServer):
    handler_class = _TrickleS3
    body = PNG


@pytest.fixture
def trickling_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with TrickleS3() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.base_url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield server.base_url


def s3_put(bucket: StagingBucket, deadline: float) -> None:
    bucket.put("staged/1.png", [PNG], content_type="image/png", deadline=deadline)


def s3_get(bucket: StagingBucket, deadline: float) -> None:
    staged = bucket.open("staged/1.png", deadline=deadline)
    try:
        b"".join(staged.chunks())
    finally:
        staged.close()


def s3_delete(bucket: StagingBucket, deadline: float) -> None:
    bucket.delete("staged/1.png", deadline=deadline)


@pytest.mark.parametrize("operation", [s3_put, s3_get, s3_delete], ids=["put", "get", "delete"])
def test_a_trickling_s3_answer_ends_by_the_deadline(
    trickling_s3: str, operation: Callable[[StagingBucket, float], None]
) -> None:
    deadline = time.monotonic() + 2.0
    with pytest.raises(StagingError, match=r"past the (attempt's )?deadline"):
        operation(StagingBucket("staging-bucket"), deadline)
    assert ended_in_time(deadline)


def original_put(bucket: OriginalsBucket, deadline: float) -> None:
    image = hold([PNG], PNG_TYPE)
    try:
        bucket.put(
            "originals/1/a.png", image, content_type="image/png", metadata={}, deadline=deadline
        )
    finally:
        image.close()


def original_copy(bucket: OriginalsBucket, deadline: float) -> None:
    bucket.copy(
        "originals/1/a.png",
        source_bucket="staging-bucket",
        source_key="staged/1.png",
        etag='"0"',
        content_type="image/png",
        metadata={},
        deadline=deadline,
    )


def original_get(bucket: OriginalsBucket, deadline: float) -> None:
    stored = bucket.open("originals/1/a.png", version_id="v1", deadline=deadline)
    try:
        b"".join(stored.chunks())
    finally:
        stored.close()


@pytest.mark.parametrize(
    "operation", [original_put, original_copy, original_get], ids=["put", "copy", "get"]
)
def test_a_trickling_answer_to_an_original_s_call_ends_by_the_deadline(
    trickling_s3: str, operation: Callable[[OriginalsBucket, float], None]
) -> None:
    deadline = time.monotonic() + 2.0
    with pytest.raises(OriginalsError, match=r"past the (attempt's )?deadline"):
        operation(OriginalsBucket("originals-bucket"), deadline)
    assert ended_in_time(deadline)
