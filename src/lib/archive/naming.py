"""File names on the image host: who, which record, when it was generated (as the seed)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_UNSAFE = re.compile(r"[^\w.-]+")
MAX_USERNAME_CHARS = 48
# What Lsky may make of our extension: ours (lib.transfer.imagetype) and the group's save
# formats, which replace it in origin_name (ImageService::store).
HOSTED_EXTENSIONS = (
    "png",
    "jpg",
    "jpeg",
    "gif",
    "webp",
    "avif",
    "bmp",
    "tif",
    "tiff",
    "ico",
    "psd",
)


def hosted_file_stem(
    *, username: str | None, user_id: int, record_id: int, started_at: datetime | None
) -> str:
    """e.g. alice_1234_20261202T124735Z; path separators and spaces never pass."""
    safe = _UNSAFE.sub("-", username or "").strip("-.")[:MAX_USERNAME_CHARS]
    who = safe or f"user{user_id}"
    when = (started_at or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{who}_{record_id}_{when}"


def hosted_file_name(
    *,
    username: str | None,
    user_id: int,
    record_id: int,
    started_at: datetime | None,
    extension: str,
) -> str:
    """e.g. alice_1234_20261202T124735Z.png"""
    stem = hosted_file_stem(
        username=username, user_id=user_id, record_id=record_id, started_at=started_at
    )
    return f"{stem}.{extension}"


def hosted_names(stem: str) -> frozenset[str]:
    """Every origin_name an upload of this record can have on Lsky (the stem is unique to
    the record; the extension comes from the image, which a look-up has not fetched)."""
    return frozenset(f"{stem}.{extension}" for extension in HOSTED_EXTENSIONS)
