"""The staging bucket: put a stream, read it back as a stream, delete (lib.archive.staging).

boto3 is imported on first use, as in lib.platform.sqs: an archive that never stages
never loads it. Memory stays bounded by one multipart part, whatever the image size, and
every call ends by the attempt's deadline (lib.platform.watchdog holds S3's sockets too).
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
from lib.platform.watchdog import Watchdog, active, watched, watched_pool

# S3's smallest multipart part, and the only image bytes held in memory while staging:
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


class _S3(Protocol):
    """The few calls of boto3's S3 client used here (typed without the S3 stubs)."""

    def put_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def create_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...
    def upload_part(self, **kwargs: Any) -> dict[str, Any]: ...
    def complete_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...
    def abort_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...
    def get_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def delete_object(self, **kwargs: Any) -> dict[str, Any]: ...


class PartReader:
    """Fills one reused part buffer from an iterator of chunks: the only image bytes held
    in memory while staging (boto3's upload_fileobj held two to three copies of a part)."""

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
    """A staged image being read: iterate `chunks()` once; `size` is its length. The
    watchdog of the GET holds its body to the deadline; close() stops it."""

    key: str
    size: int
    _body: Any
    _deadline: float
    _watchdog: Watchdog

    def chunks(self) -> Iterator[bytes]:
        while chunk := self._read():
            if time.monotonic() > self._deadline:
                raise StagingError("reading the staged copy ran past the deadline")
            yield chunk

    def _read(self) -> bytes:
        try:
            chunk = bytes(self._body.read(READ_CHUNK_BYTES))
        except Exception as error:  # noqa: BLE001 - botocore's errors (some subclass urllib3's)
            # Converted here, inside the iterator: raised into the spool that reads the copy
            # back, a botocore ReadTimeoutError would pass for a timeout of ours.
            if self._watchdog.fired:
                raise StagingError("reading the staged copy ran past the deadline") from None
            raise StagingError(f"reading the staged copy failed ({type(error).__name__})") from None
        if not chunk and self._watchdog.fired:  # the shutdown can look like the end
            raise StagingError("reading the staged copy ran past the deadline")
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
        # The regional endpoint, or AWS_ENDPOINT_URL_S3 (boto3 reads it: a local S3).
        s3: _S3 = aws.client(
            "s3",
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            max_attempts=self._max_attempts,
            # botocore's default checksum reads each part once more into memory; TLS
            # already guards the bytes in transit.
            request_checksum_calculation="when_required",
        )
        _hold_to_deadlines(s3)
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
        return StagedObject(key, size, response["Body"], deadline, watchdog)

    def delete(self, key: str, *, deadline: float | None = None) -> None:
        """Delete `key` (a missing key is no error) by `deadline` (default: CLEANUP_SECONDS
        from now); raises StagingError."""
        client = self.client
        with watched(deadline or time.monotonic() + CLEANUP_SECONDS) as watchdog:
            try:
                client.delete_object(Bucket=self.name, Key=key)
            except Exception as error:  # noqa: BLE001 - boto3 and botocore errors
                raise _failed(f"deleting staged copy {key}", error, watchdog) from None


def _failed(what: str, error: Exception, watchdog: Watchdog) -> StagingError:
    if watchdog.fired:
        return StagingError(f"{what} ran past the attempt's deadline")
    return StagingError(f"{what} failed ({_describe(error)})")


def _hold_to_deadlines(client: Any) -> None:
    """Make the client's connections report to lib.platform.watchdog, and stop botocore's
    retries once a deadline has fired (a retry would wait out its backoff for nothing).

    botocore offers no public way to choose its connection classes: the session's pool
    classes are set where botocore itself sets them (tests/integration/test_deadlines.py
    fails if a botocore upgrade moves them)."""
    from botocore.awsrequest import (  # noqa: PLC0415 - boto3 is loaded on first use
        AWSHTTPConnectionPool,
        AWSHTTPSConnectionPool,
    )

    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    pools = getattr(session, "_pool_classes_by_scheme", None)
    if not isinstance(pools, dict):
        raise TypeError("botocore's HTTP session has no pool classes to watch")
    # The same dict the session's pool managers were given: updated in place for them.
    pools.update(
        http=watched_pool(AWSHTTPConnectionPool), https=watched_pool(AWSHTTPSConnectionPool)
    )
    client.meta.events.register_first("needs-retry.s3", _no_retry_past_deadline)


def _no_retry_past_deadline(**_: Any) -> None:
    watchdog = active()
    if watchdog is not None and watchdog.fired:
        raise StagingError("an S3 call ran past the attempt's deadline")


def _describe(error: Exception) -> str:
    """The error's type and S3's code (AccessDenied, SlowDown...): never a message, which
    may quote a signed URL or a header."""
    code = aws.error_code(error)
    return f"{type(error).__name__}: {code}" if code else type(error).__name__
