"""The image's bytes in hand: the first download (or a staged copy read back), spooled once
(memory up to SPOOL_IN_MEMORY_BYTES, then /tmp) with their length, and read by every
later step: never the source again (docs/explanation/transfers.md). Their SHA-1 is taken
as the upload reads them (Sha1Reader), where it overlaps with the host's own work."""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO

from lib.transfer.imagetype import (
    GIF,
    JPEG,
    PNG,
    READ_CHUNK_BYTES,
    WEBP,
    DownloadedImage,
    ImageType,
    ReadableFile,
)

SPOOL_IN_MEMORY_BYTES = 1024 * 1024


class Sha1Reader:
    """The spool, read through: bytes read in order from the start pass SHA-1 once, so the
    read that uploads the image also takes its digest (no pass of its own on the happy
    path); `sha1()` reads what no one has read yet. A reader of the same spool that reads
    it another way (a relayed upload, lib.transfer.relay) hands its bytes to `absorb`."""

    def __init__(self, spool: IO[bytes], size: int) -> None:
        self._spool = spool
        self._size = size
        self._digests = Digests()
        self._hashed = 0  # bytes [0, _hashed) have passed the digest
        self._sha1: str | None = None
        self._released = False

    def read(self, size: int = -1, /) -> bytes:
        """At most `size` bytes, never past the image's end (a kept spool file may contain
        an earlier image's bytes beyond it)."""
        at = self.tell()
        left = max(0, self._size - at)
        data = self._spool.read(left if size < 0 else min(size, left)) if left else b""
        self.absorb(at, data)
        return data

    def read_at(self, offset: int, size: int) -> bytes:
        """At most `size` bytes at `offset`, within the image, leaving the position (and
        the digest) alone: for a reader beside the upload, on a thread of its own."""
        self._check_open()
        return read_at(self._spool, offset, max(0, min(size, self._size - offset)))

    def absorb(self, at: int, data: bytes) -> None:
        """`data`, read from offset `at`, passes the digest where it is next in order."""
        end = at + len(data)
        if self._sha1 is None and at <= self._hashed < end:
            self._digests.update(memoryview(data)[self._hashed - at :])
            self._hashed = end
            if end >= self._size:
                self._sha1 = self._digests.sha1.hexdigest()

    def seek(self, offset: int, whence: int = 0, /) -> int:
        self._check_open()
        return self._spool.seek(offset, whence)

    def tell(self) -> int:
        self._check_open()
        return self._spool.tell()

    def close(self) -> None:
        """Ends this image's use of the spool (once): a kept file goes to the next image."""
        if not self._released:
            self._released = True
            release_spool(self._spool)

    def _check_open(self) -> None:
        if self._released:  # the file may contain another image's bytes by now
            raise ValueError("the image's spool was released")

    def sha1(self) -> str:
        if self._sha1 is None:
            at = self.tell()
            self.seek(self._hashed)
            while self._sha1 is None and self.read(READ_CHUNK_BYTES):
                pass
            self.seek(at)
            if self._sha1 is None:  # shorter than announced: what there is
                self._sha1 = self._digests.sha1.hexdigest()
        return self._sha1


@dataclass
class HeldImage(DownloadedImage):
    """A whole image in a spool file (see DownloadedImage) read through a Sha1Reader, and
    sha256 and etag for a staged copy read back ("" otherwise: the happy path does not pay
    for them). `sha1` is compared with Lsky's answer. `readers`: whoever reads the spool
    beside the upload (lib.archive.originals) stops, each in turn, before it is released."""

    file: Sha1Reader
    sha256: str = ""
    etag: str = ""  # the staged object's, read back: a server-side copy of those very bytes
    readers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def sha1(self) -> str:
        return self.file.sha1()

    def read_at(self, offset: int, size: int) -> bytes:
        return self.file.read_at(offset, size)

    def close(self) -> None:
        while self.readers:
            self.readers.pop()()
        super().close()

    def dimensions(self) -> tuple[int, int] | None:
        """(width, height) from the header, as PHP's getimagesize() (Lsky's width and
        height) reads them; None for a type or header it cannot read."""
        self.file.seek(0)
        head = self.file.read(64)
        try:
            return _dimensions(self.image_type, head, self.file)
        except (struct.error, ValueError, IndexError, OSError):
            return None


class Digests:
    """sha1 (compared with Lsky's answer: Lsky reports md5 and sha1 of what it stored, and
    either one gives the verdict; sha1 is the cheaper here) and, when asked, sha256 (a
    staged copy's check) of the chunks as they pass: nothing kept but the state."""

    def __init__(self, *, sha1: bool = True, sha256: bool = False) -> None:
        self.sha1 = hashlib.sha1(usedforsecurity=False)
        self.sha256 = hashlib.sha256() if sha256 else None
        self.take_sha1 = sha1
        self.size = 0

    def update(self, chunk: bytes | memoryview) -> None:
        if self.take_sha1:
            self.sha1.update(chunk)
        if self.sha256 is not None:
            self.sha256.update(chunk)
        self.size += len(chunk)


def new_spool(size: int | None = None) -> IO[bytes]:
    """An empty spool for an image of `size` bytes (announced): in memory up to
    SPOOL_IN_MEMORY_BYTES, else the container's kept file (_KeptFiles: it may contain an
    earlier image's bytes past what is written now, so it is written at offsets and read
    within the image's length only). `release_spool` ends its use."""
    if size is not None and size > SPOOL_IN_MEMORY_BYTES:
        return _KEPT.take()
    return io.BytesIO()


