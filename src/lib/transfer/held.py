"""The image's bytes in hand: the first download (or a staged copy read back), spooled
once (memory up to SPOOL_IN_MEMORY_BYTES, then /tmp) with their length, SHA-1 and
dimensions, and read by every later step: never the source again (docs/transfer.md)."""

from __future__ import annotations

import hashlib
import struct
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, BinaryIO

from lib.transfer.imagetype import GIF, JPEG, PNG, WEBP, DownloadedImage, ImageType

SPOOL_IN_MEMORY_BYTES = 1024 * 1024
READ_CHUNK_BYTES = 256 * 1024


@dataclass
class HeldImage(DownloadedImage):
    """A whole image in a spool file (see DownloadedImage), with what was taken of it on
    the way in: sha1 (compared with Lsky's answer), and sha256 for a staged copy read
    back ("" otherwise: the happy path does not pay for it)."""

    sha1: str = ""
    sha256: str = ""

    def chunks(self) -> Iterator[bytes]:
        """The bytes from the start, a chunk at a time (may be read any number of times)."""
        self.file.seek(0)
        while chunk := self.file.read(READ_CHUNK_BYTES):
            yield chunk

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
    staged copy's check) of the chunks as they pass: one pass, nothing kept but state."""

    def __init__(self, *, sha256: bool = False) -> None:
        self.sha1 = hashlib.sha1(usedforsecurity=False)
        self.sha256 = hashlib.sha256() if sha256 else None
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self.sha1.update(chunk)
        if self.sha256 is not None:
            self.sha256.update(chunk)
        self.size += len(chunk)


def hold(chunks: Iterable[bytes], image_type: ImageType, *, sha256: bool = False) -> HeldImage:
    """Spool `chunks` (the whole body: the caller's iterator enforces size and deadline),
    hashing them on the way (`sha256`: also that). The spool is closed if the chunks fail."""
    file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115
    digests = Digests(sha256=sha256)
    try:
        for chunk in chunks:
            digests.update(chunk)
            file.write(chunk)
    except BaseException:
        file.close()
        raise
    file.seek(0)
    return HeldImage(
        file=file,
        size=digests.size,
        image_type=image_type,
        sha1=digests.sha1.hexdigest(),
        sha256=digests.sha256.hexdigest() if digests.sha256 is not None else "",
    )


def _dimensions(kind: ImageType, head: bytes, handle: IO[bytes]) -> tuple[int, int] | None:
    if kind == PNG and head[12:16] == b"IHDR":
        width, height = struct.unpack(">II", head[16:24])
        return int(width), int(height)
    if kind == GIF:
        width, height = struct.unpack("<HH", head[6:10])
        return int(width), int(height)
    if kind == JPEG:
        return _jpeg_size(handle)  # type: ignore[arg-type]
    if kind == WEBP:
        return _webp_size(head)
    return None


# Start-of-frame markers (not DHT C4, JPG C8, DAC CC).
_SOF_MARKERS = frozenset(set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC})
_MAX_JPEG_SEGMENTS = 1000


def _jpeg_size(handle: BinaryIO) -> tuple[int, int] | None:
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
