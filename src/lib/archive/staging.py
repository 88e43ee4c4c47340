"""Capture now, publish later: the rules (when an image is worth staging, what its copy
is called, what a FAILED row keeps) and Staging, the one collaborator that captures,
stages after a failure, reads back and deletes. docs/explanation/staging-and-originals.md says why.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.budget import download_needs, stage_needs, time_left, upload_needs
from lib.archive.lane import host_condition
from lib.archive.outcome import Outcome, Verdict
from lib.archive.retry import ErrorClass, classify
from lib.archive.schedule import OWN_FAULT_RETRY_SECONDS
from lib.platform.observability import logger, metrics
from lib.platform.s3 import StagedCopyMissing, StagingBucket, StagingError
from lib.state.claim import StagedCopy, Task
from lib.transfer.download import Downloader
from lib.transfer.failures import Failure, Stage
from lib.transfer.held import HeldImage, hold
from lib.transfer.imagetype import ImageType, by_extension

# Every staged object lives under this prefix: the archive function's IAM grant and the
# bucket's lifecycle rule name it, so nothing else in the bucket is reachable or expired.
STAGED_PREFIX = "staged/"


def staged_key(record_id: int, image_type: ImageType, token: str | None = None) -> str:
    """staged/<record id>/<random>.<ext>: one object per capture, so a late writer of an
    earlier attempt can never overwrite (or delete) the copy the row points at."""
    return f"{STAGED_PREFIX}{record_id}/{token or uuid.uuid4().hex}.{image_type.extension}"


def image_type_of(key: str) -> ImageType | None:
    """The image type a staged key was written with (its extension); None if not ours."""
    return by_extension(key) if key.startswith(STAGED_PREFIX) else None


def worth_staging(failure: Failure) -> bool:
    """After the image was downloaded but the host did not take it: capture it when a
    later attempt can succeed (a pause of the whole host, or a transient failure), so
    that attempt does not depend on the provider's URL, which expires."""
    if failure.stage is Stage.DOWNLOAD:
        return False  # nothing arrived to capture: the source itself failed
    if host_condition(failure) is not None:
        return True
    return classify(failure) is ErrorClass.TRANSIENT


def keeps_copy(failure: Failure) -> bool:
    """A row that becomes FAILED keeps its staged copy unless the image itself was
    refused (a permanent error): attempts used up on an outage are replayed with
    `archive-ctl requeue --failed` from the copy, long after the URL expired."""
    return classify(failure) is ErrorClass.TRANSIENT


class StagedCopyMismatch(StagingError):
    """The staged object's bytes are not those captured (replaced, truncated): never
    archived; the row forgets the copy."""