def release_spool(spool: IO[bytes]) -> None:
    """The spool's use is over: kept for the container's next image, or closed."""
    _KEPT.give_back(spool)


def read_at(spool: IO[bytes], offset: int, size: int) -> bytes:
    """At most `size` bytes at `offset`, the spool's position left alone (another thread
    reads it through that): a pread of the kept file, a slice of the memory."""
    if isinstance(spool, io.BytesIO):
        with spool.getbuffer() as view:
            return bytes(view[offset : offset + size])
    return os.pread(spool.fileno(), size, offset)


def write_at(spool: IO[bytes], offset: int, data: bytes | memoryview) -> None:
    """`data` into the spool at `offset`, whole (a raw file may write less at a time)."""
    spool.seek(offset)
    view = memoryview(data)
    while view:
        written = spool.write(view)
        if not written:
            raise OSError("the spool took no bytes")
        view = view[written:]


class _KeptFiles:
    """Spool files kept from one image to the container's next: writing over pages the
    page cache already has costs about a third of filling new ones, and nothing is
    freed (a 10 MB file's close) at the end of an attempt. Unbuffered, so no read-ahead
    of an earlier image survives in a buffer; forgotten by a forked child, which would
    otherwise share them with its parent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[IO[bytes]] = []
        self._ours: weakref.WeakSet[IO[bytes]] = weakref.WeakSet()  # handed out, ours to keep
        os.register_at_fork(after_in_child=self._forget)

    def take(self) -> IO[bytes]:
        with self._lock:
            while self._idle:
                kept = self._idle.pop()
                if not kept.closed:
                    return kept
        file = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 - lives past this call
        with self._lock:
            self._ours.add(file)
        return file

    def give_back(self, file: IO[bytes]) -> None:
        with self._lock:
            if any(kept is file for kept in self._idle):
                return  # given back already
            if file in self._ours and not file.closed and len(self._idle) < KEPT_SPOOL_FILES:
                self._idle.append(file)
                return
            self._ours.discard(file)
        file.close()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        for file in self._idle:
            file.close()
        self._idle, self._ours = [], weakref.WeakSet()


# One attempt at a time has one large spool (a container takes one message at a time).
KEPT_SPOOL_FILES = 1
_KEPT = _KeptFiles()


def hold(chunks: Iterable[bytes], image_type: ImageType, *, sha256: bool = False) -> HeldImage:
    """Spool `chunks` (the whole body: the caller's iterator enforces size and deadline),
    taking their sha256 on the way when asked: in memory while it is at most
    SPOOL_IN_MEMORY_BYTES, in the container's kept file from the first byte past that.
    The spool is released if the chunks fail."""
    spool = new_spool()
    digests = Digests(sha1=False, sha256=sha256)
    try:
        for chunk in chunks:
            if digests.size + len(chunk) > SPOOL_IN_MEMORY_BYTES and isinstance(spool, io.BytesIO):
                spool = _rolled_over(spool)
            write_at(spool, digests.size, chunk)
            digests.update(chunk)
    except BaseException:
        release_spool(spool)
        raise
    spool.seek(0)
    return HeldImage(
        file=Sha1Reader(spool, digests.size),
        size=digests.size,
        image_type=image_type,
        sha256=digests.sha256.hexdigest() if digests.sha256 is not None else "",
    )


def _rolled_over(memory: io.BytesIO) -> IO[bytes]:
    """The kept file, with what `memory` had."""
    spool = new_spool(SPOOL_IN_MEMORY_BYTES + 1)
    with memory.getbuffer() as held_so_far:
        write_at(spool, 0, held_so_far)
    memory.close()
    return spool


def _dimensions(kind: ImageType, head: bytes, handle: ReadableFile) -> tuple[int, int] | None:
    if kind == PNG and head[12:16] == b"IHDR":
        width, height = struct.unpack(">II", head[16:24])
        return int(width), int(height)
    if kind == GIF:
        width, height = struct.unpack("<HH", head[6:10])
        return int(width), int(height)
    if kind == JPEG:
        return _jpeg_size(handle)
    if kind == WEBP:
        return _webp_size(head)
    return None


# Start-of-frame markers (not DHT C4, JPG C8, DAC CC).
_SOF_MARKERS = frozenset(set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC})
_MAX_JPEG_SEGMENTS = 1000


def _jpeg_size(handle: ReadableFile) -> tuple[int, int] | None:
    handle.seek(2)
    for _ in range(_MAX_JPEG_SEGMENTS):
        marker = handle.read(2)
        if len(marker) < 2 or marker[0] != 0xFF:
            return None
        if marker[1] in (0xD8, 0x01) or 0xD0 <= marker[1] <= 0xD7:
            continue
        (length,) = struct.unpack(">H", handle.read(2))
        if marker[1] in _SOF_MARKERS:
            height, width = struct.unpack(">xHH", handle.read(5))
            return int(width), int(height)
        handle.seek(length - 2, 1)
    return None


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", head[26:30])
        return int(width) & 0x3FFF, int(height) & 0x3FFF
    if chunk == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None
