"""Copy one image from the provider's URL to Lsky Pro by a deadline.

With a Content-Length the upload streams from the download (neither memory nor /tmp
holds the image); without one the image is spooled first. The transfer has begun when
this is called, so running out of time here is a timeout that spends the attempt.
Staging (lib.archive.staging) copies the image to or from the staging bucket instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from lib.archive.budget import download_needs, stage_needs, time_left, upload_needs
from lib.archive.naming import hosted_file_name
from lib.archive.staging import image_type_of, staged_key
from lib.platform.s3 import READ_CHUNK_BYTES, StagedCopyMissing, StagingBucket, StagingError
from lib.state.claim import Task
from lib.transfer.download import Downloader, ImageStream, spool
from lib.transfer.failures import ArchiveFailure, Failure, Kind, Stage, fail
from lib.transfer.imagetype import DownloadedImage, ImageType
from lib.transfer.lsky import HostedImage, LskyClient

# Called with a spooled image whose upload failed, before the spool is dropped.
SpoolFailed = Callable[[DownloadedImage, Failure], None]


@dataclass(frozen=True)
class Copied:
    hosted: HostedImage
    size: int  # bytes sent to Lsky


@dataclass(frozen=True)
class Staged:
    key: str  # the object in the staging bucket
    size: int  # bytes stored


def can_start(deadline: float) -> bool:
    """Whether an attempt has time to begin a transfer at all (checked before any fetch)."""
    return time_left(deadline) >= download_needs(0) + upload_needs(0)


class Copier:
    def __init__(
        self,
        *,
        downloader: Downloader,
        lsky: LskyClient,
        max_image_bytes: int,
        staging: StagingBucket | None = None,
    ) -> None:
        self.downloader = downloader
        self.lsky = lsky
        self.max_image_bytes = max_image_bytes
        self.staging = staging  # None: staging is off (ARCHIVE_STAGING_BUCKET empty)

    def copy(
        self, task: Task, deadline: float, *, on_spool_failed: SpoolFailed | None = None
    ) -> Copied:
        """Download and upload by `deadline`; raises ArchiveFailure for every failure.
        on_spool_failed: offered a spooled image whose upload failed (staging keeps it)."""
        with contextlib.ExitStack() as streams:
            stream = streams.enter_context(
                self.downloader.open(task.image_url, deadline=deadline - upload_needs(0))
            )
            declared = stream.declared_length
            # The sequential estimate even when streaming: pessimistic on purpose.
            size = declared if declared is not None else self.max_image_bytes
            if time_left(deadline) < download_needs(declared or 0) + upload_needs(size):
                raise fail(
                    Stage.DOWNLOAD,
                    Kind.TIMEOUT,
                    f"not enough time left to transfer a {declared}-byte image",
                )
            filename = _filename(task, stream.image_type)
            if declared is not None:
                return self._stream(
                    task, streams, stream, size=declared, name=filename, by=deadline
                )
            # The spooled body must end early enough to leave the upload its share.
            stream.set_deadline(deadline - upload_needs(size))
            image = spool(stream)
        try:
            if time_left(deadline) < upload_needs(image.size):
                raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload")
            return Copied(self.lsky.upload(image, filename=filename, deadline=deadline), image.size)
        except ArchiveFailure as error:
            if on_spool_failed is not None:
                on_spool_failed(image, error.failure)
            raise
        finally:
            image.close()

    def _stream(
        self,
        task: Task,
        streams: contextlib.ExitStack,
        stream: ImageStream,
        *,
        size: int,
        name: str,
        by: float,
    ) -> Copied:
        """Upload straight from the download (`size`: its Content-Length); a body that breaks
        off aborts the upload with it."""
        stream.set_deadline(by - upload_needs(0))

        def reopen() -> ImageStream:
            # Only after a 401 with a rotated token: the first body is spent, so fetch the
            # image again (Lsky stored nothing), if there is still time for both ways.
            if time_left(by) < download_needs(size) + upload_needs(size):
                raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload again")
            return streams.enter_context(
                self.downloader.open(task.image_url, deadline=by - upload_needs(0))
            )

        hosted = self.lsky.upload_stream(
            stream,
            size=size,
            mime_type=stream.image_type.mime_type,
            filename=name,
            deadline=by,
            reopen=reopen,
        )
        return Copied(hosted, size)

    # -- staging (lib.archive.staging): the image goes to, or comes from, the bucket ------

    def _bucket(self) -> StagingBucket:
        if self.staging is None:
            raise StagingError("staging is off (ARCHIVE_STAGING_BUCKET is empty)")
        return self.staging

    def capture(self, task: Task, deadline: float) -> Staged:
        """Download the image straight into the staging bucket, by `deadline`.

        Raises ArchiveFailure for the download's own failures (the record's), and
        StagingError when S3 fails or the time left cannot fit it (not the record's).
        """
        bucket = self._bucket()
        with self.downloader.open(task.image_url, deadline=deadline) as stream:
            declared = stream.declared_length
            size = declared if declared is not None else self.max_image_bytes
            if time_left(deadline) < download_needs(declared or 0) + stage_needs(size):
                raise StagingError(f"not enough time left to stage a {declared}-byte image")
            key = staged_key(task.record_id, stream.image_type)
            stored = bucket.put(
                key, stream, content_type=stream.image_type.mime_type, deadline=deadline
            )
        return Staged(key, stored)

    def stage_spooled(self, task: Task, image: DownloadedImage, deadline: float) -> Staged:
        """Stage an image already spooled to /tmp (no second download). Raises StagingError."""
        bucket = self._bucket()
        if time_left(deadline) < stage_needs(image.size):
            raise StagingError("not enough time left to stage the spooled image")
        image.file.seek(0)
        key = staged_key(task.record_id, image.image_type)
        chunks = iter(lambda: image.file.read(READ_CHUNK_BYTES), b"")
        stored = bucket.put(key, chunks, content_type=image.image_type.mime_type, deadline=deadline)
        return Staged(key, stored)

    def copy_staged(self, task: Task, deadline: float) -> Copied:
        """Upload the row's staged copy to Lsky, streamed from S3 (its length is known).

        Raises StagedCopyMissing when the copy is gone (the caller goes back to the
        source), StagingError when S3 fails, ArchiveFailure for Lsky's failures.
        """
        bucket = self._bucket()
        key = task.staged_key or ""
        image_type = image_type_of(key)
        if image_type is None:
            raise StagedCopyMissing(f"{key!r} is not a staged copy")
        with contextlib.ExitStack() as objects:
            staged = bucket.open(key, deadline=deadline)
            objects.callback(staged.close)
            size = staged.size
            if time_left(deadline) < stage_needs(size) + upload_needs(size):
                raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload")

            def reopen() -> Iterator[bytes]:
                # After a 401 with a rotated token: read the copy again, if time allows.
                if time_left(deadline) < stage_needs(size) + upload_needs(size):
                    raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload again")
                again = bucket.open(key, deadline=deadline)
                objects.callback(again.close)
                return again.chunks()

            hosted = self.lsky.upload_stream(
                staged.chunks(),
                size=size,
                mime_type=image_type.mime_type,
                filename=_filename(task, image_type),
                deadline=deadline,
                reopen=reopen,
            )
        return Copied(hosted, size)


def _filename(task: Task, image_type: ImageType) -> str:
    return hosted_file_name(
        username=task.username,
        user_id=task.user_id,
        record_id=task.record_id,
        started_at=task.started_at,
        extension=image_type.extension,
    )