class Staging:
    """The staging bucket as the attempt uses it: capture now, stage after a failure, read
    back, delete. With no bucket (ARCHIVE_STAGING_BUCKET empty) every call is a no-op.

    S3's failures never become the record's: capture and stage log, count StagingFailed
    and return None (the record is no worse off than without staging)."""

    def __init__(
        self, bucket: StagingBucket | None, *, downloader: Downloader, max_image_bytes: int
    ) -> None:
        self.bucket = bucket
        self.downloader = downloader
        self.max_image_bytes = max_image_bytes

    @property
    def enabled(self) -> bool:
        return self.bucket is not None

    def capture(self, task: Task, deadline: float, why: str) -> StagedCopy | None:
        """Download the image straight into the bucket (no copy in hand); None when staging
        is off, the row is staged already, or S3 failed. Raises ArchiveFailure when the
        download fails (the record's own failure)."""
        if self.bucket is None or task.staged_key is not None:
            return None
        try:
            staged = self._download_into(self.bucket, task, deadline)
        except StagingError as error:
            _failed(error, why)
            return None
        return _stored(staged, why)

    def stage(self, task: Task, held: HeldImage, deadline: float, why: str) -> StagedCopy | None:
        """Stage the bytes in hand: no second download. None as capture."""
        if self.bucket is None:
            return None
        if time_left(deadline) < stage_needs(held.size):
            _failed(StagingError("not enough time left to stage the image in hand"), why)
            return None
        key = staged_key(task.record_id, held.image_type)
        # The digest is taken on the way to the bucket: only a staged image pays for it.
        digest = hashlib.sha256()
        try:
            stored = self.bucket.put(
                key,
                _hashed(held.chunks(), digest),
                content_type=held.image_type.mime_type,
                deadline=deadline,
            )
        except StagingError as error:
            _failed(error, why)
            return None
        return _stored(StagedCopy(key, digest.hexdigest(), stored), why)

    def read_back(self, task: Task, deadline: float) -> HeldImage:
        """The row's staged copy, into a spool, checked against what was captured. Raises
        StagedCopyMissing (gone), StagedCopyMismatch (other bytes), StagingError."""
        key = task.staged_key or ""
        image_type = image_type_of(key)
        if self.bucket is None:
            raise StagingError("staging is off (ARCHIVE_STAGING_BUCKET is empty)")
        if image_type is None:
            raise StagedCopyMissing(f"{key!r} is not a staged copy")
        staged = self.bucket.open(key, deadline=deadline)
        try:
            if time_left(deadline) < stage_needs(staged.size) + upload_needs(staged.size):
                raise StagingError("not enough time left to read the staged copy and upload it")
            held = hold(staged.chunks(), image_type, sha256=True)
        finally:
            staged.close()
        held.etag = staged.etag  # a server-side copy takes that very object (originals)
        mismatch = _mismatch(task, held)
        if mismatch is not None:
            held.close()
            raise StagedCopyMismatch(f"staged copy {key} {mismatch}")
        return held

    def discard(self, key: str | None) -> None:
        """Delete a staged copy nobody needs any more; the lifecycle rule is the backstop."""
        if key is None or self.bucket is None:
            return
        try:
            self.bucket.delete(key)
        except StagingError as error:
            logger.warning("staged copy not deleted (the lifecycle rule will)", error=str(error))

    def _download_into(self, bucket: StagingBucket, task: Task, deadline: float) -> StagedCopy:
        with self.downloader.open(task.image_url, deadline=deadline) as stream:
            declared = stream.declared_length
            size = declared if declared is not None else self.max_image_bytes
            if time_left(deadline) < download_needs(declared or 0) + stage_needs(size):
                raise StagingError(f"not enough time left to stage a {declared}-byte image")
            key = staged_key(task.record_id, stream.image_type)
            digest = hashlib.sha256()
            stored = bucket.put(
                key,
                _hashed(stream, digest),
                content_type=stream.image_type.mime_type,
                deadline=deadline,
            )
        return StagedCopy(key, digest.hexdigest(), stored)


def _hashed(chunks: Iterable[bytes], digest: Any) -> Iterator[bytes]:
    for chunk in chunks:
        digest.update(chunk)
        yield chunk


def _mismatch(task: Task, held: HeldImage) -> str | None:
    """How a copy read back differs from what was captured (rows staged by an older
    release carry no digest: their length and type were checked on the way)."""
    if task.staged_bytes is not None and held.size != task.staged_bytes:
        return f"holds {held.size} bytes, {task.staged_bytes} were captured"
    if task.staged_sha256 is not None and held.sha256 != task.staged_sha256:
        return "does not hold the bytes captured (SHA-256 differs)"
    return None


def _stored(staged: StagedCopy, why: str) -> StagedCopy:
    logger.info("image staged", staged_key=staged.key, bytes=staged.size, reason=why)
    metrics.add_metric(name="Staged", unit=MetricUnit.Count, value=1)
    return staged


def _failed(error: StagingError, why: str) -> None:
    # The record is no worse off than without staging; the alarm is on the metric.
    logger.error("could not stage the image; going on without", error=str(error), reason=why)
    metrics.add_metric(name="StagingFailed", unit=MetricUnit.Count, value=1)


def mismatched(error: str) -> Verdict:
    """The staged copy is not what was captured: never archived. Our fault, not the
    record's: the attempt is given back and the row forgets the copy (the source next)."""
    logger.error("staged copy does not match what was captured; dropped", error=error)
    return Verdict(
        Outcome.OWN_FAULT,
        f"staging error: {error}",
        OWN_FAULT_RETRY_SECONDS,
        forget_staged=True,
        metrics=("StagingError", "StagedCopyMismatch"),
        fields={"error": error},
    )
