"""The archive's states, mirrored by the CHECK constraint of archive_migration.sql."""

from __future__ import annotations

import enum


class ArchiveStatus(enum.StrEnum):
    """`image_generation_records.archive_status`; NULL means never queued."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def concluded(self) -> bool:
        return self in (ArchiveStatus.SUCCEEDED, ArchiveStatus.FAILED)


# The generation's own status (owned by the generation service) that makes a row archivable.
GENERATION_SUCCEEDED = "SUCCEEDED"


class WaitReason(enum.StrEnum):
    """`image_generation_records.archive_wait_reason`: why a PENDING row waits for its due
    time (NULL: it does not). Held or parked is archive_enqueued_at: NULL is parked (no
    message out; the sweeper sends one when due), set is held (its message comes back)."""

    BACKOFF = "backoff"  # a failed attempt's retry delay (ARCHIVE_RETRY_DELAYS)
    PAUSED = "paused"  # the host paused the lane (rate limit, Retry-After, account)
    PACED = "paced"  # our pacing (LSKY_RATE_LIMITS) booked it a later upload slot
    OWN_FAULT = "own_fault"  # our configuration or code stopped it; attempt given back
    NO_TIME = "no_time"  # the invocation had no time left for a transfer
