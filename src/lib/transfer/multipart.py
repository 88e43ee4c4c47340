"""multipart/form-data bodies generated while they are sent, with an exact Content-Length.

The image is never in memory whole; a body whose chunks cannot match the promised
length raises BodyLengthError before the request completes (docs/explanation/transfers.md).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping


class BodyLengthError(ValueError):
    """The file part's bytes did not add up to the length announced in Content-Length.

    Not an OSError on purpose: urllib3 would read that as a network failure (and wrap
    it); this must reach the caller as what it is.
    """


def _quote(value: str) -> str:
    # RFC 7578: quotes and line breaks in a filename are escaped, never passed through.
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


class MultipartBody:
    """The fields and one file part around `content()` (the file's bytes from the start,
    each call anew: a resend starts over), `file_size` bytes announced up front."""

    def __init__(
        self,
        *,
        fields: Mapping[str, str],
        file_field: str,
        filename: str,
        file_content_type: str,
        content: Callable[[], Iterable[bytes]],
        file_size: int,
    ) -> None:
        if file_size < 0:
            raise ValueError("file_size must not be negative")
        self.boundary = f"----image-archive-{secrets.token_hex(16)}"
        self.file_size = file_size
        self._content = content
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

    def __iter__(self) -> Iterator[bytes]:
        """The whole body, checking the file's length as it streams: the closing boundary
        (the last bytes) goes only after exactly `file_size` bytes and the content's end."""
        yield self._head
        sent = 0
        for chunk in self._content():
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
