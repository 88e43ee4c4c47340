"""Small, valid image files as bytes, and a magic-number sniffer.

PNG, JPEG and GIF are encoded here from their specs (tiny, fully decodable).
The WebP and AVIF constants were produced once on a dev machine with libwebp
(WebPEncodeLosslessRGBA) and libavif 0.11 + libaom (a 1x1 image) and checked
to decode with WebPDecodeRGBA / avifDecoderReadMemory.

`png(size=N)` makes a PNG of exactly N bytes, cheap even for 50 MB: the
picture stays tiny and the bulk is a private ancillary chunk (which decoders
must skip) filled with incompressible bytes. `png_stream` yields the same file
piece by piece so a server can send 50 MB without holding it in memory.
"""

from __future__ import annotations

import functools
import random
import struct
import zlib
from collections.abc import Callable, Iterator

__all__ = [
    "EXTENSIONS",
    "avif",
    "gif",
    "jpeg",
    "png",
    "png_stream",
    "sniff",
    "webp",
]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Chunk-name case bits: ancillary (p), private (a), reserved (D), safe-to-copy (d).
PAD_CHUNK = b"paDd"
_CHUNK_OVERHEAD = 12  # length + type + CRC

EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "image/avif": "avif",
    "image/heic": "heic",
    "image/bmp": "bmp",
    "image/tiff": "tif",
    "image/x-icon": "ico",
    "image/vnd.adobe.photoshop": "psd",
}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_parts(width: int, height: int) -> tuple[bytes, bytes]:
    """(signature + IHDR + IDAT, IEND) for an 8-bit RGB gradient."""
    if not (1 <= width <= 65535 and 1 <= height <= 65535):
        raise ValueError("width and height must be 1..65535")
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter type None
        for x in range(width):
            rows += bytes(((x * 255) // max(width - 1, 1), (y * 255) // max(height - 1, 1), 128))
    head = PNG_SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(bytes(rows), 9))
    return head, _chunk(b"IEND", b"")


@functools.lru_cache(maxsize=4)
def _noise(seed: int, length: int = 1 << 20) -> bytes:
    # One random MiB, repeated. Deflate's window is 32 KiB, so a repeat of a
    # 1 MiB block is still incompressible to gzip/deflate transports.
    return random.Random(seed).randbytes(length)  # noqa: S311 (test data, not secrets)


def png_stream(
    width: int = 4,
    height: int = 4,
    *,
    size: int | None = None,
    seed: int = 0,
    chunk_size: int = 1 << 20,
) -> Iterator[bytes]:
    """Yield a PNG in pieces; with `size`, the whole file is exactly `size` bytes."""
    head, tail = _png_parts(width, height)
    yield head
    if size is not None:
        pad = size - len(head) - len(tail) - _CHUNK_OVERHEAD
        if pad < 0 and size != len(head) + len(tail):
            raise ValueError(
                f"a {width}x{height} PNG needs at least {len(head) + len(tail)} bytes "
                f"(or {len(head) + len(tail) + _CHUNK_OVERHEAD} with padding); got size={size}"
            )
        if pad >= 0:
            yield from _pad_chunk(pad, seed, chunk_size)
    yield tail


def _pad_chunk(length: int, seed: int, chunk_size: int) -> Iterator[bytes]:
    # Byte i of the padding is noise[i % len(noise)], whatever the chunk size.
    noise = _noise(seed)
    crc = zlib.crc32(PAD_CHUNK)
    yield struct.pack(">I", length) + PAD_CHUNK
    offset = 0
    while offset < length:
        start = offset % len(noise)
        piece = noise[start : start + min(chunk_size, length - offset)]
        crc = zlib.crc32(piece, crc)
        yield piece
        offset += len(piece)
    yield struct.pack(">I", crc)


def png(width: int = 4, height: int = 4, *, size: int | None = None, seed: int = 0) -> bytes:
    """A valid RGB PNG; with `size`, padded to exactly `size` bytes."""
    return b"".join(png_stream(width, height, size=size, seed=seed))


def _jpeg_segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload


@functools.cache
def jpeg() -> bytes:
    """A 1x1 mid-grey baseline JFIF (about 150 bytes).

    A flat 128-grey block is all zeros after the level shift, so its only
    Huffman symbols are DC category 0 and end-of-block: one 1-bit code each,
    and the whole scan is the bits 00 padded with 1s (0x3F).
    """
    jfif = b"JFIF\x00" + bytes([1, 1, 0]) + struct.pack(">HH", 1, 1) + b"\x00\x00"
    dqt = b"\x00" + bytes([1] * 64)  # table 0, 8-bit, all ones
    sof0 = struct.pack(">BHHB", 8, 1, 1, 1) + bytes([1, 0x11, 0])  # 1x1, one component
    one_code = bytes([1] + [0] * 15) + b"\x00"  # a single 1-bit code for symbol 0
    dht = b"\x00" + one_code + b"\x10" + one_code  # DC table 0, AC table 0
    sos = bytes([1, 1, 0x00, 0, 63, 0])
    return (
        b"\xff\xd8"
        + _jpeg_segment(0xE0, jfif)
        + _jpeg_segment(0xDB, dqt)
        + _jpeg_segment(0xC0, sof0)
        + _jpeg_segment(0xC4, dht)
        + _jpeg_segment(0xDA, sos)
        + b"\x3f"
        + b"\xff\xd9"
    )


def gif() -> bytes:
    """A 1x1 white GIF89a (35 bytes).

    LZW with a 2-bit minimum code size: CLEAR (4), index 0, EOI (5) in 3-bit
    codes, packed LSB first, is 0x44 0x01.
    """
    screen = struct.pack("<HHBBB", 1, 1, 0x80, 0, 0)  # global colour table of 2
    palette = b"\xff\xff\xff\x00\x00\x00"
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0)
    return b"GIF89a" + screen + palette + image + b"\x02\x02\x44\x01\x00" + b"\x3b"


