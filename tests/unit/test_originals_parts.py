"""The originals' parts that need no server: their settings, the PUT body streamed from a
spool (its SHA-256 taken once whatever botocore re-reads), another reader of a relay,
a write kept waiting no longer than asked, and the rows KeptOriginal accepts."""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.archive.originals import Keeping, object_metadata, original_key
from lib.platform.config import load_settings
from lib.platform.errors import ConfigError
from lib.platform.s3_body import BodyCut, Cut, StreamedBody
from lib.state.claim import KeptOriginal, OriginalSource
from lib.transfer.failures import ArchiveFailure
from lib.transfer.held import Sha1Reader, hold
from lib.transfer.imagetype import JPEG, PNG
from lib.transfer.multipart import BodyLengthError
from lib.transfer.relay import Relay
from tests.support import HANG_SECONDS, Spool, wait_until

BASE = {
    "DATABASE_URL": "postgresql://u:p@127.0.0.1:5432/db",
    "LSKY_BASE_URL": "https://img.example.com/",
    "LSKY_TOKEN": "1|abc",
}


# -- settings ----------------------------------------------------------------------------


def test_originals_are_off_unless_a_bucket_is_named() -> None:
    settings = load_settings(BASE)
    assert settings.originals_bucket is None
    assert settings.originals_storage_class == "GLACIER_IR"
    assert load_settings({**BASE, "ARCHIVE_ORIGINALS_BUCKET": " "}).originals_bucket is None
    named = load_settings(
        {
            **BASE,
            "ARCHIVE_ORIGINALS_BUCKET": "image-archive-originalsbucket-1a2b3c",
            "ARCHIVE_ORIGINALS_STORAGE_CLASS": "STANDARD_IA",
        }
    )
    assert named.originals_bucket == "image-archive-originalsbucket-1a2b3c"
    assert named.originals_storage_class == "STANDARD_IA"


@pytest.mark.parametrize(
    "value", ["arn:aws:s3:::bucket", "s3://bucket", "Bucket", "a", "b" * 64, "192.168.1.1"]
)
def test_an_originals_bucket_that_cannot_be_one_stops_the_start(value: str) -> None:
    # The operator believes every original is kept: it must not quietly turn off.
    with pytest.raises(ConfigError, match="ARCHIVE_ORIGINALS_BUCKET must be an S3 bucket name"):
        load_settings({**BASE, "ARCHIVE_ORIGINALS_BUCKET": value})


@pytest.mark.parametrize("value", ["GLACIER", "DEEP_ARCHIVE", "glacier_ir", "REDUCED_REDUNDANCY"])
def test_a_storage_class_outside_the_template_s_stops_the_start(value: str) -> None:
    with pytest.raises(ConfigError, match="ARCHIVE_ORIGINALS_STORAGE_CLASS must be one of"):
        load_settings({**BASE, "ARCHIVE_ORIGINALS_STORAGE_CLASS": value})


# -- keys and metadata -------------------------------------------------------------------


def test_each_write_has_a_key_of_its_own_under_the_record() -> None:
    first, second = original_key(42, PNG), original_key(42, PNG)
    assert first != second
    assert first.startswith("originals/42/")
    assert original_key(42, JPEG).endswith(".jpg")
    assert object_metadata(42, OriginalSource.STAGED) == {"record-id": "42", "source": "staged"}
    row = [
        "bucket-a",
        first,
        "3sL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY",
        "0" * 64,
        1,
        "image/png",
        "archive",
    ]
    assert KeptOriginal.from_row(row) == KeptOriginal(
        "bucket-a", first, row[2], "0" * 64, 1, "image/png", OriginalSource.ARCHIVE
    )


@given(
    st.tuples(
        st.one_of(st.text(max_size=70), st.integers(), st.none()),
        st.one_of(st.text(max_size=80), st.none()),
        st.one_of(st.text(max_size=40), st.none(), st.integers()),
        st.one_of(st.text(max_size=70), st.none()),
        st.one_of(st.integers(), st.floats(), st.text(max_size=5), st.none()),
        st.one_of(st.text(max_size=20), st.none()),
        st.one_of(st.text(max_size=10), st.none()),
    )
)
def test_whatever_a_row_holds_is_checked_before_it_is_an_original(row: tuple[Any, ...]) -> None:
    original = KeptOriginal.from_row(row)
    if original is not None:
        assert original.key.startswith("originals/")
        assert len(original.sha256) == 64
        assert 0 < original.bytes <= 500_000_000
        assert original.source in set(OriginalSource)


# -- the body streamed from the spool -------------------------------------------------------


DATA = bytes(range(256)) * 3000  # 768,000 bytes: several of the body's reads


def test_the_body_hands_botocore_every_byte_and_hashes_each_once() -> None:
    digest, cut = hashlib.sha256(), Cut()
    body = StreamedBody(Spool(DATA), digest, cut)
    assert len(body) == len(DATA)

    first = body.read(100_000) + body.read(50_000)
    body.seek(0)  # botocore's retry reads it again from the start
    whole = b"".join(iter(lambda: body.read(65_536), b""))

    assert first == DATA[:150_000]
    assert whole == DATA
    assert digest.hexdigest() == hashlib.sha256(DATA).hexdigest()
    assert body.hashed == len(DATA)
    assert cut.sent
    assert body.read() == b""


