"""What a claim returns, and the pure reading of a claim that did not win."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.platform.env_values import MAX_IMAGE_BYTES_BOUND, is_bucket_name
from lib.state.lane import LaneState
from lib.state.status import GENERATION_SUCCEEDED, ArchiveStatus

# A message may come back a little before the row's due time (clock skew between SQS
# and PostgreSQL); within this slack it is on time. Earlier than that it is a second
# copy arriving during a backoff (or a Retry-After) and is held back until due.
EARLY_SLACK_SECONDS = 5


@dataclass(frozen=True)
class StagedCopy:
    """An image captured to the staging bucket: its object, and what was captured."""

    key: str
    sha256: str
    size: int


class OriginalSource(enum.StrEnum):
    """Where a kept original's bytes came from (image_archive_originals.source's CHECK)."""

    ARCHIVE = "archive"  # the bytes sent to Lsky, written as they passed
    STAGED = "staged"  # a staged copy, copied in server-side
    HOSTED = "hosted"  # the audit's GET of the hosted file, matching what Lsky reported
    PROVIDER = "provider"  # the provider's URL again, matching what was sent


# Every original lives under this prefix: the archive function's IAM grant names it.
ORIGINALS_PREFIX = "originals/"
_KEY = re.compile(r"originals/[0-9]{1,19}/[0-9a-f]{32}\.[a-z0-9]{1,8}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MIME = re.compile(r"image/[a-z0-9][a-z0-9.+-]{0,60}")
_VERSION = re.compile(r"[\x21-\x7e]{1,1024}")  # S3's are 32 printable characters


@dataclass(frozen=True)
class KeptOriginal:
    """An image's original kept in the originals bucket: where (the bucket it was written
    to, its key, S3's version), and what (SHA-256 and length of the object's bytes).
    `confirmed` False: its body went out whole, S3's answer (and version) not seen yet."""

    bucket: str
    key: str
    version_id: str | None
    sha256: str
    bytes: int
    mime_type: str
    source: OriginalSource
    confirmed: bool = True

    @classmethod
    def from_row(cls, row: list[Any] | tuple[Any, ...]) -> KeptOriginal | None:
        """From image_archive_originals' (bucket, key, version_id, sha256, bytes,
        mime_type, source[, confirmed]); None for a row no release of ours writes (a
        hand's, a damaged one): each value is checked, none is trusted."""
        bucket, key, version_id, sha256, size, mime_type, source, *rest = row
        confirmed = rest[0] if rest else True
        if not (
            is_original(bucket, key, size)
            and _is_version(version_id)
            and isinstance(sha256, str)
            and _SHA256.fullmatch(sha256)
            and isinstance(mime_type, str)
            and _MIME.fullmatch(mime_type)
            and source in set(OriginalSource)
            and isinstance(confirmed, bool)
            and len(rest) <= 1
        ):
            return None
        source = OriginalSource(source)
        return cls(bucket, key, version_id, sha256, size, mime_type, source, confirmed)


def is_original(bucket: Any, key: Any, size: Any) -> bool:
    """Whether a row's bucket, key and length are what a release of ours records."""
    return (
        isinstance(bucket, str)
        and is_bucket_name(bucket)
        and isinstance(key, str)
        and bool(_KEY.fullmatch(key))
        and isinstance(size, int)
        and 0 < size <= MAX_IMAGE_BYTES_BOUND
    )


def _is_version(value: Any) -> bool:
    return value is None or (isinstance(value, str) and bool(_VERSION.fullmatch(value)))


def is_version(value: Any) -> bool:
    """Whether `value` is a version S3 could have given (or none: an unversioned bucket)."""
    return _is_version(value)


@dataclass(frozen=True)
class Confirmed:
    """An original S3 holds (its answer to the PUT, or the audit's HEAD): the row it
    confirms (record and key, still unconfirmed) and the object's version."""

    record_id: int
    key: str
    version_id: str | None


def original_params(original: KeptOriginal | None) -> dict[str, Any]:
    """The original's columns as the success write's parameters (all None: none kept)."""
    if original is None:
        names = ("bucket", "key", "version_id", "sha256", "bytes", "mime_type", "source")
        return {f"original_{name}": None for name in (*names, "confirmed")}
    return {
        "original_bucket": original.bucket,
        "original_key": original.key,
        "original_version_id": original.version_id,
        "original_sha256": original.sha256,
        "original_bytes": original.bytes,
        "original_mime_type": original.mime_type,
        "original_source": str(original.source),
        "original_confirmed": original.confirmed,
    }


def confirmed_params(confirmed: Sequence[Confirmed]) -> dict[str, Any]:
    """The parameters of original_confirmed (lib/sql/queries.sql), parallel arrays."""
    return {
        "confirmed_records": [c.record_id for c in confirmed],
        "confirmed_keys": [c.key for c in confirmed],
        "confirmed_versions": [c.version_id for c in confirmed],
    }


@dataclass(frozen=True)
class Restoring:
    """A restore under way (image_archive_restores): the hosted copy it replaces (its key
    on Lsky), and the original to publish again (None: the source, as any archive)."""

    old_key: str | None
    original: KeptOriginal | None


