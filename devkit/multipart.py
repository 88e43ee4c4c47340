"""A small streaming multipart/form-data parser (the cgi module is deprecated).

File parts are written to a sink as they arrive, so a 50 MB upload is never
held in memory; plain fields are kept as text (bounded). Request bodies come
in as an iterator of byte chunks, see `read_body`.
"""

from __future__ import annotations

import email.message
import email.parser
import email.utils
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

__all__ = [
    "BodyCut",
    "FilePart",
    "Form",
    "MultipartError",
    "boundary_from",
    "parse",
    "read_body",
]

MAX_FIELD_BYTES = 64 * 1024
MAX_HEADER_BYTES = 16 * 1024
READ_SIZE = 64 * 1024


class Readable(Protocol):
    """What a request's rfile offers (BufferedReader, BytesIO...)."""

    def read(self, size: int, /) -> bytes: ...

    def readline(self, size: int, /) -> bytes: ...


class MultipartError(ValueError):
    """The body is not well-formed multipart/form-data."""


class BodyCut(MultipartError):
    """The request body ended before its Content-Length (or its last chunk): the client
    gave up mid-request. Not a body at all: a server in front of the app never hands it on."""


@dataclass
class FilePart:
    name: str
    filename: str
    content_type: str | None
    size: int = 0
    md5: str = ""
    sha1: str = ""
    sha256: str = ""
    head: bytes = b""  # the first bytes, for sniffing the type


@dataclass
class Form:
    fields: dict[str, str] = field(default_factory=dict)
    files: list[FilePart] = field(default_factory=list)

    def file(self, name: str) -> FilePart | None:
        return next((f for f in self.files if f.name == name), None)


def boundary_from(content_type: str | None) -> bytes:
    """The boundary parameter of a multipart/form-data Content-Type."""
    if not content_type:
        raise MultipartError("no Content-Type")
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_type() != "multipart/form-data":
        raise MultipartError(f"not multipart/form-data: {message.get_content_type()}")
    boundary = message.get_param("boundary")
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 70:
        raise MultipartError("missing or invalid boundary")
    return boundary.encode("latin-1")


def read_body(
    rfile: Readable, headers: dict[str, str], *, read_size: int = READ_SIZE
) -> Iterator[bytes]:
    """Yield a request body per Content-Length or chunked Transfer-Encoding.

    `headers` has lower-case names. Raises BodyCut on a short body.
    """
    if "chunked" in headers.get("transfer-encoding", "").lower():
        yield from _read_chunked(rfile, read_size)
        return
    try:
        remaining = int(headers["content-length"])
    except (KeyError, ValueError):
        raise MultipartError("neither Content-Length nor chunked encoding") from None
    while remaining > 0:
        piece = rfile.read(min(read_size, remaining))
        if not piece:
            raise BodyCut(f"body ended {remaining} bytes early")
        remaining -= len(piece)
        yield piece


def _read_chunked(rfile: Readable, read_size: int) -> Iterator[bytes]:
    while True:
        line = rfile.readline(1024)
        if not line:
            raise BodyCut("chunked body ended before its last chunk")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise MultipartError(f"bad chunk size line {line[:40]!r}") from None
        if size == 0:
            while rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return
        while size > 0:
            piece = rfile.read(min(read_size, size))
            if not piece:
                raise BodyCut("chunked body ended early")
            size -= len(piece)
            yield piece
        rfile.readline(1024)  # CRLF after the chunk data


