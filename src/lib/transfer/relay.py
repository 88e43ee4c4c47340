"""A download poured into the spool while an upload, on a thread of its own, reads it as
it lands (docs/explanation/transfers.md, "The relayed copy"). `relay(...)` gives the whole image in
hand once the download has ended, its upload maybe still under way (`RelayedImage`): the
upload never reads a byte the spool lacks, never keeps the download back but to take a
CPU, briefly, and a download that fails cuts it before its last byte (BodyLengthError)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from lib.platform.kept_threads import KeptThreads
from lib.transfer.failures import ArchiveFailure, Failure, Kind, Stage, fail
from lib.transfer.held import HeldImage, Sha1Reader, new_spool, release_spool, write_at
from lib.transfer.imagetype import READ_CHUNK_BYTES, ImageType
from lib.transfer.lsky_upload import HostedImage
from lib.transfer.multipart import BodyLengthError

# One relayed upload runs at a time in a container; more only while one is cut short.
UPLOAD_THREADS = 4
# The longest the download waits for the upload's request to be under way (its head sent,
# asking for the image's first bytes): never for Lsky's answer.
UPLOAD_START_WAIT_SECONDS = 0.01
# The longest the download waits, having landed what the upload's thread waits for, for
# that thread to take it: the CPU this thread leaves is the one the other wakes up on.
HAND_OVER_WAIT_SECONDS = 0.002

Sent = HostedImage | Failure  # what an upload came to
Send = Callable[["Relay"], Sent]  # the upload, reading the relay's chunks()


class Reader(Protocol):
    """Another reader of the relay beside the upload (the original's write)."""

    def drop(self) -> None:
        """The upload failed: what the reader does is not wanted (called once it has)."""

    def stop(self) -> None:
        """Read the spool no more (called before the spool's release)."""


Beside = Callable[["Relay"], Reader]  # starts a reader of the relay's read_at()


class Relay:
    """The spool a download is poured into (`pour`, by the downloading thread, taking the
    sha1 on the way: `reader`, the Sha1Reader the image in hand is read through later)
    and read back from as it lands (`chunks`, by another thread)."""

    def __init__(self, *, size: int, image_type: ImageType) -> None:
        self.size = size  # announced (the source's Content-Length)
        self.image_type = image_type
        self.spool = new_spool(size)
        self.reader = Sha1Reader(self.spool, size)
        self._landed = 0  # bytes [0, _landed) are in the spool
        self._ended = False
        self._failed = False
        self._waiting_at: int | None = None  # the offset the upload's thread waits at
        lock = threading.RLock()
        self._changed = threading.Condition(lock)  # the upload's thread waits on this
        # The reader beside the upload (the original's write) waits on this, woken only
        # once a whole read of its has landed (or the end): on links slower than the CPU
        # the download lands in small chunks, and a read and a send for each cost that
        # reader more CPU than its bytes. Its body need only end with the upload's.
        self._beside = threading.Condition(lock)
        self._beside_wants: int | None = None  # the end of the read it waits for
        # Whether the upload read the image to its end, on some pass: only then did its
        # request's body go out whole (one cut by its own deadline before that did not).
        self.read_whole = False

    def pour(self, chunks: Iterable[bytes]) -> None:
        """Every chunk into the spool as it comes, never waiting for a reader; exactly
        `size` bytes, or ArchiveFailure (stage download). Readers learn the end either way."""
        try:
            self._pour(chunks)
        except BaseException:
            self._end(failed=True)
            raise
        self._end(failed=False)

    def _pour(self, chunks: Iterable[bytes]) -> None:
        for chunk in chunks:
            if self._landed + len(chunk) > self.size:
                raise _length_failure(f"the source sent more than its {self.size} bytes")
            # Outside the lock (hashlib lets go of the GIL), on the download's side: it has
            # time to spare, where the upload, bound to the host's speed, has none.
            self.reader.absorb(self._landed, chunk)
            with self._changed:
                write_at(self.spool, self._landed, chunk)
                self._landed += len(chunk)
                self._changed.notify_all()
                if self._beside_wants is not None and self._landed >= self._beside_wants:
                    self._beside.notify_all()
                self._hand_over()
        if self._landed != self.size:
            raise _length_failure(f"body was {self._landed} bytes, announced {self.size}")

    def _end(self, *, failed: bool) -> None:
        with self._changed:
            self._ended, self._failed = True, failed
            self._changed.notify_all()
            self._beside.notify_all()

    def wait_started(self, timeout: float) -> None:
        """Until the upload's thread asks for the image's first bytes (its request's head
        is sent), `timeout` at most."""
        with self._changed:
            self._changed.wait_for(lambda: self._waiting_at == 0, timeout)

    def _hand_over(self) -> None:
        """Called with the lock, having landed bytes: when they are what the upload's
        thread waits for, wait (briefly) for it to take them. Both CPUs busy with the
        download and the provider, a woken thread would wait a scheduler slice or more
        for one, and the host with it; waiting here gives it this one."""
        at = self._waiting_at
        if at is not None and self._enough(at):
            self._changed.wait_for(lambda: self._waiting_at != at, HAND_OVER_WAIT_SECONDS)

    def _enough(self, at: int) -> bool:
        """Bytes landed from `at` on, or the end."""
        return self._ended or self._landed > at

    def _next(self, at: int) -> bytes:
        """The bytes landed from `at` on (a chunk at most), once there are any; b"" once
        the download has ended whole there; BodyLengthError once it failed there."""
        with self._changed:
            if not self._enough(at):
                self._waiting_at = at
                self._changed.notify_all()  # wait_started, for the first bytes
                self._changed.wait_for(lambda: self._enough(at))
                self._waiting_at = None
                self._changed.notify_all()  # _hand_over
            if self._landed > at:
                self.spool.seek(at)
                return self.spool.read(min(READ_CHUNK_BYTES, self._landed - at))
            if self._failed:
                raise BodyLengthError(f"the download broke off after {at} of {self.size} bytes")
            return b""

    def read_at(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset` (fewer only at the end) once they have landed, for the
        one reader beside the upload (the original's write): b"" at the end,
        BodyLengthError once the download failed short of `offset`. The download never
        waits for this reader."""
        wants = offset + max(1, min(size, self.size - offset))
        with self._changed:
            self._beside_wants = wants
            self._beside.wait_for(lambda: self._ended or self._landed >= wants)
            self._beside_wants = None
            if self._landed > offset:
                return self.reader.read_at(offset, min(size, self._landed - offset))
            if self._failed:
                raise BodyLengthError(f"the download broke off after {offset} of {self.size} bytes")
            return b""

    def chunks(self) -> Iterator[bytes]:
        """The bytes from the start as they land (a resend reads them again from the
        start); raises BodyLengthError, before the last byte, when the download fails."""
        at = 0
        while chunk := self._next(at):
            at += len(chunk)
            yield chunk
        self.read_whole = at == self.size


@dataclass
class RelayedImage(HeldImage):
    """The whole image in hand, and the upload that read it as it landed (`sending`: its
    answer, once it has one). Every use of the spool waits for that upload to end first:
    it reads the spool, and its reads take the sha1."""

    sending: Future[Sent] = field(default_factory=Future)

    @property
    def sha1(self) -> str:
        _settled(self.sending)
        return super().sha1

    def chunks(self) -> Iterator[bytes]:
        _settled(self.sending)
        return super().chunks()

    def dimensions(self) -> tuple[int, int] | None:
        _settled(self.sending)
        return super().dimensions()

    def close(self) -> None:
        _settled(self.sending)
        super().close()


def relay(
    chunks: Iterable[bytes],
    *,
    size: int,
    image_type: ImageType,
    send: Send,
    beside: Beside | None = None,
) -> RelayedImage:
    """`send(relay)` started on a thread of its own (and `beside(relay)`, another reader),
    then `chunks` (the download) poured into the spool on this one. Returns once the
    download has ended whole; raises its ArchiveFailure (stage download) once the upload,
    cut short by it, and the other reader have ended too."""
    spool = Relay(size=size, image_type=image_type)
    sending = _UPLOADS.submit(send, spool)
    readers = [] if beside is None else [beside(spool)]
    for reader in readers:
        # A failed upload drops it at once, while the download may still be landing.
        sending.add_done_callback(functools.partial(_dropped, reader=reader))
    # This thread's CPU, until the upload's request is under way: with the download and
    # the provider keeping both CPUs busy, its thread would wait a scheduler slice or more
    # for one, and Lsky's work with it.
    spool.wait_started(UPLOAD_START_WAIT_SECONDS)
    try:
        spool.pour(chunks)
    except BaseException:
        _settled(sending)  # the upload ends before its last byte: nothing is stored
        for reader in readers:
            reader.stop()  # so does the other reader's
        release_spool(spool.spool)
        raise
    stops = [reader.stop for reader in readers]
    return RelayedImage(
        file=spool.reader, size=size, image_type=image_type, sending=sending, readers=stops
    )


def _dropped(done: Future[Sent], reader: Reader) -> None:
    if done.exception() is not None or isinstance(done.result(), Failure):
        reader.drop()


# The threads relayed uploads run on, kept for the container's next image.
_UPLOADS = KeptThreads(UPLOAD_THREADS, "upload")


def _settled(sending: Future[Sent]) -> None:
    """Wait for the upload to end, whatever it came to (its own deadline ends it)."""
    sending.exception()


def _length_failure(message: str) -> ArchiveFailure:
    return fail(Stage.DOWNLOAD, Kind.CONNECTION, message)
