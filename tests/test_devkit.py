"""The devkit's own tests: each local service behaves like the thing it stands in for."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from urllib3.exceptions import ProtocolError

from devkit import images, multipart
from devkit.lsky import Behaviour, GuestMode, LskyStandIn
from devkit.postgres import PostgresCluster, connect, find_bindir, schema_statements
from devkit.sqs import MotoServer, QueuePair, create_queue_pair, receive_as_lambda_event
from devkit.upstream import StreamBody, UpstreamServer
from tests.support import (
    HANG_SECONDS,
    LSKY_FILE_FIELDS,
    FakeLambdaContext,
    fetch_record,
    queue_attrs,
    seed_record,
    sqs_event,
    wait_until,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


@pytest.fixture(scope="module")
def http() -> Iterator[urllib3.PoolManager]:
    with urllib3.PoolManager(retries=False, timeout=10) as pool:
        yield pool


# -- PostgreSQL ------------------------------------------------------------------------


ARCHIVE_COLUMNS = {
    "archive_status",
    "archive_attempts",
    "archive_next_run_at",
    "archive_locked_by",
    "archive_locked_at",
    "archive_enqueued_at",
    "archive_error",
    "archived_at",
    "hosted_image_url",
    "image_mime_type",
    "hosted_response",
    "archive_may_be_hosted",
    "archive_altered",
}


def test_schema_has_archive_columns_and_partial_indexes(db: Any) -> None:
    columns = {
        row[0]
        for row in db.run(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'image_generation_records'"
        )
    }
    assert columns >= ARCHIVE_COLUMNS | {"id", "user_id", "status", "image_url", "started_at"}
    indexes = dict(
        db.run(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE tablename = 'image_generation_records'"
        )
    )
    for name, predicate in [
        ("image_generation_records_archive_pending_idx", "'PENDING'"),
        ("image_generation_records_archive_running_idx", "'RUNNING'"),
        ("image_generation_records_archive_failed_idx", "'FAILED'"),
        ("image_generation_records_archive_backfill_idx", "archive_status IS NULL"),
        ("image_generation_records_archive_altered_idx", "WHERE archive_altered"),
    ]:
        assert predicate in indexes[name]
    # CONCURRENTLY builds leave an invalid index behind when they fail.
    assert db.run("SELECT count(*) FROM pg_index WHERE NOT indisvalid") == [[0]]
    assert db.run("SELECT count(*) FROM users") == [[0]]


def test_seed_record_and_fetch_record(db: Any) -> None:
    seed_record(db, 1, image_url="http://example.test/1.png")
    seed_record(
        db,
        2,
        image_url="http://example.test/2.png",
        archive_status="RUNNING",
        attempts=2,
        locked_by="req-1",
        locked_at=700,
        next_run_at=datetime(2030, 1, 1, tzinfo=UTC),
        archive_error="boom",
    )
    assert db.run("SELECT id, username FROM users") == [[1, "alice"]]
    first = fetch_record(db, 1)
    assert first["archive_status"] == "PENDING"
    assert first["archive_attempts"] == 0
    assert first["archive_locked_at"] is None
    second = fetch_record(db, 2)
    assert second["archive_locked_by"] == "req-1"
    assert second["archive_error"] == "boom"
    assert second["archive_next_run_at"] == datetime(2030, 1, 1, tzinfo=UTC)
    # created_at defaults to now() in the same INSERT, so the offset is exact.
    [[age]] = db.run(
        "SELECT created_at - archive_locked_at FROM image_generation_records WHERE id = 2"
    )
    assert age == timedelta(seconds=700)
    with pytest.raises(LookupError):
        fetch_record(db, 3)


def test_db_fixture_starts_from_empty_tables(db: Any) -> None:
    # Runs after test_seed_record_and_fetch_record in file order.
    assert db.run("SELECT count(*) FROM image_generation_records") == [[0]]


def test_session_cluster_and_create_database(pg_cluster: PostgresCluster | None) -> None:
    if pg_cluster is None:
        pytest.skip("TEST_DATABASE_URL is set: no throwaway cluster in this run")
    assert pg_cluster.running
    assert pg_cluster.dsn == f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/postgres"
    dsn = pg_cluster.create_database("devkit_probe")
    assert dsn == pg_cluster.create_database("devkit_probe")  # idempotent
    conn = connect(dsn)
    try:
        assert conn.run("SELECT current_database(), current_setting('fsync')") == [
            ["devkit_probe", "off"]
        ]
    finally:
        conn.close()


def test_cluster_stop_removes_everything() -> None:
    with PostgresCluster() as cluster:
        root = cluster._root
        assert root is not None
        assert root.exists()
        connect(cluster.dsn).close()
    assert not cluster.running
    assert not root.exists()
    cluster.stop()  # twice is fine


def test_missing_binaries_error_is_actionable(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="apt-get install -y postgresql"):
        find_bindir(pg_config=None, debian_root=tmp_path)


def test_schema_statements_split_on_line_end_semicolons() -> None:
    sql = "-- c\nSET a = 1;\n\nCREATE INDEX x\n  ON t (c) -- tail; not an end\n  WHERE s = 'a;b';\n"
    assert schema_statements(sql) == [
        "SET a = 1",
        "CREATE INDEX x\n  ON t (c) -- tail; not an end\n  WHERE s = 'a;b'",
    ]


# -- SQS on moto --------------------------------------------------------------------------


def test_receive_as_lambda_event_matches_lambda_shape(sqs: SQSClient, queues: QueuePair) -> None:
    body = json.dumps({"recordId": "42"})
    sqs.send_message(
        QueueUrl=queues.url,
        MessageBody=body,
        MessageAttributes={"source": {"DataType": "String", "StringValue": "test"}},
    )
    event = receive_as_lambda_event(sqs, queues, wait_seconds=0)
    [record] = event["Records"]
    assert set(record) >= {
        "messageId",
        "receiptHandle",
        "body",
        "attributes",
        "messageAttributes",
        "md5OfBody",
        "eventSource",
        "eventSourceARN",
        "awsRegion",
    }
    assert record["body"] == body
    assert record["md5OfBody"] == hashlib.md5(body.encode()).hexdigest()  # noqa: S324
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == queues.arn
    assert record["awsRegion"] == "us-east-1"
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert set(record["attributes"]) >= {
        "ApproximateReceiveCount",
        "SentTimestamp",
        "SenderId",
        "ApproximateFirstReceiveTimestamp",
    }
    assert record["messageAttributes"] == {
        "source": {
            "stringValue": "test",
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": "String",
        }
    }
    # The synthetic builder produces the same keys.
    [synthetic] = sqs_event([{"recordId": "42"}], queues.arn)["Records"]
    assert set(synthetic) == set(record) - {"md5OfMessageAttributes"}
    assert set(synthetic["attributes"]) == set(record["attributes"])


def test_change_message_visibility_is_observed(sqs: SQSClient, queues: QueuePair) -> None:
    sqs.send_message(QueueUrl=queues.url, MessageBody='{"recordId": "1"}')
    assert queue_attrs(sqs, queues.url) == (1, 0, 0)
    [record] = receive_as_lambda_event(sqs, queues, wait_seconds=0)["Records"]
    assert queue_attrs(sqs, queues.url) == (0, 1, 0)  # 720 s visibility timeout

    sqs.change_message_visibility(
        QueueUrl=queues.url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
    )
    assert queue_attrs(sqs, queues.url) == (1, 0, 0)
    [again] = receive_as_lambda_event(sqs, queues, wait_seconds=0)["Records"]
    assert again["messageId"] == record["messageId"]
    assert again["attributes"]["ApproximateReceiveCount"] == "2"


def test_moto_keeps_what_each_sqs_request_asked_for(
    moto: MotoServer, sqs: SQSClient, queues: QueuePair
) -> None:
    sqs.send_message(QueueUrl=queues.url, MessageBody='{"recordId": "1"}')
    [record] = receive_as_lambda_event(sqs, queues, wait_seconds=0)["Records"]
    sqs.change_message_visibility(
        QueueUrl=queues.url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=42
    )
    [change] = moto.sqs_calls("ChangeMessageVisibility", QueueUrl=queues.url)
    assert change == {
        "QueueUrl": queues.url,
        "ReceiptHandle": record["receiptHandle"],
        "VisibilityTimeout": 42,
    }
    [sent] = moto.sqs_calls("SendMessage", QueueUrl=queues.url)
    assert sent["MessageBody"] == '{"recordId": "1"}'
    assert moto.sqs_calls("ChangeMessageVisibility", QueueUrl=queues.url + "-other") == []


def test_redrive_to_dlq_after_max_receive_count(sqs: SQSClient, queues: QueuePair) -> None:
    pair = create_queue_pair(sqs, queues.name + "-short", max_receive_count=2)
    sqs.send_message(QueueUrl=pair.url, MessageBody='{"recordId": "7"}')
    for expected_count in ("1", "2"):
        [record] = receive_as_lambda_event(sqs, pair, wait_seconds=0)["Records"]
        assert record["attributes"]["ApproximateReceiveCount"] == expected_count
        sqs.change_message_visibility(
            QueueUrl=pair.url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
        )
    # The receive after the count reached maxReceiveCount moves it instead.
    assert receive_as_lambda_event(sqs, pair, wait_seconds=0)["Records"] == []
    assert queue_attrs(sqs, pair.url) == (0, 0, 0)
    dead = sqs.receive_message(QueueUrl=pair.dlq_url, WaitTimeSeconds=0)["Messages"]
    assert [m["Body"] for m in dead] == ['{"recordId": "7"}']
    attributes = sqs.get_queue_attributes(QueueUrl=pair.url, AttributeNames=["All"])["Attributes"]
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": pair.dlq_arn,
        "maxReceiveCount": 2,
    }
    assert attributes["VisibilityTimeout"] == "720"


def test_moto_env_lets_plain_boto3_clients_find_the_server(
    moto: MotoServer, queues: QueuePair
) -> None:
    import boto3

    assert os.environ["AWS_ENDPOINT_URL_SQS"] == moto.endpoint_url
    plain = boto3.client("sqs")  # what a handler does: no endpoint, region or keys given
    assert queues.url in plain.list_queues(QueueNamePrefix=queues.name)["QueueUrls"]


def test_sqs_event_synthetic_bodies() -> None:
    event = sqs_event([{"recordId": 5}, "not json"], receive_count=3)
    assert [r["body"] for r in event["Records"]] == ['{"recordId": 5}', "not json"]
    assert {r["attributes"]["ApproximateReceiveCount"] for r in event["Records"]} == {"3"}
    assert len({r["messageId"] for r in event["Records"]}) == 2


def test_fake_lambda_context() -> None:
    first, second = FakeLambdaContext(), FakeLambdaContext(timeout_seconds=0)
    assert first.aws_request_id != second.aws_request_id
    assert 0 < first.get_remaining_time_in_millis() <= 120_000
    assert second.get_remaining_time_in_millis() == 0
    assert first.invoked_function_arn.endswith(":function:ArchiveFunction")


def test_a_context_counting_from_the_first_look_has_its_whole_budget_then() -> None:
    context = FakeLambdaContext(timeout_seconds=0.2, from_first_look=True)
    time.sleep(0.3)  # the test's own setup, longer than the whole budget
    assert 0 < context.get_remaining_time_in_millis() <= 200
    time.sleep(0.3)
    assert context.get_remaining_time_in_millis() == 0  # counting since the first look


# -- images ---------------------------------------------------------------------------------


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == images.PNG_SIGNATURE
    chunks, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        chunks.append((kind, body))
        offset += 12 + length
    return chunks


@pytest.mark.parametrize("size", [None, 200, 1 << 20])
def test_png_is_valid_and_sized(size: int | None) -> None:
    data = images.png(5, 3, size=size)
    if size is not None:
        assert len(data) == size
    chunks = _png_chunks(data)
    kinds = [kind for kind, _ in chunks]
    assert kinds[0] == b"IHDR"
    assert kinds[-1] == b"IEND"
    width, height = struct.unpack(">II", chunks[0][1][:8])
    assert (width, height) == (5, 3)
    pixels = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    assert len(pixels) == height * (1 + 3 * width)
    assert b"".join(images.png_stream(5, 3, size=size, chunk_size=4096)) == data


def test_png_too_small_size_is_refused() -> None:
    with pytest.raises(ValueError, match="needs at least"):
        images.png(size=50)


@pytest.mark.parametrize(
    ("make", "mime"),
    [
        (images.png, "image/png"),
        (images.jpeg, "image/jpeg"),
        (images.gif, "image/gif"),
        (images.webp, "image/webp"),
        (images.avif, "image/avif"),
    ],
)
def test_image_bytes_sniff_as_their_type(make: Any, mime: str) -> None:
    assert images.sniff(make()) == mime


def test_sniff_rejects_non_images() -> None:
    assert images.sniff(b"<html>nope</html>") is None
    assert images.sniff(b"") is None
    assert images.sniff(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom") is None


def test_jpeg_and_gif_structure() -> None:
    jpeg = images.jpeg()
    assert jpeg.startswith(b"\xff\xd8\xff\xe0")
    assert jpeg.endswith(b"\xff\xd9")
    assert b"\xff\xc0" in jpeg  # baseline frame
    assert images.gif().endswith(b";")


# -- upstream server ----------------------------------------------------------------------------


def test_upstream_fail_first_then_success(upstream: UpstreamServer, http: Any) -> None:
    body = images.png()
    url = upstream.add("/img/a.png", body, fail_first=2, fail_status=502)
    assert [http.request("GET", url).status for _ in range(3)] == [502, 502, 200]
    assert http.request("GET", url + "?sig=abc").data == body  # query strings ignored
    assert upstream.hits("/img/a.png") == 4
    assert upstream.requests[-1].path == "/img/a.png?sig=abc"
    assert "user-agent" in upstream.requests[-1].headers


def test_upstream_unknown_path_is_404(upstream: UpstreamServer, http: Any) -> None:
    assert http.request("GET", upstream.url("/missing")).status == 404
    assert upstream.hits("/missing") == 1


def test_upstream_content_length_lies(upstream: UpstreamServer, http: Any) -> None:
    long_url = upstream.add("/long", b"x" * 10, content_length=100)
    with pytest.raises(ProtocolError, match="IncompleteRead"):
        http.request("GET", long_url)
    short_url = upstream.add("/short", b"abcdefgh", content_length=3)
    response = http.request("GET", short_url)
    assert response.headers["Content-Length"] == "3"
    assert response.data == b"abc"


def test_upstream_drop_after(upstream: UpstreamServer, http: Any) -> None:
    url = upstream.add("/drop.png", images.png(size=5000), drop_after=1000)
    response = http.request("GET", url, preload_content=False)
    assert response.headers["Content-Length"] == "5000"
    with pytest.raises(ProtocolError):
        response.read()
    assert upstream.hits("/drop.png") == 1


def test_upstream_gate_after_holds_the_body_part_way(upstream: UpstreamServer, http: Any) -> None:
    gate = threading.Event()
    url = upstream.add("/part.png", b"0123456789", gate_after=4, gate=gate)
    try:
        response = http.request("GET", url, preload_content=False)
        assert response.headers["Content-Length"] == "10"
        assert response.read(4) == b"0123"  # what comes before the hold arrives
        assert upstream.bodies_sent("/part.png") == []  # held: the body is not done
        before = time.monotonic()
    finally:
        gate.set()
    assert response.read() == b"456789"
    wait_until(lambda: upstream.bodies_sent("/part.png"), "the body's end was recorded")
    [last_byte] = upstream.bodies_sent("/part.png")
    assert last_byte >= before  # the last byte went out after the gate opened


def test_upstream_gate_then_drop_at_the_same_byte(upstream: UpstreamServer, http: Any) -> None:
    gate = threading.Event()
    url = upstream.add("/cut.png", b"0123456789", gate_after=4, drop_after=4, gate=gate)
    try:
        response = http.request("GET", url, preload_content=False)
        assert response.read(4) == b"0123"
    finally:
        gate.set()
    with pytest.raises(ProtocolError):
        response.read()
    assert upstream.bodies_sent("/cut.png") == []  # never whole


def test_a_link_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        UpstreamServer(link_bytes_per_sec=0)
    with pytest.raises(ValueError, match="positive"):
        LskyStandIn(link_bytes_per_sec=-1)


def test_upstream_redirect(upstream: UpstreamServer, http: Any) -> None:
    body = images.gif()
    upstream.add("/final.gif", body, content_type="image/gif")
    url = upstream.add("/go", redirect_to="/final.gif")
    response = http.request("GET", url, redirect=False)
    assert (response.status, response.headers["Location"]) == (302, "/final.gif")
    followed = http.request(
        "GET", url, retries=urllib3.Retry(total=1, redirect=1, connect=0, read=0)
    )
    assert (followed.status, followed.data) == (200, body)
    assert followed.headers["Content-Type"] == "image/gif"
    upstream.add("/moved", redirect_to=upstream.url("/final.gif"), status=301)
    assert http.request("GET", upstream.url("/moved"), redirect=False).status == 301


def test_upstream_streaming_and_chunked(upstream: UpstreamServer, http: Any) -> None:
    url = upstream.add("/big", StreamBody.repeat(b"z" * 4096, 256), headers={"X-Test": "1"})
    response = http.request("GET", url, preload_content=False)
    assert response.headers["Content-Length"] == str(4096 * 256)
    assert response.headers["X-Test"] == "1"
    assert sum(len(piece) for piece in response.stream(65536)) == 4096 * 256

    chunked = upstream.add("/chunked", lambda: iter([b"ab", b"", b"cd"]))
    response = http.request("GET", chunked)
    assert response.headers.get("Transfer-Encoding") == "chunked"
    assert "Content-Length" not in response.headers
    assert response.data == b"abcd"


def test_upstream_drip_and_delay_deliver_the_body(upstream: UpstreamServer, http: Any) -> None:
    url = upstream.add("/slow", b"s" * 2000, drip_bytes_per_sec=200_000, delay=0.01)
    assert http.request("GET", url).data == b"s" * 2000


def test_upstream_gate_holds_each_request_until_it_opens(
    upstream: UpstreamServer, http: Any
) -> None:
    gate = threading.Event()
    url = upstream.add("/held", b"body", gate=gate)
    answers: list[bytes] = []
    client = threading.Thread(target=lambda: answers.append(http.request("GET", url).data))
    client.start()
    try:
        wait_until(lambda: upstream.hits("/held") == 1, "the request arrived")
        client.join(timeout=0.2)
        assert client.is_alive()  # held: no answer yet
        assert answers == []
    finally:
        gate.set()
    client.join(timeout=HANG_SECONDS)
    assert answers == [b"body"]


def test_upstream_reset_forgets_routes(upstream: UpstreamServer, http: Any) -> None:
    url = upstream.add("/x", b"1")
    http.request("GET", url)
    upstream.reset()
    assert upstream.hits("/x") == 0
    assert http.request("GET", url).status == 404


# -- Lsky stand-in ---------------------------------------------------------------------------------


def _upload(
    http: Any,
    lsky: LskyStandIn,
    data: bytes | None = None,
    *,
    filename: str = "1.png",
    fields: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    accept_json: bool = True,
    token: str | None = None,
    anonymous: bool = False,
) -> Any:
    """POST a file; `token` overrides the right one, `anonymous` sends none."""
    request_headers = {}
    if not anonymous:
        request_headers["Authorization"] = f"Bearer {token or lsky.token}"
    if accept_json:
        request_headers["Accept"] = "application/json"
    request_headers.update(headers or {})
    form: dict[str, Any] = dict(fields or {})
    form["file"] = (filename, images.png() if data is None else data, "image/png")
    return http.request(
        "POST", lsky.api_url + "/upload", fields=form, headers=request_headers, redirect=False
    )


def test_lsky_success_envelope(http: Any, lsky: LskyStandIn) -> None:
    data = images.png(6, 6)
    response = _upload(http, lsky, data, filename="42_cat.png")
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json"
    raw = response.data.decode()
    assert "\\u4e0a\\u4f20\\u6210\\u529f" in raw  # 上传成功, json_encode style
    assert "http:\\/\\/" in raw
    payload = json.loads(raw)
    assert payload["status"] is True
    assert payload["message"] == "上传成功"
    info = payload["data"]
    assert list(info) == ["key", "name", "pathname", *LSKY_FILE_FIELDS, "links"]
    assert len(info["key"]) == 6
    assert info["origin_name"] == "42_cat.png"
    assert info["pathname"].endswith("/" + info["name"])
    assert info["name"].endswith(".png")
    assert isinstance(info["size"], float)
    assert info["size"] == len(data) / 1024
    assert (info["mimetype"], info["extension"]) == ("image/png", "png")
    assert info["md5"] == hashlib.md5(data).hexdigest()  # noqa: S324
    assert info["sha1"] == hashlib.sha1(data).hexdigest()  # noqa: S324
    links = info["links"]
    url = links["url"]
    assert url == f"{lsky.base_url}/i/{info['pathname']}"
    assert links["html"] == f'&lt;img src="{url}" alt="42_cat.png" title="42_cat.png" /&gt;'
    assert links["bbcode"] == f"[img]{url}[/img]"
    assert links["markdown"] == f"![42_cat.png]({url})"
    assert links["markdown_with_link"] == f"[![42_cat.png]({url})]({url})"
    assert links["thumbnail_url"].startswith(lsky.base_url + "/thumbnails/")

    served = http.request("GET", url)
    assert (served.status, served.data) == (200, data)
    assert served.headers["Content-Type"] == "image/png"
    assert lsky.stored_path(url).read_bytes() == data
    assert http.request("GET", links["thumbnail_url"]).status == 200

    [attempt] = lsky.uploads
    assert attempt.outcome == "success"
    assert attempt.pathname == info["pathname"]
    assert (lsky.upload_count, lsky.successful_uploads) == (1, 1)


def test_lsky_identical_file_reuses_the_stored_path(http: Any, lsky: LskyStandIn) -> None:
    first = json.loads(_upload(http, lsky).data)["data"]
    second = json.loads(_upload(http, lsky).data)["data"]
    assert second["pathname"] == first["pathname"]
    assert second["key"] != first["key"]


def test_lsky_auth_failures(http: Any, lsky: LskyStandIn) -> None:
    wrong = _upload(http, lsky, token="1|wrong")
    assert wrong.status == 401
    assert json.loads(wrong.data) == {
        "status": False,
        "message": "Authentication failed.",
        "data": {},
    }
    redirected = _upload(http, lsky, token="1|wrong", accept_json=False)
    assert redirected.status == 302
    assert redirected.headers["Location"] == lsky.base_url + "/login"
    missing = _upload(http, lsky, anonymous=True)
    assert missing.status == 401
    not_bearer = _upload(http, lsky, headers={"Authorization": lsky.token})
    assert not_bearer.status == 401
    assert [u.outcome for u in lsky.uploads] == ["unauthenticated"] * 4
    assert lsky.successful_uploads == 0


def test_lsky_guest_modes(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.guest_mode = GuestMode.DISABLED
    disabled = json.loads(_upload(http, lsky, anonymous=True).data)
    assert disabled == {"status": False, "message": "管理员关闭了游客上传", "data": {}}
    lsky.config.guest_mode = GuestMode.ALLOW
    assert json.loads(_upload(http, lsky, anonymous=True).data)["status"] is True
    lsky.reset()
    assert lsky.config.guest_mode is GuestMode.REJECT


def test_lsky_profile(http: Any, lsky: LskyStandIn) -> None:
    good = http.request(
        "GET",
        lsky.api_url + "/profile",
        headers={"Authorization": f"Bearer {lsky.token}", "Accept": "application/json"},
    )
    assert good.status == 200
    payload = json.loads(good.data)
    assert payload["status"] is True
    assert {"name", "email", "capacity", "used_capacity", "image_num"} <= set(payload["data"])
    bad = http.request(
        "GET",
        lsky.api_url + "/profile",
        headers={"Authorization": "Bearer nope", "Accept": "application/json"},
    )
    assert bad.status == 401
    assert json.loads(bad.data)["message"] == "Unauthenticated."
    assert http.request("GET", lsky.api_url + "/profile", redirect=False).status == 302


def _json(response: Any) -> Any:
    return json.loads(response.data)


def _refused(message: str) -> Callable[[Any], bool]:
    return lambda r: _json(r) == {"status": False, "message": message, "data": {}}


def _says(message: str) -> Callable[[Any], bool]:
    return lambda r: _json(r)["message"] == message


def _nginx_413(r: Any) -> bool:
    return b"<center>nginx</center>" in r.data and r.headers["Content-Type"] == "text/html"


def _throttled_for_17_s(r: Any) -> bool:
    return (
        _json(r)["message"] == "Too Many Attempts."
        and r.headers["Retry-After"] == "17"
        and r.headers["X-RateLimit-Remaining"] == "0"
        and "X-RateLimit-Limit" in r.headers
    )


def _html_page(r: Any) -> bool:
    html = r.headers["Content-Type"].startswith("text/html")
    return html and r.data.lstrip().startswith(b"<!DOCTYPE html>")


# id: (the scripted behaviour, the HTTP status it answers, what its answer must be)
SCRIPTED: dict[str, tuple[Behaviour, int, Callable[[Any], bool]]] = {
    "status_false": (Behaviour.status_false("图片上传失败"), 200, _refused("图片上传失败")),
    "401": (Behaviour.unauthorized(), 401, _says("Authentication failed.")),
    "403": (Behaviour.forbidden(), 403, _refused("管理员未启用 API")),
    "413": (Behaviour.too_large(), 413, _nginx_413),
    "429": (Behaviour.rate_limited(retry_after=17), 429, _throttled_for_17_s),
    "500": (Behaviour.server_error(), 500, lambda r: _json(r) == {"message": "Server Error"}),
    "html_200": (Behaviour.html_200(), 200, _html_page),
    "slow": (Behaviour.slow(0.05), 200, lambda r: _json(r)["status"] is True),
}


@pytest.mark.parametrize(("behaviour", "status", "check"), SCRIPTED.values(), ids=list(SCRIPTED))
def test_lsky_scripted_behaviours(
    http: Any, lsky: LskyStandIn, behaviour: Behaviour, status: int, check: Any
) -> None:
    lsky.script(behaviour)
    response = _upload(http, lsky)
    assert response.status == status
    assert check(response)
    assert lsky.uploads[-1].outcome == behaviour.kind.value
    # The script is used up: the next upload succeeds.
    assert _json(_upload(http, lsky))["status"] is True
    assert lsky.pending_script == 0


@pytest.mark.parametrize("partial", [True, False])
def test_lsky_drop_connection(http: Any, lsky: LskyStandIn, partial: bool) -> None:
    lsky.script(Behaviour.drop(partial=partial))
    with pytest.raises(ProtocolError):
        _upload(http, lsky)
    [attempt] = lsky.uploads
    assert attempt.outcome == "drop"
    assert attempt.pathname is not None  # stored before the connection died
    assert lsky.stored_path(attempt.pathname).exists()


def test_lsky_script_order_and_stored_failure(http: Any, lsky: LskyStandIn) -> None:
    lsky.script(Behaviour.rate_limited(), Behaviour.status_false("图片上传失败", store=True))
    assert [_upload(http, lsky).status for _ in range(3)] == [429, 200, 200]
    outcomes = [(u.outcome, u.pathname is not None) for u in lsky.uploads]
    assert outcomes == [("http_429", False), ("status_false", True), ("success", True)]
    # Same bytes: the retry is deduplicated onto the file stored by the "failure".
    assert lsky.uploads[1].pathname == lsky.uploads[2].pathname


def test_lsky_auth_failures_do_not_consume_the_script(http: Any, lsky: LskyStandIn) -> None:
    lsky.script(Behaviour.server_error())
    assert _upload(http, lsky, token="bad").status == 401
    assert _upload(http, lsky).status == 500


def test_lsky_validation_messages(http: Any, lsky: LskyStandIn) -> None:
    def message(response: Any) -> str:
        body = _json(response)
        assert body["status"] is False
        return str(body["message"])

    assert message(_upload(http, lsky, filename="no-extension")) == "不支持的文件类型"
    assert message(_upload(http, lsky, images.avif(), filename="a.avif")) == "不支持的文件类型"
    assert message(_upload(http, lsky, fields={"strategy_id": ""})) == "选定的策略不存在"
    assert message(_upload(http, lsky, fields={"strategy_id": "9"})) == "选定的策略不存在"
    lsky.config.max_file_kb = 1
    assert message(_upload(http, lsky, images.png(size=2048))) == "图片大小超出限制"
    no_file = http.request(
        "POST",
        lsky.api_url + "/upload",
        fields={"strategy_id": "1"},
        headers={"Authorization": f"Bearer {lsky.token}", "Accept": "application/json"},
    )
    assert message(no_file) == "服务异常，请稍后再试"
    assert {u.outcome for u in lsky.uploads} == {"rejected"}
    assert lsky.successful_uploads == 0


def test_lsky_records_a_real_urllib3_multipart_request(http: Any, lsky: LskyStandIn) -> None:
    data = images.jpeg()
    response = http.request(
        "POST",
        lsky.api_url + "/upload",
        fields={
            "strategy_id": "1",
            "album_id": "7",
            "file": ("图片 1.jpg", data, "image/jpeg"),
        },
        headers={
            "Authorization": f"Bearer {lsky.token}",
            "Accept": "application/json",
            "Referer": "https://site.example/",
        },
    )
    assert _json(response)["data"]["mimetype"] == "image/jpeg"
    [attempt] = lsky.uploads
    assert attempt.filename == "图片 1.jpg"
    assert attempt.content_type == "image/jpeg"
    assert attempt.size == len(data)
    assert attempt.sha256 == hashlib.sha256(data).hexdigest()
    assert attempt.fields == {"strategy_id": "1", "album_id": "7"}
    assert attempt.authorization == f"Bearer {lsky.token}"
    assert attempt.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert attempt.referer == "https://site.example/"
    assert attempt.origin is None
    assert attempt.sent_origin_or_referer


def test_lsky_accepts_a_chunked_streamed_upload(http: Any, lsky: LskyStandIn) -> None:
    data = images.png(size=300_000)
    boundary = "devkitboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.png"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body() -> Iterator[bytes]:
        yield head
        for offset in range(0, len(data), 7000):
            yield data[offset : offset + 7000]
        yield tail

    response = http.request(
        "POST",
        lsky.api_url + "/upload",
        body=body(),
        headers={
            "Authorization": f"Bearer {lsky.token}",
            "Accept": "application/json",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
        chunked=True,
    )
    assert _json(response)["data"]["md5"] == hashlib.md5(data).hexdigest()  # noqa: S324
    assert lsky.uploads[0].headers["transfer-encoding"] == "chunked"


def test_lsky_csrf_check_on_origin(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.csrf_check = True
    response = _upload(http, lsky, headers={"Origin": "http://127.0.0.1"})
    assert response.status == 419
    assert lsky.uploads[0].origin == "http://127.0.0.1"
    assert _upload(http, lsky).status == 200


def test_lsky_laravel_404_and_405(http: Any, lsky: LskyStandIn) -> None:
    wrong_method = http.request("GET", lsky.api_url + "/upload")
    assert wrong_method.status == 405
    assert "status" not in _json(wrong_method)
    missing = http.request("GET", lsky.api_url + "/nothing")
    assert missing.status == 404
    assert _json(missing) == {"message": "The route api/v1/nothing could not be found."}
    assert http.request("GET", lsky.base_url + "/i/../../etc/passwd").status == 404


# -- multipart parser ------------------------------------------------------------------------------


def test_multipart_parser_survives_one_byte_reads_and_fake_boundaries() -> None:
    tricky = b"\r\n--bound\r\n--boun" * 3 + bytes(range(256))
    fields: dict[str, Any] = {
        "strategy_id": "1",
        "file": ("x.bin", tricky, "application/octet-stream"),
    }
    body, content_type = urllib3.encode_multipart_formdata(fields, boundary="bound-real")
    sink: list[bytes] = []

    class Sink:
        def write(self, piece: bytes) -> int:
            sink.append(piece)
            return len(piece)

    form = multipart.parse(
        (body[i : i + 1] for i in range(len(body))),
        multipart.boundary_from(content_type),
        lambda part: Sink(),  # type: ignore[arg-type,return-value]
    )
    assert form.fields == {"strategy_id": "1"}
    part = form.file("file")
    assert part is not None
    assert b"".join(sink) == tricky
    assert (part.filename, part.size) == ("x.bin", len(tricky))
    assert part.sha256 == hashlib.sha256(tricky).hexdigest()


@pytest.mark.parametrize(
    "body",
    [
        b"no boundary here",
        b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nvalue-without-end',
        b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--\r\n",
    ],
)
def test_multipart_parser_rejects_malformed_bodies(body: bytes) -> None:
    with pytest.raises(multipart.MultipartError):
        multipart.parse(iter([body]), b"b", lambda part: None)