@dataclass(frozen=True)
class SentImage:
    """What an upload sent, for comparing an image found on Lsky with (archive_sent)."""

    sha1: str
    dimensions: tuple[int, int] | None

    def as_json(self) -> dict[str, Any]:
        width, height = self.dimensions or (None, None)
        return {"sha1": self.sha1, "width": width, "height": height}

    @classmethod
    def from_json(cls, value: Any) -> SentImage | None:
        """From the column (an older release also wrote md5: not needed, sha1 decides);
        None for anything else an older release (or a hand) left there."""
        if not isinstance(value, dict):
            return None
        sha1 = value.get("sha1")
        if not isinstance(sha1, str) or not sha1:
            return None
        width, height = value.get("width"), value.get("height")
        if isinstance(width, int) and isinstance(height, int):
            return cls(sha1, (width, height))
        return cls(sha1, None)


@dataclass(frozen=True)
class Task:
    """What an attempt needs, as returned by the claim."""

    record_id: int
    user_id: int
    username: str | None
    image_url: str
    started_at: datetime | None
    attempt: int
    # The last attempt may have left an image on Lsky that the row does not point at:
    # look it up before uploading again (lib.archive.reconcile).
    may_be_hosted: bool = False
    # Where an earlier attempt staged the image (lib.archive.staging): upload from there,
    # once its bytes match what was captured (SHA-256, length).
    staged_key: str | None = None
    staged_sha256: str | None = None
    staged_bytes: int | None = None
    # The first claim that could upload: an image stored before it is not this record's.
    first_claimed_at: datetime | None = None
    # The upload slot pacing booked for this record, if any.
    booked_at: datetime | None = None
    # What the last upload sent, when Lsky may have kept it (compared before adopting).
    sent: SentImage | None = None
    # A restore (image_archive_restores): the copy it replaces, and the original it
    # publishes again once read back whole and matching; None: an archive.
    restore: Restoring | None = None


@dataclass(frozen=True)
class ClaimSnapshot:
    """The row as the claim statement saw it, for explaining a claim that did not win."""

    exists: bool
    status: str | None = None
    archive_status: str | None = None
    lock_expired: bool = False
    due_in_seconds: float = 0.0  # archive_next_run_at - now(); negative when past due
    exhausted: bool = False  # an expired lock on the last attempt, failed by the claim
    lane: LaneState | None = None  # the upload lane when the claim ran
    booked_at: datetime | None = None  # the record's booked upload slot, if any

    @classmethod
    def of(cls, head: Sequence[Any], lane: LaneState, booked_at: datetime | None) -> ClaimSnapshot:
        """From the claim's first columns: status, archive status, whether the lock had
        expired, seconds until due, whether the claim failed the row (exhausted)."""
        status, archive_status, expired, due_in, exhausted = head
        return cls(
            exists=status is not None,
            status=status,
            archive_status=archive_status,
            lock_expired=bool(expired),
            due_in_seconds=float(due_in) if due_in is not None else 0.0,
            exhausted=bool(exhausted),
            lane=lane,
            booked_at=booked_at,
        )


@dataclass(frozen=True)
class ClaimResult:
    task: Task | None
    snapshot: ClaimSnapshot
    confirmed: int = 0  # originals the claim confirmed (ArchiveRecords.claim's `confirmed`)


def early_delay(snapshot: ClaimSnapshot) -> int | None:
    """Seconds until a PENDING row that a message came for early is due, or None.

    The claim refuses such a row so that a duplicate cannot cut a backoff short; the
    message is kept (or the row parked), not dropped, in case it is the row's only one.
    """
    if snapshot.status != GENERATION_SUCCEEDED or snapshot.archive_status != ArchiveStatus.PENDING:
        return None
    if snapshot.due_in_seconds <= 0:
        return None
    return math.ceil(snapshot.due_in_seconds)


def skip_reason(snapshot: ClaimSnapshot) -> str:
    """Why a message whose claim did not win is a duplicate or a stray."""
    if not snapshot.exists:
        return "record not found"
    if snapshot.exhausted:
        return "lock expired after the last attempt: failed"
    if snapshot.status != GENERATION_SUCCEEDED:
        return f"generation status is {snapshot.status}"
    if snapshot.archive_status is None:
        return "archive was never queued"
    status = ArchiveStatus(snapshot.archive_status)
    if status.concluded:
        return f"archive already {status}"
    if status is ArchiveStatus.RUNNING and not snapshot.lock_expired:
        return "archive is RUNNING under a live lock"
    # PENDING or an expired RUNNING lock the claim should have taken: a race it lost.
    return f"claimed concurrently (archive {status})"


def blocked_by_lane(snapshot: ClaimSnapshot) -> bool:
    """The claim lost only because the upload lane is paused: the row itself was ready."""
    if snapshot.lane is None or not snapshot.lane.paused or snapshot.exhausted:
        return False
    if snapshot.status != GENERATION_SUCCEEDED:
        return False
    if snapshot.archive_status == ArchiveStatus.PENDING:
        return snapshot.due_in_seconds <= EARLY_SLACK_SECONDS
    return snapshot.archive_status == ArchiveStatus.RUNNING and snapshot.lock_expired
