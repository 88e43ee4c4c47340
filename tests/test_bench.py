"""The bench plumbing that is not timing: process memory readers, the table, and the S3
stand-in that costs the machine what a remote S3 would."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from bench.common import Row, peak_rss, reset_peak_rss, rss
from bench.lane import greedy_schedule
from bench.migrate import window
from bench.remote_s3 import RemoteS3Server
from bench.run import render

from lib.platform.s3 import OriginalsError
from lib.platform.s3_originals import OriginalsBucket
from tests.support import Spool


def test_memory_readers_see_an_allocation() -> None:
    reset_peak_rss()
    before = rss()
    block = b"\x01" * (32 * 1024 * 1024)  # written, so resident
    assert peak_rss() >= before + 30 * 1024 * 1024
    del block
    if reset_peak_rss():
        assert peak_rss() < before + 30 * 1024 * 1024


def test_render_has_one_row_per_result_and_each_command_once() -> None:
    rows = [
        Row("1", "a", "1 MB", "<= 2 MB", True, "cmd one"),
        Row("1", "b", "3 MB", "<= 2 MB", False, "cmd one"),
        Row("3", "c", "5 ms", "reported", None, "cmd two"),
    ]
    table = render(rows, "header")
    assert "| 1 | a | 1 MB | <= 2 MB | PASS |" in table
    assert "| 1 | b | 3 MB | <= 2 MB | FAIL |" in table
    assert "| 3 | c | 5 ms | reported | info |" in table
    assert table.count("`cmd one`") == 1
    assert table.count("`cmd two`") == 1


def test_the_migrate_bench_counts_every_statement_that_overlapped_the_run() -> None:
    samples = [(0.0, 1.0), (4.0, 0.5), (9.0, 2.0), (10.5, 0.1), (12.0, 0.1)]
    # Started before and still waiting; inside; started inside and ending after.
    assert window(samples, start=0.5, end=10.0) == [1.0, 0.5, 2.0]


def test_the_lane_s_minimum_counts_lsky_s_whole_seconds() -> None:
    # Two per 10 s from 0.9 s past a second: the first pair leaves the window when second
    # 0 + 10 + 1 begins (10.1 s later), not 10 s after it went.
    assert greedy_schedule(4, [(10.0, 2)], start=1000.9) == pytest.approx([0, 0, 10.1, 10.1])
    assert greedy_schedule(3, [(10.0, 1)], concurrency=1, transfer=0.5, start=1000.0) == [
        0.0,
        11.0,
        22.0,
    ]


def test_the_history_bench_s_plans_run_the_statements_as_they_are_now(db: Any, pg_dsn: str) -> None:
    # The bench EXPLAINs the archive path's statements with parameters of its own: a
    # statement that gains one must not break `make bench` at its last bench.
    from bench.history import archive_path_plans

    db.run("INSERT INTO users (id, username) VALUES (1, 'bench')")
    plans = archive_path_plans(pg_dsn)
    # Each statement ran (an empty table may well be read whole: the bench asks with
    # 10,000,000 events, where the plan matters).
    assert set(plans) == {"claim", "take_lost", "date_undated"}


@pytest.fixture
def remote_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """bench.remote_s3 on loopback, and the environment an S3 client of ours reads."""
    server = RemoteS3Server(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = server.url
    for name, value in {
        "AWS_ENDPOINT_URL_S3": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    yield url
    server.shutdown()
    server.server_close()


def _counts(url: str) -> dict[str, int]:
    answer = urllib3.request("GET", f"{url}/__counts", timeout=5)
    counts: dict[str, int] = json.loads(answer.data)
    return counts


def test_the_remote_s3_stand_in_answers_the_originals_put_as_s3_does(remote_s3: str) -> None:
    bucket = OriginalsBucket("bench-originals")
    data = bytes(range(256)) * 4096 * 3  # 3 MiB: more than one read of the server's
    first = bucket.put(
        "originals/1/a.png",
        Spool(data),
        content_type="image/png",
        metadata={"record-id": "1"},
        deadline=time.monotonic() + 10,
    )
    second = bucket.put(
        "originals/1/b.png",
        Spool(b"x"),
        content_type="image/png",
        metadata={"record-id": "1"},
        deadline=time.monotonic() + 10,
    )
    assert first.sha256 == hashlib.sha256(data).hexdigest()
    assert first.size == len(data)
    assert first.version_id
    assert second.version_id
    assert first.version_id != second.version_id
    assert _counts(remote_s3) == {"puts": 2, "bytes": len(data) + 1}


def test_the_remote_s3_stand_in_stores_nothing_of_a_body_cut_short(remote_s3: str) -> None:
    bucket = OriginalsBucket("bench-originals", max_attempts=1)
    with pytest.raises(OriginalsError):
        bucket.put(
            "originals/2/a.png",
            Spool(b"y" * 200_000, short_by=300_000),  # the source fails part way
            content_type="image/png",
            metadata={"record-id": "2"},
            deadline=time.monotonic() + 10,
        )
    assert _counts(remote_s3) == {"puts": 0, "bytes": 0}


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", "/bench-originals/originals/1/a.png", {}, 501),
        ("HEAD", "/bench-originals/originals/1/a.png", {}, 501),
        ("PUT", "/bench-originals/k?uploads", {"Content-Length": "0"}, 501),
        ("PUT", "/bench-originals/", {"Content-Length": "0"}, 501),
        ("PUT", "/b/k", {"Transfer-Encoding": "chunked"}, 411),
        (
            "PUT",
            "/b/k",
            {"Content-Length": "4", "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"},
            501,
        ),
        ("PUT", "/b/k", {"Content-Length": str(6 * 1024**3)}, 400),
    ],
)
def test_the_remote_s3_stand_in_refuses_what_the_function_does_not_send(
    remote_s3: str, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    answer = urllib3.request(
        method, remote_s3 + path, headers=headers, body=None, timeout=5, retries=False
    )
    assert answer.status == status
    assert _counts(remote_s3)["puts"] == 0
