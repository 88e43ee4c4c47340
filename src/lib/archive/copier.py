"""Copy one image to Lsky Pro by a deadline, from bytes in hand: `fetch` downloads the
source once into a spool (lib.transfer.held), or relays it to the upload as it lands
(lib.transfer.relay); `find_ours` looks up an image an earlier attempt may have stored;
`upload` sends the spool, or gives the relayed upload's answer. Every failure says
whether Lsky may have stored the image."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import tzinfo

from lib.archive.budget import download_needs, relayed_needs, time_left, upload_needs
from lib.archive.fidelity import Digest
from lib.archive.naming import hosted_file_name, hosted_file_stem, hosted_names
from lib.archive.outcome import Copied
from lib.archive.reconcile import may_be_hosted, not_ours, why_ours
from lib.state.claim import SentImage, Task
from lib.transfer.download import Downloader, ImageStream
from lib.transfer.failures import ArchiveFailure, Failure, Kind, Stage, fail
from lib.transfer.held import HeldImage, hold
from lib.transfer.imagetype import ImageType
from lib.transfer.lsky import LskyClient, Sendable
from lib.transfer.lsky_upload import HostedImage
from lib.transfer.relay import Beside, Relay, RelayedImage, relay


def can_start(deadline: float) -> bool:
    """Whether an attempt has time to begin a transfer at all (checked before any fetch)."""
    return time_left(deadline) >= download_needs(0) + upload_needs(0)


@dataclass(frozen=True)
class LookUp:
    """What the look-up found: an image to adopt (and further ones with the record's name),
    and the listed images that cannot be ours, with why."""

    adopted: Copied | None
    refused: tuple[tuple[str, str], ...] = ()  # (key, why)
    why: str = ""  # why the adopted one can be ours


class Copier:
    def __init__(
        self,
        *,
        downloader: Downloader,
        lsky: LskyClient,
        max_image_bytes: int,
        host_timezone: tzinfo,
    ) -> None:
        self.downloader = downloader
        self.lsky = lsky
        self.max_image_bytes = max_image_bytes
        self.host_timezone = host_timezone

    def fetch(
        self,
        task: Task,
        deadline: float,
        *,
        gate: Callable[[], bool] | None = None,
        beside: Beside | None = None,
    ) -> HeldImage:
        """The source image, downloaded once into a spool, leaving the upload its share
        of the time. With a relay `gate`, asked once the first bytes (the type) and the
        Content-Length (the upload's exact length) are known: yes, and the upload starts
        on a thread of its own, reading the spool as it fills (a RelayedImage: `upload`
        gives its answer). Raises ArchiveFailure (stage download); a relayed upload is
        then cut before its last byte, and stores nothing (docs/explanation/transfers.md). `beside`
        starts another reader of a relayed download as it lands (the original's write)."""
        with self.downloader.open(task.image_url, deadline=deadline - upload_needs(0)) as stream:
            declared = stream.declared_length
            if gate is not None and declared is not None:
                if time_left(deadline) < relayed_needs(declared):
                    raise _no_time_for(declared)
                if gate():
                    # The upload follows the download: after its last byte, Lsky's work.
                    stream.set_deadline(deadline - upload_needs(0))
                    return self._relay(task, stream, declared, deadline, beside)
            size = declared if declared is not None else self.max_image_bytes
            if time_left(deadline) < download_needs(declared or 0) + upload_needs(size):
                raise _no_time_for(declared)
            # The body must end early enough to leave the upload its share.
            stream.set_deadline(deadline - upload_needs(size))
            return hold(stream, stream.image_type)

    def _relay(
        self, task: Task, stream: ImageStream, size: int, deadline: float, beside: Beside | None
    ) -> HeldImage:
        def send(image: Sendable) -> HostedImage | Failure:
            return self._send(task, image, deadline)

        return relay(stream, size=size, image_type=stream.image_type, send=send, beside=beside)

    def find_ours(self, task: Task, sent: SentImage | None, deadline: float) -> LookUp:
        """The image an earlier attempt stored, by its exact name, if it can be ours (see
        lib.archive.reconcile.not_ours). Raises ArchiveFailure (stage lookup)."""
        stem = hosted_file_stem(
            username=task.username,
            user_id=task.user_id,
            record_id=task.record_id,
            started_at=task.started_at,
        )
        try:
            # The keyword ends at the dot: only names with our stem and an extension match.
            found = self.lsky.find(hosted_names(stem), keyword=f"{stem}.", deadline=deadline)
        except ArchiveFailure as error:
            failure = error.failure
        else:
            return self._judge(task, found, sent)
        # Unanswered, the question stays open: the image may still be on the host.
        raise ArchiveFailure(replace(failure, may_be_hosted=True))

    def still_listed(self, task: Task, key: str, deadline: float) -> bool:
        """Whether Lsky still lists image `key` under the record's name (a restore's damaged
        copy: Lsky reuses a listed image's file for the same bytes). Raises ArchiveFailure
        (stage lookup)."""
        stem = hosted_file_stem(
            username=task.username,
            user_id=task.user_id,
            record_id=task.record_id,
            started_at=task.started_at,
        )
        found = self.lsky.find(hosted_names(stem), keyword=f"{stem}.", deadline=deadline)
        return any(str(image.data.get("key", "")) == key for image in found)

    def _judge(self, task: Task, found: list[HostedImage], sent: SentImage | None) -> LookUp:
        """Which of the images found with the record's name can be ours."""
        ours: list[HostedImage] = []
        refused: list[tuple[str, str]] = []
        for image in found:
            why = not_ours(
                image.data,
                first_claimed_at=task.first_claimed_at,
                sent=sent,
                host_timezone=self.host_timezone,
            )
            if why is None:
                ours.append(image)
            else:
                refused.append((str(image.data.get("key", "")), why))
        if not ours:
            return LookUp(None, tuple(refused))
        first, *others = ours
        duplicates = tuple(str(image.data.get("key", "")) for image in others)
        adopted = Copied(first, 0, adopted=True, duplicates=duplicates)
        return LookUp(adopted, tuple(refused), why_ours(first.data, sent=sent))

    def upload(self, task: Task, held: HeldImage, deadline: float) -> Copied:
        """Send the bytes in hand (or, relayed, wait for the upload that read them as they
        landed). Raises ArchiveFailure saying whether Lsky may have kept them
        (Failure.may_be_hosted): the next attempt looks them up first when it may."""
        if isinstance(held, RelayedImage):
            answer = held.sending.result()
        elif time_left(deadline) < upload_needs(held.size):
            raise fail(Stage.UPLOAD, Kind.TIMEOUT, "not enough time left to upload")
        else:
            answer = self._send(task, held, deadline)
        if isinstance(answer, Failure):
            # Raised outside any except block: nothing else is chained to the failure.
            raise ArchiveFailure(answer)
        return Copied(answer, held.size, sent=Digest(held.sha1, held.size))

    def _send(self, task: Task, image: Sendable, deadline: float) -> HostedImage | Failure:
        """The upload's answer, or its failure saying whether Lsky may have kept the image
        (Failure.may_be_hosted): the next attempt looks it up first when it may."""
        try:
            return self.lsky.upload(
                image, filename=file_name(task, image.image_type), deadline=deadline
            )
        except ArchiveFailure as error:
            failure = error.failure
        # Bytes in hand go out whole as far as we know; a relayed body only once the upload
        # read it to its end (cut by its own deadline before that, Lsky stored nothing).
        complete = image.read_whole if isinstance(image, Relay) else True
        return replace(failure, may_be_hosted=may_be_hosted(failure, body_complete=complete))


def _no_time_for(size: int | None) -> ArchiveFailure:
    return fail(
        Stage.DOWNLOAD, Kind.TIMEOUT, f"not enough time left to transfer a {size}-byte image"
    )


def sent_of(held: HeldImage) -> SentImage:
    """What uploading `held` sends, as the look-up compares it."""
    return SentImage(held.sha1, held.dimensions())


def sent_after(failure: Failure, held: HeldImage | None) -> SentImage | None:
    """What the failed upload sent, kept for the look-up when Lsky may have stored it."""
    if held is None or not failure.may_be_hosted or failure.stage is not Stage.UPLOAD:
        return None
    return sent_of(held)


def file_name(task: Task, image_type: ImageType) -> str:
    return hosted_file_name(
        username=task.username,
        user_id=task.user_id,
        record_id=task.record_id,
        started_at=task.started_at,
        extension=image_type.extension,
    )
