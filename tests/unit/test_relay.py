"""The relay (lib.transfer.relay): a download poured into the spool while an upload, on a
thread of its own, reads it as it lands. The download here is a generator the test steps
with a semaphore; the upload is a function reading the relay, as the Lsky client does."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator

import pytest

from lib.transfer import relay as relay_module
from lib.transfer.failures import ArchiveFailure, Failure, Kind, Stage, fail
from lib.transfer.imagetype import PNG
from lib.transfer.lsky_upload import HostedImage
from lib.transfer.multipart import BodyLengthError
from lib.transfer.relay import Relay, RelayedImage, relay
from tests.support import HANG_SECONDS, wait_until

CHUNKS = [bytes([n]) * 100_000 for n in range(1, 6)]  # 500 kB
DATA = b"".join(CHUNKS)
SHA1 = hashlib.sha1(DATA, usedforsecurity=False).hexdigest()
HOSTED = HostedImage("https://img.example/i/a.png", "image/png", {})
REFUSED = fail(Stage.UPLOAD, Kind.HTTP_STATUS, "Lsky answered HTTP 503", status=503).failure


class Download:
    """Chunks handed out one at a time, each once the test lets it go (`release`)."""

    def __init__(self, chunks: list[bytes], *, then: Exception | None = None) -> None:
        self.chunks = chunks
        self.then = then
        self._go = threading.Semaphore(0)

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self._go.release()

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            assert self._go.acquire(timeout=HANG_SECONDS), "the test never let it go"
            yield chunk
        if self.then is not None:
            raise self.then


def pouring(spool: Relay, download: Download) -> threading.Thread:
    """The download poured on a thread of its own (as `relay` pours on the caller's)."""

    def pour() -> None:
        with contextlib.suppress(ArchiveFailure):  # the readers see the end
            spool.pour(download)

    thread = threading.Thread(target=pour)
    thread.start()
    return thread


def test_a_reader_gets_each_chunk_as_it_lands_never_ahead() -> None:
    spool, download = Relay(size=len(DATA), image_type=PNG), Download(CHUNKS)
    thread = pouring(spool, download)
    reader = spool.chunks()
    for index, chunk in enumerate(CHUNKS):
        download.release()  # one more chunk lands...
        got = b""
        while len(got) < len(chunk):
            got += next(reader)  # ...and is read before the next is even produced
        assert got == chunk, index
    assert b"".join(reader) == b""  # ends with the download, whole
    thread.join(HANG_SECONDS)
    spool.spool.close()


def test_every_reader_starts_from_the_first_byte() -> None:
    spool, download = Relay(size=len(DATA), image_type=PNG), Download(CHUNKS)
    thread = pouring(spool, download)
    download.release(2)
    first = spool.chunks()
    begun = next(first)
    download.release(len(CHUNKS) - 2)
    again = spool.chunks()  # a resend after a 401, while the download goes on
    assert b"".join(again) == DATA
    assert begun + b"".join(first) == DATA
    thread.join(HANG_SECONDS)
    spool.spool.close()


def test_an_upload_that_gives_up_does_not_stop_the_spool_filling() -> None:
    download = Download(CHUNKS)
    download.release()  # the first chunk
    read: list[bytes] = []

    def send(image: Relay) -> HostedImage | Failure:
        read.append(next(image.chunks()))  # what has landed
        download.release(len(CHUNKS) - 1)  # the rest comes after the upload gave up
        return REFUSED  # refused part-way: nobody reads any more

    held = relay(download, size=len(DATA), image_type=PNG, send=send)
    try:
        assert held.sending.result(HANG_SECONDS) is REFUSED
        assert read == [CHUNKS[0]]
        assert b"".join(held.chunks()) == DATA  # the rest landed all the same
        assert held.sha1 == SHA1  # taken once, as it landed
        assert held.size == len(DATA)
    finally:
        held.close()


def test_an_upload_that_stalls_does_not_hold_the_download() -> None:
    download = Download(CHUNKS)
    download.release(len(CHUNKS))
    go = threading.Event()

    def send(image: Relay) -> HostedImage | Failure:
        go.wait(HANG_SECONDS)  # Lsky reads nothing for now
        return HOSTED if b"".join(image.chunks()) == DATA else REFUSED

    held = relay(download, size=len(DATA), image_type=PNG, send=send)
    try:
        # The whole download is in (relay returns once it has ended whole), the upload
        # not begun; it then reads every byte from the spool.
        assert not held.sending.done()
        go.set()
        assert held.sending.result(HANG_SECONDS) is HOSTED
        assert b"".join(held.chunks()) == DATA
        assert held.sha1 == SHA1
    finally:
        go.set()
        held.close()


def test_a_download_that_breaks_off_cuts_the_upload_before_its_end() -> None:
    broke = fail(Stage.DOWNLOAD, Kind.CONNECTION, "connection dropped")
    download = Download(CHUNKS[:2], then=broke)
    download.release(2)
    read: list[bytes] = []
    cut: list[BodyLengthError] = []
    ended = threading.Event()

    def send(image: Relay) -> HostedImage | Failure:
        try:
            read.extend(image.chunks())
        except BodyLengthError as error:
            cut.append(error)
        finally:
            ended.set()
        return fail(Stage.UPLOAD, Kind.CONNECTION, "cut short").failure

    with pytest.raises(ArchiveFailure) as caught:
        relay(download, size=len(DATA), image_type=PNG, send=send)
    assert caught.value is broke  # the download's own failure, for the attempt
    assert ended.is_set()  # raised only once the upload had ended, cut short
    assert b"".join(read) == DATA[:200_000]  # all that landed, never more
    [error] = cut  # and the body's end never came: its reader was told
    assert "broke off after 200000 of 500000 bytes" in str(error)


@pytest.mark.parametrize(
    ("size", "why"),
    [(len(DATA) - 1, "more than its"), (len(DATA) + 1, "announced")],
    ids=["more-than-announced", "fewer-than-announced"],
)
def test_a_download_that_does_not_match_its_length_fails(size: int, why: str) -> None:
    download = Download(CHUNKS)
    download.release(len(CHUNKS))
    cut: list[bool] = []

    def send(image: Relay) -> HostedImage | Failure:
        try:
            b"".join(image.chunks())
        except BodyLengthError:
            cut.append(True)
        return REFUSED

    with pytest.raises(ArchiveFailure, match=why) as caught:
        relay(download, size=size, image_type=PNG, send=send)
    assert caught.value.failure.stage is Stage.DOWNLOAD
    assert cut == [True]


def test_closing_waits_for_the_upload_then_closes_the_spool() -> None:
    download = Download(CHUNKS)
    download.release(len(CHUNKS))
    go = threading.Event()

    def send(image: Relay) -> HostedImage | Failure:
        assert go.wait(HANG_SECONDS)
        return HOSTED

    held = relay(download, size=len(DATA), image_type=PNG, send=send)
    assert isinstance(held, RelayedImage)
    closing = threading.Thread(target=held.close)
    closing.start()
    closing.join(0.05)
    assert closing.is_alive()  # waiting for the upload, which reads the spool
    go.set()
    closing.join(HANG_SECONDS)
    assert held.sending.done()


def _relay_whole(data: bytes) -> tuple[RelayedImage, list[int]]:
    """`data` relayed at once; the upload notes the thread it ran on."""
    threads: list[int] = []

    def send(image: Relay) -> HostedImage:
        threads.append(threading.get_ident())
        b"".join(image.chunks())
        return HOSTED

    return relay(iter([data]), size=len(data), image_type=PNG, send=send), threads


def test_relayed_uploads_run_on_a_thread_kept_for_the_next_one() -> None:
    seen: list[int] = []
    for _ in range(3):
        image, threads = _relay_whole(DATA)
        assert image.sending.result(HANG_SECONDS) is HOSTED
        image.close()
        seen += threads
    assert len(set(seen)) == 1  # no thread started per upload: the first one, kept


def test_a_forked_child_relays_on_threads_of_its_own() -> None:
    image, _ = _relay_whole(DATA)  # the parent's upload thread exists, idle, at the fork
    assert image.sending.result(HANG_SECONDS) is HOSTED
    image.close()
    pid = os.fork()
    if pid == 0:  # the parent's thread is not in the child: a relay must still be sent
        code = 1
        with contextlib.suppress(BaseException):
            child, _ = _relay_whole(DATA)
            code = 0 if child.sending.result(HANG_SECONDS) is HOSTED else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_download_waits_for_the_upload_s_thread_briefly_never_for_the_upload() -> None:
    # Every upload thread busy: this relay's upload cannot start, and its download is poured
    # all the same, after UPLOAD_START_WAIT_SECONDS at most.
    go = threading.Event()

    def stuck(image: Relay) -> HostedImage:
        assert go.wait(HANG_SECONDS)
        return HOSTED

    busy = [relay(iter([DATA]), size=len(DATA), image_type=PNG, send=stuck)]
    busy += [
        relay(iter([DATA]), size=len(DATA), image_type=PNG, send=stuck)
        for _ in range(relay_module.UPLOAD_THREADS - 1)
    ]
    relayed: list[tuple[RelayedImage, list[int]]] = []
    pouring = threading.Thread(target=lambda: relayed.append(_relay_whole(DATA)))
    try:
        pouring.start()
        pouring.join(HANG_SECONDS)
        assert relayed, "the download waited for an upload that could not start"
        image, threads = relayed[0]
        assert not threads  # poured whole, its upload not started yet
    finally:
        go.set()
    assert image.sending.result(HANG_SECONDS) is HOSTED  # it runs once a thread is free
    for held in [*busy, image]:
        held.close()


def test_the_download_starts_once_the_upload_asks_for_the_first_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its request's head is sent by then: the CPU the download waits with is the one the
    # upload's thread sends on (bounded: the test above).
    monkeypatch.setattr(relay_module, "UPLOAD_START_WAIT_SECONDS", HANG_SECONDS)
    asked = threading.Event()
    asked_first: list[bool] = []

    def download() -> Iterator[bytes]:
        asked_first.append(asked.is_set())
        yield DATA

    def send(image: Relay) -> HostedImage | Failure:
        asked.set()  # as the Lsky client, having sent the request's head
        return HOSTED if b"".join(image.chunks()) == DATA else REFUSED

    held = relay(download(), size=len(DATA), image_type=PNG, send=send)
    try:
        assert held.sending.result(HANG_SECONDS) is HOSTED
        assert asked_first == [True]
    finally:
        held.close()


def test_bytes_the_upload_waits_for_are_handed_over_before_the_next_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With no bound the hand-over is seen whole: bytes landed where the upload's thread
    # waits are taken (it waits there no more) before the download reads on.
    monkeypatch.setattr(relay_module, "HAND_OVER_WAIT_SECONDS", HANG_SECONDS)
    spool = Relay(size=len(DATA), image_type=PNG)
    still_waiting: list[bool] = []

    def download() -> Iterator[bytes]:
        landed = 0
        for chunk in CHUNKS:
            wait_until(lambda: spool._waiting_at == landed, "the upload waits")  # noqa: B023
            yield chunk
            still_waiting.append(spool._waiting_at == landed)
            landed += len(chunk)

    taken: list[bytes] = []
    reader = threading.Thread(target=lambda: taken.extend(spool.chunks()))
    reader.start()
    spool.pour(download())
    reader.join(HANG_SECONDS)
    assert b"".join(taken) == DATA
    assert still_waiting == [False] * len(CHUNKS)
    spool.spool.close()


def test_the_hand_over_is_bounded_when_the_upload_s_thread_does_not_come() -> None:
    # A reader recorded as waiting that never wakes (a thread starved of a CPU): each
    # hand-over gives up after HAND_OVER_WAIT_SECONDS and the download lands whole.
    spool = Relay(size=len(DATA), image_type=PNG)
    spool._waiting_at = 0  # the state a starved reader leaves
    spool.pour(iter(CHUNKS))
    assert b"".join(spool.chunks()) == DATA
    assert spool.reader.sha1() == SHA1
    spool.spool.close()
