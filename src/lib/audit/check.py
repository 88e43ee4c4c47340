"""One check's I/O: the hosted file read (the download's guard, deadline and size cap) and
judged against what Lsky reported; the provider's URL read again and checked against the bytes
first sent. The bytes read are kept in hand (a spool) while they may become an original."""

from __future__ import annotations

import time
from dataclasses import dataclass

from lib.archive.fidelity import Digest
from lib.audit.verdict import Expected, Judged, judge_bytes, judge_failure
from lib.state.audits import AuditTarget
from lib.transfer.download import Downloader, safe_url
from lib.transfer.failures import ArchiveFailure
from lib.transfer.held import HeldImage, hold


@dataclass
class Checked:
    """A check's outcome, and the bytes it read when they were a whole image."""

    target: AuditTarget
    judged: Judged
    held: HeldImage | None = None
    seconds: float = 0.0

    def close(self) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None


def expected_of(target: AuditTarget) -> Expected:
    return Expected(
        sha1=target.reported_sha1,
        size_kb=target.reported_size_kb,
        sent_sha1=target.sent_sha1,
        altered=target.altered,
    )


def read(downloader: Downloader, url: str, deadline: float) -> HeldImage:
    """The image at `url`, whole, in a spool; raises ArchiveFailure as a download does."""
    with downloader.open(url, deadline=deadline) as stream:
        return hold(stream, stream.image_type)


def check_hosted(downloader: Downloader, target: AuditTarget, deadline: float) -> Checked:
    """GET the hosted URL and judge what came back."""
    started = time.monotonic()
    url = target.hosted_url or ""
    try:
        held = read(downloader, url, deadline)
    except ArchiveFailure as error:
        judged = judge_failure(error.failure)
        return Checked(target, judged, seconds=time.monotonic() - started)
    judged = judge_bytes(Digest(held.sha1, held.size), expected_of(target))
    return Checked(target, judged, held, time.monotonic() - started)


@dataclass(frozen=True)
class Refetched:
    """The provider's URL read again: the bytes when they are those first sent, else why not."""

    held: HeldImage | None
    why: str


def refetch(downloader: Downloader, target: AuditTarget, deadline: float) -> Refetched:
    """The provider's URL, once more: its bytes count only when their sha1 is the one the
    record first sent (the provider may serve another image, or an error page, by now)."""
    wanted = expected_of(target).original_sha1
    if not target.image_url or wanted is None:
        return Refetched(None, "no provider URL or no record of the bytes first sent")
    try:
        held = read(downloader, target.image_url, deadline)
    except ArchiveFailure as error:
        return Refetched(None, f"the provider's URL failed: {error.failure.message}")
    if held.sha1 != wanted:
        held.close()
        where = safe_url(target.image_url)
        return Refetched(None, f"the provider's URL ({where}) gives other bytes now")
    return Refetched(held, "the provider's URL gives the bytes first sent")
