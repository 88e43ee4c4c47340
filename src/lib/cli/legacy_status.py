"""archive_status values an older release or a script wrote, and the state each one maps to
(docs/reference/database.md, "Legacy archive_status values"). Pure: `migrate` scans, this
decides."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from lib.platform.migration_plan import LegacyValue
from lib.state.status import ArchiveStatus

# Other words for the four states. Case, spaces and hyphens do not count (`canonical`), so
# 'pending', ' Pending ' and 'in-progress' are covered too. Anything not here (CANCELLED,
# SKIPPED, '', ...) has no obvious meaning in this state machine: migrate stops on it.
SYNONYMS: dict[str, ArchiveStatus] = {
    **dict.fromkeys(
        ("QUEUED", "WAITING", "NEW", "RETRY", "RETRYING", "SCHEDULED"), ArchiveStatus.PENDING
    ),
    **dict.fromkeys(
        ("PROCESSING", "IN_PROGRESS", "ARCHIVING", "UPLOADING", "STARTED", "LOCKED"),
        ArchiveStatus.RUNNING,
    ),
    **dict.fromkeys(
        ("DONE", "COMPLETED", "COMPLETE", "ARCHIVED", "SUCCESS", "SUCCESSFUL", "UPLOADED", "OK"),
        ArchiveStatus.SUCCEEDED,
    ),
    **dict.fromkeys(("ERROR", "ERRORED", "FAILURE", "FAIL", "DEAD"), ArchiveStatus.FAILED),
}


def canonical(value: str) -> str:
    return re.sub(r"[\s-]+", "_", value.strip()).upper()


def target(value: str, *, hosted: bool) -> ArchiveStatus | None:
    """The state `value` means, or None when there is no obvious one.

    A success without the hosted URL it produced is not one: those rows are left to the
    operator (archive again, or look the image up), never marked SUCCEEDED blind.
    """
    key = canonical(value)
    status = ArchiveStatus(key) if key in ArchiveStatus.__members__ else SYNONYMS.get(key)
    if status is ArchiveStatus.SUCCEEDED and not hosted:
        return None
    return status


def classify(rows: Iterable[Sequence[Any]]) -> list[LegacyValue]:
    """The `legacy_statuses` rows (value, has a hosted URL, count) with their targets."""
    found = []
    for value, hosted, count in rows:
        mapped = target(str(value), hosted=bool(hosted))
        name = None if mapped is None else str(mapped)
        found.append(LegacyValue(str(value), bool(hosted), int(count), name))
    return found
