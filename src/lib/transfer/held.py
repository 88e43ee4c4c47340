"""The image's bytes in hand: the first download (or a staged copy read back), spooled
once (memory up to SPOOL_IN_MEMORY_BYTES, then /tmp) with their length, and read by
every later step: never the source again (docs/transfer.md). Their SHA-1 is taken as the
upload reads them (Sha1Reader), where it overlaps with the host's own work."""

from __future__ import annotations

import hashlib
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
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

    def read(self, size: int = -1, /) -> bytes:
        at = self._spool.tell()
        data = self._spool.read(size)
        self.absorb(at, data)
        return data

    def absorb(self, at: int, data: bytes) -> None:
        """`data`, read from offset `at`, passes the digest where it is next in order."""
        end = at + len(data)
        if self._sha1 is None and at <= self._hashed < end:
            self._digests.update(memoryview(data)[self._hashed - at :])
            self._hashed = end
            if end >= self._size:
                self._sha1 = self._digests.sha1.hexdigest()

    def seek(self, offset: int, whence: int = 0, /) -> int:
        return self._spool.seek(offset, whence)

    def tell(self) -> int:
        return self._spool.tell()

    def close(self) -> None:
        self._spool.close()

    def sha1(self) -> str:
        if self._sha1 is None:
            at = self._spool.tell()
            self._spool.seek(self._hashed)
            while self._sha1 is None and self.read(READ_CHUNK_BYTES):
                pass
            self._spool.seek(at)
            if self._sha1 is None:  # shorter than announced: what there is
                self._sha1 = self._digests.sha1.hexdigest()
        return self._sha1


@dataclass
class HeldImage(DownloadedImage):
    """A whole image in a spool file (see DownloadedImage) read through a Sha1Reader, and
    sha256 for a staged copy read back ("" otherwise: the happy path does not pay for it).
    `sha1` is compared with Lsky's answer."""

    file: Sha1Reader
    sha256: str = ""

    @property
    def sha1(self) -> str:
        return self.file.sha1()

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
    """An empty spool: in memory up to SPOOL_IN_MEMORY_BYTES, then a file in /tmp; a file
    from the start when `size` (announced) says it will not fit in memory (no copy of the
    first MiB when it rolls over)."""
    if size is not None and size > SPOOL_IN_MEMORY_BYTES:
        return tempfile.TemporaryFile()
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)


def hold(chunks: Iterable[bytes], image_type: ImageType, *, sha256: bool = False) -> HeldImage:
    """Spool `chunks` (the whole body: the caller's iterator enforces size and deadline),
    taking their sha256 on the way when asked. The spool is closed if the chunks fail."""
    file = new_spool()
    digests = Digests(sha1=False, sha256=sha256)
    try:
        for chunk in chunks:
            digests.update(chunk)
            file.write(chunk)
    except BaseException:
        file.close()
        raise
    file.seek(0)
    return HeldImage(
        file=Sha1Reader(file, digests.size),
        size=digests.size,
        image_type=image_type,
        sha256=digests.sha256.hexdigest() if digests.sha256 is not None else "",
    )


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
