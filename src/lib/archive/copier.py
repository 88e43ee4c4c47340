"""Copy one image from the provider's URL to Lsky Pro by a deadline.

With a Content-Length the upload streams from the download (neither memory nor /tmp
holds the image); without one the image is spooled first. The transfer has begun when
this is called, so running out of time here is a timeout that spends the attempt.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from lib.archive.budget import download_needs, time_left, upload_needs
from lib.archive.naming import hosted_file_name
from lib.state.claim import Task
from lib.transfer.download import Downloader, ImageStream, spool
from lib.transfer.failures import Kind, Stage, fail
from lib.transfer.imagetype import ImageType
from lib.transfer.lsky import HostedImage, LskyClient


@dataclass(frozen=True)
class Copied:
    hosted: HostedImage
    size: int  # bytes sent to Lsky


def can_start(deadline: float) -> bool:
    """Whether an attempt has time to begin a transfer at all (checked before any fetch)."""
    return time_left(deadline) >= download_needs(0) + upload_needs(0)


class Copier:
    def __init__(self, *, downloader: Downloader, lsky: LskyClient, max_image_bytes: int) -> None:
        self.downloader = downloader
        self.lsky = lsky
        self.max_image_bytes = max_image_bytes

    def copy(self, task: Task, deadline: float) -> Copied:
        """Download and upload by `deadline`; raises ArchiveFailure for every failure."""
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


def _filename(task: Task, image_type: ImageType) -> str:
    return hosted_file_name(
        username=task.username,
        user_id=task.user_id,
        record_id=task.record_id,
        started_at=task.started_at,
        extension=image_type.extension,
    )
