"""Copy one image from the provider's URL to Lsky Pro by a deadline, once.

When an earlier attempt may have stored it, it is looked up and adopted instead. With a
Content-Length the upload streams from the download, else the image is spooled first.
Running out of time here is a timeout that spends the attempt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

from lib.archive.budget import download_needs, time_left, upload_needs
from lib.archive.fidelity import ContentDigest, Digest, Fidelity, compare
from lib.archive.naming import hosted_file_name, hosted_file_stem, hosted_names
from lib.archive.reconcile import may_be_hosted
from lib.state.claim import Task
from lib.transfer.download import Downloader, ImageStream, spool
from lib.transfer.failures import ArchiveFailure, Kind, Stage, fail
from lib.transfer.imagetype import ImageType
from lib.transfer.lsky import HostedImage, LskyClient


@dataclass(frozen=True)
class Copied:
    hosted: HostedImage
    size: int  # bytes sent to Lsky (0 when adopted)
    # Adopted: an earlier attempt had stored it, nothing was sent. `duplicates`: the keys
    # of further images with the record's name (stored before this fix, or by hand).
    adopted: bool = False
    duplicates: tuple[str, ...] = ()
    sent: Digest | None = None  # md5/sha1/size of the bytes sent (None when adopted)

    @property
    def fidelity(self) -> Fidelity | None:
        """The bytes sent against those Lsky says it stored (None when adopted)."""
        return None if self.sent is None else compare(self.sent, self.hosted.data)


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
    def __init__(self, *, downloader: Downloader, lsky: LskyClient, max_image_bytes: int) -> None:
        self.downloader = downloader
        self.lsky = lsky
        self.max_image_bytes = max_image_bytes

    def copy(self, task: Task, deadline: float) -> Copied:
        """Adopt the record's image if an earlier attempt stored it, else download and upload
        it by `deadline`. Raises ArchiveFailure for every failure, saying whether Lsky may
        hold an image for this attempt (Failure.may_be_hosted)."""
        progress = _Progress()
        try:
            if task.may_be_hosted:
                adopted = self._adopt(task, deadline)
                if adopted is not None:
                    return adopted
            return self._transfer(task, deadline, progress)
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

    def _transfer(self, task: Task, deadline: float, progress: _Progress) -> Copied:
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


def _filename(task: Task, image_type: ImageType) -> str:
    return hosted_file_name(
        username=task.username,
        user_id=task.user_id,
        record_id=task.record_id,
        started_at=task.started_at,
        extension=image_type.extension,
    )
