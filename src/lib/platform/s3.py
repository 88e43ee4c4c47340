"""The staging bucket (put a stream, read it back, delete: lib.archive.staging), and what
the originals bucket (lib.platform.s3_originals) shares with it: errors, an object being
read. boto3 is imported on first use; memory stays bounded whatever the image size; every
call ends by its deadline (lib.platform.watchdog binds S3's sockets).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from lib.platform import aws
from lib.platform.errors import ServiceError
from lib.platform.watchdog import Watchdog, watched

# S3's smallest multipart part, and the only image bytes kept in memory while staging:
# one buffer, filled from the source, sent, then filled again.
PART_BYTES = 5 * 1024 * 1024
READ_CHUNK_BYTES = 256 * 1024
# A delete asked for without the attempt's deadline (after the record concluded) and the
# abort of a failed multipart upload get this long of their own.
CLEANUP_SECONDS = 5.0


class StagingError(ServiceError):
    """The staging bucket could not be written or read (S3 unreachable, access denied, a
    deadline passed). The message names the operation and the error type, no data."""


class StagedCopyMissing(StagingError):
    """The staged object is not there (expired by the lifecycle rule, or deleted)."""


class OriginalsError(StagingError):
    """The originals bucket could not be written or read. A StagingError too: S3's failures
    are handled alike (never the record's)."""


class OriginalMissing(OriginalsError):
    """The original's object (that version) is not there."""


class _S3(Protocol):
    """The few calls of boto3's S3 client used here (typed without the S3 stubs)."""

    def put_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def create_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...
    def upload_part(self, **kwargs: Any) -> dict[str, Any]: ...
    def complete_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...
    def abort_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...
    def get_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def delete_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def copy_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def head_object(self, **kwargs: Any) -> dict[str, Any]: ...


class PartReader:
    """Fills one reused part buffer from an iterator of chunks: the only image bytes kept
    in memory while staging (boto3's upload_fileobj kept two to three copies of a part)."""

    def __init__(self, chunks: Iterable[bytes], deadline: float) -> None:
        self._chunks = iter(chunks)
        self._pending = b""
        self._deadline = deadline
        self.size = 0

    def fill(self, buffer: bytearray) -> int:
        """Bytes written to the start of `buffer` (fewer than its length: the end)."""
        if time.monotonic() > self._deadline:
            raise StagingError("staging ran past the attempt's deadline")
        view, filled = memoryview(buffer), 0
        while filled < len(buffer):
            chunk = self._pending or next(self._chunks, None)
            if chunk is None:
                break
            take = min(len(chunk), len(buffer) - filled)
            view[filled : filled + take] = chunk[:take]
            self._pending = chunk[take:]
            filled += take
        self.size += filled
        return filled


@dataclass
class StagedObject:
    """An object being read (a staged copy, an original): iterate `chunks()` once; `size`
    is its length, `etag` and `version_id` S3's. The watchdog of the GET binds its body to
    the deadline; close() stops it. Errors are `error` (StagingError, OriginalsError)."""

    key: str
    size: int
    _body: Any
    _deadline: float
    _watchdog: Watchdog
    etag: str = ""
    version_id: str | None = None
    what: str = "staged copy"
    error: type[StagingError] = StagingError

    def chunks(self) -> Iterator[bytes]:
        while chunk := self._read():
            if time.monotonic() > self._deadline:
                raise self.error(f"reading the {self.what} ran past the deadline")
            yield chunk

    def _read(self) -> bytes:
        try:
            chunk = bytes(self._body.read(READ_CHUNK_BYTES))
        except Exception as error:  # noqa: BLE001 - botocore's errors (some subclass urllib3's)
            # Converted here, inside the iterator: raised into the spool that reads the copy
            # back, a botocore ReadTimeoutError would pass for a timeout of ours.
            if self._watchdog.fired:
                raise self.error(f"reading the {self.what} ran past the deadline") from None
            raise self.error(f"reading the {self.what} failed ({type(error).__name__})") from None
        if not chunk and self._watchdog.fired:  # the shutdown can look like the end
            raise self.error(f"reading the {self.what} ran past the deadline")
        return chunk

    def close(self) -> None:
        self._watchdog.cancel()
        self._body.close()


class StagingBucket:
    def __init__(
        self,
        name: str,
        *,
        connect_timeout: float = 2,
        read_timeout: float = 10,
        max_attempts: int = 3,
    ) -> None:
        self.name = name
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_attempts = max_attempts

    @cached_property
    def client(self) -> _S3:
        s3: _S3 = aws.s3_client(self._connect_timeout, self._read_timeout, self._max_attempts)
        return s3

    def put(self, key: str, chunks: Iterable[bytes], *, content_type: str, deadline: float) -> int:
        """Store the chunks under `key` as they come (multipart above one part); returns
        the bytes stored. The service's own errors from the chunks (the download's
        ArchiveFailure) pass through; S3's raise StagingError. A failed upload leaves no
        object (a multipart upload is aborted; the lifecycle rule is the backstop)."""
        reader = PartReader(chunks, deadline)
        buffer = bytearray(PART_BYTES)
        client = self.client
        with watched(deadline) as watchdog:
            try:
                filled = reader.fill(buffer)
                if filled < PART_BYTES:
                    del buffer[filled:]
                    client.put_object(
                        Bucket=self.name, Key=key, Body=buffer, ContentType=content_type
                    )
                else:
                    self._put_parts(key, reader, buffer, content_type=content_type)
            except ServiceError:
                raise
            except Exception as error:  # noqa: BLE001 - boto3 and botocore errors
                raise _failed(f"staging {key}", error, watchdog) from None
        return reader.size

    def _put_parts(
        self, key: str, reader: PartReader, buffer: bytearray, *, content_type: str
    ) -> None:
        """A multipart upload of `buffer` (full) and what the reader still has."""
        upload = self.client.create_multipart_upload(
            Bucket=self.name, Key=key, ContentType=content_type
        )["UploadId"]
        parts: list[dict[str, Any]] = []
        try:
            filled = len(buffer)
            while filled:
                if filled < len(buffer):
                    del buffer[filled:]  # the last part: shrunk in place, not copied
                answer = self.client.upload_part(
                    Bucket=self.name,
                    Key=key,
                    UploadId=upload,
                    PartNumber=len(parts) + 1,
                    Body=buffer,
                )
                parts.append({"ETag": answer["ETag"], "PartNumber": len(parts) + 1})
                filled = reader.fill(buffer) if len(buffer) == PART_BYTES else 0
            self.client.complete_multipart_upload(
                Bucket=self.name, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            # Its own short deadline: the attempt's may be what just ran out.
            with contextlib.suppress(Exception), watched(time.monotonic() + CLEANUP_SECONDS):
                self.client.abort_multipart_upload(Bucket=self.name, Key=key, UploadId=upload)
            raise

    def open(self, key: str, *, deadline: float) -> StagedObject:
        """Start reading `key`; raises StagedCopyMissing when it is gone, StagingError."""
        client = self.client
        # Kept running after the GET: the body is read on the same connection.
        with watched(deadline, keep=True) as watchdog:
            try:
                response = client.get_object(Bucket=self.name, Key=key)
            except Exception as error:  # noqa: BLE001 - boto3 and botocore errors
                watchdog.cancel()
                if aws.error_code(error) in ("NoSuchKey", "404"):
                    raise StagedCopyMissing(f"staged copy {key} is gone") from None
                raise _failed(f"reading staged copy {key}", error, watchdog) from None
        size = int(response["ContentLength"])
        etag = str(response.get("ETag") or "")
        return StagedObject(key, size, response["Body"], deadline, watchdog, etag=etag)

    def delete(self, key: str, *, deadline: float | None = None) -> None:
        """Delete `key` (a missing key is no error) by `deadline` (default: CLEANUP_SECONDS
        from now); raises StagingError."""
        client = self.client
        with watched(deadline or time.monotonic() + CLEANUP_SECONDS) as watchdog:
            try:
                client.delete_object(Bucket=self.name, Key=key)
            except Exception as error:  # noqa: BLE001 - boto3 and botocore errors
                raise _failed(f"deleting staged copy {key}", error, watchdog) from None


def _version(answer: dict[str, Any]) -> str | None:
    """S3's VersionId (none from an unversioned bucket), bounded: S3's are 32 characters."""
    version = answer.get("VersionId")
    return str(version)[:1024] if version else None


def _failed(
    what: str, error: Exception, watchdog: Watchdog, kind: type[StagingError] = StagingError
) -> StagingError:
    if watchdog.fired:
        return kind(f"{what} ran past the attempt's deadline")
    return kind(f"{what} failed ({aws.describe(error)})")
