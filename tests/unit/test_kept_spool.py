"""The container's kept spool file (lib.transfer.held): a large image's spool is the file
the previous one used, written over at offsets. These hold what that must never cost: a
byte of an earlier image read as this one's, a file shared with a forked child, a file
closed under the image that holds it."""

from __future__ import annotations

import hashlib
import os
from typing import IO

import pytest

from lib.transfer import held
from lib.transfer.held import Sha1Reader, hold, new_spool, release_spool, write_at
from lib.transfer.imagetype import PNG
from lib.transfer.lsky_upload import HostedImage
from lib.transfer.relay import Relay, relay

LARGE = held.SPOOL_IN_MEMORY_BYTES + 1
HOSTED = HostedImage("https://img.example/i/a.png", "image/png", {})


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


def _relayed(data: bytes) -> tuple[bytes, str]:
    """`data` relayed, as the upload read it, and the sha1 of the image in hand."""
    sent: list[bytes] = []

    def send(image: Relay) -> HostedImage:
        sent.extend(image.chunks())
        return HOSTED

    chunks = [data[at : at + 300_000] for at in range(0, len(data), 300_000)]
    image = relay(iter(chunks), size=len(data), image_type=PNG, send=send)
    try:
        assert image.sending.result() is HOSTED
        assert b"".join(image.chunks()) == data  # the image in hand, read again
        return b"".join(sent), image.sha1
    finally:
        image.close()


def test_a_shorter_image_after_a_longer_one_is_read_as_itself_only() -> None:
    longer, shorter = b"\x89PNG" + b"L" * (3 * LARGE), b"\x89PNG" + b"S" * LARGE
    assert _relayed(longer) == (longer, _sha1(longer))
    sent, sha1 = _relayed(shorter)  # into the same file, which still holds `longer` beyond
    assert sent == shorter
    assert sha1 == _sha1(shorter)


def test_the_next_large_spool_is_the_file_the_last_one_gave_back() -> None:
    first = new_spool(LARGE)
    write_at(first, 0, b"a" * LARGE)
    release_spool(first)
    second = new_spool(LARGE)
    try:
        assert second is first  # written over, not made anew
        assert not second.closed
        write_at(second, 0, b"b" * 10)
        reader = Sha1Reader(second, 10)
        reader.seek(0)
        assert reader.read() == b"b" * 10  # not one byte of the earlier image
        assert reader.sha1() == _sha1(b"b" * 10)
    finally:
        release_spool(second)


def test_a_spool_given_back_twice_is_kept_open_once() -> None:
    spool = new_spool(LARGE)
    reader = Sha1Reader(spool, 0)
    reader.close()
    reader.close()
    release_spool(spool)  # and once more by hand: still the one kept file, open
    again = new_spool(LARGE)
    try:
        assert again is spool
        assert not again.closed
        assert new_spool(LARGE) is not spool  # the kept one is in use: a file of its own
    finally:
        release_spool(again)


def test_an_image_given_back_cannot_be_read_any_more() -> None:
    spool = new_spool(LARGE)
    write_at(spool, 0, b"c" * 100)
    reader = Sha1Reader(spool, 100)
    reader.close()
    for use in (reader.read, reader.tell, lambda: reader.seek(0), reader.sha1):
        with pytest.raises(ValueError, match="released"):
            use()


def test_a_small_spool_is_not_kept() -> None:
    small = new_spool(held.SPOOL_IN_MEMORY_BYTES)
    release_spool(small)
    assert small.closed


def test_a_forked_child_never_writes_into_its_parent_s_kept_file() -> None:
    parent_file = new_spool(LARGE)
    write_at(parent_file, 0, b"p" * 100)
    release_spool(parent_file)  # kept, idle, when the process forks
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its large spool must be a file of its own
        os.close(read)
        mine = new_spool(LARGE)
        write_at(mine, 0, b"x" * 100)
        os.write(write, b"own" if mine is not parent_file else b"shared")
        os._exit(0)
    os.close(write)
    said = os.read(read, 16)
    os.waitpid(pid, 0)
    os.close(read)
    kept = new_spool(LARGE)
    try:
        assert said == b"own"
        assert kept is parent_file
        assert os.pread(kept.fileno(), 100, 0) == b"p" * 100  # the child wrote nothing here
    finally:
        release_spool(kept)


def _kept_with(stale: bytes) -> IO[bytes]:
    """The container's kept file, idle, holding `stale` (an earlier image)."""
    spool = new_spool(LARGE)
    write_at(spool, 0, stale)
    release_spool(spool)
    return spool


def test_a_body_without_a_length_rolls_over_into_the_kept_file() -> None:
    kept = _kept_with(b"z" * (3 * LARGE))
    body = b"\x89PNG" + b"n" * LARGE  # past what is held in memory
    image = hold(iter([body[:1000], body[1000:]]), PNG)
    try:
        assert new_spool(LARGE) is not kept  # in use by the image: another file
        assert b"".join(image.chunks()) == body  # none of the earlier image's bytes
        assert image.sha1 == _sha1(body)
    finally:
        image.close()
    again = new_spool(LARGE)
    release_spool(again)
    assert again is kept  # given back when the image was done with


def test_a_small_body_stays_in_memory_and_leaves_the_kept_file_idle() -> None:
    kept = _kept_with(b"z" * LARGE)
    image = hold(iter([b"\x89PNG", b"s" * 200]), PNG)
    try:
        again = new_spool(LARGE)
        release_spool(again)
        assert again is kept
        assert b"".join(image.chunks()) == b"\x89PNGs" + b"s" * 199
    finally:
        image.close()
