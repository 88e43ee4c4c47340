"""multipart/form-data bodies generated while they are sent, with an exact Content-Length.

The image is never held whole in memory; a body whose chunks cannot match the promised
length raises BodyLengthError before the request completes (docs/transfer.md).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping

from lib.transfer.imagetype import ReadableFile

CHUNK_BYTES = 256 * 1024


class BodyLengthError(ValueError):
    """The file part's bytes did not add up to the length announced in Content-Length.

    Not an OSError on purpose: urllib3 would read that as a network failure (and wrap
    it); this must reach the caller as what it is.
    """


def _quote(value: str) -> str:
    # RFC 7578: quotes and line breaks in a filename are escaped, never passed through.
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


class _Framing:
    """Boundary, the bytes before and after the file's content, and the exact total."""

    def __init__(
        self,
        *,
        fields: Mapping[str, str],
        file_field: str,
        filename: str,
        file_content_type: str,
        file_size: int,
    ) -> None:
        if file_size < 0:
            raise ValueError("file_size must not be negative")
        self.boundary = f"----image-archive-{secrets.token_hex(16)}"
        self.file_size = file_size
        parts = [
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{_quote(name)}"'
            f"\r\n\r\n{value}\r\n"
            for name, value in fields.items()
        ]
        parts.append(
            f"--{self.boundary}\r\nContent-Disposition: form-data; "
            f'name="{_quote(file_field)}"; filename="{_quote(filename)}"\r\n'
            f"Content-Type: {file_content_type}\r\n\r\n"
        )
        self._head = "".join(parts).encode()
        self._tail = f"\r\n--{self.boundary}--\r\n".encode()

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    @property
    def content_length(self) -> int:
        return len(self._head) + self.file_size + len(self._tail)

    def frame(self, content: Iterable[bytes]) -> Iterator[bytes]:
        """The whole body around `content`, checking its length as it streams."""
        yield self._head
        sent = 0
        for chunk in content:
            sent += len(chunk)
            if sent > self.file_size:
                raise BodyLengthError(f"file is longer than the announced {self.file_size} bytes")
            if chunk:
                yield chunk
        if sent != self.file_size:
            raise BodyLengthError(
                f"file ended after {sent} of the announced {self.file_size} bytes"
            )
        yield self._tail


class MultipartBody(_Framing):
    """The file part read from a seekable file of known size; iterable more than once."""

    def __init__(
        self,
        *,
        fields: Mapping[str, str],
        file_field: str,
        filename: str,
        file_content_type: str,
        file: ReadableFile,
        file_size: int,
    ) -> None:
        super().__init__(
            fields=fields,
            file_field=file_field,
            filename=filename,
            file_content_type=file_content_type,
            file_size=file_size,
        )
        self._file = file

    def _read(self) -> Iterator[bytes]:
        remaining = self.file_size
        while remaining > 0:
            chunk = self._file.read(min(CHUNK_BYTES, remaining))
            if not chunk:
                return  # frame() reports the shortfall
            remaining -= len(chunk)
            yield chunk

    def __iter__(self) -> Iterator[bytes]:
        # Restartable: a retried request (e.g. after a token refresh) resends from the start.
        self._file.seek(0)
        return self.frame(self._read())