_WEBP_1X1 = bytes.fromhex(
    "524946461c000000574542505650384c0f0000002f000000000710fd8ffe0722a2ff0100"
)

_AVIF_1X1 = bytes.fromhex(
    "00000020667479706176696600000000617669666d6966316d6961664d413142000000f26d657461"
    "000000000000002868646c720000000000000000706963740000000000000000000000006c696261"
    "766966000000000e7069746d0000000000010000001e696c6f6300000000440000010001000000010000"
    "011a000000100000002869696e660000000000010000001a696e6665020000000001000061763031436f"
    "6c6f72000000006a697072700000004b6970636f0000001469737065000000000000000100000001000000"
    "107069786900000000030808080000000c6176314381000c0000000013636f6c726e636c780002000200"
    "02800000001769706d61000000000000000100010401028304000000186d64617412000a0518000e4420"
    "32051000000480"
)


def webp() -> bytes:
    """A 1x1 red lossless WebP (VP8L, 36 bytes)."""
    return _WEBP_1X1


def avif() -> bytes:
    """A 1x1 AVIF still image (ftyp avif/mif1/miaf, AV1 payload; 298 bytes)."""
    return _AVIF_1X1


_AVIF_BRANDS = {b"avif", b"avis"}
_HEIC_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis"}


def sniff(data: bytes) -> str | None:
    """Mime type from the first bytes, or None for anything unrecognised."""
    if data[4:8] == b"ftyp":
        return _sniff_ftyp(data)
    for mime, matches in _MAGIC:
        if matches(data):
            return mime
    return None


_MAGIC: tuple[tuple[str, Callable[[bytes], bool]], ...] = (
    ("image/png", lambda d: d.startswith(PNG_SIGNATURE)),
    ("image/jpeg", lambda d: d.startswith(b"\xff\xd8\xff")),
    ("image/gif", lambda d: d[:6] in (b"GIF87a", b"GIF89a")),
    ("image/webp", lambda d: d[:4] == b"RIFF" and d[8:12] == b"WEBP"),
    ("image/tiff", lambda d: d[:4] in (b"II*\x00", b"MM\x00*")),
    ("image/vnd.adobe.photoshop", lambda d: d[:4] == b"8BPS"),
    # ICO: reserved 0, type 1, and a non-zero image count.
    ("image/x-icon", lambda d: d[:4] == b"\x00\x00\x01\x00" and d[4:6] not in (b"", b"\x00\x00")),
    # BMP: "BM", then file size, then four reserved zero bytes.
    ("image/bmp", lambda d: d[:2] == b"BM" and d[6:10] == b"\x00\x00\x00\x00"),
)


def _sniff_ftyp(data: bytes) -> str | None:
    box_size = int.from_bytes(data[:4], "big")
    major = data[8:12]
    compatible = {data[i : i + 4] for i in range(16, min(box_size, len(data)) - 3, 4)}
    if major in _AVIF_BRANDS:
        return "image/avif"
    if major in _HEIC_BRANDS:
        return "image/heic"
    if compatible & _AVIF_BRANDS:
        return "image/avif"
    if compatible & _HEIC_BRANDS:
        return "image/heic"
    return None
