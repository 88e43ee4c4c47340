"""Which image a byte stream contains, by its first bytes (never by a header's say-so)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

SNIFF_BYTES = 32  # enough for every signature below
READ_CHUNK_BYTES = 256 * 1024  # an image's bytes are read (and sent) this much at a time


class ImageType(NamedTuple):
    mime_type: str
    extension: str


PNG = ImageType("image/png", "png")
JPEG = ImageType("image/jpeg", "jpg")
GIF = ImageType("image/gif", "gif")
WEBP = ImageType("image/webp", "webp")
AVIF = ImageType("image/avif", "avif")
IMAGE_TYPES = (PNG, JPEG, GIF, WEBP, AVIF)
_BY_EXTENSION = {image_type.extension: image_type for image_type in IMAGE_TYPES}


def by_extension(key: str) -> ImageType | None:
    """The image type a key of ours was written with (its extension); None if none."""
    _, dot, extension = key.rpartition(".")
    return _BY_EXTENSION.get(extension) if dot else None


def sniff(head: bytes) -> ImageType | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return GIF
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return WEBP
    # ISO-BMFF: a box size, then 'ftyp' and the major brand.
    if head[4:8] == b"ftyp" and head[8:12] in (b"avif", b"avis"):
        return AVIF
    return None


class ReadableFile(Protocol):
    """What the image's file is read through: a spool, or a reader over one."""

    def read(self, size: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def close(self) -> None: ...


@dataclass
class DownloadedImage:
    """A whole image in a (spooled) temporary file."""

    file: ReadableFile
    size: int
    image_type: ImageType

    def chunks(self) -> Iterator[bytes]:
        """The bytes from the start, a chunk at a time (may be read any number of times)."""
        self.file.seek(0)
        while chunk := self.file.read(READ_CHUNK_BYTES):
            yield chunk

    def close(self) -> None:
        self.file.close()
