"""Copy one image from the provider's URL to Lsky Pro by a deadline, once.

An image an earlier attempt may have stored is looked up and adopted instead; with a
Content-Length the upload streams from the download, else it is spooled first; staging
copies it to or from the bucket. Running out of time here spends the attempt."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from lib.archive.budget import download_needs, stage_needs, time_left, upload_needs
from lib.archive.fidelity import ContentDigest
from lib.archive.naming import hosted_file_name, hosted_file_stem, hosted_names
from lib.archive.outcome import Copied
from lib.archive.reconcile import may_be_hosted
from lib.archive.staging import Staging, image_type_of
from lib.platform.s3 import StagedCopyMissing
from lib.state.claim import Task
from lib.transfer.download import Downloader, ImageStream, spool
from lib.transfer.failures import ArchiveFailure, Failure, Kind, Stage, fail
from lib.transfer.imagetype import DownloadedImage, ImageType
from lib.transfer.lsky import LskyClient

# Called with a spooled image whose upload failed, before the spool is dropped.
SpoolFailed = Callable[[DownloadedImage, Failure], None]


class _Progress:
    """How far an attempt's upload got, for deciding whether Lsky may have stored it."""

    def __init__(self) -> None:
        self.upload_started = False
        self.streamed: ContentDigest | None = None  # the streamed body's file bytes

    @property
    def body_complete(self) -> bool:
        return self.upload_started and (self.streamed is None or self.streamed.finished)


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
        staging: Staging,
    ) -> None:
        self.downloader = downloader
        self.lsky = lsky
        self.max_image_bytes = max_image_bytes
        self.staging = staging  # reads staged copies back (copy_staged)

    def copy(
        self, task: Task, deadline: float, *, on_spool_failed: SpoolFailed | None = None
    ) -> Copied:
        """Adopt the record's image if an earlier attempt stored it, else download and upload
        it by `deadline`. Raises ArchiveFailure for every failure, saying whether Lsky may
        hold an image for this attempt (Failure.may_be_hosted).
        on_spool_failed: offered a spooled image whose upload failed (staging keeps it)."""
        progress = _Progress()
        try:
            if task.may_be_hosted:
                adopted = self._adopt(task, deadline)
                if adopted is not None:
                    return adopted
            return self._transfer(task, deadline, progress, on_spool_failed)
        except ArchiveFailure as error:
            failure = error.failure
        # Raised outside the except block: nothing else is chained to the failure.
        hosted = may_be_hosted(failure, body_complete=progress.body_complete)
        raise ArchiveFailure(replace(failure, may_be_hosted=hosted))

    def _adopt(self, task: Task, deadline: float) -> Copied | None:
        """The image an earlier attempt stored, looked up by its exact name, or None."""
        stem = hosted_file_stem(
            username=task.username,
            user_id=task.user_id,
            record_id=task.record_id,
            started_at=task.started_at,
        )
        # The keyword ends at the dot, so only names with our stem and an extension match.
        found = self.lsky.find(hosted_names(stem), keyword=f"{stem}.", deadline=deadline)
        if not found:
            return None
        first, *others = found
        return Copied(
            first,
            0,
            adopted=True,
            duplicates=tuple(str(image.data.get("key", "")) for image in others),
        )

    def _transfer(
        self,
        task: Task,
        deadline: float,
        progress: _Progress,
        on_spool_failed: SpoolFailed | None,
    ) -> Copied:
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
                    task,
                    streams,
                    stream,
                    size=declared,
                    name=filename,
                    by=deadline,
                    progress=progress,
                )
            # The spooled body must end early enough to leave the upload its share.
            stream.set_deadline(deadline - upload_needs(size))
            digest = ContentDigest()
            image = spool(stream, observe=digest.update)
        try:
            if time_left(deadline) < upload_needs(image.size):
                raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload")
            progress.upload_started = True
            hosted = self.lsky.upload(image, filename=filename, deadline=deadline)
            return Copied(hosted, image.size, sent=digest.result())
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
        progress: _Progress,
    ) -> Copied:
        """Upload straight from the download (`size`: its Content-Length); a body that breaks
        off aborts the upload with it."""
        stream.set_deadline(by - upload_needs(0))

        def reopen() -> Iterable[bytes]:
            # Only after a 401 with a rotated token: the first body is spent, so fetch the
            # image again (Lsky stored nothing), if there is still time for both ways.
            progress.upload_started = False  # the 401 settled the first request
            if time_left(by) < download_needs(size) + upload_needs(size):
                raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload again")
            again = streams.enter_context(
                self.downloader.open(task.image_url, deadline=by - upload_needs(0))
            )
            progress.upload_started = True
            progress.streamed = ContentDigest()
            return progress.streamed.wrap(again)

        progress.upload_started = True
        progress.streamed = ContentDigest()
        hosted = self.lsky.upload_stream(
            progress.streamed.wrap(stream),
            size=size,
            mime_type=stream.image_type.mime_type,
            filename=name,
            deadline=by,
            reopen=reopen,
        )
        # The body's framing checked the length, so every byte went through the digest.
        return Copied(hosted, size, sent=progress.streamed.result())

    def copy_staged(self, task: Task, deadline: float) -> Copied:
        """Upload the row's staged copy to Lsky, streamed from S3 (its length is known).

        Raises StagedCopyMissing when the copy is gone (the caller goes back to the
        source), StagingError when S3 fails, ArchiveFailure for Lsky's failures.
        """
        if task.may_be_hosted:
            # An earlier upload from this copy may have been stored: adopt it, as `copy` does.
            lookup: Failure | None
            try:
                adopted = self._adopt(task, deadline)
            except ArchiveFailure as error:
                lookup = error.failure
            else:
                if adopted is not None:
                    return adopted
                lookup = None
            if lookup is not None:
                unknown = may_be_hosted(lookup, body_complete=False)
                raise ArchiveFailure(replace(lookup, may_be_hosted=unknown))
        key = task.staged_key or ""
        image_type = image_type_of(key)
        if image_type is None:
            raise StagedCopyMissing(f"{key!r} is not a staged copy")
        with contextlib.ExitStack() as objects:
            staged = self.staging.open(key, deadline)
            objects.callback(staged.close)
            size = staged.size
            if time_left(deadline) < stage_needs(size) + upload_needs(size):
                raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload")

            # The staged bytes are the provider's: they get the same fidelity check.
            digest = ContentDigest()

            def reopen() -> Iterator[bytes]:
                # After a 401 with a rotated token: read the copy again, if time allows.
                nonlocal digest
                if time_left(deadline) < stage_needs(size) + upload_needs(size):
                    raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload again")
                again = self.staging.open(key, deadline)
                objects.callback(again.close)
                digest = ContentDigest()
                return iter(digest.wrap(again.chunks()))

            try:
                hosted = self.lsky.upload_stream(
                    digest.wrap(staged.chunks()),
                    size=size,
                    mime_type=image_type.mime_type,
                    filename=_filename(task, image_type),
                    deadline=deadline,
                    reopen=reopen,
                )
            except ArchiveFailure as error:
                failure = error.failure
            else:
                return Copied(hosted, size, sent=digest.result())
        hosted_maybe = may_be_hosted(failure, body_complete=digest.finished)
        raise ArchiveFailure(replace(failure, may_be_hosted=hosted_maybe))


def _filename(task: Task, image_type: ImageType) -> str:
    return hosted_file_name(
        username=task.username,
        user_id=task.user_id,
        record_id=task.record_id,
        started_at=task.started_at,
        extension=image_type.extension,
    )
