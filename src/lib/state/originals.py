"""The kept originals' table (image_archive_originals) outside the archive's success write,
which records its own: the audit's original for a record, told in its story, and a
record's original read (`archive-ctl show`)."""

from __future__ import annotations

from lib.state.claim import KeptOriginal
from lib.state.events import Actor
from lib.state.queries import Statements


class OriginalStore(Statements):
    """Runs keep_original and original_of (lib/sql/queries.sql), one round trip each."""

    def keep(self, record_id: int, original: KeptOriginal, *, by: Actor = Actor.AUDITOR) -> bool:
        """Record `original` as the record's, replacing the row's (the older object stays
        in the versioned bucket), and note `original_kept` in its story; whether the row
        was written (the record may be gone)."""
        rows = self._run(
            "keep_original",
            record_id=record_id,
            bucket=original.bucket,
            key=original.key,
            version_id=original.version_id,
            sha256=original.sha256,
            bytes=original.bytes,
            mime_type=original.mime_type,
            source=str(original.source),
            by=str(by),
        )
        return bool(rows)

    def of(self, record_id: int) -> KeptOriginal | None:
        """The record's kept original; None when it has none, or when its row has what
        no release of ours writes (KeptOriginal.from_row)."""
        rows = self._run("original_of", record_id=record_id)
        return KeptOriginal.from_row(rows[0]) if rows else None
