"""The kept originals' table (image_archive_originals) outside the archive's success write,
which records its own: the audit's original for a record, told in its story, and a
record's original read (`archive-ctl show`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lib.state.claim import Confirmed, KeptOriginal, confirmed_params, is_original
from lib.state.events import Actor
from lib.state.queries import Statements


@dataclass(frozen=True)
class Unconfirmed:
    """An original recorded before S3's answer, as the audit looks it up (a HEAD)."""

    record_id: int
    bucket: str
    key: str
    bytes: int


class OriginalStore(Statements):
    """Runs keep_original, original_of and the audit's look at unconfirmed originals
    (lib/sql/queries.sql), one round trip each."""

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

    def unconfirmed(self, *, grace_seconds: int, limit: int) -> list[Unconfirmed]:
        """Originals recorded unconfirmed more than `grace_seconds` ago, oldest first; a
        row no release of ours writes is left out (is_original)."""
        rows = self._run("originals_unconfirmed", grace=grace_seconds, limit=limit)
        found = []
        for record_id, bucket, key, size in rows:
            if is_original(bucket, key, size):
                found.append(Unconfirmed(int(record_id), bucket, key, int(size)))
        return found

    def confirm(self, confirmed: Sequence[Confirmed]) -> int:
        """Confirm these (still unconfirmed, that key); how many rows it did."""
        [[count]] = self._run("confirm_originals", **confirmed_params(confirmed))
        return int(count)

    def absent(self, record_id: int, key: str) -> bool:
        """The original (still unconfirmed, that key) is not in the bucket: its row goes,
        and the record is due for the audit now; whether the row went."""
        return bool(self._run("original_absent", record_id=record_id, key=key))
