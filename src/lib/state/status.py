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
