"""The bytes we sent against what Lsky says it stored (lib.archive.fidelity, pure)."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest

from lib.archive.fidelity import Digest, compare, note
from lib.transfer.held import Sha1Reader, hold
from lib.transfer.imagetype import PNG


def sha1(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


DATA = bytes(range(256)) * 40  # 10,240 bytes = 10.0 KB
MD5 = hashlib.md5(DATA, usedforsecurity=False).hexdigest()
SHA1 = sha1(DATA)
SENT = Digest(SHA1, len(DATA))


def test_the_digests_are_taken_in_one_pass_over_any_chunking() -> None:
    chunks = [DATA[:1], DATA[1:4000], b"", DATA[4000:]]
    held = hold(iter(chunks), PNG)
    assert Digest(held.sha1, held.size) == SENT
    assert held.sha256 == ""  # the happy path does not pay for it
    assert hold(iter(chunks), PNG, sha256=True).sha256 == hashlib.sha256(DATA).hexdigest()
    assert b"".join(held.chunks()) == DATA  # and again: the spool reads from the start
    assert b"".join(held.chunks()) == DATA


def test_chunks_that_stop_early_leave_nothing_in_hand() -> None:
    def broken() -> Any:
        yield DATA[:10]
        raise OSError("dropped")

    with pytest.raises(OSError, match="dropped"):
        hold(broken(), PNG)


@pytest.mark.parametrize(
    "hosted",
    [
        {"md5": MD5, "sha1": SHA1, "size": 10.0},  # the upload answer: bytes / 1024
        {"md5": MD5, "sha1": SHA1.upper(), "size": "10.00"},  # read back from DECIMAL(8,2)
        {"md5": MD5, "sha1": SHA1, "size": 10.004},  # within the column's rounding
    ],
)
def test_identical(hosted: dict[str, Any]) -> None:
    fidelity = compare(SENT, hosted)
    assert fidelity.altered is False
    assert fidelity.compared == ("sha1", "size")  # Lsky's md5 says what its sha1 says


@pytest.mark.parametrize(
    ("hosted", "differs"),
    [
        ({"md5": "0" * 32, "sha1": "0" * 40, "size": 7.5}, ("sha1", "size")),
        ({"md5": MD5, "sha1": "0" * 40, "size": 10.0}, ("sha1",)),
        ({"md5": MD5, "sha1": SHA1, "size": 10.01}, ("size",)),  # 10 bytes more
        ({"sha1": "0" * 40}, ("sha1",)),
    ],
)
def test_altered(hosted: dict[str, Any], differs: tuple[str, ...]) -> None:
    fidelity = compare(SENT, hosted)
    assert fidelity.altered is True
    assert fidelity.differs == differs


@pytest.mark.parametrize(
    "hosted",
    [
        {},
        {"md5": "", "sha1": None, "size": True},
        {"md5": 5, "size": "n/a"},
        {"size": "nan"},
        {"md5": "0" * 32},  # md5 alone: not taken on our side, so no verdict
    ],
)
def test_nothing_to_compare_is_no_verdict(hosted: dict[str, Any]) -> None:
    assert compare(SENT, hosted).altered is None


def test_the_note_kept_with_the_row() -> None:
    fidelity = compare(SENT, {"md5": MD5, "sha1": "0" * 40, "size": 10.0})
    assert note(SENT, fidelity) == {
        "sent": {"sha1": SHA1, "bytes": len(DATA)},
        "altered": True,
        "differs": ["sha1"],
    }


class CountingSpool(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads += 1
        return super().read(size)


def test_the_upload_s_own_read_takes_the_sha1_without_a_pass_of_its_own() -> None:
    spool = CountingSpool(DATA)
    reader = Sha1Reader(spool, len(DATA))
    reader.seek(0)
    assert reader.read(64) == DATA[:64]  # the header, for the dimensions
    reader.seek(5000)
    reader.read(100)  # a JPEG's segments, out of order
    reader.seek(0)
    while reader.read(1000):  # the upload, from the start
        pass
    reads = spool.reads
    assert reader.sha1() == SHA1
    assert spool.reads == reads  # known already: nothing read again
    reader.seek(0)
    assert reader.read() == DATA
    assert reader.sha1() == SHA1  # a resend (a 401's) hashes nothing twice


def test_a_sha1_asked_before_the_upload_reads_the_rest_and_keeps_the_position() -> None:
    reader = Sha1Reader(io.BytesIO(DATA), len(DATA))
    reader.seek(0)
    reader.read(3000)
    reader.seek(123)
    assert reader.sha1() == SHA1  # the look-up before an upload: the rest read once
    assert reader.tell() == 123
    assert hold(iter([DATA]), PNG).sha1 == SHA1
