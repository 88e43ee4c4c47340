"""The originals bucket (versioned): put from a spool, copy a staged copy in, read a
version back, look one up (lib.archive.originals, lib.audit.confirm). boto3 is imported
on first use; every call ends by its deadline (lib.platform.watchdog binds S3's sockets).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lib.platform import aws
from lib.platform.s3 import (
    _S3,
    OriginalMissing,
    OriginalsError,
    StagedObject,
    _failed,
    _version,
)
from lib.platform.s3_body import Cut, Readable, StreamedBody
from lib.platform.watchdog import watched


@dataclass(frozen=True)
class Written:
    """An original as S3 stored it: its version, and the SHA-256 and length of the bytes."""

    version_id: str | None
    sha256: str
    size: int


class OriginalsBucket:
    """The originals bucket (versioned): each original one PUT, streamed from the spool the
    upload reads (no part buffer: the spool is the bounded copy), in `storage_class`,
    with metadata naming its record. Errors are OriginalsError."""

    def __init__(
        self,
        name: str,
        *,
        storage_class: str = "GLACIER_IR",
        connect_timeout: float = 2,
        read_timeout: float = 10,
        max_attempts: int = 3,
    ) -> None:
        self.name = name
        self.storage_class = storage_class
        self._timeouts = (connect_timeout, read_timeout, max_attempts)

    @cached_property
    def client(self) -> _S3:
        # Unsigned payload: signed, the body is read whole before a byte is sent (the
        # download waited for, the spool read twice). docs/explanation/staging-and-originals.md.
        s3: _S3 = aws.s3_client(*self._timeouts, s3={"payload_signing_enabled": False})
        return s3

    def put(
        self,
        key: str,
        source: Readable,
        *,
        content_type: str,
        metadata: dict[str, str],
        deadline: float,
        cut: Cut | None = None,
    ) -> Written:
        """Store `source` (all `source.size` bytes, as they become readable) under `key`.
        `cut`, called from another thread, gives the PUT up: S3 stores nothing of a body
        short of its Content-Length. Raises OriginalsError."""
        digest, cut = hashlib.sha256(), cut or Cut()
        body = StreamedBody(source, digest, cut)
        answer = self._call(
            f"keeping original {key}",
            lambda client: client.put_object(
                Bucket=self.name,
                Key=key,
                Body=body,
                ContentLength=source.size,
                ContentType=content_type,
                StorageClass=self.storage_class,
                Metadata=metadata,
            ),
            deadline=deadline,
            cut=cut,
            why=lambda: body.failure,
        )
        if body.hashed != source.size:  # S3 took the body whole: it passed the digest whole
            raise OriginalsError(f"keeping original {key}: {body.hashed} bytes hashed")
        return Written(_version(answer), digest.hexdigest(), source.size)

    def copy(
        self,
        key: str,
        *,
        source_bucket: str,
        source_key: str,
        etag: str,
        content_type: str,
        metadata: dict[str, str],
        deadline: float,
        cut: Cut | None = None,
    ) -> str | None:
        """Copy an object in server-side (a staged copy), only if it still has `etag` (the
        object whose bytes were read and checked); its version. Raises OriginalsError."""
        cut = cut or Cut()
        cut.went_whole()  # no body: S3 may copy it from the moment it is asked
        answer = self._call(
            f"copying {source_key} in as {key}",
            lambda client: client.copy_object(
                Bucket=self.name,
                Key=key,
                CopySource={"Bucket": source_bucket, "Key": source_key},
                CopySourceIfMatch=etag,
                MetadataDirective="REPLACE",
                ContentType=content_type,
                StorageClass=self.storage_class,
                Metadata=metadata,
            ),
            deadline=deadline,
            cut=cut,
        )
        return _version(answer)

    def _call(
        self,
        what: str,
        call: Callable[[_S3], dict[str, Any]],
        *,
        deadline: float,
        cut: Cut,
        why: Callable[[], str | None] = lambda: None,
    ) -> dict[str, Any]:
        """`call` by `deadline`, given up when `cut`; S3's errors (and `why` the body
        stopped short, if it did) as OriginalsError."""
        client = self.client
        with watched(deadline) as watchdog:
            cut.watch(watchdog)
            try:
                return call(client)
            except Exception as error:  # noqa: BLE001 - boto3 and botocore errors
                stopped = "it was cut" if cut.done else why()
                if stopped is None and cut.sealed and aws.error_code(error) is None:
                    stopped = "not answered whole, and not sent again (its source was released)"
                if stopped is not None:
                    raise OriginalsError(f"{what} failed: {stopped}") from None
                raise _failed(what, error, watchdog, OriginalsError) from None

    def head(self, key: str, *, deadline: float, bucket: str | None = None) -> Found | None:
        """What S3 holds under `key` now (its latest version) in `bucket` (default this one);
        None when nothing is there. Raises OriginalsError (S3 unreachable, refused)."""
        client = self.client
        with watched(deadline) as watchdog:
            try:
                answer = client.head_object(Bucket=bucket or self.name, Key=key)
            except Exception as error:  # noqa: BLE001 - boto3 and botocore errors
                if aws.error_code(error) in ("NoSuchKey", "404"):
                    return None
                raise _failed(
                    f"looking up original {key}", error, watchdog, OriginalsError
                ) from None
        return Found(int(answer.get("ContentLength") or 0), _version(answer), _metadata(answer))

    def open(
        self, key: str, *, version_id: str | None, deadline: float, bucket: str | None = None
    ) -> StagedObject:
        """Start reading `key` (that version) in `bucket` (the one a row recorded; default
        this one); raises OriginalMissing, OriginalsError."""
        client = self.client
        version = {} if version_id is None else {"VersionId": version_id}
        with watched(deadline, keep=True) as watchdog:
            try:
                response = client.get_object(Bucket=bucket or self.name, Key=key, **version)
            except Exception as error:  # noqa: BLE001 - boto3 and botocore errors
                watchdog.cancel()
                if aws.error_code(error) in ("NoSuchKey", "NoSuchVersion", "404"):
                    raise OriginalMissing(f"original {key} is gone") from None
                raise _failed(f"reading original {key}", error, watchdog, OriginalsError) from None
        return StagedObject(
            key,
            int(response["ContentLength"]),
            response["Body"],
            deadline,
            watchdog,
            etag=str(response.get("ETag") or ""),
            version_id=_version(response),
            what="original",
            error=OriginalsError,
        )


@dataclass(frozen=True)
class Found:
    """What a HEAD of an original says: its length, version and metadata (bounded)."""

    size: int
    version_id: str | None
    metadata: dict[str, str]


def _metadata(answer: dict[str, Any]) -> dict[str, str]:
    """S3's x-amz-meta-* (2 KiB at most on S3), each value bounded and text."""
    found = answer.get("Metadata")
    if not isinstance(found, dict):
        return {}
    return {str(k)[:128]: str(v)[:256] for k, v in list(found.items())[:16]}