def parse(
    chunks: Iterator[bytes],
    boundary: bytes,
    open_sink: Callable[[FilePart], BinaryIO | None],
) -> Form:
    """Parse the whole body. `open_sink(part)` gives a file for a file part's
    bytes (or None to discard them); the caller closes it.

    The iterator is consumed to the end, epilogue included, so the connection
    stays usable for keep-alive.
    """
    reader = _Buffer(chunks)
    form = Form()
    # Treat the body as if preceded by CRLF, so every delimiter is CRLF--boundary.
    delimiter = b"\r\n--" + boundary
    reader.buf[:0] = b"\r\n"
    reader.skip_past(delimiter, what="opening boundary")
    while True:
        reader.need(2)
        if reader.buf[:2] == b"--":
            reader.drain()
            return form
        line_end = reader.find(b"\r\n", limit=1024, what="boundary line")
        if bytes(reader.buf[:line_end]).strip(b" \t"):
            raise MultipartError("garbage after a boundary")
        del reader.buf[: line_end + 2]
        headers = _part_headers(reader)
        disposition = headers.get_param("name", header="content-disposition")
        if disposition is None:
            raise MultipartError("part without Content-Disposition name")
        name = email.utils.collapse_rfc2231_value(disposition)
        filename = headers.get_filename()
        if filename is None:
            value = b"".join(reader.until(delimiter, limit=MAX_FIELD_BYTES))
            form.fields[name] = value.decode("utf-8", errors="replace")
            continue
        part = FilePart(name=name, filename=filename, content_type=headers.get("content-type"))
        _receive_file(reader, delimiter, part, open_sink(part))
        form.files.append(part)


def _part_headers(reader: _Buffer) -> email.message.Message:
    if reader.need(2) and reader.buf[:2] == b"\r\n":
        del reader.buf[:2]  # a part with no headers at all
        return email.message.Message()
    end = reader.find(b"\r\n\r\n", limit=MAX_HEADER_BYTES, what="part headers")
    # Browsers and urllib3 send raw UTF-8 filenames (HTML5 style).
    text = bytes(reader.buf[:end]).decode("utf-8", errors="replace")
    del reader.buf[: end + 4]
    return email.parser.HeaderParser().parsestr(text + "\r\n\r\n")


def _receive_file(reader: _Buffer, delimiter: bytes, part: FilePart, sink: BinaryIO | None) -> None:
    md5, sha1, sha256 = hashlib.md5(), hashlib.sha1(), hashlib.sha256()  # noqa: S324 (Lsky reports md5/sha1)
    head = bytearray()
    for piece in reader.until(delimiter):
        md5.update(piece)
        sha1.update(piece)
        sha256.update(piece)
        part.size += len(piece)
        if len(head) < 64:
            head += piece[: 64 - len(head)]
        if sink is not None:
            sink.write(piece)
    part.md5, part.sha1, part.sha256 = md5.hexdigest(), sha1.hexdigest(), sha256.hexdigest()
    part.head = bytes(head)


class _Buffer:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self.buf = bytearray()

    def _fill(self) -> bool:
        for piece in self._chunks:
            if piece:
                self.buf += piece
                return True
        return False

    def need(self, n: int) -> bool:
        while len(self.buf) < n:
            if not self._fill():
                raise MultipartError("body ended inside the multipart structure")
        return True

    def find(self, needle: bytes, *, limit: int, what: str) -> int:
        start = 0
        while (index := self.buf.find(needle, start)) < 0:
            if len(self.buf) > limit:
                raise MultipartError(f"{what} too long")
            start = max(0, len(self.buf) - len(needle) + 1)
            if not self._fill():
                raise MultipartError(f"body ended inside the {what}")
        return index

    def skip_past(self, needle: bytes, *, what: str) -> None:
        for _ in self.until(needle, what=what):
            pass  # the preamble is ignored

    def until(
        self, needle: bytes, *, limit: int | None = None, what: str = "part"
    ) -> Iterator[bytes]:
        """Yield bytes up to `needle`, then consume the needle itself."""
        seen = 0
        keep = len(needle) - 1  # a needle may straddle two reads
        while True:
            index = self.buf.find(needle)
            if index >= 0:
                piece = bytes(self.buf[:index])
                del self.buf[: index + len(needle)]
                if piece:
                    yield piece
                return
            if len(self.buf) > keep:
                piece = bytes(self.buf[: len(self.buf) - keep])
                del self.buf[: len(piece)]
                seen += len(piece)
                if limit is not None and seen > limit:
                    raise MultipartError(f"{what} larger than {limit} bytes")
                yield piece
            if not self._fill():
                raise MultipartError(f"body ended inside the {what}")

    def drain(self) -> None:
        self.buf.clear()
        for _ in self._chunks:
            pass