def test_a_body_cut_or_short_of_its_length_stops_with_why() -> None:
    cut = Cut()
    body = StreamedBody(Spool(DATA), hashlib.sha256(), cut)
    body.read(1000)
    cut()
    with pytest.raises(BodyCut):
        body.read(1000)
    assert body.failure == "cut"
    assert not cut.sent

    short = StreamedBody(Spool(DATA, short_by=10), hashlib.sha256(), Cut())
    assert len(short.read(len(DATA))) == 262_144  # at most one read's worth at a time
    short.seek(len(DATA))
    with pytest.raises(BodyCut, match=f"ended after {len(DATA)} of {len(DATA) + 10} bytes"):
        short.read(262_144)
    with pytest.raises(ValueError, match="seeks only"):
        short.seek(0, io.SEEK_END)


# -- the spool read beside the upload ---------------------------------------------------


def test_a_held_image_is_read_at_an_offset_without_moving_its_reader() -> None:
    for data in (DATA[:1000], DATA + DATA):  # in memory, and the kept /tmp file
        image = hold([data], PNG)
        try:
            image.file.seek(10)
            assert image.read_at(5, 20) == data[5:25]
            assert image.read_at(len(data) - 3, 100) == data[-3:]
            assert image.file.tell() == 10
        finally:
            image.close()
        with pytest.raises(ValueError, match="released"):
            image.read_at(0, 1)


def test_a_reader_beside_the_relay_gets_what_landed_then_the_end_or_the_failure() -> None:
    relay = Relay(size=len(DATA), image_type=PNG)
    got: list[bytes] = []
    done = threading.Event()

    def read_all() -> None:
        at = 0
        while chunk := relay.read_at(at, 65_536):
            got.append(chunk)
            at += len(chunk)
        done.set()

    thread = threading.Thread(target=read_all)
    thread.start()
    relay.pour([DATA[:300_000], DATA[300_000:]])
    assert done.wait(HANG_SECONDS)
    thread.join(HANG_SECONDS)
    assert b"".join(got) == DATA

    broken = Relay(size=len(DATA), image_type=PNG)
    with pytest.raises(ArchiveFailure, match="body was 1000 bytes"):
        broken.pour([DATA[:1000]])
    assert broken.read_at(0, 5000) == DATA[:1000]
    with pytest.raises(BodyLengthError, match="after 1000 of"):
        broken.read_at(1000, 5000)
    assert isinstance(broken.reader, Sha1Reader)


def test_a_reader_beside_the_relay_is_woken_once_a_whole_read_has_landed() -> None:
    """The download landing in small chunks (a link slower than the CPU), the original's
    reader gets whole reads, not one read and one send for each chunk."""
    relay = Relay(size=10 * 1024, image_type=PNG)
    lands = threading.Semaphore(0)
    reads: list[bytes] = []

    def download() -> Iterator[bytes]:
        for n in range(10):
            assert lands.acquire(timeout=HANG_SECONDS)
            yield bytes([n]) * 1024

    def read_all() -> None:
        at = 0
        while chunk := relay.read_at(at, 4096):
            reads.append(chunk)
            at += len(chunk)

    reader = threading.Thread(target=read_all)
    reader.start()
    pouring = threading.Thread(target=relay.pour, args=(download(),))
    pouring.start()
    for landed in range(1, 11):
        lands.release()
        wait_until(lambda landed=landed: _landed(relay) == landed)
        if landed == 10:  # the last: the end wakes the reader
            break
        if landed % 4 == 0:  # a whole read has landed: the reader takes it
            wait_until(lambda landed=landed: len(reads) == landed // 4)
        else:
            time.sleep(0.01)  # room for a reader woken too early to read
        assert [len(r) for r in reads] == [4096] * (landed // 4), landed
    pouring.join(HANG_SECONDS)
    reader.join(HANG_SECONDS)
    assert [len(r) for r in reads] == [4096, 4096, 2048]  # the rest at the end
    assert b"".join(reads) == b"".join(bytes([n]) * 1024 for n in range(10))


def _landed(relay: Relay) -> int:
    """Kibibytes poured into `relay` so far."""
    with relay._changed:
        return relay._landed // 1024


# -- a write kept waiting --------------------------------------------------------------------


def test_a_write_slower_than_the_wait_is_cut_and_not_kept() -> None:
    cut_seen = threading.Event()

    def write(cut: Cut) -> KeptOriginal:
        deadline = time.monotonic() + HANG_SECONDS
        while not cut.done and time.monotonic() < deadline:
            time.sleep(0.001)
        cut_seen.set()
        raise BodyCut("cut")

    keeping = Keeping(1, "originals/1/x.png", write, lambda cut: None)

    assert keeping.kept(0.0) is None  # the deadline had passed: no wait at all
    keeping.stop()
    assert cut_seen.is_set()
