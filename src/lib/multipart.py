"""A multipart/form-data body streamed from a file, with its exact Content-Length.

The image is never held whole in memory: the body is generated chunk by chunk
while urllib3 sends it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from typing import IO

CHUNK_BYTES = 256 * 1024


def _quote(value: str) -> str:
    # RFC 7578: quotes and line breaks in a filename are escaped, never passed through.
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


class MultipartBody:
    def __init__(
        self,
        *,
        fields: Mapping[str, str],
        file_field: str,
        filename: str,
        file_content_type: str,
        file: IO[bytes],
        file_size: int,
    ) -> None:
        self.boundary = f"----image-archive-{secrets.token_hex(16)}"
        self._file = file
        self._file_size = file_size
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
        return len(self._head) + self._file_size + len(self._tail)

    def __iter__(self) -> Iterator[bytes]:
        # Restartable: a retried request (e.g. after a token refresh) resends from the start.
        self._file.seek(0)
        yield self._head
        remaining = self._file_size
        while remaining > 0:
            chunk = self._file.read(min(CHUNK_BYTES, remaining))
            if not chunk:
                raise OSError("image file ended before its recorded size")
            remaining -= len(chunk)
            yield chunk
        yield self._tail
