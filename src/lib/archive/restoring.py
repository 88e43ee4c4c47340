"""A restore's own check before it uploads: while Lsky lists the damaged copy's image, it
would point a new upload of the same bytes at that image's file (its dedupe is by md5 and
sha1, not by the file being there), and the restore would store nothing new."""

from __future__ import annotations

from lib.archive.copier import Copier
from lib.state.claim import Task
from lib.transfer.failures import Failure, Kind, Stage


def damaged_copy_listed(
    copier: Copier, task: Task, old_key: str, deadline: float
) -> Failure | None:
    """The restore's failure when Lsky still lists `old_key`, else None. Raises
    ArchiveFailure (stage lookup) when Lsky cannot say."""
    if not copier.still_listed(task, old_key, deadline):
        return None
    return Failure(
        Stage.RESTORE,
        Kind.REJECTED,
        f"Lsky still lists image {old_key[:64]}, the damaged copy, and would reuse its file;"
        f" delete it on the host, then `archive-ctl restore --id {task.record_id}`",
    )
