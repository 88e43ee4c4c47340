"""Originals off (ARCHIVE_ORIGINALS_BUCKET empty): nothing is kept, nothing called."""

from __future__ import annotations

from lib.state.claim import KeptOriginal
from lib.transfer.held import HeldImage


class NoOriginals:
    enabled = False

    def keep(
        self, record_id: int, held: HeldImage, source: str, deadline: float
    ) -> KeptOriginal | None:
        return None
