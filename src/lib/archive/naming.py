"""File names on the image host: who, which record, when it was generated (as the seed)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_UNSAFE = re.compile(r"[^\w.-]+")
MAX_USERNAME_CHARS = 48


def hosted_file_name(
    *,
    username: str | None,
    user_id: int,
    record_id: int,
    started_at: datetime | None,
    extension: str,
) -> str:
    """e.g. alice_1234_20261202T124735Z.png; path separators and spaces never pass."""
    safe = _UNSAFE.sub("-", username or "").strip("-.")[:MAX_USERNAME_CHARS]
    who = safe or f"user{user_id}"
    when = (started_at or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{who}_{record_id}_{when}.{extension}"
