"""Staging's pure rules: what is worth capturing, what a FAILED row keeps, the keys."""

from __future__ import annotations

import time

import pytest

from lib.archive.budget import MAX_ESTIMATE_SECONDS, stage_needs, upload_needs
from lib.archive.staging import (
    STAGED_PREFIX,
    image_type_of,
    keeps_copy,
    staged_key,
    worth_staging,
)
from lib.platform.config import load_settings
from lib.platform.errors import ConfigError
from lib.platform.s3 import PartReader, StagingError
from lib.transfer.failures import Failure, Kind, Stage
from lib.transfer.imagetype import AVIF, GIF, JPEG, PNG, WEBP

UPLOAD = Stage.UPLOAD
DOWNLOAD = Stage.DOWNLOAD


@pytest.mark.parametrize(
    ("failure", "worth"),
    [
        # The host cannot take it now: a lane pause (the attempt is given back).
        (Failure(UPLOAD, Kind.REJECTED, "每分钟内你最多可以上传 20 张图片"), True),
        (Failure(UPLOAD, Kind.HTTP_STATUS, "Too Many Attempts.", status=429), True),
        (Failure(UPLOAD, Kind.HTTP_STATUS, "Authentication failed.", status=401), True),
        (Failure(UPLOAD, Kind.REJECTED, "储存空间不足"), True),
        # Transient failures of the upload: a later attempt can succeed.
        (Failure(UPLOAD, Kind.HTTP_STATUS, "Server Error", status=500), True),
        (Failure(UPLOAD, Kind.CONNECTION, "could not connect to Lsky"), True),
        (Failure(UPLOAD, Kind.TIMEOUT, "not enough time left to upload"), True),
        (Failure(UPLOAD, Kind.REJECTED, "图片上传失败"), True),
        # The image itself was refused: no attempt will take it.
        (Failure(UPLOAD, Kind.REJECTED, "不支持的文件类型"), False),
        (Failure(UPLOAD, Kind.HTTP_STATUS, "Lsky answered HTTP 413", status=413), False),
        (Failure(UPLOAD, Kind.REJECTED, "图片涉嫌违规"), False),
        # Nothing (or nothing whole) was downloaded: there is nothing to capture.
        (Failure(DOWNLOAD, Kind.HTTP_STATUS, "upstream answered HTTP 503", status=503), False),
        (Failure(DOWNLOAD, Kind.CONNECTION, "connection dropped"), False),
        (Failure(DOWNLOAD, Kind.TIMEOUT, "too slow"), False),
    ],
)
def test_worth_staging(failure: Failure, worth: bool) -> None:
    assert worth_staging(failure) is worth


@pytest.mark.parametrize(
    ("failure", "keeps"),
    [
        # Attempts used up on an outage: the copy waits for `requeue --failed`.
        (Failure(UPLOAD, Kind.HTTP_STATUS, "Server Error", status=500), True),
        (Failure(UPLOAD, Kind.CONNECTION, "could not connect to Lsky"), True),
        # Refused for good: the copy has no use left.
        (Failure(UPLOAD, Kind.REJECTED, "不支持的文件类型"), False),
        (Failure(UPLOAD, Kind.HTTP_STATUS, "Lsky answered HTTP 413", status=413), False),
        (Failure(DOWNLOAD, Kind.HTTP_STATUS, "upstream answered HTTP 403", status=403), False),
    ],
)
def test_a_failed_row_keeps_its_copy_unless_refused_for_good(failure: Failure, keeps: bool) -> None:
    assert keeps_copy(failure) is keeps


def test_staged_keys_are_unique_per_capture_under_the_prefix() -> None:
    first, second = staged_key(42, PNG), staged_key(42, PNG)
    assert first != second
    assert first.startswith(f"{STAGED_PREFIX}42/")
    assert first.endswith(".png")
    assert staged_key(7, JPEG, token="abc") == "staged/7/abc.jpg"


@pytest.mark.parametrize("image_type", [PNG, JPEG, GIF, WEBP, AVIF])
def test_the_image_type_comes_back_from_the_key(image_type: object) -> None:
    assert image_type_of(staged_key(1, image_type)) == image_type  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["other/1/a.png", "staged/1/a", "staged/1/a.exe", ""])
def test_keys_we_did_not_write_have_no_image_type(key: str) -> None:
    assert image_type_of(key) is None


def test_staging_time_is_estimated_and_capped_like_the_transfers() -> None:
    assert stage_needs(0) < upload_needs(0)
    assert stage_needs(10_000_000) < stage_needs(50_000_000) <= MAX_ESTIMATE_SECONDS
    assert stage_needs(10**12) == MAX_ESTIMATE_SECONDS


BASE = {"DATABASE_URL": "postgresql://u@h/d", "LSKY_BASE_URL": "https://x", "LSKY_TOKEN": "t"}


def test_the_staging_bucket_setting() -> None:
    assert load_settings(BASE).staging_bucket is None
    assert load_settings({**BASE, "ARCHIVE_STAGING_BUCKET": " "}).staging_bucket is None
    named = {**BASE, "ARCHIVE_STAGING_BUCKET": "image-archive-stagingbucket-1a2b3c"}
    assert load_settings(named).staging_bucket == "image-archive-stagingbucket-1a2b3c"


@pytest.mark.parametrize(
    "value",
    [
        "arn:aws:s3:::bucket",
        "s3://bucket",
        "https://bucket.s3.amazonaws.com",
        "Bucket",
        "ab",
        "a" * 64,
        "my..bucket",
        "192.168.1.1",
        "xn--bucket",
        "bucket-s3alias",
        "-bucket",
    ],
)
def test_a_staging_bucket_that_cannot_be_one_stops_the_start(value: str) -> None:
    # Turning staging off instead would lose images the operator believes are protected.
    with pytest.raises(ConfigError, match="ARCHIVE_STAGING_BUCKET must be an S3 bucket name"):
        load_settings({**BASE, "ARCHIVE_STAGING_BUCKET": value})


def test_the_part_reader_fills_whole_parts_until_the_end() -> None:
    reader = PartReader([b"ab", b"cde", b"", b"fghij"], deadline=time.monotonic() + 60)
    buffer = bytearray(4)
    assert reader.fill(buffer) == 4
    assert buffer == b"abcd"
    assert reader.fill(buffer) == 4
    assert buffer == b"efgh"
    assert reader.fill(buffer) == 2
    assert buffer[:2] == b"ij"
    assert reader.fill(buffer) == 0
    assert reader.size == 10


def test_the_part_reader_stops_at_the_deadline() -> None:
    reader = PartReader([b"abc"], deadline=time.monotonic() - 1)
    with pytest.raises(StagingError, match="deadline"):
        reader.fill(bytearray(1))
