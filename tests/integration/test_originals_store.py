"""The two calls the audit builds on (lib.archive.originals: `keep`, `read_back`) and the
originals' table outside the success write (lib.state.originals), against moto's S3 and
the test database: what is read back is what was kept, or a clear error."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devkit import images
from lib.archive.originals import OriginalMismatch, OriginalMissing, Originals, OriginalsError
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.platform.observability import metrics
from lib.platform.s3_originals import OriginalsBucket
from lib.state.claim import KeptOriginal, OriginalSource
from lib.state.originals import OriginalStore
from lib.transfer.held import HeldImage, hold
from lib.transfer.imagetype import PNG
from tests.support import emf_metrics

IMAGE = images.png(16, 16, size=1_500_000, seed=38)
SHA256 = hashlib.sha256(IMAGE).hexdigest()


def held(data: bytes = IMAGE) -> HeldImage:
    return hold([data[i : i + 65536] for i in range(0, len(data), 65536)], PNG)


def later(seconds: float = 60) -> float:
    return time.monotonic() + seconds


def kept(originals: Originals, record_id: int, source: OriginalSource) -> KeptOriginal:
    """IMAGE kept as `record_id`'s original (its spool released after)."""
    image = held()
    try:
        original = originals.keep(record_id, image, source, later())
    finally:
        image.close()
    assert original is not None
    return original


pytestmark = pytest.mark.usefixtures("clean_metrics")


@pytest.fixture
def originals(moto: Any, originals_bucket: str) -> Originals:
    return Originals(OriginalsBucket(originals_bucket))


@pytest.fixture
def store(pg_dsn: str, db: Any) -> Iterator[OriginalStore]:
    database = Database(DatabaseConfig(url=pg_dsn), application_name="originals-test")
    yield OriginalStore(database)
    database.close()


def test_kept_bytes_read_back_are_the_bytes_kept(
    originals: Originals, s3: Any, originals_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    image = held()
    try:
        original = originals.keep(7, image, OriginalSource.HOSTED, later())
    finally:
        image.close()

    assert original is not None
    assert (original.bucket, original.sha256, original.bytes) == (
        originals_bucket,
        SHA256,
        len(IMAGE),
    )
    assert (original.mime_type, original.source) == ("image/png", OriginalSource.HOSTED)
    assert original.key.startswith("originals/7/")
    head = s3.head_object(Bucket=originals_bucket, Key=original.key)
    assert head["Metadata"] == {"record-id": "7", "source": "hosted"}
    assert head["VersionId"] == original.version_id
    metrics.flush_metrics()  # what a handler does at its end
    assert emf_metrics(capsys).get("OriginalsKept") == 1

    back = originals.read_back(original, later())
    try:
        assert (back.size, back.sha256) == (len(IMAGE), SHA256)
        assert b"".join(back.chunks()) == IMAGE
    finally:
        back.close()


def test_read_back_takes_the_recorded_version_whatever_replaced_the_key(
    originals: Originals, s3: Any, originals_bucket: str
) -> None:
    original = kept(originals, 8, OriginalSource.ARCHIVE)
    s3.put_object(Bucket=originals_bucket, Key=original.key, Body=b"something else")

    back = originals.read_back(original, later())
    try:
        assert back.sha256 == SHA256
    finally:
        back.close()


def test_an_original_whose_object_is_not_the_bytes_kept_is_refused(
    originals: Originals, s3: Any, originals_bucket: str
) -> None:
    original = kept(originals, 9, OriginalSource.ARCHIVE)
    # Truncated, then replaced with as many other bytes: the row's record does not match.
    short = KeptOriginal(**{**vars(original), "bytes": original.bytes - 1})
    other = KeptOriginal(**{**vars(original), "sha256": "0" * 64})

    with pytest.raises(OriginalMismatch, match="bytes"):
        originals.read_back(short, later())
    with pytest.raises(OriginalMismatch, match="does not hold the bytes kept"):
        originals.read_back(other, later())


def test_a_missing_original_or_version_is_told_apart(
    originals: Originals, s3: Any, originals_bucket: str
) -> None:
    original = kept(originals, 10, OriginalSource.ARCHIVE)
    s3.delete_object(Bucket=originals_bucket, Key=original.key, VersionId=original.version_id)

    with pytest.raises(OriginalMissing):
        originals.read_back(original, later())
    gone = KeptOriginal(**{**vars(original), "key": "originals/10/" + "f" * 32 + ".png"})
    with pytest.raises(OriginalMissing):
        originals.read_back(gone, later())
    with pytest.raises(OriginalMissing, match="not an original"):
        originals.read_back(KeptOriginal(**{**vars(original), "key": "staged/10/x.png"}), later())


def test_reads_use_the_recorded_bucket(s3: Any, originals_bucket: str, moto: Any) -> None:
    original = kept(Originals(OriginalsBucket(originals_bucket)), 11, OriginalSource.ARCHIVE)
    # The stack's bucket is another one now (a new stack, a renamed bucket).
    elsewhere = Originals(OriginalsBucket("another-originals-bucket"))

    back = elsewhere.read_back(original, later())
    back.close()
    assert back.sha256 == SHA256


OFF = KeptOriginal("a-bucket", "originals/1/x.png", None, "0" * 64, 1, "x", OriginalSource.ARCHIVE)


def test_keep_never_raises_for_s3_and_off_keeps_nothing(
    moto: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    image = held()
    try:
        refused = Originals(OriginalsBucket("no-such-originals-bucket"))
        assert refused.keep(12, image, OriginalSource.ARCHIVE, later()) is None
        metrics.flush_metrics()
        assert emf_metrics(capsys).get("OriginalsFailed") == 1
        requests = moto.requests("s3")
        assert Originals(None).keep(12, image, OriginalSource.ARCHIVE, later()) is None
        assert moto.requests("s3") == requests
    finally:
        image.close()
    with pytest.raises(OriginalsError, match="off"):
        Originals(None).read_back(
            KeptOriginal("b-ucket", "k", None, "0" * 64, 1, "x", OriginalSource.ARCHIVE), later()
        )


def test_the_store_keeps_and_replaces_a_record_s_original(
    store: OriginalStore, originals: Originals
) -> None:
    first = kept(originals, 13, OriginalSource.HOSTED)
    second = kept(originals, 13, OriginalSource.PROVIDER)

    assert store.of(13) is None
    assert store.keep(13, first)
    assert store.of(13) == first
    assert store.keep(13, second)
    assert store.of(13) == second


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("bucket", "Not_A_Bucket"),
        ("key", "staged/14/" + "a" * 32 + ".png"),
        ("key", "originals/14/../../etc.png"),
        ("version_id", "v" * 2000),
        ("version_id", "with space"),
        ("sha256", "ABC"),
        ("bytes", 0),
        ("bytes", 10**12),
        ("mime_type", "text/html"),
    ],
)
def test_a_row_no_release_writes_is_not_an_original(
    store: OriginalStore, db: Any, column: str, value: Any
) -> None:
    row = {
        "bucket": "originals-bucket",
        "key": "originals/14/" + "a" * 32 + ".png",
        "version_id": "3sL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY",
        "sha256": "b" * 64,
        "bytes": 5,
        "mime_type": "image/png",
        column: value,
    }
    db.run(
        "INSERT INTO image_archive_originals (record_id, bucket, key, version_id, sha256,"
        " bytes, mime_type, source) VALUES (14, :bucket, :key, :version_id, :sha256,"
        " :bytes, :mime_type, 'archive')",
        **row,
    )

    assert store.of(14) is None
