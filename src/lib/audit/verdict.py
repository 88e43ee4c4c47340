"""What a check of a hosted copy found, and what to do about it: pure.

A check ends in a verdict (intact, missing, altered) or in none (unreachable: the host did
not answer for it). The hosted bytes are checked against what Lsky reported at upload (sha1,
size in KB), the provider's against what was sent (docs/explanation/audit-and-repair.md)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lib.archive.fidelity import Digest, compare
from lib.transfer.failures import Failure, Kind


class AuditVerdict(enum.StrEnum):
    """image_archive_audits.verdict; the table's CHECK lists the same names."""

    INTACT = "intact"  # the hosted bytes are those Lsky reported storing
    MISSING = "missing"  # 404 or 410, or a body that is not an image
    ALTERED = "altered"  # an image, but other bytes


# Statuses that say the file is not there. Any other error status (5xx, 429, a 403 a proxy
# or a bucket policy gives) says nothing about the file: no verdict, checked again.
GONE_STATUSES = frozenset({404, 410})


@dataclass(frozen=True)
class Expected:
    """What the record says the hosted file is: Lsky's answer at upload (`data.sha1`,
    `data.size` in KB, of the stored file) and the sha1 of the bytes sent (our note)."""

    sha1: str | None = None
    size_kb: float | str | None = None
    sent_sha1: str | None = None
    altered: bool | None = None  # archive_altered: Lsky stored other bytes than sent

    @property
    def reported(self) -> dict[str, object]:
        """Lsky's answer, as lib.archive.fidelity.compare reads it."""
        return {"sha1": self.sha1, "size": self.size_kb}

    @property
    def original_sha1(self) -> str | None:
        """The sha1 of the generated image: what was sent, or what Lsky stored when it
        stored the bytes unaltered."""
        if self.sent_sha1:
            return self.sent_sha1.strip().lower()
        if self.altered is False and self.sha1:
            return self.sha1.strip().lower()
        return None


@dataclass(frozen=True)
class Judged:
    """A check's outcome: a verdict (None: unreachable), why, and whether the bytes were
    compared with Lsky's report (only then may they become the record's original)."""

    verdict: AuditVerdict | None
    why: str
    compared: bool = False

    @property
    def wrong(self) -> bool:
        return self.verdict in (AuditVerdict.MISSING, AuditVerdict.ALTERED)


def judge_failure(failure: Failure) -> Judged:
    """A GET that did not give an image whole."""
    if failure.kind is Kind.HTTP_STATUS and failure.status in GONE_STATUSES:
        return Judged(AuditVerdict.MISSING, f"HTTP {failure.status}")
    if failure.kind is Kind.NOT_IMAGE:
        return Judged(AuditVerdict.MISSING, "the body is not an image")
    if failure.kind is Kind.TOO_LARGE:
        # No archived image is larger than the cap: these are other bytes.
        return Judged(AuditVerdict.ALTERED, "larger than any archived image")
    if failure.kind is Kind.HTTP_STATUS:
        return Judged(None, f"HTTP {failure.status}")
    return Judged(None, str(failure.kind).replace("_", " "))


def judge_bytes(got: Digest, expected: Expected) -> Judged:
    """A whole image: intact when its sha1 and size are what Lsky reported (what it did
    report; nothing reported compares nothing and is intact by its presence)."""
    fidelity = compare(got, expected.reported)
    if fidelity.altered:
        return Judged(AuditVerdict.ALTERED, "differs in " + " and ".join(fidelity.differs), True)
    if fidelity.altered is None:
        return Judged(AuditVerdict.INTACT, "an image (Lsky reported no sha1 or size)")
    return Judged(AuditVerdict.INTACT, "sha1 and size as reported", compared=True)


def host_down(unreachable: int, checked: int) -> bool:
    """Most checks of a batch got no answer: the host (or the way to it) is down, and
    nothing the batch saw is judged."""
    return checked > 0 and unreachable * 2 > checked


class Repair(enum.StrEnum):
    """What follows a verdict."""

    NONE = "none"
    KEEP_ORIGINAL = "keep original"  # intact, no original yet: keep the bytes just read
    RESTORE = "restore"  # wrong, an original is kept: publish it again
    # Wrong, no original: the provider's URL, if it still gives the bytes first sent, is
    # archived again (kept as the original first when originals are on).
    REFETCH = "refetch"
    LOST = "lost"  # wrong, no original, and the provider's URL cannot give it back


def repair_for(
    judged: Judged, *, has_original: bool, originals_on: bool, can_refetch: bool
) -> Repair:
    if judged.verdict is AuditVerdict.INTACT:
        keep = originals_on and not has_original and judged.compared
        return Repair.KEEP_ORIGINAL if keep else Repair.NONE
    if not judged.wrong:
        return Repair.NONE
    if has_original:
        return Repair.RESTORE
    return Repair.REFETCH if can_refetch else Repair.LOST
